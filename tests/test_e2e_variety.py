"""Variety in the end-to-end specs (issue 26, item 3): each contract broken on purpose, and the spec
that turns red.

    break                                                        spec that turns red
    layer ids read from eagle_config only, silently              layer_ids/error-ids-in-both-places-differ
    top-p / min-p on the untempered distribution                 verify/target-only-logits-temperature-top-p,
                                                                 verify/target-only-logits-temperature-min-p
    the masked verify distribution not renormalised              verify/target-only-logits-renormalised
    siblings tried in descending node order                      verify/target-only-deep-wide-tree
    a coin per depth instead of the parent node's coin           verify/target-only-deep-wide-tree
    the draft's rope_theta ignored (the default 10000 taken)     draft/own-rope-theta
    routing weights normalised over a power-of-two prefix of k   generate/router-top3 (tiny's k = 2 stays green)
    the embedding gathered by a one-hot matmul (-0.0 -> +0.0)    generate/special-values
    every expert computed and zero-weighted (NaN * 0)            generate/special-values

Engine specs are checked against goldens of a clean run in this process (tests/planted.py).
"""

import json

import pytest
import torch

import lockstep.engine.boundaries
import lockstep.engine.eagle3
import lockstep.engine.model
import lockstep.engine.sampling
import lockstep.engine.spec_accept
import lockstep.engine.spec_tree
import lockstep.engine.speculative
from lockstep.engine.boundaries import LayerIdError
from lockstep.engine.eagle3 import load_draft, make_draft_checkpoint
from lockstep.engine.config import preset
from lockstep.kernels import portable
from tests.planted import Planted


# one xdist worker runs the module (pyproject --dist loadgroup): its clean recordings (tests/planted.py) once a run
pytestmark = pytest.mark.xdist_group("e2e-variety")
ENGINE_SPECS = ["draft/own-rope-theta", "generate/router-top3", "generate/special-values"]


@pytest.fixture(scope="module")
def specs(tmp_path_factory):
    return Planted(tmp_path_factory.mktemp("variety"), [])


@pytest.fixture(scope="module")
def engine_specs(tmp_path_factory):
    return Planted(tmp_path_factory.mktemp("variety-engine"), ENGINE_SPECS + ["generate/greedy-tiny-bf16"])


VERIFY_SPECS = ["verify/target-only-logits-temperature-top-p", "verify/target-only-logits-temperature-min-p",
                "verify/target-only-logits-renormalised"]
TREE_SPEC = "verify/target-only-deep-wide-tree"


def test_the_named_specs_pass_clean(specs):
    for spec_id in ["layer_ids/ids-in-both-places-equal", "layer_ids/error-ids-in-both-places-differ", TREE_SPEC] \
            + VERIFY_SPECS:
        specs.green(spec_id)


# --------------------------------------------------------------------------- ids in both places
def eagle_config_first(draft_config):
    """The reader before DESIGN §3 said otherwise: eagle_config first, the top level ignored."""
    for source in (draft_config.get("eagle_config") or {}, draft_config):
        if source.get("eagle_aux_hidden_state_layer_ids") is not None:
            return list(source["eagle_aux_hidden_state_layer_ids"])
    return None


def test_ids_in_both_places_read_silently(specs, monkeypatch):
    import lockstep.engine.boundaries               # what Lockstep's eagle3_layers operation reads the ids with
    monkeypatch.setattr(lockstep.engine.boundaries, "aux_layer_ids_from_draft_config", eagle_config_first)
    report = specs.red("layer_ids/error-ids-in-both-places-differ")
    assert "the resolver accepted the ids (boundaries [24, 30, 36])" in report
    specs.green("layer_ids/ids-in-both-places-equal")


def test_a_draft_with_different_ids_in_both_places_does_not_load(tmp_path):
    """The loader reads the same rule: the error names the config and both lists."""
    path = make_draft_checkpoint("tiny", 0, tmp_path / "draft", aux_layer_ids=[1, 2, 3])
    cfg = json.loads((path / "config.json").read_text())
    (path / "config.json").write_text(json.dumps(cfg | {"eagle_aux_hidden_state_layer_ids": [0, 2, 4]}))
    with pytest.raises(LayerIdError, match=r"draft.*\[1, 2, 3\] in eagle_config, \[0, 2, 4\] at the top level"):
        load_draft(path, preset("tiny"), convention="boundary")
    (path / "config.json").write_text(json.dumps(cfg | {"eagle_aux_hidden_state_layer_ids": [1, 2, 3]}))
    assert load_draft(path, preset("tiny"), convention="boundary").config.aux_layer_ids == (1, 2, 3)


# --------------------------------------------------------------------------- filters and temperature
def filters_before_temperature(logits, params):
    """target_probs with the filters on the untempered distribution, then the temperature."""
    z1 = logits.to(torch.float64)
    keep = lockstep.engine.sampling.keep_mask(z1, params.top_k, params.top_p, params.min_p)
    return portable.softmax(torch.where(keep, z1 / params.temperature, float("-inf")), dim=-1)


