"""Triton's interpreter without its per-call re-patching, installed process-wide (docs/DESIGN.md §1).

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

Second, the type objects of every interpreted operation. Each `tl` operation
of a kernel builds a `tl.tensor` and usually a `tl.block_type` for its result, and Triton's
constructors re-derive the same things from the shape every time: `tl.tensor` a `constexpr` per
dimension, their `tl.tuple` and its `tuple_type`; `tl.block_type` the unwrapped shape, its
validation (powers of two, the numel limit) and its `tuple_type`. That was a third of an
interpreter spec's time (profiled on kernels/matmul-tail-2881-bf16). The replacements
(`_install_type_caches`) keep what depends on the shape alone per shape of plain ints (the
immutable `constexpr`s, the `tuple_type`, the numel, the validated shape's text) and build each
object's own `tl.tuple` from them, so every object gets the attributes Triton's constructor gives
it (equal values, the same types; only immutable parts are shared); any other argument goes to
Triton's constructor. Three pure lookups of every operation are answered directly as well
(`_install_lookups`). No numpy operation changes, so neither do the bits
(tests/kernels/test_interpret_patch.py compares six kernels' bytes with `triton_as_shipped`, which
puts back everything install() replaced).

Third, the operands of a binary operation: for two tensors of plain
dtypes, whether Triton's casts to the computation type are no-ops is a function of the two dtypes
and the flags, so it is decided once per pair (`_install_operand_checks`); a dtype equals itself
without comparing names; and the launch's stand-in for each builtin sets `_semantic` in its own
keyword dict instead of filtering a copy (`_install_builtin_calls`). An interpreted `a + b` costs a
third of Triton's as shipped (bench/interpreter.py prints each case's ratio and checks the bytes).

A launch also runs under `np.errstate(all="ignore")`: the kernels' special values (the specs' inf
and NaN inputs, overflow into inf) are values, as on a GPU, where nothing warns about them; numpy
printed a RuntimeWarning for each (14 lines in a `lockstep check`). No value changes.

Installed by kernels/_common.py when the interpreter is on and Triton has the internals this
relies on (triton 3.x's `_patch_lang` and `GridExecutor`); otherwise Triton runs unchanged.
Compiled kernels (a GPU) never reach this code.
"""

from __future__ import annotations

import builtins
import contextlib
import inspect
import math

import numpy as np

_state = {"launching": False, "patched": None}     # the running launch's patched language modules
_replaced: list = []                               # (owner, attribute, Triton's own value) install() replaced


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
            with np.errstate(all="ignore"):                # as compiled: inf and NaN are values, not warnings
                return launch(self, *args, **kwargs)
        finally:
            _state["launching"], _state["patched"] = False, None

    patch_lang._lockstep = True
    _replace(interpreter, "_patch_lang", patch_lang)
    _replace(grid, "__call__", grid_call)
    _install_type_caches()
    _install_operand_checks()
    _install_builtin_calls(interpreter)
    return True


_DIMS: dict = {}     # shape (ints) -> (constexpr numel, [constexpr per dimension], their tuple_type)
_BLOCKS: dict = {}   # shape (ints) -> (validated numel, tuple_type of the ints, the shape's text)


