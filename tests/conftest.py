import os
import shutil
from pathlib import Path

import pytest

import lockstep.kernels._common  # noqa: F401  (first: it picks Triton's interpreter on a CPU, before any test imports triton)
from lockstep.harness.cli import main

REPO = Path(__file__).resolve().parent.parent
pytest_plugins = ["pytester"]
# `lockstep check` defaults to a worker per core (harness/parallel.py); the suite's xdist workers
# already fill the cores, so its many small in-process and subprocess checks run serially.
# tests/test_parallel_check.py passes -j itself.
os.environ.setdefault("LOCKSTEP_JOBS", "1")

# A minimal valid coins spec, for tests that write spec files of their own.
COINS = """\
kind: coins
description: a coins spec
inputs:
  seeds: [1, 2]
  positions: [3]
  columns: {arange: [0, 4]}
  outputs: [hash]
"""


@pytest.fixture
def project(tmp_path, monkeypatch):
    """A scratch project (specs/ + golden/) with three real coin specs, goldens recorded."""
    monkeypatch.delenv("CI", raising=False)
    specs = tmp_path / "specs" / "coins"
    specs.mkdir(parents=True)
    for name in ("known-answers", "top-hashes-verify", "gumbel-endpoints"):
        shutil.copy(REPO / "specs" / "coins" / f"{name}.yaml", specs)
    monkeypatch.chdir(tmp_path)
    assert main(["regen"]) == 0
    return tmp_path


def golden_bytes(root: Path) -> dict:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted((root / "golden").rglob("*")) if p.is_file()}