def not_renormalised(logits, params):
    """target_probs masked but not renormalised: the kept ids keep their unfiltered mass."""
    z = logits.to(torch.float64) / params.temperature
    keep = lockstep.engine.sampling.keep_mask(z, params.top_k, params.top_p, params.min_p)
    return torch.where(keep, portable.softmax(z, dim=-1), 0.0)


@pytest.mark.parametrize("planted, red, green", [
    (filters_before_temperature, VERIFY_SPECS[:2], VERIFY_SPECS[2:]),
    (not_renormalised, VERIFY_SPECS[2:], VERIFY_SPECS[:2]),
])
def test_verify_distribution_after_filters(specs, monkeypatch, planted, red, green):
    monkeypatch.setattr(lockstep.engine.speculative, "target_probs", planted)
    for spec_id in red:
        assert "expectation failed" in specs.red(spec_id)
    for spec_id in green:        # top-k does not depend on the order: a temperature keeps the ranking
        specs.green(spec_id)


# --------------------------------------------------------------------------- deep and wide trees
def test_siblings_in_descending_order(specs, monkeypatch):
    real = lockstep.engine.spec_tree._children                    # the sibling order the round tries
    flipped = lambda parents, k: real(parents, k).flip(2)         # noqa: E731
    monkeypatch.setattr(lockstep.engine.spec_tree, "_children", flipped)      # the round's layout
    monkeypatch.setattr(lockstep.engine.spec_accept, "_children", flipped)    # one tree (verify_*)
    assert "accepted the node path [0, 2, 7]" in specs.red(TREE_SPEC)


def test_a_coin_per_depth(specs, monkeypatch):
    real = lockstep.engine.speculative.verify_target_only

    def by_depth(tree, p, coins, final_coin, *args, **kwargs):
        per_depth = torch.stack([coins[tree.depth(i)] for i in range(len(coins))])
        return real(tree, p, per_depth, final_coin, *args, **kwargs)
    monkeypatch.setattr(lockstep.engine.speculative, "verify_target_only", by_depth)
    assert "accepted the node path [0, 2, 7]" in specs.red(TREE_SPEC)


# --------------------------------------------------------------------------- engine runs
def test_draft_rope_theta_ignored(engine_specs, monkeypatch):
    real = lockstep.engine.eagle3.Eagle3Config.from_hf_dict.__func__

    def default_theta(cls, d, name="draft"):
        return real(cls, {k: v for k, v in d.items() if k != "rope_theta"}, name)
    monkeypatch.setattr(lockstep.engine.eagle3.Eagle3Config, "from_hf_dict", classmethod(default_theta))
    report = engine_specs.red("draft/own-rope-theta")
    assert "tensor 'hidden'" in report and "tensor 'fc_input'" not in report   # the attention is where it parts


def power_of_two_softmax(top_logits, backend="torch"):
    """Routing weights whose sum takes the largest power-of-two prefix of the k logits (a kernel
    written for k in {2, 4, 8}): right for gpt-oss's top-4, wrong for top-3."""
    e = portable.exp(top_logits - top_logits.amax(-1, keepdim=True))
    k = top_logits.shape[-1]
    p = 1 << (k.bit_length() - 1)
    return e / portable.tree_sum(e[..., :p], -1, keepdim=True)


def test_router_top_k_not_a_power_of_two(engine_specs, monkeypatch):
    import lockstep.kernels.moe_router
    monkeypatch.setattr(lockstep.kernels.moe_router, "routing_weights", power_of_two_softmax)   # the torch ops' route
    assert "tensor 'logprobs_0'" in engine_specs.red("generate/router-top3")
    engine_specs.green("generate/greedy-tiny-bf16")       # top-2 of 4: the same bits


def test_embedding_by_one_hot_matmul(engine_specs, monkeypatch):
    """A gather computed as arithmetic: one_hot @ embed sums +0.0 products, so -0.0 becomes +0.0."""
    def one_hot_embed(self, tokens):
        one_hot = torch.nn.functional.one_hot(tokens, self.embed.shape[0]).to(self.embed.dtype)
        return portable.matmul_nt(one_hot, self.embed.t().contiguous())
    monkeypatch.setattr(lockstep.engine.model.GptOssModel, "embed_tokens", one_hot_embed)
    report = engine_specs.red("generate/special-values")
    assert "tensor 'captured_0'" in report and "-0.0 (0x80000000), got 0.0 (0x00000000)" in report, report


def test_experts_computed_densely(engine_specs, monkeypatch):
    """Every expert computed for every token and weighted by its routing weight (0 where not routed):
    the unreachable expert's NaN and inf survive the zero weight."""
    import lockstep.engine.ops
    real = lockstep.engine.ops.TORCH.experts

    def dense(x, top_ids, *weights_and_shape):
        parts = real(x, top_ids, *weights_and_shape)                              # [C, T * k, H]
        expert_0 = real(x, torch.zeros_like(top_ids), *weights_and_shape)         # every slot on expert 0
        return parts + 0.0 * expert_0
    object.__setattr__(lockstep.engine.ops.TORCH, "experts", dense)       # the ops table is frozen on purpose
    try:
        engine_specs.red("generate/special-values")
    finally:
        object.__setattr__(lockstep.engine.ops.TORCH, "experts", real)
