"""The prefix cache (engine/prefix_cache.py) and its spec kind: a hit equals a cold prefill bit
for bit, the hit count makes a cache that never hits fail, and a planted bug (the hit's last
block recomputed in another order) turns the kind red."""

from __future__ import annotations

import pytest
import torch

from lockstep.engine.generate import Request, generate
from lockstep.engine.prefix_cache import PrefixCache
from lockstep.engine.sampling import SamplingParams
from lockstep.harness import runner
from lockstep.harness.kinds import prefix_cache as kind
from lockstep.harness.platform import detect
from lockstep.harness.result import RunContext
from lockstep.harness.specfile import load_spec_file

GREEDY = SamplingParams(greedy=True, max_new_tokens=3, stop_token_ids=())
SPEC = """\
kind: prefix-cache
description: a small prefix-cache spec for the tests
inputs:
  checkpoint: {preset: tiny, seed: 0, format: bf16}
  prompt: {hashed: {count: 50, seed: 3, below: 500}}
  query: 40
  splits: [15, 16, 17, 33]
  diverge: [20]
  chains: [[9, 24, 40]]
  block: 16
  prefill_chunk: 12
  sampling: {greedy: true, max_new_tokens: 2, stop_token_ids: []}
"""


@pytest.fixture(scope="module")
def spec(tmp_path_factory):
    d = tmp_path_factory.mktemp("specs") / "specs" / "pc"
    d.mkdir(parents=True)
    (d / "small.yaml").write_text(SPEC)
    return load_spec_file(d / "small.yaml", d.parent)


@pytest.fixture(scope="module")
def ctx():
    return RunContext(detect("cpu"))


@pytest.fixture(scope="module")
def model(spec, ctx):
    from lockstep.harness.checkpoints import model_for
    return model_for(spec.inputs["checkpoint"])


def bits(r):
    return r.tokens, r.logprobs.view(torch.int32).tolist()


def test_hit_equals_cold_and_counts(model):
    base = list(range(30, 80))
    cold = generate(model, [Request(base, GREEDY)], prefill_chunk=8)[0]
    cache = PrefixCache(block=16)
    generate(model, [Request(base[:21], GREEDY)], prefix_cache=cache)       # 1 full block + a partial one
    warm = generate(model, [Request(base, GREEDY)], prefix_cache=cache, prefill_chunk=8)[0]
    assert (cache.lookups, cache.hits, cache.hit_tokens) == (2, 1, 21)
    assert bits(warm) == bits(cold)
    again = generate(model, [Request(base, GREEDY)], prefix_cache=cache)[0]  # chained: now 49 of 50 reused
    assert cache.hit_tokens == 21 + 49 and bits(again) == bits(cold)


def test_a_hit_never_covers_the_last_prompt_token_and_batches_mix_hits(model):
    cache = PrefixCache(block=4)
    a, b = list(range(10, 22)), list(range(200, 209))
    generate(model, [Request(a, GREEDY)], prefix_cache=cache)
    cold = generate(model, [Request(a, GREEDY), Request(b, GREEDY)])
    warm = generate(model, [Request(a, GREEDY), Request(b, GREEDY)], prefix_cache=cache)
    assert cache.hit_tokens == len(a) - 1 and cache.hits == 1               # b missed
    assert [bits(r) for r in warm] == [bits(r) for r in cold]


def test_capture_and_a_prefix_cache_are_refused_together(model):
    with pytest.raises(ValueError, match="capture and prefix_cache"):
        generate(model, [Request([1, 2, 3], GREEDY)], capture=[1], prefix_cache=PrefixCache())


def test_cases_predict_the_reused_positions(spec):
    got = {name: expected for name, _, _, expected in kind.cases(spec)}
    assert got == {"split 15": 15, "split 16": 16, "split 17": 17, "split 33": 33, "diverge at 20": 20,
                   "chain [9, 24, 40] link 1": 9, "chain [9, 24, 40] link 2": 24}


def test_the_kind_passes_with_hits(spec, ctx):
    result = runner.run_spec(spec, ctx)
    assert kind.check(spec, result) == []
    assert result.data["hits"] == 7 and result.data["reused_positions"] == [15, 16, 17, 33, 20, 9, 24]


def recompute_last_block_in_another_order(monkeypatch):
    """Planted: after a hit, the last reused block's keys and values are recomputed as 3x - 2x,
    equal to x in real arithmetic and not always in float (another order of operations)."""
    lookup = PrefixCache.lookup

    def planted(self, prompt, kv, slot):
        n = lookup(self, prompt, kv, slot)
        if n:
            lo = (n - 1) // self.block * self.block
            for buf in kv.k + kv.v:
                x = buf[slot, :, lo:n]
                buf[slot, :, lo:n] = torch.sub(torch.mul(x, 3.0), torch.mul(x, 2.0))
        return n
    monkeypatch.setattr(PrefixCache, "lookup", planted)


def test_planted_last_block_recompute_turns_the_kind_red(spec, ctx, monkeypatch):
    recompute_last_block_in_another_order(monkeypatch)
    fails = kind.check(spec, runner.run_spec(spec, ctx))
    assert fails and all("differ from the cold prefill" in f for f in fails), fails


def test_a_cache_that_never_hits_cannot_pass(spec, ctx, monkeypatch):
    monkeypatch.setattr(PrefixCache, "lookup", lambda self, prompt, kv, slot: 0)
    fails = kind.check(spec, runner.run_spec(spec, ctx))
    assert any("reused 0 positions" in f for f in fails) and any("prefix-cache hits" in f for f in fails), fails
