"""Checkpoints for specs: synthetic ones made on demand in the real HF layout, and loaded models.

A spec names a checkpoint as `{preset: tiny, seed: 0, format: bf16}`; the first use in a process
writes it with engine.checkpoint.make_checkpoint into a private temporary folder (removed at
exit), so every spec goes through the real loading code. `{path: models/tiny-target}` names a
checkpoint shipped in the repository instead (relative to the project root, never outside it).
Loaded models are kept for the rest of the process, since many specs share one checkpoint.

EAGLE3 drafts work alike: `{path: models/tiny-eagle3, convention: sglang}`, or a synthetic draft
for the target preset, `{seed: 0, convention: sglang, aux_layer_ids: [1, 2, 3], norm_before_fc:
true, fc_norm: false}` (engine.eagle3.make_draft_checkpoint).
"""

from __future__ import annotations

import atexit
import shutil
import tempfile
from functools import lru_cache
from pathlib import Path

from harness.schema import Bool, Field, Int, List, Map, OneOf, Str

CHECKPOINT = OneOf(
    Map({
        "preset": Field(Str(), required=True, doc="an engine preset, e.g. tiny, tiny-d36"),
        "seed": Field(Int(min=0, max=2**63 - 1), default=0),
        "format": Field(Str(choices=["bf16", "mxfp4"]), default="bf16"),
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
    }),
)

_root: Path | None = None


def _cache_root() -> Path:
    global _root
    if _root is None:
        _root = Path(tempfile.mkdtemp(prefix="lockstep-checkpoints-"))
        atexit.register(shutil.rmtree, _root, ignore_errors=True)
    return _root


@lru_cache(maxsize=None)
def checkpoint_dir(preset: str, seed: int, fmt: str) -> Path:
    from engine.checkpoint import make_checkpoint

    return make_checkpoint(preset, seed, fmt, _cache_root() / f"{preset}-s{seed}-{fmt}")


@lru_cache(maxsize=8)
def load_model(preset: str, seed: int, fmt: str, backend: str = "torch", device: str = "cpu"):
    from engine.model import GptOssModel

    return GptOssModel.from_checkpoint(checkpoint_dir(preset, seed, fmt), backend=backend, device=device)


def edited_copy(base: Path, name: str, edit) -> Path:
    """A copy of checkpoint folder `base` under the private cache, every shard rewritten with
    edit(tensor name, tensor) -> new tensor or None (unchanged); other files copied as they are.
    The copy then goes through the real loading code, like any checkpoint."""
    from safetensors import safe_open
    from safetensors.torch import save_file

    from engine.checkpoint import write_folder_atomically

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

    return write_folder_atomically(_cache_root() / name, write)


def resolve_path(relative: str, root: Path) -> Path:
    """A path from a spec, inside the project root `root`; anything that leaves it is refused."""
    root = root.resolve()
    path = (root / relative).resolve()
    if path != root and root not in path.parents:
        raise ValueError(f"path {relative!r} leaves the project root {root}")
    return path


def target_dir(ckpt: dict, root: Path) -> Path:
    if "path" in ckpt:
        return resolve_path(ckpt["path"], root)
    return checkpoint_dir(ckpt["preset"], ckpt["seed"], ckpt["format"])


@lru_cache(maxsize=8)
def _load_dir(path: Path, backend: str, device: str):
    from engine.model import GptOssModel

    return GptOssModel.from_checkpoint(path, backend=backend, device=device)


def model_for(ckpt: dict, backend: str = "torch", root: Path = Path("."), device: str = "cpu"):
    """The spec's target model on `device` (cached: specs share models)."""
    device = str(device)
    if "path" in ckpt:
        return _load_dir(resolve_path(ckpt["path"], root), backend, device)
    return load_model(ckpt["preset"], ckpt["seed"], ckpt["format"], backend, device)


@lru_cache(maxsize=None)
def _synthetic_draft_dir(preset: str, seed: int, aux_layer_ids, norm_before_fc: bool, fc_norm: bool) -> Path:
    from engine.eagle3 import make_draft_checkpoint

    name = f"draft-{preset}-s{seed}-{'-'.join(map(str, aux_layer_ids or ()))}-{int(norm_before_fc)}{int(fc_norm)}"
    return make_draft_checkpoint(preset, seed, _cache_root() / name, aux_layer_ids=aux_layer_ids,
                                 norm_before_fc=norm_before_fc, fc_norm=fc_norm)


def draft_dir(draft: dict, target_ckpt: dict, root: Path = Path(".")) -> Path:
    """The folder of a spec's draft checkpoint (a synthetic one is written on first use)."""
    if "path" in draft:
        return resolve_path(draft["path"], root)
    if "preset" not in target_ckpt:
        raise ValueError("a synthetic draft needs a target given by preset")
    ids = tuple(draft["aux_layer_ids"]) if draft.get("aux_layer_ids") is not None else None
    return _synthetic_draft_dir(target_ckpt["preset"], draft["seed"], ids, draft["norm_before_fc"], draft["fc_norm"])


def draft_for(draft: dict, target_ckpt: dict, target, root: Path = Path(".")):
    """Load the draft of a spec against its loaded target model."""
    from engine.eagle3 import load_draft

    return load_draft(draft_dir(draft, target_ckpt, root), target, convention=draft["convention"],
                      backend=target.backend)
