"""Fixtures for the speculative-decoding tests.

`fitted`: the shipped pair models/tiny-target (= make_checkpoint("tiny", 0, "bf16")) and
models/tiny-eagle3 (written by scripts/fit_draft.py), so drafts are actually accepted.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from lockstep.engine.eagle3 import load_draft
from lockstep.engine.model import GptOssModel
from lockstep.harness.checkpoints import checkpoint_dir

MODELS = Path(__file__).resolve().parents[2] / "models"


@pytest.fixture(scope="session")
def fitted():
    target = GptOssModel.from_checkpoint(MODELS / "tiny-target")
    return target, load_draft(MODELS / "tiny-eagle3", target, convention="sglang")


@pytest.fixture(scope="session")
def fitted_bf16():
    """The shipped pair under the bf16 policy: the draft on its cached path (engine/eagle3.py)."""
    target = GptOssModel.from_checkpoint(MODELS / "tiny-target", dtype="bf16")
    return target, load_draft(MODELS / "tiny-eagle3", target, convention="sglang")


@pytest.fixture(scope="session")
def deep_targets():
    """The deep presets' targets, from checkpoints made once per run (harness.checkpoints: shared
    with the layer_ids specs of the same presets and with the other xdist worker)."""
    return {name: GptOssModel.from_checkpoint(checkpoint_dir(name, 0, "bf16")) for name in ("tiny-d36", "tiny-d24")}


def training_prompts(n: int) -> list[list[int]]:
    """The first n prompts scripts/fit_draft.py trained the shipped draft on (seeded, 8 tokens)."""
    g = torch.Generator().manual_seed(1)
    return torch.randint(0, 512 - 8, (128, 8), generator=g)[:n].tolist()
