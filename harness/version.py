"""Lockstep's own version: the installed distribution's, or pyproject.toml's in a bare clone.

The distribution is `lockstep-harness` (`lockstep` on PyPI is another project). Run from a clone
that was never pip-installed, the version comes from the clone's pyproject.toml, marked so.
"""

from __future__ import annotations

import re
from importlib.metadata import PackageNotFoundError, version as _dist_version
from pathlib import Path

DISTRIBUTION = "lockstep-harness"
_PYPROJECT = Path(__file__).resolve().parent.parent / "pyproject.toml"


def version() -> str:
    """`0.1.0` when installed; `0.1.0+clone` when only a clone's pyproject.toml names it."""
    try:
        return _dist_version(DISTRIBUTION)
    except PackageNotFoundError:
        pass
    try:
        m = re.search(r'^version\s*=\s*"([^"]+)"', _PYPROJECT.read_text(), re.M)
    except OSError:
        m = None
    return f"{m.group(1)}+clone" if m else "0+unknown"
