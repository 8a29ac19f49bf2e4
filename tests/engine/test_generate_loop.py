"""generate(): D1 and D2 end to end, stopping, captured states, bad input."""

import random

import pytest
import torch
from hypothesis import given, settings, strategies as st

import lockstep.engine.generate as gen
from lockstep.engine.generate import Request, generate
from lockstep.engine.model import GptOssModel
from lockstep.engine.sampling import SamplingParams, chosen_logprob

from tests.engine.helpers import prefill, random_prompt

CAPTURE = [0, 2, 4]


def eight_requests():
    P = SamplingParams
    params = [P(greedy=True, max_new_tokens=10), P(temperature=1.0, max_new_tokens=12),
              P(temperature=0.7, top_k=20, max_new_tokens=9), P(temperature=1.3, top_p=0.8, max_new_tokens=11),
              P(temperature=0.9, min_p=0.05, max_new_tokens=8), P(temperature=1.0, top_k=50, top_p=0.9, max_new_tokens=10),
              P(temperature=0.0, max_new_tokens=7), P(temperature=1.1, max_new_tokens=12)]
    lengths = [9, 33, 20, 41, 1, 26, 17, 30]
    return [Request(random_prompt(n, 100 + i), p, seed=1000 + i if i != 6 else None)
            for i, (n, p) in enumerate(zip(lengths, params))]


def as_bits(result):
    return (result.tokens, result.finish_reason, result.logprobs.numpy().tobytes(),
            result.captured.numpy().tobytes())


def test_d2_alone_batched_shuffled_chunked(tiny_model):
    reqs = eight_requests()
    alone = [as_bits(generate(tiny_model, [r], capture=CAPTURE)[0]) for r in reqs]
    batched = [as_bits(r) for r in generate(tiny_model, reqs, capture=CAPTURE)]
    assert batched == alone
    order = list(range(8))
    random.Random(0).shuffle(order)
    shuffled = generate(tiny_model, [reqs[i] for i in order], capture=CAPTURE, max_batch=3, prefill_chunk=5)
    assert [as_bits(shuffled[order.index(i)]) for i in range(8)] == alone
    twice = generate(tiny_model, reqs + reqs[:3], capture=CAPTURE, max_batch=4)
    assert [as_bits(r) for r in twice] == alone + alone[:3]


def test_d1_generate_run_to_run(tiny_ckpts):
    reqs = eight_requests()[:4]
    a = generate(GptOssModel.from_checkpoint(tiny_ckpts["bf16"]), reqs, capture=CAPTURE)
    b = generate(GptOssModel.from_checkpoint(tiny_ckpts["mxfp4"]), reqs, capture=CAPTURE)
    assert [as_bits(r) for r in a] == [as_bits(r) for r in b]


def test_decoded_logprobs_equal_a_full_prefill(tiny_model):
    """D3 end to end: every generated token's logprob equals that of one prefill over the text."""
    req = Request(random_prompt(20, 9), SamplingParams(temperature=1.0, max_new_tokens=15), seed=4)
    res = generate(tiny_model, [req], capture=CAPTURE)[0]
    text = req.prompt + res.tokens
    full = prefill(tiny_model, text[:-1], capture=CAPTURE)
    # the engine's own (portable) log-softmax: torch.log_softmax follows the CPU's vector exp/log
    rows = full.logits[len(req.prompt) - 1:]
    assert torch.stack([chosen_logprob(r, t) for r, t in zip(rows, res.tokens)]).equal(res.logprobs)
    assert res.captured.equal(full.captured)
    assert res.captured.shape == (len(text) - 1, 3 * tiny_model.config.hidden_size)


def test_stops_on_any_stop_id_and_keeps_it(tiny_model):
    prompt = random_prompt(12, 21)
    free = generate(tiny_model, [Request(prompt, SamplingParams(greedy=True, max_new_tokens=8))])[0]
    assert free.finish_reason == "length" and len(free.tokens) == 8
    stop = free.tokens[3]
    first = free.tokens.index(stop)
    res = generate(tiny_model, [Request(prompt, SamplingParams(greedy=True, max_new_tokens=8,
                                                               stop_token_ids=(7, stop)))])[0]
    assert res.tokens == free.tokens[:first + 1] and res.finish_reason == "stop"
    # the config's EOS list is the default stop set
    cfg = tiny_model.config.replace(eos_token_id=(1, stop, 2))
    eos_model = GptOssModel.__new__(GptOssModel)
    eos_model.__dict__.update(tiny_model.__dict__, config=cfg)
    res = generate(eos_model, [Request(prompt, SamplingParams(greedy=True, max_new_tokens=8))])[0]
    assert res.tokens == free.tokens[:first + 1] and res.finish_reason == "stop"


