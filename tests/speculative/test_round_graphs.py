"""lockstep.engine.graphs.RoundGraphs: the speculative round's forwards (verify, draft steps, draft extend)
through captured CUDA graphs give the eager calls' bits.

On the CPU a RoundGraphs runs every forward eagerly on its input buffers (the plumbing: buffers,
shape keys, which forward goes where); on a GPU they are captured at their first call and
replayed, each compared bitwise with the eager call over several rounds of changing inputs, and
speculative_generate with graphs equals speculative_generate without."""

from __future__ import annotations

import pytest
import torch

from lockstep.engine import graphs as graphs_mod
from lockstep.engine.eagle3 import load_draft
from lockstep.engine.graphs import RoundGraphs
from lockstep.engine.model import GptOssModel
from lockstep.engine.request import Request, SamplingParams
from lockstep.engine.speculative import SpecParams, speculative_generate
from tests.kernels.conftest import DEVICE
from tests.speculative.conftest import MODELS, training_prompts

BACKENDS = ["torch"] + (["triton"] if DEVICE.type == "cuda" else [])


def _pair(backend: str, dtype: str):
    target = GptOssModel.from_checkpoint(MODELS / "tiny-target", backend=backend, device=DEVICE, dtype=dtype)
    return target, load_draft(MODELS / "tiny-eagle3", target, convention="sglang", backend=backend)


@pytest.mark.parametrize("backend", BACKENDS)
def test_draft_steps_and_extend_through_round_graphs_equal_eager(backend):
    """The cached head (bf16): committed rows (the extend), then tree rows at depth 2 and 3 (0 and
    1 ancestors), three rounds of new inputs, against draft.forward on a copy of the draft KV."""
    target, draft = _pair(backend, "bf16")
    assert draft.cached
    R, W, cap = 2, 3, 32
    rg = RoundGraphs(target, draft, R, R, cap, 0)
    eager_kv = draft.new_kv(R, cap)
    g = torch.Generator().manual_seed(3)
    H, Hkv, D = draft.config.hidden_size, eager_kv.k.shape[1], eager_kv.k.shape[3]
    dev, act = draft.device, draft.act
    slots = torch.arange(R, device=dev)
    for rnd in range(3):
        r = 4 + 2 * rnd                                    # root position of this round
        pos = (r - 2 + torch.arange(W)).repeat(R).to(dev)   # the extend: W committed rows per request
        tok = torch.randint(0, 500, (R * W,), generator=g).to(dev)
        hid = torch.randn((R * W, H), generator=g).to(dev, act)
        ext_slots = slots.repeat_interleave(W)
        want = draft.forward(tok, pos, hid, eager_kv, ext_slots, commit=True)
        got = rg.draft_forward(tok, pos, hid, rg.dkv, ext_slots, commit=True)
        for a, b in ((got.logits, want.logits), (got.hidden, want.hidden), (got.k, want.k)):
            assert torch.equal(a, b), rnd
        for A in (0, 1):                                   # depth 2 and depth 3 of a chain
            t = torch.randint(0, 500, (R,), generator=g).to(dev)
            h = torch.randn((R, H), generator=g).to(dev, act)
            anc = torch.randn((R, A, Hkv, D), generator=g).to(dev, act)
            prefix = torch.full((R,), r, device=dev)
            kw = dict(commit=False, prefix_lens=prefix, ancestors=(anc, anc.flip(0)))
            want = draft.forward(t, prefix + A, h, eager_kv, slots, **kw)
            got = rg.draft_forward(t, prefix + A, h, rg.dkv, slots, **kw)
            assert torch.equal(got.logits, want.logits) and torch.equal(got.hidden, want.hidden), (rnd, A)
        if rnd == 0:                                       # a shape's first call runs eagerly
            assert all(s.graph is None for s in rg.graphs.values())
    assert torch.equal(rg.dkv.k, eager_kv.k) and torch.equal(rg.dkv.v, eager_kv.v)
    kinds = sorted(k[0] for k in rg.graphs)
    assert kinds == ["draft extend", "draft step", "draft step"], kinds   # one per shape
    assert all((s.graph is not None) == (DEVICE.type == "cuda") for s in rg.graphs.values())


