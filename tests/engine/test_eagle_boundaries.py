import pytest

from lockstep.engine.boundaries import LayerIdError, aux_layer_ids_from_draft_config, resolve_boundaries
from lockstep.engine.config import preset

# DESIGN §3 table: (L, ids, convention, boundaries or None for an error)
TABLE = [
    (36, [24, 30, 36], "sglang", [24, 30, 36]),
    (36, [24, 30, 36], "output-index", None),
    (36, [1, 17, 32], "sglang", [2, 18, 33]),
    (36, [1, 17, 32], "boundary", [1, 17, 32]),
    (36, None, "boundary", [2, 18, 33]),
    (36, None, "sglang", [2, 18, 33]),
    (36, None, "output-index", [2, 18, 33]),
    (36, [], "sglang", [2, 18, 33]),
    (24, None, "boundary", [2, 12, 21]),
    (24, None, "sglang", [2, 12, 21]),
    (24, None, "output-index", [2, 12, 21]),
]


@pytest.mark.parametrize("L, ids, convention, expect", TABLE)
def test_design_table(L, ids, convention, expect):
    H = 2880
    fc_in = 8640
    if expect is None:
        with pytest.raises(LayerIdError) as err:
            resolve_boundaries(ids, convention, L, fc_in // H, "gpt-oss-120b-eagle3")
        msg = str(err.value)
        for part in ("gpt-oss-120b-eagle3", repr(convention), str(ids), "[25, 31, 37]", f"L={L}", "[37]"):
            assert part in msg, part
    else:
        assert resolve_boundaries(ids, convention, L, fc_in // H, "draft") == expect
        assert len(expect) * H == fc_in


def test_the_historical_crash_is_a_load_time_error():
    # an unconditional +1 on [24, 30, 36] leaves two usable states: fc would see 5760, not 8640
    with pytest.raises(LayerIdError, match=r"outside \[0, 36\]"):
        resolve_boundaries([24, 30, 36], "output-index", 36, 3, "x")


def test_tiny_presets_have_the_real_depths():
    for name, L, expect in (("tiny-d24", 24, [2, 12, 21]), ("tiny-d36", 36, [2, 18, 33])):
        assert preset(name).num_hidden_layers == L
        assert resolve_boundaries(None, "sglang", L, 3, name) == expect


@pytest.mark.parametrize("ids, convention, L, count, why", [
    ([1, 1, 5], "boundary", 36, 3, r"\[1\] appear more than once"),
    ([0, 35, 35], "output-index", 36, 3, r"\[36\] appear more than once"),
    ([-1, 3, 5], "boundary", 36, 3, r"\[-1\] are outside"),
    ([1, 2], "boundary", 36, 3, "expects 3 aux states"),
    ([1, 2, 3, 4], "sglang", 36, 3, "expects 3 aux states"),
    (None, "boundary", 4, 3, r"\[2\] appear more than once"),            # default [2, 2, 1] on L = 4
    ([1, 2, 3], "vllm", 36, 3, "unknown convention"),
    ([1, 2.5, 3], "boundary", 36, 3, "not an int"),
])
def test_violations(ids, convention, L, count, why):
    with pytest.raises(LayerIdError, match=why) as err:
        resolve_boundaries(ids, convention, L, count, "cfg-name")
    assert "cfg-name" in str(err.value) and f"L={L}" in str(err.value)
    assert isinstance(err.value, ValueError)


def test_sglang_uses_ids_as_is_only_when_max_is_L():
    assert resolve_boundaries([0, 5, 36], "sglang", 36, 3, "x") == [0, 5, 36]
    assert resolve_boundaries([0, 5, 35], "sglang", 36, 3, "x") == [1, 6, 36]
    assert resolve_boundaries([30, 24, 36], "boundary", 36, 3, "x") == [30, 24, 36]   # order kept


def test_ids_from_draft_config():
    assert aux_layer_ids_from_draft_config({"eagle_config": {"eagle_aux_hidden_state_layer_ids": [1, 17, 32]},
                                            "eagle_aux_hidden_state_layer_ids": [1, 17, 32]}) == [1, 17, 32]
    with pytest.raises(LayerIdError, match=r"\[1, 17, 32\] in eagle_config, \[9, 9, 9\] at the top level"):
        aux_layer_ids_from_draft_config({"eagle_config": {"eagle_aux_hidden_state_layer_ids": [1, 17, 32]},
                                         "eagle_aux_hidden_state_layer_ids": [9, 9, 9]})      # DESIGN §3
    assert aux_layer_ids_from_draft_config({"eagle_aux_hidden_state_layer_ids": [24, 30, 36]}) == [24, 30, 36]
    assert aux_layer_ids_from_draft_config({"eagle_config": {"use_aux_hidden_state": True}}) is None
    assert aux_layer_ids_from_draft_config({}) is None
    with pytest.raises(LayerIdError):
        aux_layer_ids_from_draft_config({"eagle_aux_hidden_state_layer_ids": 3})
