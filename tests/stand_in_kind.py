"""A spec kind registered for one test, so the check pipeline's rules (runner, judges) run without
a model."""

from __future__ import annotations

from types import SimpleNamespace

from lockstep.harness import kinds

KIND = "stand-in"


def stand_in_kind(monkeypatch, **parts):
    """Register KIND for this test: a module whose check finds nothing and whose goldens are
    cpu-fp32's, with `parts` replacing or adding its functions."""
    module = SimpleNamespace(**({"check": lambda spec, result: [], "golden_platform": lambda spec, ctx: "cpu-fp32"}
                                | parts))
    monkeypatch.setitem(kinds.KINDS, KIND, module)
    return module
