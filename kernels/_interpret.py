"""Triton's interpreter without its per-call re-patching (the gate's cost, docs/gate.md).

In the interpreter (TRITON_INTERPRET=1) a kernel launch patches `triton.language` once (every
builtin replaced by its numpy implementation, `range`, `reduce`, ... by interpreter versions)
and restores it when the grid is done. But every call of a `@triton.jit` helper from inside the
kernel (kernels/portable_tl.py's polynomials, the attention tile step, ...) runs the same
patching again: `inspect.getmembers` over `tl`, `tl.core`, `tl.math` and the tensor class, for
hundreds of thousands of calls per spec. Profiled on kernels/attention-prefill-256-window-128,
that re-patching was half of the interpreter's time.

Inside a launch the re-patching changes nothing: every builtin is already replaced (the
replacements are not builtins, so the helper's pass skips them all), and the other attributes
it sets are fresh copies of the functions already installed (stateless closures of the same
code). So inside a launch, a helper whose language modules are all patched already skips it:
patched by the launch, or by an earlier helper call of the same launch (Triton's own `tl.sum`,
`tl.zeros`, ... see `tl.core`, which a kernel module often does not, and Triton never restores
what a helper call patches). Anything else (a launch, the first helper call that sees a module
not yet patched, a helper called outside any launch) patches exactly as Triton does. The numpy
operations a kernel runs, and so its bits, are the same (tests/kernels/test_interpret_patch.py
runs kernels both ways and compares the bytes).

Installed by kernels/_common.py when the interpreter is on and Triton has the internals this
relies on (triton 3.x's `_patch_lang` and `GridExecutor`); otherwise Triton runs unchanged.
Compiled kernels (a GPU) never reach this code.
"""

from __future__ import annotations

import contextlib

_state = {"launching": False, "patched": None}     # the running launch's patched language modules
_originals: dict = {}                              # Triton's own _patch_lang and GridExecutor.__call__


class _NothingToRestore:
    """What a skipped patch returns: the launch's own scope restores the modules."""

    def restore(self) -> None:
        pass


def _langs(fn, tl) -> frozenset:
    """The language modules `fn` sees, as Triton's _patch_lang picks them (a global that is tl or
    tl.core: its `ismodule(v) and v in [tl, tl.core]` is identity for modules), by identity alone
    (called for every helper call: no per-global function calls)."""
    core = tl.core
    return frozenset(id(v) for v in fn.__globals__.values() if v is tl or v is core)


def install() -> bool:
    """Wrap the interpreter's _patch_lang and GridExecutor.__call__; False where Triton lacks them."""
    try:
        from triton.runtime import interpreter
        import triton.language as tl
    except ImportError:
        return False
    original = getattr(interpreter, "_patch_lang", None)
    grid = getattr(interpreter, "GridExecutor", None)
    if getattr(original, "_lockstep", False):
        return True                                        # installed already
    if original is None or grid is None:
        return False
    launch = grid.__call__
    _originals.update(patch_lang=original, grid_call=launch)

    def patch_lang(fn):
        langs, patched = _langs(fn, tl), _state["patched"]
        if patched is not None and langs <= patched:
            return _NothingToRestore()                     # a helper inside the launch: already patched
        scope = original(fn)
        if _state["launching"]:                            # the launch's own patch, or a helper's first
            _state["patched"] = langs if patched is None else patched | langs
        return scope

    def grid_call(self, *args, **kwargs):
        _state["launching"], _state["patched"] = True, None
        try:
            return launch(self, *args, **kwargs)
        finally:
            _state["launching"], _state["patched"] = False, None

    patch_lang._lockstep = True
    interpreter._patch_lang = patch_lang
    grid.__call__ = grid_call
    return True


@contextlib.contextmanager
def triton_as_shipped():
    """Triton's own re-patching for the duration (tests compare the two ways' bits)."""
    from triton.runtime import interpreter
    mine = interpreter._patch_lang, interpreter.GridExecutor.__call__
    interpreter._patch_lang, interpreter.GridExecutor.__call__ = _originals["patch_lang"], _originals["grid_call"]
    try:
        yield
    finally:
        interpreter._patch_lang, interpreter.GridExecutor.__call__ = mine
