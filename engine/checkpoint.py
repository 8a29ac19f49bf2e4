"""gpt-oss checkpoints in the HF layout: load them, and make synthetic ones.

A checkpoint directory holds `config.json` and either one `model.safetensors` or shards
listed by `model.safetensors.index.json`. Tensor names and shapes (DESIGN §7), per layer N:

    model.layers.N.input_layernorm.weight              [H]
    model.layers.N.self_attn.q_proj.weight / .bias     [Hq*D, H] / [Hq*D]
    model.layers.N.self_attn.{k,v}_proj.weight / .bias [Hkv*D, H] / [Hkv*D]
    model.layers.N.self_attn.o_proj.weight / .bias     [H, Hq*D] / [H]
    model.layers.N.self_attn.sinks                     [Hq]
    model.layers.N.post_attention_layernorm.weight     [H]
    model.layers.N.mlp.router.weight / .bias           [E, H] / [E]
    model.layers.N.mlp.experts.gate_up_proj_bias       [E, 2I]
    model.layers.N.mlp.experts.down_proj_bias          [E, H]
  experts unquantized:
    model.layers.N.mlp.experts.gate_up_proj            [E, H, 2I]   (x @ W; columns gate/up interleaved)
    model.layers.N.mlp.experts.down_proj               [E, I, H]
  experts MXFP4 (config.json has quantization_config.quant_method = "mxfp4"):
    model.layers.N.mlp.experts.gate_up_proj_blocks     [E, 2I, H/32, 16] u8, _scales [E, 2I, H/32] u8
    model.layers.N.mlp.experts.down_proj_blocks        [E, H, I/32, 16] u8,  _scales [E, H, I/32] u8
  and model.embed_tokens.weight [V, H], model.norm.weight [H], lm_head.weight [V, H].

`load_checkpoint` returns the weights under the unquantized names and shapes whatever the
format (MXFP4 experts are dequantized and transposed), upcast to fp32 (dtype policy `fp32`);
with `packed_mxfp4=True` MXFP4 experts stay packed (engine.model decodes them in its kernels).
Every problem raises a CheckpointError naming the file and the tensor (and for a dtype, the one
found and the one config.json implies).

`make_checkpoint` writes deterministic synthetic weights in exactly this layout.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import shutil
import tempfile
from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import save_file

from lockstep.engine import mxfp4
from lockstep.engine.config import MXFP4_QUANTIZATION_CONFIG, GptOssConfig, preset
from lockstep.kernels import portable

# The float dtype config.json's `torch_dtype` (transformers >= 5: `dtype`) says every float tensor
# has; released gpt-oss checkpoints say bfloat16, and so does a config that names none.
CONFIG_DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}
DEFAULT_DTYPE = "bfloat16"
INDEX_FILE = "model.safetensors.index.json"
SINGLE_FILE = "model.safetensors"


class CheckpointError(ValueError):
    pass


# ---------------------------------------------------------------------- the expected layout
def expected_tensors(config: GptOssConfig, mxfp4_experts: bool) -> dict[str, tuple[tuple[int, ...], str]]:
    """name -> (shape, kind) with kind "float" or "uint8", in checkpoint order."""
    H, I, E, V = config.hidden_size, config.intermediate_size, config.num_local_experts, config.vocab_size
    Hq, Hkv, D = config.num_attention_heads, config.num_key_value_heads, config.head_dim
    t: dict[str, tuple[tuple[int, ...], str]] = {"model.embed_tokens.weight": ((V, H), "float")}
    for n in range(config.num_hidden_layers):
        p = f"model.layers.{n}."
        t[p + "input_layernorm.weight"] = ((H,), "float")
        t[p + "self_attn.q_proj.weight"] = ((Hq * D, H), "float")
        t[p + "self_attn.q_proj.bias"] = ((Hq * D,), "float")
        t[p + "self_attn.k_proj.weight"] = ((Hkv * D, H), "float")
        t[p + "self_attn.k_proj.bias"] = ((Hkv * D,), "float")
        t[p + "self_attn.v_proj.weight"] = ((Hkv * D, H), "float")
        t[p + "self_attn.v_proj.bias"] = ((Hkv * D,), "float")
        t[p + "self_attn.o_proj.weight"] = ((H, Hq * D), "float")
        t[p + "self_attn.o_proj.bias"] = ((H,), "float")
        t[p + "self_attn.sinks"] = ((Hq,), "float")
        t[p + "post_attention_layernorm.weight"] = ((H,), "float")
        t[p + "mlp.router.weight"] = ((E, H), "float")
        t[p + "mlp.router.bias"] = ((E,), "float")
        x = p + "mlp.experts."
        if mxfp4_experts:
            t[x + "gate_up_proj_blocks"] = ((E, 2 * I, H // 32, 16), "uint8")
            t[x + "gate_up_proj_scales"] = ((E, 2 * I, H // 32), "uint8")
            t[x + "down_proj_blocks"] = ((E, H, I // 32, 16), "uint8")
            t[x + "down_proj_scales"] = ((E, H, I // 32), "uint8")
        else:
            t[x + "gate_up_proj"] = ((E, H, 2 * I), "float")
            t[x + "down_proj"] = ((E, I, H), "float")
        t[x + "gate_up_proj_bias"] = ((E, 2 * I), "float")
        t[x + "down_proj_bias"] = ((E, H), "float")
    t["model.norm.weight"] = ((H,), "float")
    t["lm_head.weight"] = ((V, H), "float")
    return t


# ---------------------------------------------------------------------- loading
def _read_json_object(file: Path) -> dict:
    """A JSON file that must hold an object; CheckpointError naming the file otherwise."""
    try:
        data = json.loads(file.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as e:
        raise CheckpointError(f"{file}: cannot be read as JSON ({e})") from None
    if not isinstance(data, dict):
        raise CheckpointError(f"{file}: expected a JSON object, found a {type(data).__name__}")
    return data


def _read_config(path: Path) -> tuple[GptOssConfig, torch.dtype]:
    """The config of a checkpoint folder, and the float dtype its config.json implies."""
    file = path / "config.json"
    data = _read_json_object(file)
    try:
        config = GptOssConfig.from_hf_dict(data)
    except (ValueError, TypeError, KeyError, AttributeError) as e:
        raise CheckpointError(f"{file}: {e}") from None
    name = data.get("torch_dtype", data.get("dtype", DEFAULT_DTYPE))
    if name not in CONFIG_DTYPES:
        raise CheckpointError(f"{file}: torch_dtype {name!r} is not one of {sorted(CONFIG_DTYPES)}")
    return config, CONFIG_DTYPES[name]


def _shard_keys(shard: Path) -> set[str]:
    """The tensor names of a safetensors file; CheckpointError naming it when it is unreadable
    (empty, truncated, not safetensors)."""
    try:
        with safe_open(shard, framework="pt") as f:
            return set(f.keys())
    except (SafetensorError, OSError, ValueError) as e:
        raise CheckpointError(f"{shard}: not a readable safetensors file ({e})") from None


def _read_shard(shard: Path) -> dict[str, torch.Tensor]:
    try:
        with safe_open(shard, framework="pt") as f:
            return {name: f.get_tensor(name) for name in f.keys()}
    except (SafetensorError, OSError, ValueError, RuntimeError) as e:
        raise CheckpointError(f"{shard}: not a readable safetensors file ({e})") from None


def _tensor_files(path: Path) -> dict[str, Path]:
    """name -> shard file, from the index (checked against the shards) or the single file."""
    index_path, single = path / INDEX_FILE, path / SINGLE_FILE
    if index_path.exists():
        weight_map = _read_json_object(index_path).get("weight_map")
        if not isinstance(weight_map, dict) or not all(isinstance(f, str) for f in weight_map.values()):
            raise CheckpointError(f"{index_path}: no weight_map of tensor names to shard file names")
        where = {name: path / fname for name, fname in weight_map.items()}
        for shard in sorted(set(where.values())):
            if not shard.is_file():
                raise CheckpointError(f"{index_path} names shard {shard.name}, which does not exist")
            present = _shard_keys(shard)
            for name, s in where.items():
                if s == shard and name not in present:
                    raise CheckpointError(f"tensor {name}: listed in {INDEX_FILE} under {shard.name}, "
                                          "but that shard does not hold it")
            for name in present:
                if where.get(name) != shard:
                    raise CheckpointError(f"tensor {name}: stored in {shard.name} but the index "
                                          f"says {where[name].name if name in where else 'nothing'}")
        return where
    if single.exists():
        return {name: single for name in _shard_keys(single)}
    raise CheckpointError(f"{path}: neither {INDEX_FILE} nor {SINGLE_FILE} found")


def load_checkpoint(path: str | Path, dtype: torch.dtype | None = torch.float32, packed_mxfp4: bool = False
                    ) -> tuple[GptOssConfig, dict[str, torch.Tensor]]:
    """-> (config, weights): HF names, unquantized expert layout, `dtype` (default fp32; None: as
    stored, for a model that converts each tensor once to its final dtype). `packed_mxfp4`: MXFP4
    experts come back as they are stored (`*_blocks`, `*_scales` uint8, checked), for a model that
    decodes them in its kernels (engine.model). Each stored tensor is released as it is converted,
    so the host never holds the checkpoint twice."""
    path = Path(path)
    if not (path / "config.json").exists():
        raise CheckpointError(f"{path}: no config.json")
    config, float_dtype = _read_config(path)
    files = _tensor_files(path)

    raw: dict[str, torch.Tensor] = {}
    for shard in sorted(set(files.values())):
        raw.update(_read_shard(shard))
    check_layout(path, config, float_dtype, files, {n: (tuple(t.shape), t.dtype) for n, t in raw.items()})

    for name, t in raw.items():
        if name.endswith("_scales"):
            refuse_nan_scales(name, t)
    weights: dict[str, torch.Tensor] = {}
    for name in sorted(raw, key=lambda n: n.endswith("_scales")):     # a block's scales outlive it
        t = raw.pop(name)
        if packed_mxfp4 and (name.endswith("_blocks") or name.endswith("_scales")):
            weights[name] = t
        elif name.endswith("_blocks"):
            base = name[: -len("_blocks")]
            w = mxfp4.dequantize(t, raw[base + "_scales"], torch.float32)    # [E, out, in]
            weights[base] = w.transpose(1, 2).contiguous().to(dtype or torch.float32)   # HF layout [E, in, out]
        elif not name.endswith("_scales"):
            weights[name] = t if dtype is None else t.to(dtype)
        del t
    return config, weights


def read_tensor(path: str | Path, name: str) -> torch.Tensor:
    """One tensor of a checkpoint folder, as stored (its shard alone is opened)."""
    files = _tensor_files(Path(path))
    if name not in files:
        raise CheckpointError(f"{path}: no tensor {name}")
    try:
        with safe_open(files[name], framework="pt") as f:
            return f.get_tensor(name)
    except (SafetensorError, OSError, ValueError, RuntimeError) as e:
        raise CheckpointError(f"{files[name]}: not a readable safetensors file ({e})") from None


def check_layout(path: Path, config: GptOssConfig, float_dtype: torch.dtype, files: dict[str, Path],
                 found: dict[str, tuple[tuple[int, ...], torch.dtype]]) -> None:
    """CheckpointError unless the tensors `found` (name -> (shape, dtype)) are exactly those
    config.json implies, with its shapes and dtypes (floats in `float_dtype`, MXFP4 in uint8)."""
    expected = expected_tensors(config, config.is_mxfp4)
    other_format = expected_tensors(config, not config.is_mxfp4)
    missing = [n for n in expected if n not in files]
    unexpected = [n for n in files if n not in expected]
    if missing or unexpected:
        hint = ""
        if missing and all(n in other_format for n in unexpected) and unexpected:
            fmt = "MXFP4" if config.is_mxfp4 else "unquantized"
            hint = (f" (config.json says {fmt} experts, but the tensors look like the other format: "
                    "check quantization_config)")
        raise CheckpointError(f"checkpoint {path} does not match its config.json{hint}: "
                              f"missing tensors {missing[:5]}{' ...' if len(missing) > 5 else ''}, "
                              f"unexpected tensors {unexpected[:5]}{' ...' if len(unexpected) > 5 else ''}")
    for name, (shape, kind) in expected.items():
        (got_shape, got_dtype), where = found[name], files[name]
        if tuple(got_shape) != shape:
            raise CheckpointError(f"{where}: tensor {name}: shape {tuple(got_shape)}, but config.json implies {shape}")
        want = torch.uint8 if kind == "uint8" else float_dtype
        if got_dtype != want:
            why = "MXFP4 blocks and scales are uint8" if kind == "uint8" else "config.json's torch_dtype implies it"
            raise CheckpointError(f"{where}: tensor {name}: dtype {got_dtype}, expected {want} ({why})")


def refuse_nan_scales(name: str, scales: torch.Tensor) -> None:
    """An MXFP4 scale of 255 (E8M0 NaN) makes its whole block NaN: refuse it, naming the tensor,
    the first such block's index and how many there are (DESIGN §7)."""
    bad = (scales == mxfp4.NAN_SCALE).nonzero()
    if bad.shape[0]:
        idx = bad[0].tolist()
        raise CheckpointError(f"tensor {name}: block {idx} has E8M0 scale {mxfp4.NAN_SCALE}, which encodes NaN "
                              f"for all {mxfp4.BLOCK} values of the block (OCP MX v1.0); {bad.shape[0]} such "
                              f"block(s) in this tensor")


