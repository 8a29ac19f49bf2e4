"""The prefix-cache kind against targets (`lockstep check --target X 'prefix-cache/*'`): Lockstep's
own adapter passes with hits; a target cache whose hit recomputes its last block in another order,
or that never hits, fails; a target without the capability is n/a with its reason."""

from __future__ import annotations

import pathlib

import pytest
import torch

from lockstep.engine.prefix_cache import PrefixCache
from lockstep.harness.golden import GoldenStore
from lockstep.harness.platform import detect
from lockstep.harness.result import RunContext
from lockstep.harness.specfile import load_specs, select
from lockstep.harness.targets import get
from lockstep.harness.target import Op, Target
from lockstep.harness.targets.judge import FAIL, NA, PASS, TOLERANCE, applicability, run_on_target

ROOT = pathlib.Path(__file__).resolve().parents[2]
SPEC = "prefix-cache/tile-block-chunk-splits"


def spec(spec_id=SPEC):
    specs, _ = load_specs(ROOT / "specs")
    (s,) = select(specs, [spec_id], [])
    return s


def run(target, spec_id=SPEC):
    return run_on_target(spec(spec_id), RunContext(platform=detect("cpu", "fp32")), target, GoldenStore(ROOT / "golden"))


def test_lockstep_through_the_target_path_passes_with_hits():
    o = run(get("lockstep"))
    assert (o.status, o.compare) == (PASS, TOLERANCE), o.messages


def test_a_target_cache_that_recomputes_the_hit_s_last_block_fails(monkeypatch):
    """Planted in the target's cache (Lockstep's adapter drives engine.prefix_cache): after a
    hit, the last reused block's KV becomes 3x - 2x (equal in real arithmetic, not in float)."""
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
    o = run(get("lockstep"))
    assert o.status == FAIL and any("differ from the cold prefill" in m for m in o.messages), o.messages


def test_a_target_cache_that_never_hits_cannot_pass():
    full = get("lockstep").ops["prefix_cache"]

    class NeverHits:
        def __init__(self, checkpoint, block):
            self.inner = full.fn(checkpoint, block)
            self.hits = self.hit_tokens = 0

        def generate(self, requests, prefill_chunk=None):
            self.inner.cache = PrefixCache(self.inner.cache.block)      # forgets everything: every run is cold
            return self.inner.generate(requests, prefill_chunk)
    o = run(Target("toy", "1", ops={"prefix_cache": Op(NeverHits, features=full.features)}))
    assert o.status == FAIL, o.messages
    assert any("reused 0 positions" in m for m in o.messages) and any("prefix-cache hits" in m for m in o.messages)


def test_a_cold_run_that_reports_a_hit_fails():
    """A fresh cache has nothing to reuse: counters that say otherwise are not believed."""
    full = get("lockstep").ops["prefix_cache"]

    class Boasts:
        def __init__(self, checkpoint, block):
            self.inner = full.fn(checkpoint, block)
            self.hits = self.hit_tokens = 0

        def generate(self, requests, prefill_chunk=None):
            out = self.inner.generate(requests, prefill_chunk)
            self.hits, self.hit_tokens = self.inner.hits + 1, self.inner.hit_tokens + 3
            return out
    o = run(Target("toy", "1", ops={"prefix_cache": Op(Boasts, features=full.features)}))
    assert o.status == FAIL and any("a fresh cache reused 3 positions" in m for m in o.messages), o.messages


def test_a_target_without_the_capability_or_a_feature_is_na_with_its_reason():
    assert applicability(spec(), Target("bare", "1")) == (NA, "bare has no 'prefix_cache' operation")
    greedy_only = Target("toy", "1", ops={"prefix_cache": Op(object, features=frozenset({"prefill_chunk"}))},
                         missing={"prefix_cache:sampling": "toy's cache serves greedy requests only"})
    assert applicability(spec("prefix-cache/seeded-unchunked"), greedy_only) == \
        (NA, "toy's cache serves greedy requests only")
    assert applicability(spec(), greedy_only) == (TOLERANCE, "")
    assert applicability(spec(), get("lockstep")) == (TOLERANCE, "")


@pytest.mark.parametrize("name, words", [("hf", "no prefix cache"), ("sglang", "RadixCache"),
                                         ("vllm", "kv_cache_manager")])
def test_the_peers_say_why_they_cannot_run_it_here(name, words):
    try:
        t = get(name)
    except Exception as e:  # not installed: the README's test command installs it
        pytest.skip(f"{name} target unavailable: {e}")
    how, why = applicability(spec(), t)
    assert how == NA and words in why, why
    assert run(t).status == NA
