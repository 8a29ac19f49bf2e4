import os
import shutil
from pathlib import Path

import pytest

import lockstep.kernels._common  # noqa: F401  (first: it picks Triton's interpreter on a CPU, before any test imports triton)
from lockstep.harness.cli import main

REPO = Path(__file__).resolve().parent.parent
pytest_plugins = ["pytester"]
# `lockstep check` defaults to a worker per core (harness/workers.py); the suite's xdist workers
# already fill the cores, so its many small in-process and subprocess checks run serially.
# tests/test_parallel_check.py passes -j itself.
os.environ.setdefault("LOCKSTEP_JOBS", "1")

def pytest_collection_modifyitems(config, items):
    """The `gpu` group (pyproject.toml's markers) needs a CUDA GPU: without one each of its tests
    is skipped, saying why, so `pytest -m gpu` on a CPU machine ends cleanly (docs/contributing.md)."""
    import torch

    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="gpu group: needs a CUDA GPU, torch sees none")
    for item in items:
        if item.get_closest_marker("gpu") is not None:
            item.add_marker(skip)


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
