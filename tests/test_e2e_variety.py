"""Variety in the end-to-end specs (issue 26, item 3): each contract broken on purpose, and the spec
that turns red.

    break                                                        spec that turns red
    layer ids read from eagle_config only, silently              layer_ids/error-ids-in-both-places-differ
    top-p / min-p on the untempered distribution                 verify/target-only-logits-temperature-top-p,
                                                                 verify/target-only-logits-temperature-min-p
    the masked verify distribution not renormalised              verify/target-only-logits-renormalised
"""

import json

import pytest
import torch

import engine.boundaries
import engine.speculative
from engine.boundaries import LayerIdError
from engine.eagle3 import load_draft, make_draft_checkpoint
from engine.config import preset
from kernels import portable
from tests.planted import Planted


@pytest.fixture(scope="module")
def specs(tmp_path_factory):
    return Planted(tmp_path_factory.mktemp("variety"), [])


VERIFY_SPECS = ["verify/target-only-logits-temperature-top-p", "verify/target-only-logits-temperature-min-p",
                "verify/target-only-logits-renormalised"]


def test_the_named_specs_pass_clean(specs):
    for spec_id in ["layer_ids/ids-in-both-places-equal", "layer_ids/error-ids-in-both-places-differ"] + VERIFY_SPECS:
        specs.green(spec_id)


# --------------------------------------------------------------------------- ids in both places
def eagle_config_first(draft_config):
    """The reader before DESIGN §3 said otherwise: eagle_config first, the top level ignored."""
    for source in (draft_config.get("eagle_config") or {}, draft_config):
        if source.get("eagle_aux_hidden_state_layer_ids") is not None:
            return list(source["eagle_aux_hidden_state_layer_ids"])
    return None


def test_ids_in_both_places_read_silently(specs, monkeypatch):
    import harness.kinds.layer_ids
    monkeypatch.setattr(harness.kinds.layer_ids, "aux_layer_ids_from_draft_config", eagle_config_first)
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
    keep = engine.speculative.keep_mask(z1, params.top_k, params.top_p, params.min_p)
    return portable.softmax(torch.where(keep, z1 / params.temperature, float("-inf")), dim=-1)


def not_renormalised(logits, params):
    """target_probs masked but not renormalised: the kept ids keep their unfiltered mass."""
    z = logits.to(torch.float64) / params.temperature
    keep = engine.speculative.keep_mask(z, params.top_k, params.top_p, params.min_p)
    return torch.where(keep, portable.softmax(z, dim=-1), 0.0)


@pytest.mark.parametrize("planted, red, green", [
    (filters_before_temperature, VERIFY_SPECS[:2], VERIFY_SPECS[2:]),
    (not_renormalised, VERIFY_SPECS[2:], VERIFY_SPECS[:2]),
])
def test_verify_distribution_after_filters(specs, monkeypatch, planted, red, green):
    monkeypatch.setattr(engine.speculative, "target_probs", planted)
    for spec_id in red:
        assert "expectation failed" in specs.red(spec_id)
    for spec_id in green:        # top-k does not depend on the order: a temperature keeps the ranking
        specs.green(spec_id)