def _install_type_caches() -> None:
    """tl.tensor and tl.block_type built from per-shape parts (module docstring), where this
    Triton's constructors are the ones these replacements were written against."""
    from triton.language import core
    needed = ("tensor", "block_type", "tuple", "constexpr", "_type_for_tuple_values", "validate_block_shape")
    if not all(hasattr(core, name) for name in needed):
        return
    shipped_tensor_init, shipped_block_type_init = core.tensor.__init__, core.block_type.__init__

    def tensor_init(self, handle, type):
        if type.is_block() and builtins.type(type.shape) is not core.tuple:
            return shipped_tensor_init(self, handle, type)
        self.handle = handle
        shape = builtins.tuple(type.shape.values) if type.is_block() else ()
        parts = _DIMS.get(shape)
        if parts is None:
            dims = [core.constexpr(d) for d in shape]
            parts = _DIMS[shape] = (core.constexpr(math.prod(shape)), dims, core._type_for_tuple_values(dims))
        self.numel = parts[0]
        self.type = type
        self.dtype = type.scalar
        self.shape = core.tuple(parts[1], parts[2])          # its own tuple (Triton's tuples are mutable)

    def block_type_init(self, element_ty, shape):
        kind = builtins.type(shape)                          # Triton takes a list or a tl.tuple
        key = builtins.tuple(shape) if kind is list else builtins.tuple(shape.values) if kind is core.tuple else ()
        parts = _BLOCKS.get(key)
        if parts is None and key and all(builtins.type(d) is int for d in key):
            numel = core.validate_block_shape(key)           # raises as Triton's does
            types = core._type_for_tuple_values(list(key))
            parts = _BLOCKS[key] = (numel, types, str(core.tuple(list(key), types)))
        if parts is None:                                    # constexprs, an empty shape, ...: Triton's own
            return shipped_block_type_init(self, element_ty, shape)
        self.element_ty = element_ty
        self.shape = core.tuple(key, parts[1])
        self.numel = parts[0]
        self.name = f"<{parts[2]}, {element_ty}>"

    _replace(core.tensor, "__init__", tensor_init)
    _replace(core.block_type, "__init__", block_type_init)
    _install_lookups(core)


def _install_lookups(core) -> None:
    """Three pure functions of every interpreted operation answered without their rebuilding:
    `_unwrap_if_constexpr` returns a plain number, string, None or tl.tensor as it is and a
    constexpr's value straight away (anything else, lists and tuples among them, goes to Triton's);
    the interpreter's `_get_np_dtype` looks a Triton dtype's numpy dtype up once per dtype instead
    of building its 19-entry table on every call (numpy's dtypes are singletons: the same objects);
    `broadcast_impl_value` of two blocks of one shape returns them as Triton's loop does."""
    from triton.runtime import interpreter
    unwrap, np_dtype = getattr(core, "_unwrap_if_constexpr", None), getattr(interpreter, "_get_np_dtype", None)
    if unwrap is None or np_dtype is None:
        return
    plain = frozenset({int, float, bool, str, type(None), core.tensor})
    constexpr, block_type, pointer_type = core.constexpr, core.block_type, core.pointer_type
    numpy_of: dict = {}

    def unwrap_if_constexpr(o):
        kind = type(o)
        if kind in plain:
            return o
        if kind is constexpr:
            return o.value
        return unwrap(o)

    def get_np_dtype(tt_dtype):
        kind = type(tt_dtype)
        if kind is block_type and type(tt_dtype.element_ty) is not pointer_type:
            tt_dtype = tt_dtype.element_ty                   # Triton's: the element type's entry
        elif kind is block_type or kind is pointer_type:
            return np_dtype(tt_dtype)
        got = numpy_of.get(tt_dtype)
        if got is None:
            got = numpy_of[tt_dtype] = np_dtype(tt_dtype)
        return got

    _replace(core, "_unwrap_if_constexpr", unwrap_if_constexpr)
    _replace(interpreter, "_get_np_dtype", get_np_dtype)
    semantic = getattr(interpreter, "TritonSemantic", None)
    broadcast = getattr(semantic, "broadcast_impl_value", None)
    if broadcast is None:
        return

    def broadcast_impl_value(self, lhs, rhs):
        """Two blocks of one shape (most operands): Triton's loop finds every dimension equal and
        returns both as they are; that answer straight away, anything else through Triton's."""
        a, b = lhs.type, rhs.type
        if type(a) is block_type and type(b) is block_type and a.shape.values == b.shape.values:
            return lhs, rhs
        return broadcast(self, lhs, rhs)

    _replace(semantic, "broadcast_impl_value", broadcast_impl_value)


_NO_CASTS: dict = {}    # (lhs dtype name, rhs dtype name, arithmetic_check, div_or_mod) -> casts are no-ops


