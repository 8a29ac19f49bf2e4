"""D4 for speculative decoding: with the target at TP 2 and 4, EP 2 and 4 and TP 2 × EP 2 and
the draft replicated on every rank, tokens, logprob bytes and accept lengths equal one device's,
for greedy, seeded target-only (tree) and seeded rejection (chain) verification; a draft that
reads the target's (vocab-sharded) embedding gets the full table; and a wrong reduction order
makes the comparison fail."""

from __future__ import annotations

import pytest

from lockstep.engine.launch import launch

from tests.parallel import speculative_scenarios as sc

TIMEOUTS = dict(timeout_s=300, collective_timeout_s=120)


@pytest.fixture(scope="session")
def spec_pairs(par_ckpt, tmp_path_factory) -> dict[str, sc.PairPaths]:
    from lockstep.engine.eagle3 import make_draft_checkpoint
    draft = make_draft_checkpoint("tiny-parallel", 3, tmp_path_factory.mktemp("draft") / "no-embed",
                                  aux_layer_ids=[0, 1, 2], with_embed=False)
    return {"fitted": sc.fitted_pair(), "parallel": sc.PairPaths(par_ckpt, str(draft), "boundary")}


@pytest.fixture(scope="session")
def spec_one_device(spec_pairs) -> dict:
    return {name: sc.reference(pair) for name, pair in spec_pairs.items()}


def check_equal(per_rank: list[dict], one_device: dict, keys) -> None:
    for key in keys:
        for rank, res in enumerate(per_rank):
            for spec_name, got in res[key].items():
                want = one_device[key[0]][spec_name]
                assert got == want, f"{key} {spec_name} rank {rank}: {sc.first_difference(got, want)}"


def check_differs(per_rank: list[dict], one_device: dict, key) -> None:
    """The negative control: some request's bits differ from one device's (what the harness's
    topology check compares), on every rank."""
    for rank, res in enumerate(per_rank):
        assert any(res[key][s] != one_device[key[0]][s] for s in sc.SPECS), \
            f"{key} rank {rank}: a wrong reduction order gave the one-device bits; the check cannot fail"


def test_the_fitted_pair_accepts_greedy_and_seeded_drafts(spec_one_device):
    """Otherwise the topology tests below would not reach the multi-token commit paths (accepted
    rows copied back from scratch slots, the draft extended over several positions, the next
    round's coins at a committed length that grew by more than one)."""
    got = sc.accepting_requests(spec_one_device["fitted"])
    assert 0 in got["tree"] and 1 in got["tree"] and 2 in got["chain"], got


def test_world_2_tp2_ep2(spec_pairs, spec_one_device):
    keys = [("fitted", 2, 1), ("fitted", 1, 2), ("parallel", 2, 1), ("fitted", 2, 1, "sequential")]
    per_rank = launch(sc.run, 2, args=(spec_pairs, keys), **TIMEOUTS)
    check_equal(per_rank, spec_one_device, keys[:3])
    # Left-to-right over all 8 K chunks is not the fixed tree: logprob bytes change.
    check_differs(per_rank, spec_one_device, keys[3])


def test_world_4_tp4_ep4_tp2xep2(spec_pairs, spec_one_device):
    keys = [("fitted", 2, 2), ("fitted", 1, 4), ("parallel", 4, 1), ("parallel", 4, 1, "rank_order")]
    per_rank = launch(sc.run, 4, args=(spec_pairs, keys), **TIMEOUTS)
    check_equal(per_rank, spec_one_device, keys[:3])
    # ((r0 + r1) + r2) + r3 leaves the fixed tree at four ranks.
    check_differs(per_rank, spec_one_device, keys[3])


def test_speculative_generate_at_world_1_and_unseeded_requests(spec_pairs, spec_one_device):
    from lockstep.engine.generate import Request
    from lockstep.engine.parallel import speculative_generate_at
    from lockstep.engine.sampling import SamplingParams
    pair = spec_pairs["parallel"]
    got = sc.bits(speculative_generate_at(pair.target, 1, 1, sc.requests(), draft=pair.draft,
                                          convention=pair.convention, spec=sc.SPECS["chain"]))
    want = spec_one_device["parallel"]["chain"]
    assert got == want, sc.first_difference(got, want)
    unseeded = sc.requests() + [Request([1, 2, 3], SamplingParams(temperature=0.9))]
    with pytest.raises(ValueError, match=r"requests \[3\] are sampled without a seed"):
        speculative_generate_at(pair.target, 2, 1, unseeded, draft=pair.draft, convention=pair.convention,
                                spec=sc.SPECS["tree"])


def test_a_draft_without_embedding_refuses_a_vocab_shard(spec_pairs):
    """What a sharded rank's model.embed is at TP 2: half the rows. Taking it silently
    would look tokens up in the wrong rows (or out of range)."""
    from lockstep.engine.checkpoint import CheckpointError, load_checkpoint
    from lockstep.engine.eagle3 import load_draft
    pair = spec_pairs["parallel"]
    config, weights = load_checkpoint(pair.target)
    shard = weights["model.embed_tokens.weight"][:config.vocab_size // 2]
    with pytest.raises(CheckpointError, match=r"\(256, 64\), not the full \[512, 64\]"):
        load_draft(pair.draft, config, convention=pair.convention, target_embed=shard)
    full = load_draft(pair.draft, config, convention=pair.convention, target_embed=weights["model.embed_tokens.weight"])
    assert full.embed.shape == (config.vocab_size, config.hidden_size)


def test_the_harness_compares_accept_lengths_of_speculative_runs():
    """A topology run of a speculative spec must also give the same accept lengths; the
    speculative-vs-plain comparison (plain generate has none) stays on tokens and logprobs."""
    import torch
    from lockstep.engine.request import Result
    from lockstep.harness.kinds.generate import _bytes, _same
    lp = torch.tensor([-0.5, -1.25], dtype=torch.float32)
    a = Result([4, 5], lp, "length", accept_lengths=[2])
    b = Result([4, 5], lp.clone(), "length", accept_lengths=[1, 1])
    plain = Result([4, 5], lp.clone(), "length", None)
    assert not _same(_bytes(b), _bytes(a))
    assert _same(_bytes(plain), _bytes(a)) and _same(_bytes(a), _bytes(a))


def test_a_speculative_spec_may_list_topologies():
    from lockstep.harness.specfile import parse_spec
    text = """\
kind: generate
description: speculative at TP 2
inputs:
  checkpoint: {path: models/tiny-target}
  draft: {path: models/tiny-eagle3, convention: sglang}
  speculative: {num_steps: 2, topk: 1, draft_token_num: 3, verify: greedy}
  topologies: [[2, 1]]
  requests:
    - {prompt: [1, 2, 3], sampling: {greedy: true, max_new_tokens: 3}}
"""
    assert parse_spec(text, "f.yaml", "topology/x").inputs["topologies"] == [[2, 1]]