# ---------------------------------------------------------------------- synthetic checkpoints
def synthetic_weights(config: GptOssConfig, seed: int, mxfp4_experts: bool,
                      progress=None, device: str | torch.device = "cpu") -> dict[str, torch.Tensor]:
    """Deterministic random weights in checkpoint form (bf16 floats; u8 MXFP4 experts).

    Scales keep activations O(1): weights ~ N(0, 1/fan_in), norms ~ 1 + N(0, 0.1^2), biases
    small, sinks ~ N(0, 1), router bias ~ N(0, 0.5^2). Expert gate_up weights are 3x larger
    (and down weights 2x smaller), so a few percent of gate/up pre-activations pass the
    SwiGLU clamp at 7 and tests see it. Expert weights are snapped onto the
    MXFP4 grid in both formats, so the bf16 and MXFP4 checkpoints of one seed hold the same
    values (bf16 represents every MXFP4 value exactly).

    `device` is where the arithmetic runs (a GPU makes the 20b shape in minutes): the draws come
    from the one CPU generator and every operation is portable's or exact, so the tensors, returned
    on the CPU, are the same bytes on any device (tests/test_gpu_branches.py compares them).
    """
    g = torch.Generator(device="cpu").manual_seed(seed)

    def normal(shape, std, mean=0.0):
        return portable.normal(shape, g, device=device) * std + mean     # torch.randn is not portable

    bf16 = lambda t: t.to(torch.bfloat16).contiguous().cpu()   # noqa: E731
    out: dict[str, torch.Tensor] = {}
    layout = expected_tensors(config, mxfp4_experts=False)
    for i, (name, (shape, kind)) in enumerate(layout.items(), 1):
        if progress is not None:                # progress("tensor", i, n, name): before each is made
            progress("tensor", i, len(layout), name)
        fan_in = shape[-1]
        if name.endswith(("layernorm.weight", "norm.weight")):
            out[name] = bf16(normal(shape, 0.1, 1.0))
        elif name == "model.embed_tokens.weight":
            out[name] = bf16(normal(shape, 1.0))
        elif name.endswith("sinks"):
            out[name] = bf16(normal(shape, 1.0))
        elif name.endswith("router.bias"):
            out[name] = bf16(normal(shape, 0.5))
        elif name.endswith(("bias", "_bias")):
            out[name] = bf16(normal(shape, 0.1))
        elif name.endswith(("gate_up_proj", "down_proj")):
            E, fan_in, fan_out = shape                                   # HF layout [E, in, out]
            gain = 3.0 if name.endswith("gate_up_proj") else 0.5           # see the docstring
            w = normal((E, fan_out, fan_in), gain / math.sqrt(fan_in))   # [E, out, in]
            # an expert at a time (blocks run along the last axis): the same bytes, bounded memory
            blocks, scales = (torch.cat(t) for t in zip(*(mxfp4.quantize(w[e:e + 1]) for e in range(E))))
            del w
            if mxfp4_experts:
                out[name + "_blocks"], out[name + "_scales"] = blocks.cpu(), scales.cpu()
            else:
                out[name] = bf16(mxfp4.dequantize(blocks, scales).transpose(1, 2))
        else:
            out[name] = bf16(normal(shape, 1.0 / math.sqrt(fan_in)))
    return out


