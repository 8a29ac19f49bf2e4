"""Targets: implementations under test (base.py: the interface; each spec kind runs against it, judge.py
judges a run on a target other than Lockstep's engine).

Built in: `lockstep` (the default), `sglang`, `vllm`, `hf`. A package adds its own with an entry
point in the group `lockstep.targets` whose value is a callable returning a `Target`:

    [project.entry-points."lockstep.targets"]
    myengine = "myengine.lockstep_adapter:target"
"""

from __future__ import annotations

import importlib
import weakref
from importlib.metadata import entry_points
from pathlib import Path

from lockstep.harness.target import (NotApplicable, Op, Refused, Request, Result, Target, TargetInterface,  # noqa: F401
                                     UpstreamChanged)
from lockstep.harness.targets.expectfile import find, load

GROUP = "lockstep.targets"
BUILTIN = {
    "lockstep": "lockstep.harness.targets.lockstep:load",
    "sglang": "lockstep.harness.targets.sglang:load",
    "vllm": "lockstep.harness.targets.vllm:load",
    "hf": "lockstep.harness.targets.hf:load",
}
EXPECTATIONS = Path(__file__).parent / "expectations"


class UnknownTarget(LookupError):
    pass


# id(target) -> (a weak reference to it, its registry name): the targets `get` and `at_policy` built,
# which a worker process can build again by name (`recipe`); any other object cannot.
_BUILT: dict[int, tuple[weakref.ref, str]] = {}


def _plugins() -> dict:
    return {ep.name: ep for ep in entry_points(group=GROUP)}


def names() -> list[str]:
    return list(BUILTIN) + sorted(n for n in _plugins() if n not in BUILTIN)


def get(name: str) -> TargetInterface:
    """Load a target by name; UnknownTarget lists the known ones. Adapters that cannot load
    (a peer missing, or moved upstream) raise NotApplicable / UpstreamChanged with the reason."""
    if name in BUILTIN:
        module, _, attr = BUILTIN[name].partition(":")
        factory = getattr(importlib.import_module(module), attr)
    else:
        eps = _plugins()
        if name not in eps:
            raise UnknownTarget(f"unknown target {name!r}; known: {', '.join(names())} (a package adds one through "
                                f"the entry point group {GROUP!r})")
        factory = eps[name].load()
    target = factory()
    if not isinstance(target, TargetInterface):
        raise TypeError(f"target {name!r}: its factory returned {type(target).__name__}, not a harness.targets.Target")
    _remember(target, name)
    return target


def _remember(target, name: str) -> None:
    try:
        ref = weakref.ref(target, lambda _, key=id(target): _BUILT.pop(key, None))
    except TypeError:                       # no weak references (__slots__): not rebuilt by name
        return
    _BUILT[id(target)] = (ref, name)


def recipe(target) -> tuple[str, str] | None:
    """(registry name, dtype policy) from which `rebuild` makes `target` again in another process,
    or None for a target the registry did not build (a test's in-process object)."""
    ref, name = _BUILT.get(id(target), (None, ""))
    if ref is None or ref() is not target:
        return None
    return name, getattr(target, "dtype", "fp32")


def rebuild(name: str, dtype: str) -> TargetInterface:
    """The target `recipe` describes: `get(name)` at policy `dtype`."""
    return at_policy(get(name), dtype)


def expectations_path(target: Target, explicit: Path | None = None) -> Path | None:
    """The expectations file a run of `target` uses, or None (no failure expected): `explicit`
    (--expectations), else the target's own `expectations` path (a plugin ships its file), else
    the shipped file under harness/targets/expectations/ whose target and version range apply
    (harness/targets/expectfile.py)."""
    return find(target.name, target.version, getattr(target, "expectations", None), explicit)


def load_expectations(target: Target, explicit: Path | None = None) -> dict:
    """The failures expected of `target` ({} when no file applies); ExpectationsError (a
    ValueError naming file and line) for a bad or inapplicable file."""

    path = expectations_path(target, explicit)
    if path is None or (explicit is None and not path.is_file()):
        return {}
    return load(path, target.name, target.version)


def at_policy(target: Target, dtype: str | None) -> Target:
    """The target at dtype policy `dtype` (None: its declared one), where it offers that policy
    (`Target.dtypes` and `at_dtype`); ValueError naming what it runs otherwise."""
    declared = getattr(target, "dtype", "fp32")
    if dtype is None or dtype == declared:
        return target
    if dtype not in getattr(target, "dtypes", ()) or getattr(target, "at_dtype", None) is None:
        raise ValueError(f"{dtype}: {target.label} runs the {declared} policy only (Target.dtype, Target.dtypes)")
    made = target.at_dtype(dtype)
    named = recipe(target)
    if named is not None and made is not target:
        _remember(made, named[0])           # the same registry name, at another policy
    return made
