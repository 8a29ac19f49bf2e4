"""The gpt-oss model configuration: one dataclass, HF config.json in and out, named presets.

`GptOssConfig` holds every number the engine's forward pass relies on (DESIGN §7). It reads
the HF `config.json` of a gpt-oss checkpoint (`from_hf_dict` / `from_json_file`) and writes
the same layout back (`to_hf_dict`), so a synthetic checkpoint made here loads in HF
transformers too.

RoPE: released checkpoints carry `rope_scaling` plus a top-level `rope_theta`; transformers
>= 5 writes `rope_parameters` (with `rope_theta` inside) instead. Both are read; `to_hf_dict`
writes the released layout.

Presets (`preset(name)`):
  gpt-oss-20b, gpt-oss-120b   the real shapes
  tiny                        4 layers, hidden 96: every structural feature, small and fast
  small                       6 layers, hidden 160, 8 experts top-4, window 16
  tiny-d24, tiny-d36          narrow models with the real depths, for layer-ID checks
  tiny-parallel               16 q / 8 KV heads, 8 experts: every TP in 1..8, EP in 1..8
  tiny-vocab8                 2 layers, 8-token vocabulary: exact output distributions (specs of kind
                              `distribution`)
Every invalid field raises a ValueError that names the field.
"""

from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

SLIDING = "sliding_attention"
FULL = "full_attention"

# The quantization_config the released MXFP4 checkpoints carry.
MXFP4_QUANTIZATION_CONFIG = {
    "quant_method": "mxfp4",
    "modules_to_not_convert": [
        "model.layers.*.self_attn",
        "model.layers.*.mlp.router",
        "model.embed_tokens",
        "lm_head",
    ],
}


def alternating_layer_types(num_layers: int) -> tuple[str, ...]:
    """gpt-oss layout: even layers slide, odd layers attend to everything."""
    return tuple(SLIDING if i % 2 == 0 else FULL for i in range(num_layers))


@dataclass(frozen=True)
class RopeParams:
    """RoPE parameters. rope_type "yarn" (gpt-oss) or "default" (plain RoPE, no scaling)."""

    rope_type: str = "yarn"
    theta: float = 150000.0
    factor: float = 32.0
    original_max_position_embeddings: int = 4096
    beta_fast: float = 32.0
    beta_slow: float = 1.0
    truncate: bool = False


