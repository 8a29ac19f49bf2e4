"""lockstep.engine.launch: per-rank results come back; a rank that raises, hangs or dies ends the run
with a RankFailure naming it, within the collective timeout, never a hang."""

from __future__ import annotations

import time

import pytest

from lockstep.engine.launch import RankFailure, launch

from tests.parallel import rank_fns


def test_results_come_back_in_rank_order():
    res = launch(rank_fns.gather_ranks, 2, args=("hi",), timeout_s=120)
    assert [r["rank"] for r in res] == [0, 1]
    assert all(r["all"] == [0, 1] and r["world"] == 2 and r["tag"] == "hi" for r in res)
    assert res[1]["env"] == ("127.0.0.1", "1")


def test_a_raising_rank_and_a_hung_rank_are_named_within_the_timeout():
    t0 = time.monotonic()
    with pytest.raises(RankFailure) as err:
        launch(rank_fns.one_raises_one_hangs, 4, timeout_s=120, collective_timeout_s=4)
    elapsed = time.monotonic() - t0
    msg = str(err.value)
    head = msg.splitlines()[0]
    assert "rank 1 raised ValueError: rank 1 fails on purpose" in head
    assert "rank 2 hung" in head
    assert "rank 0" not in head and "rank 3" not in head        # they only lost their peers
    assert err.value.ranks[2].startswith("hung")
    assert elapsed < 60, elapsed                                  # spawn + 4 s timeout + grace


def test_a_hung_rank_alone_is_named():
    with pytest.raises(RankFailure, match=r"failed \(after a rank failed\): rank 1 hung"):
        launch(rank_fns.one_hangs, 2, timeout_s=120, collective_timeout_s=3)


def test_a_dead_rank_is_named_with_its_exit_code():
    with pytest.raises(RankFailure, match=r"rank 1 died without a result \(exit code 7\)"):
        launch(rank_fns.one_dies, 2, timeout_s=120, collective_timeout_s=30)


def test_the_whole_run_timeout_kills_and_names_the_ranks():
    t0 = time.monotonic()
    with pytest.raises(RankFailure, match=r"passed timeout_s=.*rank 1 hung"):
        launch(rank_fns.one_hangs, 2, timeout_s=1, collective_timeout_s=60)
    assert time.monotonic() - t0 < 30


def test_bad_world_size():
    with pytest.raises(ValueError, match="world_size"):
        launch(rank_fns.gather_ranks, 0)


def test_process_group_options_bind_nccl_ranks_to_their_gpu(monkeypatch):
    """NCCL: device_id (so barrier() neither guesses a GPU nor warns) and a blocking wait (a
    timed-out collective raises in Python, so the launcher names its cause); gloo: nothing."""
    import torch

    from lockstep.engine import launch as launch_mod
    assert launch_mod.process_group_options("gloo", 1) == {}
    monkeypatch.delenv("TORCH_NCCL_BLOCKING_WAIT", raising=False)
    chosen = []
    monkeypatch.setattr(torch.cuda, "set_device", chosen.append)       # no GPU needed
    assert launch_mod.process_group_options("nccl", 1) == {"device_id": torch.device("cuda", 1)}
    assert chosen == [torch.device("cuda", 1)]
    import os
    assert os.environ["TORCH_NCCL_BLOCKING_WAIT"] == "1"


def test_plan_places_rank_r_on_gpu_r_mod_g_and_picks_the_transport():
    """NCCL only when every rank has its own GPU; ranks sharing a GPU go over gloo-host."""
    from lockstep.engine.launch import plan
    assert plan("cpu", 3, 0) == ("gloo", ["cpu"] * 3)
    assert plan("cpu", 3, 8) == ("gloo", ["cpu"] * 3)                  # GPUs here do not matter on the CPU
    assert plan("cuda", 2, 2) == ("nccl", ["cuda:0", "cuda:1"])
    assert plan("cuda", 2, 8) == ("nccl", ["cuda:0", "cuda:1"])
    assert plan("cuda", 4, 1) == ("gloo-host", ["cuda:0"] * 4)
    assert plan("cuda", 4, 3) == ("gloo-host", ["cuda:0", "cuda:1", "cuda:2", "cuda:0"])
    assert plan("cuda", 2, 2, "gloo-host") == ("gloo-host", ["cuda:0", "cuda:1"])   # forced
    assert plan("cpu", 2, 0, "gloo-host") == ("gloo-host", ["cpu", "cpu"])           # the CPU stand-in


@pytest.mark.parametrize("args, match", [
    (("cuda", 2, 0), "no CUDA GPU"),
    (("cuda", 4, 2, "nccl"), r"nccl needs a GPU per rank \(4\), this machine has 2"),
    (("cpu", 2, 0, "nccl"), "nccl transport needs device 'cuda'"),
    (("tpu", 2, 0), "device must be"),
    (("cpu", 2, 0, "mpi"), "transport must be one of"),
])
def test_plan_refuses_what_cannot_run(args, match):
    from lockstep.engine.launch import plan
    with pytest.raises(ValueError, match=match):
        plan(*args)


def test_each_rank_is_told_its_device_and_transport():
    res = launch(rank_fns.placement, 2, device="cpu", transport="gloo-host", timeout_s=120)
    assert res == [("cpu", "gloo-host", True), ("cpu", "gloo-host", True)]
    assert launch(rank_fns.placement, 2, timeout_s=120)[1][1:] == ("gloo", False)


def test_a_rank_takes_the_callers_environment_at_the_call_and_none_of_its_patches(monkeypatch):
    """Ranks are forked from a fork server started at the first launch (engine/launch.py
    `_rank_context`): each must still see the launching process's environment as it is at the call,
    as a spawned rank would, and import the code afresh (tests/planted.py relies on it)."""
    from lockstep.engine import launch as launch_mod
    # device "cpu": the rank function gathers CPU tensors, which NCCL (launch's default on a CUDA
    # machine with a GPU per rank) cannot move
    launch(rank_fns.gather_ranks, 1, args=("the server is started",), device="cpu", timeout_s=120)
    monkeypatch.setattr(launch_mod, "_COLLECTIVE_MARKERS", ("patched",))
    for value in ("one", "two"):
        monkeypatch.setenv("LOCKSTEP_LAUNCH_PROBE", value)
        res = launch(rank_fns.environment_and_patch, 2, args=("LOCKSTEP_LAUNCH_PROBE",), device="cpu", timeout_s=120)
        assert res == [(value, "timed out")] * 2, value


def test_ranks_start_under_a_temp_dir_too_long_for_a_socket(tmp_path):
    """The fork server's socket lives in multiprocessing's temp folder; under a $TMPDIR longer than an
    AF_UNIX path allows (107 bytes), the launcher makes that folder under a short system one."""
    import os
    import subprocess
    import sys

    from tests.conftest import REPO

    long = tmp_path / ("t" * 90)
    long.mkdir()
    probe = ("from lockstep.engine.launch import launch; from tests.parallel import rank_fns; "
             "print(launch(rank_fns.gather_ranks, 2, args=('hi',), timeout_s=120))")
    proc = subprocess.run([sys.executable, "-c", probe], cwd=REPO, capture_output=True, text=True, timeout=240,
                          env={**os.environ, "TMPDIR": str(long), "PYTHONPATH": str(REPO)})
    assert proc.returncode == 0 and "hi" in proc.stdout, proc.stderr[-2000:]
