"""What one rank of a TP × EP topology holds of a checkpoint, read through safetensors slices.

    share = RankShare.of(config, Topology(tp=2, ep=2), rank=3)
    config, weights = load_rank(ckpt_dir, Topology(2, 2), rank=3)      # only rank 3's bytes are read

The rank's share (engine/parallel.py's layout) in the checkpoint's own names and layout:

    embed_tokens, lm_head      vocab rows [tp_rank * V/tp, ...)
    q_proj / k_proj / v_proj   this rank's query / KV heads' rows (weight and bias)
    o_proj.weight              the columns of this rank's query heads (its K chunks)
    sinks                      this rank's query heads
    experts                    this EP group's experts; gate_up: the rows (MXFP4) or columns (dense)
                               of this rank's intermediate range, gate/up pairs together; down: the
                               intermediate range as K; the gate_up bias likewise
    everything else            whole (norms, router, o_proj and down biases: replicated)

MXFP4 experts stay packed (`*_blocks`, `*_scales`, as the one-device model keeps them). Packing runs
along K in blocks of 32, so down's K range is packed only where it falls on whole blocks (at TP 1
always; gpt-oss's 2880 at TP 2); elsewhere (TP 4, 8) the rank gets the blocks that cover its
range as an Mxfp4Columns window, decoded one expert at a time by the torch ops, or (for the
Triton ops, whose kernels read whole blocks) decoded once here: exact either way, so the bits are
the one-device model's. Floats keep the checkpoint's dtype (the model casts them once, as it
casts a whole checkpoint's). Names, shapes and dtypes are checked against config.json from the
files' headers, and the scales a rank holds for E8M0 NaN, as load_checkpoint checks them.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open

from lockstep.engine import mxfp4
from lockstep.engine.checkpoint import (CheckpointError, _read_config, _tensor_files, check_layout,
                                        refuse_nan_scales)
from lockstep.engine.config import GptOssConfig
from lockstep.engine.distributed import Topology
from lockstep.engine.linear import K_CHUNKS, k_chunk_bounds
from lockstep.engine.mxfp4 import Mxfp4Columns

Range = tuple[int, int]

_DTYPES = {"BF16": torch.bfloat16, "F16": torch.float16, "F32": torch.float32, "U8": torch.uint8,
           "F64": torch.float64, "I64": torch.int64, "I32": torch.int32}


@dataclass(frozen=True)
class RankShare:
    """The index ranges one rank of a topology holds (engine/parallel.py's layout)."""
    tp: int
    tp_rank: int
    ep: int
    ep_rank: int
    vocab: Range                 # embedding and lm_head rows
    q_rows: Range                # q_proj rows, o_proj columns
    kv_rows: Range               # k_proj and v_proj rows
    heads: Range                 # sinks
    inter: Range                 # the intermediate range [i_lo, i_hi) (this rank's K chunks of down)
    down_bounds: tuple           # those K chunks' bounds, relative to i_lo
    experts: Range               # this EP group's experts

    @classmethod
    def of(cls, config: GptOssConfig, topology: Topology, rank: int) -> "RankShare":
        tp, ep = topology.tp, topology.ep
        tr, er = rank % tp, rank // tp
        V, D = config.vocab_size, config.head_dim
        hq, hkv = config.num_attention_heads // tp, config.num_key_value_heads // tp
        per = K_CHUNKS // tp
        chunks = k_chunk_bounds(config.intermediate_size)[tr * per:(tr + 1) * per]
        lo, hi = chunks[0][0], chunks[-1][1]
        n_local = config.num_local_experts // ep
        return cls(tp, tr, ep, er, (tr * V // tp, (tr + 1) * V // tp), (tr * hq * D, (tr + 1) * hq * D),
                   (tr * hkv * D, (tr + 1) * hkv * D), (tr * hq, (tr + 1) * hq), (lo, hi),
                   tuple((a - lo, b - lo) for a, b in chunks), (er * n_local, (er + 1) * n_local))

    @property
    def blocks_whole(self) -> bool:
        """Whether the intermediate range falls on whole MXFP4 blocks (down stays packed)."""
        return self.inter[0] % mxfp4.BLOCK == 0 and self.inter[1] % mxfp4.BLOCK == 0


def tensor_slices(config: GptOssConfig, share: RankShare) -> dict[str, tuple]:
    """name -> the index (a tuple of slices, one per leading dim) of the rank's part of each checkpoint
    tensor; () for a tensor held whole. Down's MXFP4 entries cover the blocks that hold its range."""
    s = lambda r: slice(*r)                                                     # noqa: E731
    every = slice(None)
    e, (ilo, ihi) = s(share.experts), share.inter
    b0, b1 = ilo // mxfp4.BLOCK, -(-ihi // mxfp4.BLOCK)
    out = {"model.embed_tokens.weight": (s(share.vocab),), "lm_head.weight": (s(share.vocab),),
           "model.norm.weight": ()}
    for n in range(config.num_hidden_layers):
        p, a, x = f"model.layers.{n}.", f"model.layers.{n}.self_attn.", f"model.layers.{n}.mlp.experts."
        out.update({p + "input_layernorm.weight": (), p + "post_attention_layernorm.weight": (),
                    p + "mlp.router.weight": (), p + "mlp.router.bias": (),
                    a + "o_proj.bias": (), x + "down_proj_bias": (),
                    a + "q_proj.weight": (s(share.q_rows),), a + "q_proj.bias": (s(share.q_rows),),
                    a + "o_proj.weight": (every, s(share.q_rows)), a + "sinks": (s(share.heads),),
                    x + "gate_up_proj_bias": (e, slice(2 * ilo, 2 * ihi))})
        for kv in "kv":
            out[a + f"{kv}_proj.weight"] = out[a + f"{kv}_proj.bias"] = (s(share.kv_rows),)
        if config.is_mxfp4:                                                     # [E, out, in/32, 16]
            for suffix in ("_blocks", "_scales"):
                out[x + "gate_up_proj" + suffix] = (e, slice(2 * ilo, 2 * ihi))
                out[x + "down_proj" + suffix] = (e, every, slice(b0, b1))
        else:                                                                   # HF [E, in, out]
            out[x + "gate_up_proj"] = (e, every, slice(2 * ilo, 2 * ihi))
            out[x + "down_proj"] = (e, slice(ilo, ihi))
    return out


def _headers(files: dict[str, Path]) -> dict[str, tuple[tuple[int, ...], torch.dtype]]:
    """name -> (shape, dtype) from the safetensors headers alone."""
    out = {}
    for shard in sorted(set(files.values())):
        try:
            with safe_open(shard, framework="pt") as f:
                for name in f.keys():
                    sl = f.get_slice(name)
                    out[name] = (tuple(sl.get_shape()), _DTYPES.get(sl.get_dtype(), sl.get_dtype()))
        except (SafetensorError, OSError, ValueError) as e:
            raise CheckpointError(f"{shard}: not a readable safetensors file ({e})") from None
    return out


def _read_slices(files: dict[str, Path], index: dict[str, tuple]) -> dict[str, torch.Tensor]:
    """Each tensor's part named by `index`, read through get_slice (only those bytes)."""
    out = {}
    for shard in sorted(set(files.values())):
        try:
            with safe_open(shard, framework="pt") as f:
                for name in (n for n, s in files.items() if s == shard):
                    where = index[name]
                    out[name] = f.get_slice(name)[where] if where else f.get_tensor(name)
        except (SafetensorError, OSError, ValueError, RuntimeError) as e:
            raise CheckpointError(f"{shard}: not a readable safetensors file ({e})") from None
    return out


def load_rank(path: str | Path, topology: Topology, rank: int, windows: bool = True
              ) -> tuple[GptOssConfig, dict[str, torch.Tensor]]:
    """-> (config, the rank's weights): HF names, each tensor its part (module docstring), in the
    checkpoint's dtype. MXFP4 experts packed; a down range off the block grid comes as an
    Mxfp4Columns under `...down_proj` with `windows`, else decoded (fp32, HF layout [E, I', H])."""
    path = Path(path)
    if not (path / "config.json").exists():
        raise CheckpointError(f"{path}: no config.json")
    config, float_dtype = _read_config(path)
    topology.check(config)
    files = _tensor_files(path)
    check_layout(path, config, float_dtype, files, _headers(files))
    share = RankShare.of(config, topology, rank)
    weights = _read_slices(files, tensor_slices(config, share))
    for name, t in weights.items():
        if name.endswith("_scales"):
            refuse_nan_scales(name, t)
    if config.is_mxfp4 and not share.blocks_whole:
        lo = share.inter[0] - share.inter[0] // mxfp4.BLOCK * mxfp4.BLOCK
        width = share.inter[1] - share.inter[0]
        for n in range(config.num_hidden_layers):
            x = f"model.layers.{n}.mlp.experts.down_proj"
            w = Mxfp4Columns(weights.pop(x + "_blocks"), weights.pop(x + "_scales"), lo, width)
            weights[x] = w if windows else w.dense(torch.float32).transpose(1, 2).contiguous()
    return config, weights


def held_bytes(path: str | Path, topology: Topology, rank: int, dtype: str = "fp32", windows: bool = True) -> int:
    """The bytes of weights the rank's model holds under dtype policy `dtype` ("fp32" or "bf16"),
    from the headers alone: matmul weights and embeddings in the policy's dtype, norms, biases and
    sinks in fp32, MXFP4 experts packed (a decoded down range in the policy's dtype)."""
    path = Path(path)
    config, _ = _read_config(path)
    act = 4 if dtype == "fp32" else 2
    share = RankShare.of(config, topology, rank)
    headers = _headers(_tensor_files(path))
    total = 0
    for name, where in tensor_slices(config, share).items():
        shape = list(headers[name][0])
        for d, sl in enumerate(where):
            shape[d] = len(range(*sl.indices(shape[d])))
        numel = 1
        for n in shape:
            numel *= n
        if name.endswith(("_blocks", "_scales")):
            decoded = "down_proj" in name and not share.blocks_whole and not windows
            width = share.inter[1] - share.inter[0]                     # a decoded [E_l, H, width]
            total += (shape[0] * shape[1] * width * act if name.endswith("_blocks") else 0) if decoded else numel
        elif name.endswith(("weight", "_proj")) and "norm" not in name:
            total += numel * act
        else:
            total += numel * 4
    return total
