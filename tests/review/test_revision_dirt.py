"""A recording says `+dirty` only when a file a run reads has uncommitted changes, and names them."""

import subprocess
from types import SimpleNamespace

import pytest

from lockstep.harness import platform


@pytest.fixture
def status(monkeypatch):
    def set_status(text):
        def fake(argv, **kw):
            return SimpleNamespace(stdout="0123456789ab\n" if "rev-parse" in argv else text)
        monkeypatch.setattr(subprocess, "run", fake)
        platform._revision_and_dirt.cache_clear()
    yield set_status
    platform._revision_and_dirt.cache_clear()


def test_dirt_outside_what_a_run_reads_is_not_dirty(status):
    status(" M docs/cli.md\n M golden/cpu-fp32/x.json\n M specs/coins/a.yaml\nM  tests/test_cli.py\n")
    assert platform.lockstep_revision() == "0123456789ab" and platform.dirty_paths() == []


def test_dirt_in_the_engine_is_named(status):
    status(" M docs/cli.md\n M engine/forward.py\nR  kernels/a.py -> kernels/b.py\n")
    assert platform.lockstep_revision() == "0123456789ab+dirty"
    assert platform.dirty_paths() == ["engine/forward.py", "kernels/a.py", "kernels/b.py"]


def test_a_long_list_is_cut(status):
    status("".join(f" M harness/m{i:02}.py\n" for i in range(25)))
    assert platform.dirty_paths()[-1] == "… 5 more" and len(platform.dirty_paths()) == 21


def test_the_manifest_names_the_dirt(status):
    from lockstep.harness import runner
    from lockstep.harness.platform import detect
    from lockstep.harness.result import RunContext
    from tests.repo_specs import repo_specs

    spec = repo_specs()["coins/known-answers"]
    status(" M engine/forward.py\n")
    prov = runner.provenance(RunContext(detect("cpu")), spec, "shared")
    assert prov["lockstep_revision"].endswith("+dirty") and prov["dirty_paths"] == ["engine/forward.py"]
    status(" M README.md\n")
    prov = runner.provenance(RunContext(detect("cpu")), spec, "shared")
    assert "dirty" not in prov["lockstep_revision"] and "dirty_paths" not in prov