def test_running_ahead_drops_the_row_after_a_stop(tiny_model, monkeypatch):
    """Seeded requests decode ahead (step s + 1 launched from step s's ids before they are read):
    a request that takes a stop id has its row of the step launched after it dropped, and every
    request's tokens and logprobs are the plain loop's (captured states turn running ahead off)."""
    P = SamplingParams
    prompt = random_prompt(12, 21)
    free = generate(tiny_model, [Request(prompt, P(temperature=0.8, max_new_tokens=8), seed=5)])[0]
    j = next(j for j in range(1, 8) if free.tokens.index(free.tokens[j]) == j)   # a decode step's first sight
    reqs = [Request(prompt, P(temperature=0.8, max_new_tokens=8, stop_token_ids=(free.tokens[j],)), seed=5),
            Request(random_prompt(7, 3), P(temperature=1.0, max_new_tokens=9, stop_token_ids=()), seed=6),
            Request(random_prompt(15, 4), P(greedy=True, max_new_tokens=6, stop_token_ids=()))]
    plain = generate(tiny_model, reqs, capture=CAPTURE)
    launched = []
    real = gen.launch_step
    monkeypatch.setattr(gen, "launch_step", lambda run, group, after=None: launched.append(list(group))
                        or real(run, group, after=after))
    ahead = generate(tiny_model, reqs)
    for a, b in zip(ahead, plain):
        assert (a.tokens, a.finish_reason, a.logprobs.numpy().tobytes()) == \
               (b.tokens, b.finish_reason, b.logprobs.numpy().tobytes())
    assert ahead[0].finish_reason == "stop" and len(ahead[0].tokens) == j + 1
    assert launched[0] == [0, 1, 2]
    assert sum(0 in g for g in launched) == j + 1         # decode steps 1..j, and step j + 1 dropped
    assert len(launched) == 9 - 1                          # the longest request's decode steps, no more


@settings(max_examples=10, deadline=None)
@given(data=st.data())
def test_running_ahead_is_the_plain_loop_for_any_stops(tiny_model, data):
    """Any batch of seeded or greedy requests with any stop ids (wide sets, so requests stop
    mid-batch) and any max_batch that holds the batch: running ahead gives the plain loop's tokens,
    finish reasons and logprob bits."""
    V = tiny_model.config.vocab_size
    reqs = []
    for i in range(data.draw(st.integers(1, 5), label="requests")):
        prompt = data.draw(st.lists(st.integers(0, V - 1), min_size=1, max_size=12), label="prompt")
        stops = tuple(data.draw(st.sets(st.integers(0, V - 1), max_size=V // 8), label="stops"))
        greedy = data.draw(st.booleans(), label="greedy")
        params = SamplingParams(greedy=greedy, temperature=1.0, max_new_tokens=data.draw(st.integers(1, 10)),
                                stop_token_ids=stops)
        reqs.append(Request(prompt, params, seed=None if greedy else 50 + i))
    max_batch = len(reqs) + data.draw(st.integers(0, 3), label="spare rows")
    ahead = generate(tiny_model, reqs, max_batch=max_batch)
    plain = generate(tiny_model, reqs, max_batch=max_batch, capture=CAPTURE)
    for a, b in zip(ahead, plain):
        assert (a.tokens, a.finish_reason, a.logprobs.numpy().tobytes()) == \
               (b.tokens, b.finish_reason, b.logprobs.numpy().tobytes())


def test_unseeded_requests_follow_the_generator(tiny_model):
    req = Request(random_prompt(5, 3), SamplingParams(max_new_tokens=6))
    a = generate(tiny_model, [req], generator=torch.Generator().manual_seed(1))[0]
    b = generate(tiny_model, [req], generator=torch.Generator().manual_seed(1))[0]
    assert a.tokens == b.tokens


@pytest.mark.parametrize("make, match", [
    (lambda: Request([]), r"Request\.prompt: must not be empty"),
    (lambda: Request([1, 2.0]), r"Request\.prompt: token at index 1"),
    (lambda: Request("abc"), r"Request\.prompt"),
    (lambda: Request([1], seed=2**64), r"Request\.seed"),
    (lambda: Request([1], params=dict(temperature=1)), r"Request\.params"),
])
def test_bad_requests(make, match):
    with pytest.raises(ValueError, match=match):
        make()


def test_bad_requests_against_the_model(tiny_model):
    with pytest.raises(ValueError, match=r"request 1: Request\.prompt: token id 512 at index 2"):
        generate(tiny_model, [Request([1]), Request([1, 2, 512])])
    with pytest.raises(ValueError, match=r"SamplingParams\.max_new_tokens: prompt \(3\) \+ max_new_tokens"):
        generate(tiny_model, [Request([1, 2, 3], SamplingParams(max_new_tokens=131072))])
    with pytest.raises(ValueError, match=r"exceeds the context of 10"):
        generate(tiny_model, [Request([1, 2, 3], SamplingParams(max_new_tokens=8))], max_context=10)
    with pytest.raises(ValueError, match=r"SamplingParams\.stop_token_ids"):
        generate(tiny_model, [Request([1], SamplingParams(stop_token_ids=(600,)))])
    assert generate(tiny_model, []) == []