@dataclass(frozen=True)
class GptOssConfig:
    vocab_size: int = 201088
    hidden_size: int = 2880
    intermediate_size: int = 2880
    num_hidden_layers: int = 36
    num_attention_heads: int = 64
    num_key_value_heads: int = 8
    head_dim: int = 64
    sliding_window: int = 128
    layer_types: tuple[str, ...] = ()          # empty -> alternating, layer 0 sliding
    rope: RopeParams = RopeParams()
    num_local_experts: int = 128
    num_experts_per_tok: int = 4               # top-k
    swiglu_limit: float = 7.0
    swiglu_alpha: float = 1.702
    rms_norm_eps: float = 1e-5
    max_position_embeddings: int = 131072
    eos_token_id: tuple[int, ...] = (200002, 199999, 200012)
    pad_token_id: int | None = 199999
    bos_token_id: int | None = None
    attention_bias: bool = True
    tie_word_embeddings: bool = False
    quantization_config: dict | None = field(default=None, compare=False)

    def __post_init__(self):
        if not self.layer_types:
            object.__setattr__(self, "layer_types", alternating_layer_types(self.num_hidden_layers))
        object.__setattr__(self, "layer_types", tuple(self.layer_types))
        object.__setattr__(self, "eos_token_id", tuple(self.eos_token_id))
        self.validate()

    # ------------------------------------------------------------------ derived values
    @property
    def q_dim(self) -> int:
        return self.num_attention_heads * self.head_dim

    @property
    def kv_dim(self) -> int:
        return self.num_key_value_heads * self.head_dim

    @property
    def is_mxfp4(self) -> bool:
        return bool(self.quantization_config) and self.quantization_config.get("quant_method") == "mxfp4"

    def window(self, layer: int) -> int:
        """Keys a query of this layer sees: sliding_window, or 0 meaning all earlier keys."""
        return self.sliding_window if self.layer_types[layer] == SLIDING else 0

    def replace(self, **changes) -> "GptOssConfig":
        return dataclasses.replace(self, **changes)

    # ------------------------------------------------------------------ validation
    def validate(self) -> None:
        def bad(name: str, why: str):
            raise ValueError(f"GptOssConfig.{name}: {why}, got {getattr(self, name, None)!r}")

        for name in ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
                     "num_attention_heads", "num_key_value_heads", "head_dim", "sliding_window",
                     "num_local_experts", "num_experts_per_tok", "max_position_embeddings"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                bad(name, "must be a positive int")
        if self.num_attention_heads % self.num_key_value_heads:
            bad("num_key_value_heads", f"must divide num_attention_heads ({self.num_attention_heads})")
        if self.head_dim % 2:
            bad("head_dim", "must be even (half-split RoPE)")
        if self.num_experts_per_tok > self.num_local_experts:
            bad("num_experts_per_tok", f"must be <= num_local_experts ({self.num_local_experts})")
        if len(self.layer_types) != self.num_hidden_layers:
            bad("layer_types", f"must list one type per layer ({self.num_hidden_layers})")
        for t in self.layer_types:
            if t not in (SLIDING, FULL):
                bad("layer_types", f"entries must be {SLIDING!r} or {FULL!r}")
        for name in ("swiglu_limit", "swiglu_alpha", "rms_norm_eps"):
            v = getattr(self, name)
            if not isinstance(v, (int, float)) or isinstance(v, bool) or not (v > 0 and math.isfinite(v)):
                bad(name, "must be a positive finite number")
        if not self.eos_token_id:
            bad("eos_token_id", "must list at least one token id")
        for t in self.eos_token_id:
            if isinstance(t, bool) or not isinstance(t, int) or not 0 <= t < self.vocab_size:
                bad("eos_token_id", f"ids must be ints in [0, vocab_size={self.vocab_size})")
        if self.attention_bias is not True:
            bad("attention_bias", "gpt-oss has q/k/v/o biases; only true is supported")
        if self.tie_word_embeddings is not False:
            bad("tie_word_embeddings", "gpt-oss has an untied lm_head; only false is supported")
        r = self.rope
        if r.rope_type not in ("yarn", "default"):
            bad("rope", "rope_type must be 'yarn' or 'default'")
        if not r.theta > 0:
            bad("rope", "rope_theta must be > 0")
        if r.rope_type == "yarn":
            if not r.factor >= 1:
                bad("rope", "yarn factor must be >= 1")
            if not (r.original_max_position_embeddings >= 1 and r.beta_fast > 0 and r.beta_slow > 0):
                bad("rope", "yarn needs original_max_position_embeddings >= 1 and beta_fast, beta_slow > 0")
        q = self.quantization_config
        if q is not None:
            if not isinstance(q, dict) or "quant_method" not in q:
                bad("quantization_config", "must be a dict with a quant_method")
            if q["quant_method"] != "mxfp4":
                bad("quantization_config", "only quant_method 'mxfp4' is supported")
            if self.hidden_size % 32:
                bad("hidden_size", "must be a multiple of 32 for MXFP4 experts")
            if self.intermediate_size % 32:
                bad("intermediate_size", "must be a multiple of 32 for MXFP4 experts")

    # ------------------------------------------------------------------ HF config.json
    @classmethod
    def from_hf_dict(cls, d: dict[str, Any]) -> "GptOssConfig":
        """Read an HF gpt-oss config.json dict (released or transformers>=5 rope layout)."""
        if d.get("model_type", "gpt_oss") != "gpt_oss":
            raise ValueError(f"GptOssConfig.model_type: expected 'gpt_oss', got {d.get('model_type')!r}")

        def need(key):
            if key not in d:
                raise ValueError(f"GptOssConfig.{key}: missing from config.json")
            return d[key]

        rope_src = d.get("rope_parameters") or d.get("rope_scaling") or {}
        if not isinstance(rope_src, dict):
            raise ValueError(f"GptOssConfig.rope: rope_parameters/rope_scaling must be a dict, got {rope_src!r}")
        theta = rope_src.get("rope_theta", d.get("rope_theta", 150000.0))
        rope_type = rope_src.get("rope_type", rope_src.get("type", "yarn" if rope_src else "default"))
        rope = RopeParams(
            rope_type=rope_type,
            theta=float(theta),
            factor=float(rope_src.get("factor", 1.0)),
            original_max_position_embeddings=int(rope_src.get("original_max_position_embeddings",
                                                              d.get("initial_context_length", 4096))),
            beta_fast=float(rope_src.get("beta_fast") or 32.0),
            beta_slow=float(rope_src.get("beta_slow") or 1.0),
            truncate=bool(rope_src.get("truncate", True)),  # HF's default when the key is absent
        )
        eos = d.get("eos_token_id")
        eos = [eos] if isinstance(eos, int) else list(eos or [])
        top_k = d.get("num_experts_per_tok", d.get("experts_per_token"))
        if top_k is None:
            raise ValueError("GptOssConfig.num_experts_per_tok: missing from config.json")
        return cls(
            vocab_size=need("vocab_size"),
            hidden_size=need("hidden_size"),
            intermediate_size=need("intermediate_size"),
            num_hidden_layers=need("num_hidden_layers"),
            num_attention_heads=need("num_attention_heads"),
            num_key_value_heads=need("num_key_value_heads"),
            head_dim=d.get("head_dim") or need("hidden_size") // need("num_attention_heads"),
            sliding_window=need("sliding_window"),
            layer_types=tuple(d.get("layer_types") or ()),
            rope=rope,
            num_local_experts=d.get("num_local_experts", d.get("num_experts")),
            num_experts_per_tok=top_k,
            swiglu_limit=d.get("swiglu_limit", 7.0),
            swiglu_alpha=d.get("swiglu_alpha", 1.702),
            rms_norm_eps=d.get("rms_norm_eps", 1e-5),
            max_position_embeddings=need("max_position_embeddings"),
            eos_token_id=tuple(eos),
            pad_token_id=d.get("pad_token_id"),
            bos_token_id=d.get("bos_token_id"),
            attention_bias=d.get("attention_bias", True),
            tie_word_embeddings=d.get("tie_word_embeddings", False),
            quantization_config=d.get("quantization_config"),
        )

    @classmethod
    def from_json_file(cls, path: str | Path) -> "GptOssConfig":
        with open(path, encoding="utf-8") as f:
            return cls.from_hf_dict(json.load(f))

    def to_hf_dict(self) -> dict[str, Any]:
        """The HF config.json layout of a released gpt-oss checkpoint."""
        r = self.rope
        d: dict[str, Any] = {
            "architectures": ["GptOssForCausalLM"],
            "model_type": "gpt_oss",
            "attention_bias": self.attention_bias,
            "attention_dropout": 0.0,
            "eos_token_id": list(self.eos_token_id),
            "experts_per_token": self.num_experts_per_tok,
            "head_dim": self.head_dim,
            "hidden_act": "silu",
            "hidden_size": self.hidden_size,
            "initial_context_length": r.original_max_position_embeddings,
            "initializer_range": 0.02,
            "intermediate_size": self.intermediate_size,
            "layer_types": list(self.layer_types),
            "max_position_embeddings": self.max_position_embeddings,
            "num_attention_heads": self.num_attention_heads,
            "num_experts_per_tok": self.num_experts_per_tok,
            "num_hidden_layers": self.num_hidden_layers,
            "num_key_value_heads": self.num_key_value_heads,
            "num_local_experts": self.num_local_experts,
            "output_router_logits": False,
            "rms_norm_eps": self.rms_norm_eps,
            "rope_theta": r.theta,
            "router_aux_loss_coef": 0.9,
            "sliding_window": self.sliding_window,
            "swiglu_alpha": self.swiglu_alpha,
            "swiglu_limit": self.swiglu_limit,
            "tie_word_embeddings": self.tie_word_embeddings,
            "torch_dtype": "bfloat16",
            "use_cache": True,
            "vocab_size": self.vocab_size,
        }
        if r.rope_type == "yarn":
            d["rope_scaling"] = {
                "rope_type": "yarn",
                "factor": r.factor,
                "beta_fast": r.beta_fast,
                "beta_slow": r.beta_slow,
                "original_max_position_embeddings": r.original_max_position_embeddings,
                "truncate": r.truncate,
            }
        if self.pad_token_id is not None:
            d["pad_token_id"] = self.pad_token_id
        if self.bos_token_id is not None:
            d["bos_token_id"] = self.bos_token_id
        if self.quantization_config is not None:
            d["quantization_config"] = dict(self.quantization_config)
        return dict(sorted(d.items()))


