"""The EAGLE3 draft's checkpoint half (DESIGN §4): its config, the tensors a config implies,
reading and checking a draft folder, and writing synthetic drafts. The head is engine.eagle3.

Checkpoints use the SpecForge / EAGLE3 naming (`midlayer.*`; `layers.0.*` is read too, and the
legacy `aux_norm_{low,mid,high}` for `fc_norm.{0,1,2}`):

    fc.weight                               [H_draft, A]
    input_norm.weight                       [A]            iff norm_before_fc
    fc_norm.{i}.weight                      [H_target]     iff fc_norm (i < n_aux)
    embed_tokens.weight                     [V, H_draft]   optional: else the target's (needs H_draft == H_target)
    midlayer.input_layernorm.weight         [H_draft]
    midlayer.hidden_norm.weight             [H_draft]
    midlayer.self_attn.q_proj.weight        [Hq*D, 2*H_draft]      (k_proj, v_proj: [Hkv*D, 2*H_draft])
    midlayer.self_attn.o_proj.weight        [H_draft, Hq*D]
    midlayer.post_attention_layernorm.weight [H_draft]
    midlayer.mlp.{gate,up}_proj.weight      [I, H_draft];  midlayer.mlp.down_proj.weight [H_draft, I]
    norm.weight                             [H_draft]
    lm_head.weight                          [V_draft, H_draft]
    d2t                                     [V_draft] int64;  t2d [V] bool (optional, not used)
                                            (d2t may be absent iff V_draft == V: the identity map)

config.json: `LlamaForCausalLMEagle3` fields plus `draft_vocab_size`, `target_hidden_size`, and
`eagle_config` {eagle_aux_hidden_state_layer_ids, norm_before_fc, use_aux_hidden_state};
`eagle_aux_hidden_state_layer_ids`, `norm_before_fc` and `fc_norm` fall back to the top level.
The layer ids are resolved by engine.boundaries under a convention the caller names.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

import torch
from safetensors import safe_open
from safetensors.torch import save_file

from lockstep.engine.boundaries import LayerIdError, aux_layer_ids_from_draft_config
from lockstep.engine.checkpoint import CheckpointError, write_folder_atomically
from lockstep.engine.config import GptOssConfig, preset
from lockstep.kernels import portable


DRAFT_FILE = "model.safetensors"


AUX_NORM_LEGACY = ("aux_norm_low", "aux_norm_mid", "aux_norm_high")


def _flag(d: dict[str, Any], key: str) -> bool:
    """`key` from eagle_config first, then the top level; absent -> False."""
    for source in (d.get("eagle_config") or {}, d):
        if key in source and source[key] is not None:
            v = source[key]
            if not isinstance(v, bool):
                raise ValueError(f"Eagle3Config.{key}: must be a bool, got {v!r}")
            return v
    return False


@dataclass(frozen=True)
class Eagle3Config:
    hidden_size: int                   # H_draft
    intermediate_size: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    vocab_size: int                    # the target vocabulary
    draft_vocab_size: int
    target_hidden_size: int | None     # None: same as hidden_size
    aux_layer_ids: tuple[int, ...] | None
    norm_before_fc: bool = False
    fc_norm: bool = False
    rope_theta: float = 10000.0
    rms_norm_eps: float = 1e-5
    max_position_embeddings: int = 131072
    name: str = "draft"                # used in error messages (the checkpoint path)

    def __post_init__(self):
        for f in ("hidden_size", "intermediate_size", "num_attention_heads", "num_key_value_heads",
                  "head_dim", "vocab_size", "draft_vocab_size", "max_position_embeddings"):
            v = getattr(self, f)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"Eagle3Config.{f}: must be a positive int, got {v!r}")
        if self.num_attention_heads % self.num_key_value_heads:
            raise ValueError(f"Eagle3Config.num_key_value_heads: must divide num_attention_heads "
                             f"({self.num_attention_heads}), got {self.num_key_value_heads}")
        if self.head_dim % 2:
            raise ValueError(f"Eagle3Config.head_dim: must be even, got {self.head_dim}")
        if self.draft_vocab_size > self.vocab_size:
            raise ValueError(f"Eagle3Config.draft_vocab_size: {self.draft_vocab_size} exceeds vocab_size "
                             f"{self.vocab_size}")
        if not (self.rope_theta > 0 and math.isfinite(self.rope_theta)):
            raise ValueError(f"Eagle3Config.rope_theta: must be > 0, got {self.rope_theta!r}")

    @classmethod
    def from_hf_dict(cls, d: dict[str, Any], name: str = "draft") -> "Eagle3Config":
        def need(key):
            if d.get(key) is None:
                raise ValueError(f"{name}: Eagle3Config.{key}: missing from config.json")
            return d[key]

        if d.get("num_hidden_layers", 1) != 1:
            raise ValueError(f"{name}: Eagle3Config.num_hidden_layers: only 1 draft layer is supported, "
                             f"got {d['num_hidden_layers']}")
        rs = d.get("rope_scaling")
        if rs and (rs.get("rope_type", rs.get("type")) not in (None, "default")):
            raise ValueError(f"{name}: Eagle3Config.rope_scaling: only plain Llama RoPE is supported, got {rs!r}")
        try:
            ids = aux_layer_ids_from_draft_config(d)
        except LayerIdError as e:                   # ids in both places that differ: name the config
            raise LayerIdError(f"{name}: {e}") from None
        V = need("vocab_size")
        return cls(
            hidden_size=need("hidden_size"), intermediate_size=need("intermediate_size"),
            num_attention_heads=need("num_attention_heads"),
            num_key_value_heads=d.get("num_key_value_heads") or need("num_attention_heads"),
            head_dim=d.get("head_dim") or need("hidden_size") // need("num_attention_heads"),
            vocab_size=V, draft_vocab_size=d.get("draft_vocab_size") or V,
            target_hidden_size=d.get("target_hidden_size"),
            aux_layer_ids=None if ids is None else tuple(ids),
            norm_before_fc=_flag(d, "norm_before_fc"),
            fc_norm=_flag(d, "fc_norm") or _flag(d, "use_aux_norm"),
            rope_theta=float(d.get("rope_theta") or 10000.0),
            rms_norm_eps=float(d.get("rms_norm_eps", 1e-5)),
            max_position_embeddings=d.get("max_position_embeddings", 131072),
            name=name,
        )

    def to_hf_dict(self, ids_at_top_level: bool = False) -> dict[str, Any]:
        eagle: dict[str, Any] = {"use_aux_hidden_state": True, "norm_before_fc": self.norm_before_fc}
        d: dict[str, Any] = {
            "architectures": ["LlamaForCausalLMEagle3"], "model_type": "llama",
            "hidden_size": self.hidden_size, "intermediate_size": self.intermediate_size,
            "num_hidden_layers": 1, "num_attention_heads": self.num_attention_heads,
            "num_key_value_heads": self.num_key_value_heads, "head_dim": self.head_dim,
            "hidden_act": "silu", "rms_norm_eps": self.rms_norm_eps, "rope_theta": self.rope_theta,
            "max_position_embeddings": self.max_position_embeddings, "vocab_size": self.vocab_size,
            "draft_vocab_size": self.draft_vocab_size, "tie_word_embeddings": False,
            "torch_dtype": "bfloat16", "eagle_config": eagle,
        }
        if self.target_hidden_size is not None:
            d["target_hidden_size"] = self.target_hidden_size
        if self.fc_norm:
            d["fc_norm"] = True
        if self.aux_layer_ids is not None:
            (d if ids_at_top_level else eagle)["eagle_aux_hidden_state_layer_ids"] = list(self.aux_layer_ids)
        return dict(sorted(d.items()))


def expected_draft_tensors(cfg: Eagle3Config, n_aux: int, target_hidden: int,
                           with_embed: bool) -> dict[str, tuple[tuple[int, ...], str]]:
    """name -> (shape, kind) in the SpecForge layout (see the module docstring)."""
    H, I, D = cfg.hidden_size, cfg.intermediate_size, cfg.head_dim
    Hq, Hkv, V, Vd = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.vocab_size, cfg.draft_vocab_size
    A = n_aux * target_hidden
    t: dict[str, tuple[tuple[int, ...], str]] = {}
    if with_embed:
        t["embed_tokens.weight"] = ((V, H), "float")
    if cfg.norm_before_fc:
        t["input_norm.weight"] = ((A,), "float")
    if cfg.fc_norm:
        for i in range(n_aux):
            t[f"fc_norm.{i}.weight"] = ((target_hidden,), "float")
    t["fc.weight"] = ((H, A), "float")
    p = "midlayer."
    t[p + "input_layernorm.weight"] = ((H,), "float")
    t[p + "hidden_norm.weight"] = ((H,), "float")
    t[p + "self_attn.q_proj.weight"] = ((Hq * D, 2 * H), "float")
    t[p + "self_attn.k_proj.weight"] = ((Hkv * D, 2 * H), "float")
    t[p + "self_attn.v_proj.weight"] = ((Hkv * D, 2 * H), "float")
    t[p + "self_attn.o_proj.weight"] = ((H, Hq * D), "float")
    t[p + "post_attention_layernorm.weight"] = ((H,), "float")
    t[p + "mlp.gate_proj.weight"] = ((I, H), "float")
    t[p + "mlp.up_proj.weight"] = ((I, H), "float")
    t[p + "mlp.down_proj.weight"] = ((H, I), "float")
    t["norm.weight"] = ((H,), "float")
    t["lm_head.weight"] = ((Vd, H), "float")
    t["d2t"] = ((Vd,), "int")             # optional when Vd == V (see Eagle3Draft)
    return t


def _canonical_name(name: str) -> str:
    if name.startswith("layers.0."):
        return "midlayer." + name[len("layers.0."):]
    for i, legacy in enumerate(AUX_NORM_LEGACY):
        if name == legacy + ".weight":
            return f"fc_norm.{i}.weight"
    return name


def _check_tensors(name: str, cfg: Eagle3Config, weights: dict, expected: dict) -> None:
    """The checkpoint's tensors are exactly those config.json implies, each of its shape and kind."""
    missing = [n for n in expected if n not in weights]
    unexpected = [n for n in weights if n not in expected and n != "t2d"]
    if missing or unexpected:
        hint = ""
        if "input_norm.weight" in unexpected:
            hint = " (input_norm.weight is present but norm_before_fc is false)"
        if "input_norm.weight" in missing:
            hint = " (norm_before_fc is true but input_norm.weight is missing)"
        if "d2t" in missing:
            hint = (f" (no d2t, but the draft vocabulary ({cfg.draft_vocab_size}) is smaller than the "
                    f"target's ({cfg.vocab_size}))")
        raise CheckpointError(f"{name}: tensors do not match config.json{hint}: missing {missing}, "
                              f"unexpected {unexpected}")
    for n, (shape, kind) in expected.items():
        t = weights[n]
        if tuple(t.shape) != shape:
            raise CheckpointError(f"{name}: tensor {n}: shape {tuple(t.shape)}, expected {shape}")
        if kind == "int" and t.dtype not in (torch.int64, torch.int32):
            raise CheckpointError(f"{name}: tensor {n}: dtype {t.dtype}, expected int64")
        if kind == "float" and not t.dtype.is_floating_point:
            raise CheckpointError(f"{name}: tensor {n}: dtype {t.dtype}, expected a float dtype")


