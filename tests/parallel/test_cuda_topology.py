"""The parallel engine on CUDA: ranks on GPU r mod G (NCCL with a GPU per rank, gloo over host
copies when ranks share one) give the one-device CUDA bits, and a trace recorded at one topology
replays bitwise at another.

The GPU tests are skipped without CUDA (CI); run them on a GPU machine (one GPU is enough: the
ranks share it). On any machine: the transport and memory rules, which are pure functions.
"""

from __future__ import annotations

import pytest
import torch

from lockstep.engine.distributed import Topology, UnsupportedTopology
from lockstep.engine.generate import generate
from lockstep.engine.model import GptOssModel
from lockstep.engine.parallel import generate_at, transport

from tests.parallel import scenarios

pytestmark = pytest.mark.gpu      # every test here runs ranks on CUDA GPUs (docs/contributing.md)
GPUS = torch.cuda.device_count() if torch.cuda.is_available() else 0
needs_gpus = lambda n: pytest.mark.skipif(GPUS < n, reason=f"needs {n} CUDA GPU(s), found {GPUS}")  # noqa: E731


@pytest.fixture(scope="module")
def cuda_one_device(par_ckpt):
    model = GptOssModel.from_checkpoint(par_ckpt, device="cuda")
    return scenarios.bits(generate(model, scenarios.requests(), capture=scenarios.CAPTURE))


@needs_gpus(1)
@pytest.mark.parametrize("backend", ["torch", "triton"])
def test_world_1_on_cuda_equals_the_one_device_model(par_ckpt, backend):
    model = GptOssModel.from_checkpoint(par_ckpt, backend=backend, device="cuda")
    want = scenarios.bits(generate(model, scenarios.requests(), capture=scenarios.CAPTURE))
    got = generate_at(par_ckpt, 1, 1, scenarios.requests(), capture=scenarios.CAPTURE, backend=backend, device="cuda")
    assert scenarios.bits(got) == want


TOPOLOGIES = [(2, 1), (1, 2), (2, 2)]


@needs_gpus(1)
@pytest.mark.parametrize("backend", ["torch", "triton"])
@pytest.mark.parametrize("tp, ep", TOPOLOGIES)
def test_cuda_topologies_equal_one_device(par_ckpt, backend, tp, ep):
    model = GptOssModel.from_checkpoint(par_ckpt, backend=backend, device="cuda")
    want = scenarios.bits(generate(model, scenarios.requests(), capture=scenarios.CAPTURE))
    got = generate_at(par_ckpt, tp, ep, scenarios.requests(), capture=scenarios.CAPTURE, backend=backend,
                      device="cuda", timeout_s=300)
    assert scenarios.bits(got) == want
    shared = GPUS < tp * ep
    assert transport(Topology(tp, ep), "cuda").startswith("gloo-host" if shared else "nccl")


@needs_gpus(1)
def test_a_planted_wrong_order_on_shared_gpu_ranks_is_caught(par_ckpt, cuda_one_device, monkeypatch):
    """The check is real on CUDA: rank 1 adding its partials left to right parts from one device."""
    from lockstep.engine import parallel
    from tests.parallel import wrong_orders
    monkeypatch.setattr(parallel, "_generate_rank", wrong_orders.generate_rank_one_rank_sequential)
    got = generate_at(par_ckpt, 2, 1, scenarios.requests(), capture=scenarios.CAPTURE, device="cuda", timeout_s=300)
    assert scenarios.bits(got) != cuda_one_device


@needs_gpus(1)
def test_a_topology_that_cannot_fit_is_refused_up_front(par_ckpt, monkeypatch):
    from lockstep.engine import parallel
    monkeypatch.setattr(parallel, "RANK_OVERHEAD_BYTES", 1 << 50)
    with pytest.raises(UnsupportedTopology, match=r"on cuda does not fit: 2 rank\(s\) on GPU 0 need about"):
        generate_at(par_ckpt, 2, 1, scenarios.requests(), device="cuda")


@needs_gpus(1)
def test_a_failing_rank_on_a_shared_gpu_is_named():
    from lockstep.engine.launch import RankFailure, launch
    from tests.parallel import rank_fns
    with pytest.raises(RankFailure, match=r"rank 1 raised ValueError: rank 1 fails on purpose.*rank 2 hung"):
        launch(rank_fns.one_raises_one_hangs, 4, device="cuda", timeout_s=120, collective_timeout_s=4)


@needs_gpus(1)
@pytest.mark.parametrize("recorded, replayed", [((1, 1), (2, 1)), ((1, 1), (1, 2)),
                                                ((2, 1), (1, 1)), ((1, 2), (1, 1))])
def test_a_cuda_trace_replays_bitwise_at_another_topology(recorded, replayed):
    """Recorded at one topology on the GPU, replayed at another (free-run and teacher-forced)."""
    from lockstep.harness.replay.record import record
    from lockstep.harness.replay.rerun import replay
    from lockstep.harness.replay.run import Setup
    setup = Setup(checkpoint={"preset": "tiny-parallel", "seed": 0, "format": "bf16"}, tp=recorded[0], ep=recorded[1], device="cuda")
    trace = record(setup, scenarios.requests()[:2])
    for mode in ("free-run", "teacher-forced"):
        report = replay(trace, mode=mode, overrides={"tp": replayed[0], "ep": replayed[1]})
        statuses = {v.status for v in report.verdicts}
        assert statuses == {"bitwise"}, (mode, [v for v in report.verdicts if v.status != "bitwise"][:3])


@pytest.mark.skipif(GPUS > 0, reason="a machine without CUDA refuses a CUDA topology")
def test_cuda_without_a_gpu_is_refused_up_front(par_ckpt):
    with pytest.raises(UnsupportedTopology, match=r"on cuda needs a CUDA GPU, this machine has none"):
        generate_at(par_ckpt, 2, 1, scenarios.requests(), device="cuda")


def test_fit_counts_every_rank_on_a_gpu():
    from lockstep.engine.parallel import RANK_OVERHEAD_BYTES, fit_problem
    gib = 1 << 30
    per = 2 * gib
    assert fit_problem({0: 4}, per, {0: 4 * (per + RANK_OVERHEAD_BYTES)}) is None
    msg = fit_problem({0: 2, 1: 2}, per, {0: 100 * gib, 1: 5 * gib})
    assert msg.startswith("on cuda does not fit: 2 rank(s) on GPU 1 need about 6.0 GiB") and "5.0 GiB free" in msg


def test_rank_weights_are_estimated_as_what_a_rank_holds(par_ckpt):
    """The estimate is the largest rank's held bytes (tests/parallel/test_sharded_loading.py checks
    them against a built rank): fp32 doubles the bf16 checkpoint's floats, TP 4 holds about a quarter."""
    from pathlib import Path

    from lockstep.engine.parallel import rank_weight_bytes
    disk = sum(f.stat().st_size for f in Path(par_ckpt).glob("*.safetensors"))
    one = rank_weight_bytes(par_ckpt, Topology(1, 1))
    assert 1.9 * disk < one < 2 * disk                                       # bf16 -> fp32 (headers aside)
    assert rank_weight_bytes(par_ckpt, Topology(1, 1), "bf16") * 2 < one * 1.1
    assert one / 4 < rank_weight_bytes(par_ckpt, Topology(4, 1)) < one / 4 * 1.2
