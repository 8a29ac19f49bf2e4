"""D4 on the Triton backend: every rank computes its experts with engine.experts.expert_partials
(rows grouped by expert on the device, non-local experts skipped) and its o_proj / down K chunks
with one launch; TP and EP give the one-device Triton model's bits.

Runs on DEVICE (tests/kernels/conftest.py): in Triton's interpreter on a CPU (gloo, one process
per rank), compiled on CUDA when there are GPUs enough for the ranks. Kept small: the interpreter
is slow."""

from __future__ import annotations

import pytest
import torch

from lockstep.engine.generate import Request, generate
from lockstep.engine.model import GptOssModel
from lockstep.engine.parallel import generate_at
from lockstep.engine.sampling import SamplingParams
from tests.kernels.conftest import DEVICE

CAPTURE = [0, 1, 2]
GPUS = torch.cuda.device_count() if torch.cuda.is_available() else 0


def requests() -> list[Request]:
    return [Request([1, 2, 3, 4, 5, 6], SamplingParams(greedy=True, max_new_tokens=2)),
            Request([9, 8, 7], SamplingParams(temperature=0.8, max_new_tokens=2), seed=3)]


def bits(results) -> list[tuple]:
    return [(r.tokens, r.logprobs.numpy().tobytes(), r.captured.numpy().tobytes()) for r in results]


@pytest.fixture(scope="module")
def one_device_triton(par_ckpt):
    model = GptOssModel.from_checkpoint(par_ckpt, backend="triton", device=DEVICE)
    return bits(generate(model, requests(), capture=CAPTURE))


@pytest.mark.parametrize("tp, ep", [(1, 2), (2, 1), (2, 2)])
def test_triton_topologies_equal_one_device(par_ckpt, one_device_triton, tp, ep):
    if DEVICE.type == "cuda" and GPUS < tp * ep:
        pytest.skip(f"needs {tp * ep} CUDA GPUs, found {GPUS}")
    got = generate_at(par_ckpt, tp, ep, requests(), capture=CAPTURE, backend="triton", device=DEVICE.type,
                      timeout_s=600)
    assert bits(got) == one_device_triton
