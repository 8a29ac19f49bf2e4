"""generate() reads the device once per sampling call: the tokens of the whole group.

Counted on the CPU by wrapping every way a tensor's value reaches Python (item, tolist, int,
float, bool, index) outside the model's forward (the forward itself is a captured graph on a
GPU, where a read would fail the capture). The count must equal the number of forward calls,
whatever the number of requests in the group, and the results must be the ones without the
wrappers. On a GPU, CUDA's sync debug mode checks that a decode step never waits for the stream:
it waits for its own ids' copy only, while the next step runs (engine.generate runs ahead)."""

from __future__ import annotations

import warnings

import pytest
import torch

from lockstep.engine.generate import Request, generate
from lockstep.engine.model import GptOssModel
from lockstep.engine.sampling import SamplingParams
from tests.engine.helpers import random_prompt
from tests.kernels.conftest import DEVICE

READS = ("item", "tolist", "__int__", "__float__", "__bool__", "__index__")


def _requests(n: int, new: int) -> list[Request]:
    kinds = [SamplingParams(greedy=True, max_new_tokens=new, stop_token_ids=()),
             SamplingParams(temperature=0.8, top_k=5, top_p=0.9, max_new_tokens=new, stop_token_ids=()),
             SamplingParams(temperature=1.1, min_p=0.05, max_new_tokens=new, stop_token_ids=())]
    return [Request(prompt=random_prompt(3 + i, i), params=kinds[i % 3], seed=11 + i) for i in range(n)]


def _count_reads(monkeypatch, model, requests):
    counts = {"reads": 0, "forwards": 0}
    inside = [False]
    for name in READS:
        orig = getattr(torch.Tensor, name)

        def wrapped(self, *a, _orig=orig, **k):
            if not inside[0]:
                counts["reads"] += 1
            return _orig(self, *a, **k)
        monkeypatch.setattr(torch.Tensor, name, wrapped)
    forward = model.forward

    def counted_forward(*a, **k):
        counts["forwards"] += 1
        inside[0] = True
        try:
            return forward(*a, **k)
        finally:
            inside[0] = False
    monkeypatch.setattr(model, "forward", counted_forward)
    results = generate(model, requests, max_batch=8)
    monkeypatch.undo()
    return results, counts


@pytest.mark.parametrize("n", [1, 3])
def test_one_host_read_per_forward(monkeypatch, tiny_ckpts, n):
    model = GptOssModel.from_checkpoint(tiny_ckpts["bf16"])
    requests = _requests(n, 5)
    results, counts = _count_reads(monkeypatch, model, requests)
    assert counts["forwards"] == 1 + 4                     # one prefill, then 4 decode steps (5 tokens)
    assert counts["reads"] == counts["forwards"], counts
    again = generate(model, requests, max_batch=8)
    for a, b in zip(results, again):
        assert a.tokens == b.tokens and torch.equal(a.logprobs, b.logprobs)


@pytest.mark.gpu
@pytest.mark.skipif(DEVICE.type != "cuda", reason="CUDA sync debug mode needs a GPU")
@pytest.mark.parametrize("backend", ["torch", "triton"])
def test_gpu_decode_syncs_once_per_step(tiny_ckpts, backend, monkeypatch):
    model = GptOssModel.from_checkpoint(tiny_ckpts["bf16"], backend=backend, device=DEVICE, dtype="bf16")
    requests = _requests(3, 6)
    generate(model, requests)                              # captures the graphs
    torch.cuda.synchronize()
    waits = []
    wait = torch.cuda.Event.synchronize
    monkeypatch.setattr(torch.cuda.Event, "synchronize", lambda self: waits.append(self) or wait(self))
    torch.cuda.set_sync_debug_mode("warn")
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            generate(model, requests)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    syncs = [w for w in caught if "synchroniz" in str(w.message)]
    # the prefill's read and the one logprob read at the end wait for the stream; each of the 5
    # decode steps waits only for its own ids (an event), the next step already queued behind it
    assert len(syncs) == 1 + 1, [str(w.message) for w in syncs]
    assert len(waits) == 5
