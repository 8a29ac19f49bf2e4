"""Checkpoints for specs: synthetic ones made on demand in the real HF layout, and loaded models.

A spec names a checkpoint as `{preset: tiny, seed: 0, format: bf16}`; the first use in a process
writes it with engine.checkpoint.make_checkpoint into a private temporary folder (removed at
exit), so every spec goes through the real loading code. `{path: models/tiny-target}` names a
checkpoint shipped in the repository instead (relative to the project root, never outside it).
Loaded models are kept for the rest of the process, since many specs share one checkpoint.

EAGLE3 drafts work alike: `{path: models/tiny-eagle3, convention: sglang}`, or a synthetic draft
for the target preset, `{seed: 0, convention: sglang, aux_layer_ids: [1, 2, 3], norm_before_fc:
true, fc_norm: false, d2t: true}` (engine.eagle3.make_draft_checkpoint; `d2t: false` gives the full
target vocabulary and no d2t tensor; `rope_theta: 500.0` gives it its own RoPE theta).

Constructed ties (DESIGN §8: ties rank by the lower index in every path). `router_ties: {experts:
[0, 1, 2], weight: 0.0}` in a preset checkpoint, or `lm_head_ties: {ids: [3, 7], weight: 8.0}` in a
synthetic draft, replace those rows of every layer's router (or of the draft's lm_head) by
weight · e_0 (the weight in column 0, zeros elsewhere) and their router bias by 0: their outputs
are then exactly weight · x_0 (+ 0), the same bits whatever order any reduction takes, so the
logits tie for every token. The edited checkpoint is written in the HF layout and loaded through
the real loading code.

Special values (DESIGN §2: -0.0 and NaN payloads are bits like any other): `special_values: {tokens:
[3, 7], expert: 0}` sets the first embedding entries of those tokens to -0.0 and makes one expert
per layer unreachable (router bias -inf) and full of NaN and inf (`special_value_edit`).
"""

from __future__ import annotations

import atexit
import json
import math
import os
import posixpath
import shutil
import tempfile
from functools import lru_cache
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import save_file

from lockstep.engine import lifeline
from lockstep.engine.boundaries import LayerIdError, resolve_boundaries
from lockstep.engine.checkpoint import expected_tensors, make_checkpoint, write_folder_atomically
from lockstep.engine.config import GptOssConfig, preset
from lockstep.engine.eagle3 import load_draft, make_draft_checkpoint
from lockstep.engine.model import GptOssModel
from lockstep.harness.limits import MAX_CHECKPOINT_PARAMS
from lockstep.harness.schema import Bool, Field, Float, Int, List, Map, OneOf, Problem, Str
from lockstep.harness.suite_paths import mapped_checkpoint

CHECKPOINT = OneOf(
    Map({
        "preset": Field(Str(), required=True, doc="an engine preset, e.g. tiny, tiny-d36"),
        "seed": Field(Int(min=0, max=2**63 - 1), default=0),
        "format": Field(Str(choices=["bf16", "mxfp4"]), default="bf16"),
        "router_ties": Field(Map({
            "experts": Field(List(Int(min=0), min_len=2), required=True),
            "weight": Field(Float(), default=0.0),
        }), doc="these experts' router rows become weight * e_0 and their bias 0, in every layer"),
        "special_values": Field(Map({
            "tokens": Field(List(Int(min=0), min_len=1), required=True),
            "expert": Field(Int(min=0), default=0),
        }), doc="-0.0 in these tokens' embedding rows; this expert unreachable and full of NaN and inf"),
    }),
    Map({"path": Field(Str(), required=True, doc="a checkpoint folder, relative to the project root")}),
)
DRAFT = OneOf(
    Map({
        "path": Field(Str(), required=True, doc="a draft checkpoint folder, relative to the project root"),
        "convention": Field(Str(choices=["boundary", "sglang", "output-index"]), required=True),
    }),
    Map({
        "seed": Field(Int(min=0, max=2**63 - 1), required=True),
        "convention": Field(Str(choices=["boundary", "sglang", "output-index"]), required=True),
        "aux_layer_ids": Field(List(Int())),
        "norm_before_fc": Field(Bool(), default=False),
        "fc_norm": Field(Bool(), default=False),
        "d2t": Field(Bool(), default=True, doc="false: the full target vocabulary, no d2t tensor"),
        "rope_theta": Field(Float(min=1.0), doc="the draft's own RoPE theta (default 10000, DESIGN §4)"),
        "lm_head_ties": Field(Map({
            "ids": Field(List(Int(min=0), min_len=2), required=True),
            "weight": Field(Float(), default=8.0),
        }), doc="these draft ids' lm_head rows become weight * e_0"),
    }),
)

