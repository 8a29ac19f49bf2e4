"""Shared fixtures: synthetic checkpoints of the `tiny` preset (made once per run: harness.checkpoints
shares them between the session's xdist workers and the spec items that use the same checkpoint)."""

from __future__ import annotations

import pytest

from lockstep.engine.model import GptOssModel
from lockstep.harness.checkpoints import checkpoint_dir


@pytest.fixture(scope="session")
def tiny_ckpts():
    """{"bf16": dir, "mxfp4": dir} for preset tiny, seed 0 (read-only: shared)."""
    return {fmt: checkpoint_dir("tiny", 0, fmt) for fmt in ("bf16", "mxfp4")}


@pytest.fixture(scope="session")
def tiny_model(tiny_ckpts):
    return GptOssModel.from_checkpoint(tiny_ckpts["bf16"])