# ---------------------------------------------------------------------- presets
def _tiny_family(**changes) -> GptOssConfig:
    """Small shapes, real gpt-oss conventions (YaRN params, sinks, GQA, alternating window)."""
    base = dict(
        vocab_size=512, hidden_size=96, intermediate_size=64, num_hidden_layers=4,
        num_attention_heads=4, num_key_value_heads=2, head_dim=32, sliding_window=8,
        num_local_experts=4, num_experts_per_tok=2, eos_token_id=(509, 510, 511),
        pad_token_id=508, max_position_embeddings=131072,
    )
    base.update(changes)
    return GptOssConfig(**base)


PRESETS = {
    "gpt-oss-20b": lambda: GptOssConfig(num_hidden_layers=24, num_local_experts=32),
    "gpt-oss-120b": lambda: GptOssConfig(num_hidden_layers=36, num_local_experts=128),
    "tiny": lambda: _tiny_family(),
    "small": lambda: _tiny_family(vocab_size=1024, hidden_size=160, intermediate_size=96,
                                  num_hidden_layers=6, num_attention_heads=8, num_key_value_heads=2,
                                  sliding_window=16, num_local_experts=8, num_experts_per_tok=4,
                                  eos_token_id=(1021, 1022, 1023), pad_token_id=1020),
    "tiny-parallel": lambda: _tiny_family(vocab_size=512, hidden_size=64, intermediate_size=64,
                                          num_hidden_layers=2, num_attention_heads=16,
                                          num_key_value_heads=8, head_dim=16, num_local_experts=8),
    "tiny-d24": lambda: _tiny_family(vocab_size=256, hidden_size=32, intermediate_size=32,
                                     num_hidden_layers=24, num_attention_heads=2, num_key_value_heads=1,
                                     head_dim=16, eos_token_id=(253, 254, 255), pad_token_id=252),
    "tiny-d36": lambda: _tiny_family(vocab_size=256, hidden_size=32, intermediate_size=32,
                                     num_hidden_layers=36, num_attention_heads=2, num_key_value_heads=1,
                                     head_dim=16, eos_token_id=(253, 254, 255), pad_token_id=252),
    "tiny-top3": lambda: _tiny_family(num_local_experts=6, num_experts_per_tok=3),   # k and E not powers of two
    "tiny-vocab8": lambda: _tiny_family(vocab_size=8, hidden_size=32, intermediate_size=32,
                                        num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1,
                                        head_dim=16, eos_token_id=(7,), pad_token_id=6),
}


def preset(name: str) -> GptOssConfig:
    """A named configuration (see the module docstring). Unquantized; checkpoints add MXFP4."""
    if name not in PRESETS:
        raise ValueError(f"unknown preset {name!r}; known: {sorted(PRESETS)}")
    return PRESETS[name]()