def make_checkpoint(preset_name: str, seed: int, fmt: str, out_dir: str | Path,
                    overwrite: bool = False, num_shards: int = 2, progress=None,
                    device: str | torch.device = "cpu") -> Path:
    """Write a synthetic checkpoint of a preset: config.json, `num_shards` safetensors shards
    and model.safetensors.index.json. Same (preset, seed, fmt) -> byte-identical files.
    `progress(stage, done, total, name)`, if given, is called before each tensor is made
    (stage "tensor") and after each shard is written (stage "shard"). `device`: where the weights'
    arithmetic runs (synthetic_weights: the same bytes on any device).

    Written into a temp dir beside out_dir and renamed into place, so a failure leaves nothing
    half-written. A non-empty out_dir is refused unless `overwrite`.
    """
    if fmt not in ("bf16", "mxfp4"):
        raise ValueError(f"make_checkpoint: fmt must be 'bf16' or 'mxfp4', got {fmt!r}")
    if num_shards < 1:
        raise ValueError(f"make_checkpoint: num_shards must be >= 1, got {num_shards}")
    out_dir = Path(out_dir)
    if out_dir.exists() and (not out_dir.is_dir() or any(out_dir.iterdir())) and not overwrite:
        raise FileExistsError(f"make_checkpoint: {out_dir} exists and is not empty (pass overwrite=True)")
    config = preset(preset_name)
    if fmt == "mxfp4":
        config = config.replace(quantization_config=json.loads(json.dumps(MXFP4_QUANTIZATION_CONFIG)))
    tensors = synthetic_weights(config, seed, mxfp4_experts=(fmt == "mxfp4"), progress=progress, device=device)

    # Shards: consecutive tensors in checkpoint order, cut at equal byte fractions.
    names = list(tensors)
    sizes = [tensors[n].numel() * tensors[n].element_size() for n in names]
    total = sum(sizes)
    shard_of, running = [], 0
    for size in sizes:
        shard_of.append(min(num_shards - 1, running * num_shards // max(total, 1)))
        running += size
    shard_names = [f"model-{i + 1:05d}-of-{num_shards:05d}.safetensors" for i in range(num_shards)]

    def write(tmp: Path) -> None:
        for i, fname in enumerate(shard_names):
            part = {n: tensors[n] for n, s in zip(names, shard_of) if s == i}
            save_file(part, str(tmp / fname), metadata={"format": "pt"})
            if progress is not None:
                progress("shard", i + 1, num_shards, fname)
        index = {"metadata": {"total_size": total},
                 "weight_map": {n: shard_names[s] for n, s in sorted(zip(names, shard_of))}}
        (tmp / INDEX_FILE).write_text(json.dumps(index, indent=2, sort_keys=True) + "\n", encoding="utf-8")
        (tmp / "config.json").write_text(json.dumps(config.to_hf_dict(), indent=2, sort_keys=True) + "\n",
                                         encoding="utf-8")

    return write_folder_atomically(out_dir, write)


def write_folder_atomically(out_dir: Path, write) -> Path:
    """Run write(tmp) on a fresh temp folder beside out_dir, then rename it into place: a failure
    (or a kill) never leaves a half-written out_dir. An existing out_dir is replaced."""
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f"{out_dir.name}.tmp-", dir=out_dir.parent))
    try:
        write(tmp)
        _honour_umask(tmp)
        if out_dir.exists():
            shutil.rmtree(out_dir) if out_dir.is_dir() else out_dir.unlink()
        os.rename(tmp, out_dir)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out_dir


def _honour_umask(folder: Path) -> None:
    """mkdtemp makes its folder 0700 and safetensors writes its files 0600: give the folder and its
    files the modes the user's umask gives anything new (0755 and 0644 under the usual 022)."""
    mask = os.umask(0o022)
    os.umask(mask)
    os.chmod(folder, 0o777 & ~mask)
    for f in folder.iterdir():
        if f.is_file():
            os.chmod(f, 0o666 & ~mask)


def checkpoint_digest(path: str | Path) -> dict[str, str]:
    """sha256 of every file in a checkpoint directory, by file name."""
    path = Path(path)
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(path.iterdir()) if p.is_file()}
