"""Lockstep: a deterministic-replay and conformance harness for gpt-oss + EAGLE3 inference.

Three subpackages, each one floor of DESIGN §1 (a floor imports only those below it):
  lockstep.kernels   Triton kernels and their plain-torch references (the repository's kernels/)
  lockstep.engine    the reference gpt-oss and EAGLE3 engine (engine/)
  lockstep.harness   specs, goldens, judges, the `lockstep` command and the pytest plugin (harness/)

Installed from a wheel they sit inside this folder. In a checkout they are the repository's
top-level folders, found through `__path__` below; they carry no `__init__.py`, so from a
checkout's root a bare `import kernels` still reaches another project's installed `kernels`.
"""

from __future__ import annotations

import os as _os

_here = _os.path.dirname(_os.path.abspath(__file__))
_checkout = _os.path.dirname(_here)
if not _os.path.isdir(_os.path.join(_here, "harness")) and \
        _os.path.isfile(_os.path.join(_checkout, "harness", "cli.py")):
    __path__.append(_checkout)
