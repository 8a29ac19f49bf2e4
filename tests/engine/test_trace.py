"""lockstep.engine.trace: the op-level trace observes and never alters; it keeps exactly the rows of the
request and step it was asked for, op by op in the order the forward runs them."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from lockstep.engine.eagle3 import load_draft
from lockstep.engine.generate import Request, generate
from lockstep.engine.model import GptOssModel
from lockstep.engine.sampling import SamplingParams
from lockstep.engine.speculative import SpecParams, speculative_generate
from lockstep.engine.trace import OPS, OpTrace, op_of

MODELS = Path(__file__).resolve().parents[2] / "models"


def requests() -> list[Request]:
    P = SamplingParams
    return [Request(list(range(40, 70)), P(greedy=True, max_new_tokens=4, stop_token_ids=())),
            Request([5, 9, 2, 11, 3], P(temperature=0.9, top_k=20, max_new_tokens=4, stop_token_ids=()), seed=3)]


def bits(results) -> list:
    return [(r.tokens, r.logprobs.numpy().tobytes(),
             None if getattr(r, "captured", None) is None else r.captured.numpy().tobytes(),
             getattr(r, "accept_lengths", None)) for r in results]


def traced(run, request, step):
    """run(observer) with an OpTrace of (request, step) passed in as the observer."""
    trace = OpTrace(request, step)
    return run(trace), trace


def test_a_traced_generation_gives_the_untraced_bits(tiny_model):
    run = lambda observer=None: generate(tiny_model, requests(), capture=[0, 2], max_batch=2,  # noqa: E731
                                         prefill_chunk=7, observer=observer)
    plain = run()
    for request, step in ((0, 0), (1, 2)):
        results, trace = traced(run, request, step)
        assert bits(results) == bits(plain), (request, step)


def test_a_trace_keeps_its_request_and_step_op_by_op(tiny_model):
    cfg = tiny_model.config
    results, trace = traced(lambda o: generate(tiny_model, requests(), prefill_chunk=7, observer=o), 1, 2)
    prompt = len(requests()[1].prompt)
    assert trace.positions == [prompt + 1]                      # decode step 2 reads token 1
    names = list(trace.ops)
    per_layer = ["attn_norm", "qkv", "attention", "o_proj.partials", "o_proj", "mlp_norm", "router",
                 "router.top_ids", "routing", "experts", "down", "moe"]
    want = ["boundary.0"]
    for i in range(cfg.num_hidden_layers):
        want += [f"L{i}.{op}" for op in per_layer] + [f"boundary.{i + 1}"]
    assert names == want + ["final_norm", "lm_head", "sampling.token", "sampling.logprob"]
    assert all(op_of(n) in OPS for n in names)
    assert trace.ops["sampling.token"].tolist() == [results[1].tokens[2]]
    assert trace.ops["sampling.logprob"].view(torch.int32).tolist() == \
        results[1].logprobs[2:3].view(torch.int32).tolist()
    k, H = cfg.num_experts_per_tok, cfg.hidden_size
    assert trace.ops["L0.experts"].shape == (1, k, 8, H) and trace.ops["L0.down"].shape == (1, k, H)
    assert trace.ops["L0.qkv"].shape == (1, cfg.num_attention_heads + 2 * cfg.num_key_value_heads, cfg.head_dim)
    # the traced parts add up as the engine adds them: the fixed tree, then the bias
    from lockstep.engine.linear import tree_sum
    partials = trace.ops["L0.o_proj.partials"]
    assert torch.equal(tree_sum(list(partials.unbind(1))) + tiny_model.blocks[0].attn.o_b, trace.ops["L0.o_proj"])


def test_the_prefill_is_step_0_over_every_chunk(tiny_model):
    _, trace = traced(lambda o: generate(tiny_model, requests(), prefill_chunk=7, observer=o), 0, 0)
    assert trace.positions == list(range(30))                   # five chunks, in position order
    assert trace.ops["boundary.1"].shape[0] == 30
    assert trace.row_positions["lm_head"] == [29]               # logits of the last prompt row only


def test_without_a_request_every_row_of_a_direct_forward_is_kept(tiny_model):
    cache = tiny_model.new_cache(2, 16)
    tiny_model.trace = OpTrace()
    try:
        out = tiny_model.forward(torch.tensor([3, 4, 5, 6]), torch.tensor([0, 1, 0, 1]), torch.tensor([0, 0, 1, 1]),
                                 cache, logit_rows=torch.tensor([3, 1]))
        trace = tiny_model.trace
    finally:
        tiny_model.trace = None
    assert trace.positions == [0, 1, 0, 1] and trace.ops["boundary.2"].shape[0] == 4
    assert torch.equal(trace.ops["lm_head"], out.logits[[1, 0]])  # rows in forward order: 1, then 3
    assert trace.row_positions["lm_head"] == [1, 1]


@pytest.fixture(scope="module")
def fitted_pair():
    target = GptOssModel.from_checkpoint(MODELS / "tiny-target")
    return target, load_draft(MODELS / "tiny-eagle3", target, convention="sglang")


def test_a_traced_speculative_run_gives_the_untraced_bits_and_records_the_round(fitted_pair):
    target, draft = fitted_pair
    reqs = [Request([301, 59, 396, 248, 367, 433, 371, 5], SamplingParams(greedy=True, max_new_tokens=8)),
            Request([287, 360, 200, 489, 460, 215, 373, 180], SamplingParams(temperature=0.2, max_new_tokens=8),
                    seed=14)]
    spec = SpecParams(num_steps=3, topk=2, draft_token_num=6, verify="target-only")
    run = lambda observer=None: speculative_generate(target, draft, reqs, spec, observer=observer)  # noqa: E731
    plain = run()
    results, trace = traced(run, 0, 1)
    assert bits(results) == bits(plain)
    assert list(trace.ops)[:2] == ["draft.tokens", "draft.parents"]
    tree = trace.ops["draft.tokens"].tolist()
    assert len(tree) == 6 and tree[0] == results[0].tokens[0]   # round 1's root: the prefill's token
    verify = trace.ops["verify"].tolist()                       # accepted nodes, then the bonus token
    accepted = results[0].accept_lengths[0]
    assert len(verify) == accepted + 1 and verify[0] == 0
    emitted = trace.ops["sampling.token"].tolist()
    assert emitted == results[0].tokens[1:1 + accepted] and emitted[-1] == verify[-1]
    assert trace.ops["boundary.0"].shape[0] >= 6                # every node's row, on every path
