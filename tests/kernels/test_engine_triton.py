"""The engine on the triton backend (tiny preset): D1/D2/D3 bitwise, close to the torch backend.

The triton-backend model (weights, KV cache, activations) lives on DEVICE; the torch-backend
reference on the CPU. Bitwise checks compare triton runs with each other, all on DEVICE."""

import pytest
import torch

from engine.model import GptOssModel
from tests.engine.helpers import random_prompt
from tests.kernels.conftest import DEVICE

T = 10


@pytest.fixture(scope="module")
def models(tiny_ckpts):
    return (GptOssModel.from_checkpoint(tiny_ckpts["bf16"], backend="triton", device=DEVICE),
            GptOssModel.from_checkpoint(tiny_ckpts["bf16"], backend="torch", device="cpu"))


def run(model, prompt, chunks, slot=0, slots=1, other=None):
    """Feed `prompt` in (lo, hi) chunks into `slot`; `other` = (prompt2, slot2) joins the first chunk.
    Returns the logits on the model's device."""
    cache = model.new_cache(slots, len(prompt))
    out = []
    for n, (lo, hi) in enumerate(chunks):
        toks, pos, sl = list(prompt[lo:hi]), list(range(lo, hi)), [slot] * (hi - lo)
        if other is not None and n == 0:
            p2, s2 = other
            toks, pos, sl = list(p2) + toks, list(range(len(p2))) + pos, [s2] * len(p2) + sl
        ints = lambda v: torch.tensor(v, dtype=torch.int64, device=model.device)   # noqa: E731
        logits = model.forward(ints(toks), ints(pos), ints(sl), cache).logits
        out.append(logits[-(hi - lo):])
    return torch.cat(out)


def test_triton_engine_is_deterministic_and_close_to_torch(models):
    mt, m0 = models
    prompt = random_prompt(T, seed=1)
    full = run(mt, prompt, [(0, T)])
    assert full.device.type == DEVICE.type and torch.isfinite(full).all()
    assert full.equal(run(mt, prompt, [(0, T)]))                                           # D1
    assert full.equal(run(mt, prompt, [(0, 4), (4, 7)] + [(i, i + 1) for i in range(7, T)]))   # D3
    assert full.equal(run(mt, prompt, [(0, T)], slot=1, slots=2,
                          other=(random_prompt(5, seed=2), 0)))                             # D2
    ref = run(m0, prompt, [(0, T)])                                                        # on the CPU
    torch.testing.assert_close(full.cpu(), ref, rtol=0, atol=1e-3)
    assert full.cpu().argmax(-1).equal(ref.argmax(-1))
