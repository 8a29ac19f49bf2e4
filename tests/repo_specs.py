"""The repository's specs, parsed once per process.

Four test modules parsed every spec under specs/ at import time, and some tests again per call, so
each pytest-xdist worker's collection parsed the whole suite five times over (with the plugin's own
parse); parsing is pure-Python YAML with line tracking, the largest part of collection (issue 38).
Spec is a frozen dataclass and the tests only read these."""

from __future__ import annotations

from functools import lru_cache

from lockstep.harness.specfile import Spec, load_specs
from tests.conftest import REPO


@lru_cache(maxsize=1)
def repo_specs() -> dict[str, Spec]:
    """{spec id: Spec} of REPO/specs, in load_specs' (sorted) order."""
    specs, _ = load_specs(REPO / "specs")
    return {s.id: s for s in specs}
