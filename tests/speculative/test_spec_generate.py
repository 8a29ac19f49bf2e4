"""speculative_generate end to end on the shipped fitted pair (models/tiny-target, models/tiny-eagle3)."""

import random

import pytest
import torch

from lockstep.engine import spec_accept, spec_round
import lockstep.kernels.coins as coins_mod
from lockstep.engine.eagle3 import load_draft
from lockstep.engine.generate import Request, generate
from lockstep.engine.kv_cache import KVCache
from lockstep.engine.model import GptOssModel
from lockstep.engine.sampling import SamplingParams
from lockstep.engine.speculative import SpecParams, speculative_generate

from tests.speculative.conftest import MODELS, training_prompts

TRAIN = training_prompts(8)

CHAIN = SpecParams(num_steps=3, topk=1, draft_token_num=4)
TREE = SpecParams(num_steps=3, topk=2, draft_token_num=6)


def prompt(n, seed):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, 500, (n,), generator=g).tolist()


def bits(r):
    return r.tokens, r.finish_reason, r.logprob_bytes, r.accept_lengths


def greedy_requests():
    """Two prompts the draft was fitted on (so drafts get accepted) and one it has never seen."""
    return [Request(TRAIN[0], SamplingParams(greedy=True, max_new_tokens=12)),
            Request(TRAIN[1], SamplingParams(greedy=True, max_new_tokens=9)),
            Request(prompt(3, 70), SamplingParams(greedy=True, max_new_tokens=4))]


@pytest.mark.parametrize("sp", [CHAIN, TREE], ids=["chain", "tree"])
def test_greedy_speculative_equals_greedy_generate(fitted, sp, monkeypatch):
    target, draft = fitted
    copies = []
    real = KVCache.copy_positions

    def spy(cache, dst, src, positions):
        copies.append((dst.tolist(), src.tolist()))
        return real(cache, dst, src, positions)

    monkeypatch.setattr(KVCache, "copy_positions", spy)
    reqs = greedy_requests()
    plain = generate(target, reqs)
    fast = speculative_generate(target, draft, reqs, sp)
    for a, b in zip(plain, fast):
        assert (a.tokens, a.finish_reason, a.logprobs.numpy().tobytes()) == (b.tokens, b.finish_reason,
                                                                                b.logprob_bytes)
    lens = [x for r in fast for x in r.accept_lengths]
    assert max(lens) >= 3 and sum(lens) / len(lens) > 1.3, lens          # drafts were really accepted
    if sp.topk > 1:                    # some accepted path ran in a scratch slot and was copied back
        assert any(d != s_ for dst, src in copies for d, s_ in zip(dst, src)), copies


def sampled_requests():
    P = SamplingParams
    return [Request(TRAIN[2], P(temperature=0.1, max_new_tokens=8), seed=11),
            Request(TRAIN[3], P(temperature=0.2, top_k=20, max_new_tokens=6), seed=12),
            Request(prompt(4, 3), P(greedy=True, max_new_tokens=4)),
            Request(TRAIN[4], P(temperature=1.2, top_p=0.9, max_new_tokens=5), seed=2**63 + 5)]


@pytest.mark.parametrize("sp", [TREE, SpecParams(verify="rejection")], ids=["target-only-tree", "rejection-chain"])
def test_seeded_d1_and_d2(fitted, sp):
    target, draft = fitted
    reqs = sampled_requests()
    alone = [bits(speculative_generate(target, draft, [r], sp)[0]) for r in reqs]
    # D2: shuffled, and with a duplicate in the batch; D1: fresh loads of the same files
    order = list(range(len(reqs)))
    random.Random(1).shuffle(order)
    t2 = GptOssModel.from_checkpoint(MODELS / "tiny-target")
    d2 = load_draft(MODELS / "tiny-eagle3", t2, convention="sglang")
    shuffled = speculative_generate(t2, d2, [reqs[i] for i in order] + reqs[:1], sp)
    assert [bits(shuffled[order.index(i)]) for i in range(len(reqs))] == alone
    assert bits(shuffled[-1]) == alone[0]
    assert any(max(r[3] or [1]) > 1 for r in alone)                        # some drafts were accepted