SYNTHETIC_DRAFT_AUX = 3  # aux states of a synthetic draft (engine.eagle3.make_draft_checkpoint's n_aux)

_root: Path | None = None
# A folder made for one run (`lockstep check -j N`'s parent, the pytest plugin's controller) and
# removed after it, in which that run's processes share the synthetic checkpoints they make.
SHARED_ENV = "LOCKSTEP_CHECKPOINT_CACHE"


def _cache_root() -> Path:
    global _root
    if _root is None:
        _root = Path(lifeline.run_folder("lockstep-checkpoints"))
        atexit.register(shutil.rmtree, _root, ignore_errors=True)
    return _root


def _cached(name: str, build) -> Path:
    """The cache's folder `name`, written by build(out_dir) on first use. Each name is a function of
    everything its content depends on (preset, seed, format, edits), so within one run it is
    content-addressed. Under $LOCKSTEP_CHECKPOINT_CACHE the run's processes share it: the first to
    finish a folder renames it into place (atomic), one that finds it there reads it, and a folder
    is never replaced, so none is read while it is rewritten; two processes racing both build it,
    and the second one's copy is dropped (same bits: making a checkpoint is deterministic)."""
    shared = os.environ.get(SHARED_ENV)
    if not shared or not os.path.isdir(shared):
        return build(_cache_root() / name)
    final = Path(shared) / name
    if final.is_dir():
        return final
    staging = Path(tempfile.mkdtemp(prefix=f"{name}.tmp-", dir=shared))
    try:
        build(staging / name)
        try:
            os.rename(staging / name, final)
        except OSError:
            if not final.is_dir():
                raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return final


@lru_cache(maxsize=None)
def checkpoint_dir(preset: str, seed: int, fmt: str) -> Path:
    return _cached(f"{preset}-s{seed}-{fmt}", lambda out: make_checkpoint(preset, seed, fmt, out))


def tie_rows(t, ids, weight: float, bias: bool = False):
    """Rows `ids` of a weight [N, K] -> weight * e_0; of a bias [N] -> 0 (see the module docstring)."""
    t = t.clone()
    t[list(ids)] = 0
    if not bias:
        t[list(ids), 0] = weight
    return t


@lru_cache(maxsize=None)
def _tied_checkpoint_dir(preset: str, seed: int, fmt: str, experts: tuple, weight: float) -> Path:
    def edit(name, t):
        if name.endswith("mlp.router.weight") or name.endswith("mlp.router.bias"):
            return tie_rows(t, experts, weight, bias=name.endswith("bias"))
        return None

    tag = "-".join(map(str, experts))
    return _cached_edit(checkpoint_dir(preset, seed, fmt), f"{preset}-s{seed}-{fmt}-router-ties-{tag}-w{weight!r}", edit)


SPECIAL_COLUMNS = 4          # embedding columns of each special token set to -0.0