def test_what_round_graphs_leave_eager(fitted):
    """The fp32 portable head runs the eager draft.forward (no graph made for it) while the
    verify goes through one; graphs=False makes none."""
    target, draft = fitted
    assert not draft.cached
    rg = RoundGraphs(target, draft, 1, 1, 16, 0)
    h = torch.zeros((1, draft.config.hidden_size))
    one = (torch.tensor([3]), torch.tensor([2]), h)
    rg.draft_forward(*one, rg.dkv, torch.tensor([0]), commit=True)
    assert rg.graphs == {}
    rg.verify(torch.tensor([3, 4]), torch.tensor([2, 3]), torch.tensor([0, 0]))
    assert list(rg.graphs) == [("verify", 2)]
    off = RoundGraphs(target, draft, 1, 1, 16, 0, graphs=False)
    off.verify(torch.tensor([3, 4]), torch.tensor([2, 3]), torch.tensor([0, 0]))
    assert off.graphs == {}


CASES = [("bf16", SpecParams(num_steps=3, topk=1, draft_token_num=4, verify="greedy")),
         ("bf16", SpecParams(num_steps=3, topk=2, draft_token_num=6)),
         ("bf16", SpecParams(verify="rejection")),
         ("fp32", SpecParams(num_steps=3, topk=2, draft_token_num=6))]
IDS = ["bf16-chain-greedy", "bf16-tree-target-only", "bf16-rejection", "fp32-tree-target-only"]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype,sp", CASES[:1] if DEVICE.type != "cuda" else CASES,
                         ids=IDS[:1] if DEVICE.type != "cuda" else IDS)
def test_speculative_generate_with_graphs_equals_without(backend, dtype, sp):
    """Whole runs, several requests finishing at different rounds (the extend's row count
    changes), twice with graphs (the second reuses the kept graphs over zeroed caches): tokens,
    logprob bits and accept lengths equal the eager run's. Under rejection one sampled request has
    no seed: while it runs, the draft trees are drafted eagerly (host draws) around per-depth draft
    graphs; after it finishes, as one graph."""
    target, draft = _pair(backend, dtype)
    P = training_prompts(3)
    reqs = [Request(P[0], SamplingParams(greedy=True, max_new_tokens=9)),
            Request(P[1], SamplingParams(temperature=0.8, max_new_tokens=5), seed=4),
            Request(P[2], SamplingParams(temperature=0.6, top_k=20, max_new_tokens=12), seed=9)]
    if sp.verify == "rejection":
        reqs[1] = Request(reqs[1].prompt, reqs[1].params)                  # unseeded: the generator draws
    if sp.verify == "greedy":
        reqs = [Request(r.prompt, SamplingParams(greedy=True, max_new_tokens=r.params.max_new_tokens)) for r in reqs]

    def run(graphs):
        gen = torch.Generator().manual_seed(7)
        return [(r.tokens, r.logprob_bytes, r.accept_lengths)
                for r in speculative_generate(target, draft, reqs, sp, generator=gen, graphs=graphs)]

    eager = run(False)
    assert run(True) == eager
    assert run(True) == eager
    if DEVICE.type == "cuda":
        kept = graphs_mod._KEPT_ROUNDS[target]
        names = {k[0] for k in kept.graphs}
        assert {"verify", "verify rows", "chosen logprobs"} <= names, names
        assert ("draft trees" in names) == ("draft extend" in names) == draft.cached, names   # the fp32 head: eager
        failed = {k: s.failed for k, s in kept.graphs.items() if s.graph is None}
        assert not failed, failed                                  # every graph captured, none refused
