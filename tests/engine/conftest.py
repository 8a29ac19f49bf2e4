"""Shared fixtures: synthetic checkpoints of the `tiny` preset (made once per session)."""

from __future__ import annotations

import pytest

from engine.checkpoint import make_checkpoint
from engine.model import GptOssModel


@pytest.fixture(scope="session")
def tiny_ckpts(tmp_path_factory):
    """{"bf16": dir, "mxfp4": dir} for preset tiny, seed 0."""
    root = tmp_path_factory.mktemp("ckpt")
    return {fmt: make_checkpoint("tiny", 0, fmt, root / f"tiny-{fmt}") for fmt in ("bf16", "mxfp4")}


@pytest.fixture(scope="session")
def tiny_model(tiny_ckpts):
    return GptOssModel.from_checkpoint(tiny_ckpts["bf16"])
