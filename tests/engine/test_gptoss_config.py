import json

import pytest

from lockstep.engine.config import FULL, MXFP4_QUANTIZATION_CONFIG, SLIDING, GptOssConfig, preset, PRESETS

# config.json of the released gpt-oss-20b (reference notes §3, quant_method restored to mxfp4).
RELEASED_20B = {
    "architectures": ["GptOssForCausalLM"], "attention_bias": True, "attention_dropout": 0.0,
    "eos_token_id": 200002, "experts_per_token": 4, "head_dim": 64, "hidden_act": "silu",
    "hidden_size": 2880, "initial_context_length": 4096, "initializer_range": 0.02,
    "intermediate_size": 2880, "layer_types": ["sliding_attention", "full_attention"] * 12,
    "max_position_embeddings": 131072, "model_type": "gpt_oss", "num_attention_heads": 64,
    "num_experts_per_tok": 4, "num_hidden_layers": 24, "num_key_value_heads": 8, "num_local_experts": 32,
    "output_router_logits": False, "pad_token_id": 199999,
    "quantization_config": MXFP4_QUANTIZATION_CONFIG, "rms_norm_eps": 1e-05,
    "rope_scaling": {"beta_fast": 32.0, "beta_slow": 1.0, "factor": 32.0,
                     "original_max_position_embeddings": 4096, "rope_type": "yarn", "truncate": False},
    "rope_theta": 150000, "router_aux_loss_coef": 0.9, "sliding_window": 128, "swiglu_limit": 7.0,
    "tie_word_embeddings": False, "transformers_version": "4.55.0.dev0", "use_cache": True, "vocab_size": 201088,
}


def test_released_20b_config_matches_preset():
    c = GptOssConfig.from_hf_dict(RELEASED_20B)
    p = preset("gpt-oss-20b")
    assert c.eos_token_id == (200002,)           # the released file has one id; the preset lists three
    assert c.replace(eos_token_id=p.eos_token_id) == p
    assert c.is_mxfp4 and not p.is_mxfp4
    assert c.rope.theta == 150000 and c.rope.factor == 32 and c.rope.truncate is False


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_presets_round_trip_through_hf_json(name):
    c = preset(name)
    d = json.loads(json.dumps(c.to_hf_dict()))
    assert d["model_type"] == "gpt_oss" and d["architectures"] == ["GptOssForCausalLM"]
    assert GptOssConfig.from_hf_dict(d) == c
    assert [c.window(i) for i in range(c.num_hidden_layers)] == \
        [c.sliding_window if i % 2 == 0 else 0 for i in range(c.num_hidden_layers)]


def test_real_shapes():
    for name, L, E in (("gpt-oss-20b", 24, 32), ("gpt-oss-120b", 36, 128)):
        c = preset(name)
        assert (c.num_hidden_layers, c.num_local_experts, c.hidden_size, c.head_dim) == (L, E, 2880, 64)
        assert (c.num_attention_heads, c.num_key_value_heads, c.num_experts_per_tok) == (64, 8, 4)
        assert (c.vocab_size, c.sliding_window, c.eos_token_id) == (201088, 128, (200002, 199999, 200012))


def test_small_presets_keep_every_structural_feature():
    for name in ("tiny", "small"):
        c = preset(name)
        assert c.hidden_size % 32 == 0 and c.hidden_size % 128 != 0 and c.intermediate_size % 32 == 0
        assert c.num_attention_heads > c.num_key_value_heads > 0          # GQA
        assert c.q_dim != c.hidden_size                                   # o_proj changes width
        assert c.sliding_window <= 16 and set(c.layer_types) == {SLIDING, FULL}
        assert c.rope.rope_type == "yarn" and c.rope.factor > 1
        assert 1 < c.num_experts_per_tok < c.num_local_experts
        assert len(c.eos_token_id) >= 2 and c.vocab_size <= 1024
    assert preset("tiny-d24").num_hidden_layers == 24 and preset("tiny-d36").num_hidden_layers == 36


def test_transformers5_rope_parameters_layout():
    d = preset("tiny").to_hf_dict()
    rope = dict(d.pop("rope_scaling"), rope_theta=d.pop("rope_theta"))
    d["rope_parameters"] = rope
    assert GptOssConfig.from_hf_dict(d) == preset("tiny")


@pytest.mark.parametrize("change, field", [
    (dict(num_key_value_heads=3), "num_key_value_heads"),
    (dict(head_dim=31), "head_dim"),
    (dict(num_experts_per_tok=5), "num_experts_per_tok"),
    (dict(layer_types=(SLIDING,)), "layer_types"),
    (dict(layer_types=(SLIDING, "bogus", SLIDING, FULL)), "layer_types"),
    (dict(eos_token_id=(600,)), "eos_token_id"),
    (dict(eos_token_id=()), "eos_token_id"),
    (dict(hidden_size=0), "hidden_size"),
    (dict(rms_norm_eps=-1.0), "rms_norm_eps"),
    (dict(attention_bias=False), "attention_bias"),
    (dict(tie_word_embeddings=True), "tie_word_embeddings"),
    (dict(hidden_size=100, quantization_config={"quant_method": "mxfp4"}), "hidden_size"),
    (dict(quantization_config={"quant_method": "gptq"}), "quantization_config"),
])
def test_validation_names_the_field(change, field):
    with pytest.raises(ValueError, match=rf"GptOssConfig\.{field}"):
        preset("tiny").replace(**change)


def test_missing_key_names_the_field():
    d = preset("tiny").to_hf_dict()
    del d["sliding_window"]
    with pytest.raises(ValueError, match=r"GptOssConfig\.sliding_window"):
        GptOssConfig.from_hf_dict(d)


def test_unknown_preset():
    with pytest.raises(ValueError, match="unknown preset"):
        preset("gpt-oss-7b")