def _shared_embed(name: str, cfg: Eagle3Config, target_embed: torch.Tensor | None, Ht: int,
                  device: torch.device, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """A draft without embed_tokens.weight reads the target's full embedding table."""
    if target_embed is None or cfg.hidden_size != Ht:
        raise CheckpointError(f"{name}: no embed_tokens.weight, and the target's embedding cannot be "
                              f"shared (pass the target model; hidden sizes {cfg.hidden_size} vs {Ht})")
    if tuple(target_embed.shape) != (cfg.vocab_size, Ht):      # e.g. a vocab-parallel shard
        raise CheckpointError(f"{name}: no embed_tokens.weight, and the target embedding passed is "
                              f"{tuple(target_embed.shape)}, not the full [{cfg.vocab_size}, {Ht}] "
                              f"(a sharded target: pass target_embed=the checkpoint's table)")
    return target_embed.to(device, dtype)           # the target's own table when it is already `dtype`


def _check_d2t(name: str, cfg: Eagle3Config, hot_ids: torch.Tensor) -> None:
    """d2t must map the draft vocabulary one to one into the target's."""
    bad = (hot_ids < 0) | (hot_ids >= cfg.vocab_size)
    if bool(bad.any()):
        d = int(bad.nonzero()[0, 0])
        raise CheckpointError(f"{name}: d2t maps draft id {d} to target id {int(hot_ids[d])}, outside "
                              f"[0, {cfg.vocab_size})")
    if len(set(hot_ids.tolist())) != cfg.draft_vocab_size:
        raise CheckpointError(f"{name}: d2t maps two draft ids to one target id")


def read_draft(path: str | Path) -> tuple[Eagle3Config, dict[str, torch.Tensor]]:
    """A draft folder's config.json and every tensor of its .safetensors files, as stored."""
    path = Path(path)
    if not (path / "config.json").exists():
        raise CheckpointError(f"{path}: no config.json")
    with open(path / "config.json", encoding="utf-8") as f:
        cfg = Eagle3Config.from_hf_dict(json.load(f), name=str(path))
    files = sorted(path.glob("*.safetensors"))
    if not files:
        raise CheckpointError(f"{path}: no .safetensors file")
    weights: dict[str, torch.Tensor] = {}
    for file in files:
        with safe_open(file, framework="pt") as f:
            for n in f.keys():
                weights[n] = f.get_tensor(n)
    return cfg, weights


def synthetic_draft_weights(cfg: Eagle3Config, n_aux: int, target_hidden: int, seed: int,
                            hot_ids: Sequence[int] | None = None, with_embed: bool = True,
                            with_d2t: bool = True) -> dict[str, torch.Tensor]:
    """Deterministic random draft weights (bf16 floats; d2t int64, t2d bool; without d2t and t2d
    when `with_d2t` is false, which needs the full target vocabulary)."""
    g = torch.Generator().manual_seed(seed)
    out: dict[str, torch.Tensor] = {}
    for name, (shape, kind) in expected_draft_tensors(cfg, n_aux, target_hidden, with_embed).items():
        if kind == "int":
            continue
        if "norm" in name:                                     # every RMSNorm weight
            w = 1.0 + 0.1 * portable.normal(shape, g)
            if name == "input_norm.weight" or name.startswith("fc_norm."):
                w = 0.25 + 1.5 * torch.rand(shape, generator=g)   # far from 1: the norms must matter
        elif name == "embed_tokens.weight":
            w = portable.normal(shape, g)
        else:
            w = portable.normal(shape, g) / math.sqrt(shape[-1])
        out[name] = w.to(torch.bfloat16).contiguous()
    V, Vd = cfg.vocab_size, cfg.draft_vocab_size
    if not with_d2t:
        if Vd != V:
            raise ValueError(f"synthetic_draft_weights: a draft without d2t needs draft_vocab_size == vocab_size "
                             f"({V}), got {Vd}")
        return out
    if hot_ids is None:
        hot_ids = sorted(torch.randperm(V, generator=g)[:Vd].tolist())
    hot = torch.tensor(list(hot_ids), dtype=torch.int64)
    out["d2t"] = hot - torch.arange(Vd, dtype=torch.int64)
    t2d = torch.zeros(V, dtype=torch.bool)
    t2d[hot] = True
    out["t2d"] = t2d
    return out


def write_draft(out_dir: str | Path, cfg: Eagle3Config, tensors: dict[str, torch.Tensor],
                overwrite: bool = False, ids_at_top_level: bool = False) -> Path:
    """Write config.json + model.safetensors atomically (temp dir beside out_dir, then rename)."""
    out_dir = Path(out_dir)
    if out_dir.exists() and (not out_dir.is_dir() or any(out_dir.iterdir())) and not overwrite:
        raise FileExistsError(f"write_draft: {out_dir} exists and is not empty (pass overwrite=True)")

    def write(tmp: Path) -> None:
        save_file({n: tensors[n].contiguous() for n in sorted(tensors)}, str(tmp / DRAFT_FILE),
                  metadata={"format": "pt"})
        (tmp / "config.json").write_text(json.dumps(cfg.to_hf_dict(ids_at_top_level), indent=2, sort_keys=True)
                                         + "\n", encoding="utf-8")

    return write_folder_atomically(out_dir, write)


def make_draft_checkpoint(target: str | GptOssConfig, seed: int, out_dir: str | Path, *,
                          aux_layer_ids: Sequence[int] | None = None, n_aux: int = 3,
                          norm_before_fc: bool = False, fc_norm: bool = False,
                          hidden_size: int | None = None, intermediate_size: int | None = None,
                          num_attention_heads: int = 2, num_key_value_heads: int = 1, head_dim: int | None = None,
                          draft_vocab_size: int | None = None, rope_theta: float = 10000.0,
                          ids_at_top_level: bool = False, with_embed: bool = True, with_d2t: bool = True,
                          overwrite: bool = False) -> Path:
    """A synthetic EAGLE3 draft for a target preset (or config), in the SpecForge layout.
    Same arguments -> byte-identical files. Defaults: H_draft = target hidden, draft vocab = half
    the target vocab (a seeded random subset, so d2t is not trivial); with_d2t=False: the full
    target vocabulary and no d2t / t2d tensors (draft id d is target id d)."""
    tc = preset(target) if isinstance(target, str) else target
    H = hidden_size or tc.hidden_size
    heads = num_attention_heads
    cfg = Eagle3Config(
        hidden_size=H, intermediate_size=intermediate_size or 2 * H, num_attention_heads=heads,
        num_key_value_heads=num_key_value_heads, head_dim=head_dim or max(2, (H // heads) // 2 * 2),
        vocab_size=tc.vocab_size,
        draft_vocab_size=draft_vocab_size or (tc.vocab_size // 2 if with_d2t else tc.vocab_size),
        target_hidden_size=tc.hidden_size, aux_layer_ids=None if aux_layer_ids is None else tuple(aux_layer_ids),
        norm_before_fc=norm_before_fc, fc_norm=fc_norm, rope_theta=rope_theta, rms_norm_eps=tc.rms_norm_eps,
        max_position_embeddings=tc.max_position_embeddings)
    tensors = synthetic_draft_weights(cfg, n_aux, tc.hidden_size, seed, with_embed=with_embed, with_d2t=with_d2t)
    return write_draft(out_dir, cfg, tensors, overwrite=overwrite, ids_at_top_level=ids_at_top_level)
