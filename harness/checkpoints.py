"""Checkpoints for specs: synthetic ones made on demand in the real HF layout, and loaded models.

A spec names a checkpoint as `{preset: tiny, seed: 0, format: bf16}`; the first use in a process
writes it with engine.checkpoint.make_checkpoint into a private temporary folder (removed at
exit), so every spec goes through the real loading code. Loaded models are kept for the rest of
the process, since many specs share one checkpoint.
"""

from __future__ import annotations

import atexit
import shutil
import tempfile
from functools import lru_cache
from pathlib import Path

from harness.schema import Field, Int, Map, Str

CHECKPOINT = Map({
    "preset": Field(Str(), required=True, doc="an engine preset, e.g. tiny, tiny-d36"),
    "seed": Field(Int(min=0, max=2**63 - 1), default=0),
    "format": Field(Str(choices=["bf16", "mxfp4"]), default="bf16"),
})

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
def load_model(preset: str, seed: int, fmt: str, backend: str = "torch"):
    from engine.model import GptOssModel

    return GptOssModel.from_checkpoint(checkpoint_dir(preset, seed, fmt), backend=backend)


def model_for(ckpt: dict, backend: str = "torch"):
    return load_model(ckpt["preset"], ckpt["seed"], ckpt["format"], backend)
