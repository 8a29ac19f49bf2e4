"""A synthetic `tiny-parallel` checkpoint (TP and EP up to 8) and its one-device results."""

from __future__ import annotations

import pytest

from lockstep.engine.checkpoint import make_checkpoint

from tests.parallel import scenarios


@pytest.fixture(scope="session")
def par_ckpt(tmp_path_factory) -> str:
    return str(make_checkpoint("tiny-parallel", 0, "bf16", tmp_path_factory.mktemp("par") / "tiny-parallel"))


@pytest.fixture(scope="session")
def one_device(par_ckpt) -> dict:
    """The one-device GptOssModel's bits for scenarios.workload."""
    return scenarios.reference(par_ckpt)
