"""The parallel engine on CUDA: NCCL with one GPU per rank gives the one-device CUDA bits.

Skipped without CUDA (CI); run on a GPU machine. World size 1 needs one GPU; the TP 2 and
EP 2 runs need two, and are skipped with the count otherwise. On any machine: asking for a
CUDA topology with fewer GPUs than ranks is refused up front, naming the count."""

from __future__ import annotations

import pytest
import torch

from engine.distributed import UnsupportedTopology
from engine.generate import generate
from engine.model import GptOssModel
from engine.parallel import generate_at

from tests.parallel import scenarios

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


@needs_gpus(2)
@pytest.mark.parametrize("tp, ep", [(2, 1), (1, 2)])
def test_nccl_topologies_equal_one_device(par_ckpt, cuda_one_device, tp, ep):
    got = generate_at(par_ckpt, tp, ep, scenarios.requests(), capture=scenarios.CAPTURE, device="cuda", timeout_s=300)
    assert scenarios.bits(got) == cuda_one_device


@pytest.mark.skipif(GPUS >= 8, reason="the tiny-parallel model splits at most 8 ways")
def test_more_ranks_than_gpus_is_refused_up_front(par_ckpt):
    tp, ep = next((w, 1) for w in (2, 4, 8) if w > GPUS)
    with pytest.raises(UnsupportedTopology, match=rf"needs {tp} GPUs \(one per rank\), this machine has {GPUS}"):
        generate_at(par_ckpt, tp, ep, scenarios.requests(), device="cuda")