def _install_operand_checks() -> None:
    """`binary_op_type_checking_impl` of two tensors of plain (non-pointer) dtypes, the operands of
    most interpreted operations (`a + b`, `a < b`, ...). Triton's checks the pointer rules (which
    raise for pointers only), casts each operand to the computation type (a cast to the type it
    has returns the operand itself) and broadcasts. The computation type is a function of the two
    dtypes and the flags alone, so whether both casts are no-ops is decided once per (dtype, dtype,
    flags) by Triton's own `computation_type_impl`; when they are, the answer is Triton's
    broadcast of the operands as they are, exactly what its function returns. Numbers, pointers,
    other dtype classes and pairs that need a cast go to Triton's."""
    from triton.language import core
    from triton.runtime import interpreter

    semantic = getattr(interpreter, "TritonSemantic", None)
    shipped = getattr(semantic, "binary_op_type_checking_impl", None)
    expected = ["self", "lhs", "rhs", "allow_lhs_ptr", "allow_rhs_ptr", "arithmetic_check", "div_or_mod"]
    if shipped is None or list(inspect.signature(shipped).parameters) != expected:
        return
    tensor, plain = core.tensor, core.dtype

    def binary_op_type_checking_impl(self, lhs, rhs, allow_lhs_ptr=False, allow_rhs_ptr=False,
                                     arithmetic_check=True, div_or_mod=False):
        if type(lhs) is tensor and type(rhs) is tensor:
            a, b = lhs.dtype, rhs.dtype
            if type(a) is plain and type(b) is plain:
                key = (a.name, b.name, arithmetic_check, div_or_mod)
                no_casts = _NO_CASTS.get(key)
                if no_casts is None:
                    ret = self.computation_type_impl(a, False, b, False, div_or_mod) if arithmetic_check else a
                    no_casts = _NO_CASTS[key] = (not arithmetic_check) or (ret == a and ret == b)
                if no_casts:
                    return self.broadcast_impl_value(lhs, rhs)
        return shipped(self, lhs, rhs, allow_lhs_ptr, allow_rhs_ptr, arithmetic_check, div_or_mod)

    _replace(semantic, "binary_op_type_checking_impl", binary_op_type_checking_impl)

    shipped_eq = core.dtype.__eq__

    def dtype_eq(self, other):
        """A dtype equals itself (Triton's compares the names: equal); anything else as Triton's."""
        return True if other is self else shipped_eq(self, other)

    _replace(core.dtype, "__eq__", dtype_eq)


def _install_builtin_calls(interpreter) -> None:
    """The stand-in the launch installs for each `tl` builtin calls it with the interpreter's
    `_semantic` in place of any the caller passed; Triton's builds a filtered copy of the keyword
    arguments on every call, this one sets the key in the call's own (fresh) keyword dict."""
    shipped = getattr(interpreter, "_patch_attr", None)
    if shipped is None or list(inspect.signature(shipped).parameters) != ["obj", "name", "member", "builder", "scope"]:
        return

    def _patch_attr(obj, name, member, builder, scope):
        def new_member(*args, **kwargs):
            kwargs["_semantic"] = interpreter.interpreter_semantic
            return member(*args, **kwargs)
        scope.set_attr(obj, name, new_member)

    _replace(interpreter, "_patch_attr", _patch_attr)


def _replace(owner, name: str, ours) -> None:
    """owner.name = ours, remembering Triton's own value for triton_as_shipped."""
    _replaced.append((owner, name, getattr(owner, name)))
    setattr(owner, name, ours)


@contextlib.contextmanager
def triton_as_shipped():
    """Triton as shipped for the duration: everything install() replaced (its re-patching, the type
    constructors, the lookups) put back, then ours again (tests compare the two ways' bits)."""
    ours = [(owner, name, getattr(owner, name)) for owner, name, _ in _replaced]
    for owner, name, shipped in _replaced:
        setattr(owner, name, shipped)
    try:
        yield
    finally:
        for owner, name, mine in ours:
            setattr(owner, name, mine)