def test_coins_are_verify_coins_at_the_committed_length(fitted, monkeypatch):
    target, draft = fitted
    calls, used = [], []
    finals = []
    real_coins, real_verify, real_read = spec_accept.verify_coins, spec_round._accept_target_only, spec_round._read_round

    def coins_spy(seeds, seq_lens, n):
        out = real_coins(seeds, seq_lens, n)
        calls.append((seeds.tolist(), seq_lens.tolist(), n, out))
        return out

    def verify_spy(tokens, children, p, c, *a):          # the batched target-only step: coins [1, N]
        used.append(c[0].clone())
        return real_verify(tokens, children, p, c, *a)

    def read_spy(ints, weights, final_coins):            # the final draw's coin rides the round's read
        finals.append(float(final_coins[0]))
        return real_read(ints, weights, final_coins)

    monkeypatch.setattr(spec_accept, "verify_coins", coins_spy)
    monkeypatch.setattr(spec_round, "_accept_target_only", verify_spy)
    monkeypatch.setattr(spec_round, "_read_round", read_spy)
    req = Request(TRAIN[5], SamplingParams(temperature=0.5, max_new_tokens=8), seed=77)
    res = speculative_generate(target, draft, [req], TREE)[0]
    n, expect = len(req.prompt) + 1, []
    for k in res.accept_lengths:
        expect.append(n)
        n += k
    assert [c[1][0] for c in calls] == expect
    assert all(c[0] == [77] and c[2] == TREE.draft_token_num for c in calls)
    assert len(used) == len(finals) == len(calls)
    for j, (uc, uf) in enumerate(zip(used, finals)):
        c, f = coins_mod.verify_coins(torch.tensor([77]), torch.tensor([expect[j]]), TREE.draft_token_num)
        assert uc.equal(c[0]) and uf == float(f[0])


def test_unseeded_requests_use_the_explicit_generator(fitted, monkeypatch):
    target, draft = fitted
    req = Request(prompt(5, 5), SamplingParams(temperature=1.0, max_new_tokens=5))
    a = speculative_generate(target, draft, [req], TREE, generator=torch.Generator().manual_seed(3))[0]
    b = speculative_generate(target, draft, [req], TREE, generator=torch.Generator().manual_seed(3))[0]
    assert bits(a) == bits(b)
    monkeypatch.setattr(spec_accept, "verify_coins", lambda *a: pytest.fail("unseeded requests must not hash"))
    speculative_generate(target, draft, [req], TREE, generator=torch.Generator().manual_seed(4))


def test_top_hash_coins_are_clamped_end_to_end(fitted, monkeypatch):
    """Every hash = 0xFFFFFFFF: float32 coins would be exactly 1.0 without the clamp (DESIGN §5)."""
    target, draft = fitted
    real = coins_mod.murmur_hash32_torch             # the hash verify_coins and gumbel_noise take by default
    monkeypatch.setattr(coins_mod, "murmur_hash32_torch", lambda s, p, c: torch.full_like(real(s, p, c), 0xFFFFFFFF))
    for sp in (TREE, SpecParams(verify="rejection")):
        res = speculative_generate(target, draft, [Request(prompt(5, 6), SamplingParams(temperature=1.0, top_k=5,
                                                                                        max_new_tokens=4), seed=1)], sp)
        assert len(res[0].tokens) == 4 and torch.isfinite(res[0].logprobs).all()


def test_bad_input(fitted, tmp_path, deep_targets):
    target, draft = fitted
    from lockstep.engine.eagle3 import make_draft_checkpoint
    other = load_draft(make_draft_checkpoint("tiny-d36", 0, tmp_path / "d36"), deep_targets["tiny-d36"],
                       convention="sglang")
    req = [Request([1, 2, 3], SamplingParams(greedy=True, max_new_tokens=4))]
    with pytest.raises(ValueError, match="target_hidden_size=32 .* hidden_size=96"):
        speculative_generate(target, other, req)
    for kw, match in [(dict(topk=0), "SpecParams.topk"), (dict(num_steps=0), "SpecParams.num_steps"),
                      (dict(draft_token_num=1), "SpecParams.draft_token_num"),
                      (dict(topk=2, num_steps=2, draft_token_num=8), r"SpecParams.draft_token_num: must be <= .* = 7"),
                      (dict(verify="typical"), "SpecParams.verify"),
                      (dict(verify="rejection", topk=2, draft_token_num=3), "SpecParams.topk: verify='rejection'"),
                      (dict(threshold_acc=0.0), "SpecParams.threshold_acc")]:
        with pytest.raises(ValueError, match=match):
            SpecParams(**kw)
    with pytest.raises(ValueError, match=r"SpecParams.draft_token_num: must be <= .* = 3 \(topk=1, num_steps=2\)"):
        SpecParams(num_steps=2, topk=1, draft_token_num=4)                 # a chain holds num_steps + 1 nodes
    with pytest.raises(ValueError, match="SpecParams.topk: 300 exceeds the draft vocabulary"):
        speculative_generate(target, draft, req, SpecParams(topk=300, num_steps=1, draft_token_num=3))
    with pytest.raises(ValueError, match=r"request 0: SpecParams.num_steps: .* exceeds the context of 9"):
        speculative_generate(target, draft, req, SpecParams(num_steps=3), max_context=9)
    with pytest.raises(ValueError, match="verify='greedy' needs greedy requests"):
        speculative_generate(target, draft, [Request([1], SamplingParams(max_new_tokens=2), seed=1)],
                             SpecParams(verify="greedy"))
    assert speculative_generate(target, draft, []) == []