def special_value_edit(name: str, t, tokens, expert: int):
    """The `special_values` edit of one checkpoint tensor (None: unchanged). Embedding rows of
    `tokens`: their first SPECIAL_COLUMNS entries -0.0. In every layer, `expert`'s router row and bias
    -inf, so it is never routed, and its weights and biases NaN (two payloads), +inf and -inf: a
    gather that built rows by arithmetic (a one-hot matmul, `+ 0.0`) loses the sign of zero, and an
    engine that computed or zero-weighted the expert it skips turns NaN."""

    if name == "model.embed_tokens.weight":
        t = t.clone()
        t[list(tokens), :SPECIAL_COLUMNS] = -0.0
        return t
    if name.endswith("mlp.router.weight") or name.endswith("mlp.router.bias"):
        t = t.clone()
        t[expert] = 0.0 if name.endswith("weight") else float("-inf")
        return t
    if ".mlp.experts." in name and not name.endswith(("_blocks", "_scales")):
        t = t.clone()
        row = t[expert].reshape(-1)
        bits = row.view(torch.int16) if row.dtype == torch.bfloat16 else None
        if bits is None:
            raise ValueError(f"special_values: expected bf16 expert weights, found {name} in {row.dtype}")
        pattern = torch.tensor([0x7FC1, -0x3F, 0x7F80, -0x80], dtype=torch.int16)   # NaN 0x7FC1, NaN 0xFFC1, +inf, -inf
        bits.copy_(pattern.repeat(row.numel() // 4 + 1)[:row.numel()])
        return t
    return None


@lru_cache(maxsize=None)
def _special_checkpoint_dir(preset: str, seed: int, fmt: str, tokens: tuple, expert: int) -> Path:
    return _cached_edit(checkpoint_dir(preset, seed, fmt),
                        f"{preset}-s{seed}-{fmt}-special-{'-'.join(map(str, tokens))}-e{expert}",
                        lambda n, t: special_value_edit(n, t, tokens, expert))


def _preset_dir(ckpt: dict) -> Path:
    special = ckpt.get("special_values")
    if special:
        if ckpt.get("router_ties"):
            raise ValueError("special_values and router_ties cannot be combined")
        return _special_checkpoint_dir(ckpt["preset"], ckpt["seed"], ckpt["format"], tuple(special["tokens"]),
                                       special["expert"])
    ties = ckpt.get("router_ties")
    if ties:
        return _tied_checkpoint_dir(ckpt["preset"], ckpt["seed"], ckpt["format"], tuple(ties["experts"]),
                                    float(ties["weight"]))
    return checkpoint_dir(ckpt["preset"], ckpt["seed"], ckpt["format"])


def checkpoint_problems(ckpt: dict | None, path: tuple, check_preset: bool = True) -> list[Problem]:
    """Load-time checks of a preset checkpoint mapping: the preset exists (unless the caller
    checks it, as checkpoint_config does), router ties name experts of the preset."""
    if not ckpt or "preset" not in ckpt:
        return []

    try:
        cfg = preset(ckpt["preset"])
    except ValueError as e:
        return [Problem(path + ("preset",), str(e))] if check_preset else []
    special = ckpt.get("special_values")
    if special:
        bad = [t for t in special["tokens"] if t >= cfg.vocab_size]
        if bad or special["expert"] >= cfg.num_local_experts or ckpt.get("router_ties") or ckpt["format"] != "bf16":
            return [Problem(path + ("special_values",), f"expected token ids below {cfg.vocab_size}, an expert below "
                                                        f"{cfg.num_local_experts}, format bf16 and no router_ties "
                                                        f"(preset {ckpt['preset']})")]
    ties = ckpt.get("router_ties")
    if ties:
        E = cfg.num_local_experts
        bad = [e for e in ties["experts"] if e >= E]
        if bad or len(set(ties["experts"])) != len(ties["experts"]):
            return [Problem(path + ("router_ties", "experts"), f"expected distinct expert ids below {E} "
                                                               f"(preset {ckpt['preset']}), found {ties['experts']}")]
    return []


def draft_tie_problems(draft: dict | None, target_ckpt: dict | None, path: tuple) -> list[Problem]:
    """Load-time checks of a synthetic draft mapping: lm_head ties name draft ids of its vocabulary."""
    if not draft or "seed" not in draft or not draft.get("lm_head_ties") or not target_ckpt \
            or "preset" not in target_ckpt:
        return []

    try:
        V = preset(target_ckpt["preset"]).vocab_size
    except ValueError:
        return []
    Vd = V if not draft.get("d2t", True) else V // 2           # engine.eagle3.make_draft_checkpoint
    ids = draft["lm_head_ties"]["ids"]
    if any(i >= Vd for i in ids) or len(set(ids)) != len(ids):
        return [Problem(path + ("lm_head_ties", "ids"), f"expected distinct draft ids below the draft vocabulary "
                                                        f"size {Vd}, found {ids}")]
    return []


@lru_cache(maxsize=8)
def load_model(preset: str, seed: int, fmt: str, backend: str = "torch", device: str = "cpu", dtype: str = "fp32"):
    return GptOssModel.from_checkpoint(checkpoint_dir(preset, seed, fmt), backend=backend, device=device, dtype=dtype)


def edited_copy(base: Path, name: str, edit) -> Path:
    """A copy of checkpoint folder `base` under the private cache, every shard rewritten with
    edit(tensor name, tensor) -> new tensor or None (unchanged); other files copied as they are.
    The copy then goes through the real loading code, like any checkpoint. Written again on every
    call (the caller's `name` need not say everything the edit does)."""

    return write_folder_atomically(_cache_root() / name, _edit_writer(base, edit))


def _cached_edit(base: Path, name: str, edit) -> Path:
    """edited_copy through the (shareable) cache: for a `name` that says everything the edit does."""

    return _cached(name, lambda out: write_folder_atomically(out, _edit_writer(base, edit)))


def _edit_writer(base: Path, edit):
    def write(tmp: Path) -> None:
        for f in sorted(base.iterdir()):
            if f.suffix != ".safetensors":
                shutil.copyfile(f, tmp / f.name)
                continue
            with safe_open(f, framework="pt") as sf:
                tensors = {n: sf.get_tensor(n) for n in sf.keys()}
            for n, t in tensors.items():
                new = edit(n, t)
                if new is not None:
                    tensors[n] = new.contiguous()
            save_file(tensors, str(tmp / f.name), metadata={"format": "pt"})

    return write


# --------------------------------------------------------------------------- validation
def path_problems(relative: str, root: Path | None, where: tuple) -> list[Problem]:
    """A checkpoint path of a spec: relative, inside the project root, and (with the root known) an
    existing folder; symbolic links are followed, so a link out of the project is refused too."""
    if posixpath.isabs(relative) or "\\" in relative:
        return [Problem(where, f"expected a path relative to the project root (with '/'), found {relative!r}")]
    if posixpath.normpath(relative).split("/")[0] == "..":
        return [Problem(where, f"path {relative!r} leaves the project root")]
    if root is None:
        return []
    if mapped_checkpoint(relative) is not None and not mapped_checkpoint(relative).is_dir():
        return [Problem(where, f"no checkpoint folder at {mapped_checkpoint(relative)} (where {relative!r} is mapped "
                               f"by --checkpoint-path / lockstep_checkpoints / LOCKSTEP_CHECKPOINT_PATHS)")]
    try:
        path = resolve_path(relative, root)
    except ValueError as e:
        return [Problem(where, str(e))]
    if not path.is_dir():
        return [Problem(where, f"no checkpoint folder at {relative!r} (relative to the project root {root})")]
    return []


def parameter_count(config) -> int:
    """Parameters of a checkpoint of this config (its unquantized tensors)."""

    return sum(math.prod(shape) for shape, _ in expected_tensors(config, False).values())


def preset_config(name: str, where: tuple, make: bool) -> tuple[object | None, list[Problem]]:
    """The config of an engine preset; an error for an unknown one, and (`make`: the spec makes a
    checkpoint of it) for one too large to make."""

    try:
        config = preset(name)
    except ValueError as e:
        return None, [Problem(where, str(e))]
    if make and parameter_count(config) > MAX_CHECKPOINT_PARAMS:
        return None, [Problem(where, f"preset {name!r} has {parameter_count(config):,} parameters; a spec may make "
                                     f"checkpoints of at most {MAX_CHECKPOINT_PARAMS:,} (use a test preset such as "
                                     f"tiny, small, tiny-d24 or tiny-d36)")]
    return config, []


def checkpoint_config(ckpt: dict, root: Path | None, where: tuple) -> tuple[object | None, list[Problem]]:
    """The config of a spec's checkpoint, read without loading its weights, and the problems found.
    None without problems when it cannot be known (a path, with no project root to read it from)."""
    if "preset" in ckpt:
        return preset_config(ckpt["preset"], where + ("preset",), make=True)
    problems = path_problems(ckpt["path"], root, where + ("path",))
    if problems or root is None:
        return None, problems

    config_file = resolve_path(ckpt["path"], root) / "config.json"
    try:
        data = json.loads(config_file.read_text(encoding="utf-8"))
        if not isinstance(data, dict):
            raise ValueError(f"expected a JSON object, found {type(data).__name__}")
        return GptOssConfig.from_hf_dict(data), []
    except (OSError, UnicodeDecodeError, ValueError, TypeError, KeyError, AttributeError) as e:
        return None, [Problem(where + ("path",), f"cannot read the checkpoint's config {config_file}: {e}")]


def draft_problems(draft: dict, target_ckpt: dict, target_config, root: Path | None, where: tuple) -> list[Problem]:
    """A spec's EAGLE3 draft: a path inside the project, or a synthetic draft of a preset target
    whose aux layer ids resolve to its 3 aux states under the convention."""
    if "path" in draft:
        return path_problems(draft["path"], root, where + ("path",))
    if "preset" not in target_ckpt:
        return [Problem(where, "a synthetic draft (seed, convention, ...) needs a checkpoint given by preset; "
                               "give the draft a path instead")]
    if target_config is None or draft.get("aux_layer_ids") is None:
        return []

    try:
        resolve_boundaries(draft["aux_layer_ids"], draft["convention"], target_config.num_hidden_layers,
                           SYNTHETIC_DRAFT_AUX, f"the synthetic draft of {target_ckpt['preset']}")
    except LayerIdError as e:
        return [Problem(where + ("aux_layer_ids",), str(e))]
    return []


# --------------------------------------------------------------------------- at run time
def resolve_path(relative: str, root: Path) -> Path:
    """A path from a spec, inside the project root `root`; anything that leaves it is refused."""

    mapped = mapped_checkpoint(relative)       # named explicitly by whoever runs the suite, not by the spec
    if mapped is not None:
        return mapped
    root = root.resolve()
    path = (root / relative).resolve()
    if path != root and root not in path.parents:
        raise ValueError(f"path {relative!r} leaves the project root {root}")
    return path


def target_dir(ckpt: dict, root: Path) -> Path:
    if "path" in ckpt:
        return resolve_path(ckpt["path"], root)
    return _preset_dir(ckpt)


@lru_cache(maxsize=8)
def _load_dir(path: Path, backend: str, device: str, dtype: str):
    return GptOssModel.from_checkpoint(path, backend=backend, device=device, dtype=dtype)


def model_at(path, backend: str = "torch", device: str = "cpu", dtype: str = "fp32"):
    """The model of the checkpoint folder `path` (a target operation's checkpoint_dir) on `device`
    under dtype policy `dtype` (cached)."""
    return _load_dir(Path(path), backend, str(device), dtype)


def reference_model(target, ckpt: dict, root: Path, device: str):
    """The model a kind runs a reference forward on (aux rows, an exact law): the target's own
    (its `model` operation: Lockstep's engine under the run's settings), else Lockstep's fp32
    model of the same checkpoint on the CPU."""
    if "model" in target.ops:
        return target.op("model", device)(target_dir(ckpt, root))
    return model_for(ckpt, "torch", root, "cpu", "fp32")


def model_for(ckpt: dict, backend: str = "torch", root: Path = Path("."), device: str = "cpu", dtype: str = "fp32"):
    """The spec's target model on `device` under dtype policy `dtype` (cached: specs share models)."""
    device = str(device)
    if "path" in ckpt:
        return _load_dir(resolve_path(ckpt["path"], root), backend, device, dtype)
    if ckpt.get("router_ties") or ckpt.get("special_values"):
        return _load_dir(_preset_dir(ckpt), backend, device, dtype)
    return load_model(ckpt["preset"], ckpt["seed"], ckpt["format"], backend, device, dtype)


@lru_cache(maxsize=None)
def _synthetic_draft_dir(preset: str, seed: int, aux_layer_ids, norm_before_fc: bool, fc_norm: bool,
                         d2t: bool = True, rope_theta: float | None = None) -> Path:
    name = (f"draft-{preset}-s{seed}-{'-'.join(map(str, aux_layer_ids or ()))}-{int(norm_before_fc)}{int(fc_norm)}"
            f"{'' if d2t else '-no-d2t'}{'' if rope_theta is None else f'-theta{rope_theta!r}'}")
    theta = {} if rope_theta is None else {"rope_theta": rope_theta}
    return _cached(name, lambda out: make_draft_checkpoint(preset, seed, out, aux_layer_ids=aux_layer_ids,
                                                           norm_before_fc=norm_before_fc, fc_norm=fc_norm,
                                                           with_d2t=d2t, **theta))


@lru_cache(maxsize=None)
def _tied_draft_dir(base: Path, ids: tuple, weight: float) -> Path:
    return _cached_edit(base, f"{base.name}-lm-head-ties-{'-'.join(map(str, ids))}-w{weight!r}",
                        lambda n, t: tie_rows(t, ids, weight) if n == "lm_head.weight" else None)


def draft_dir(draft: dict, target_ckpt: dict, root: Path = Path(".")) -> Path:
    """The folder of a spec's draft checkpoint (a synthetic one is written on first use)."""
    if "path" in draft:
        return resolve_path(draft["path"], root)
    if "preset" not in target_ckpt:
        raise ValueError("a synthetic draft needs a target given by preset")
    ids = tuple(draft["aux_layer_ids"]) if draft.get("aux_layer_ids") is not None else None
    path = _synthetic_draft_dir(target_ckpt["preset"], draft["seed"], ids, draft["norm_before_fc"], draft["fc_norm"],
                                draft.get("d2t", True), draft.get("rope_theta"))
    ties = draft.get("lm_head_ties")
    return _tied_draft_dir(path, tuple(ties["ids"]), float(ties["weight"])) if ties else path


def draft_for(draft: dict, target_ckpt: dict, target, root: Path = Path(".")):
    """Load the draft of a spec against its loaded target model."""

    return load_draft(draft_dir(draft, target_ckpt, root), target, convention=draft["convention"],
                      backend=target.backend)
