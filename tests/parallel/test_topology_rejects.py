"""Unsupported splits are rejected up front, each violated constraint named."""

from __future__ import annotations

import pytest

from lockstep.engine.config import preset
from lockstep.engine.distributed import ParallelContext, Topology, UnsupportedTopology


@pytest.mark.parametrize("preset_name, tp, ep, needle", [
    ("tiny", 4, 1, "tp=4 must divide num_key_value_heads=2"),
    ("tiny", 1, 8, "ep=8 must divide num_local_experts=4"),
    ("tiny", 3, 1, "tp=3 must divide the K chunk count 8"),
    ("tiny-parallel", 16, 1, "tp=16 must divide the K chunk count 8"),
    ("tiny-parallel", 16, 1, "tp=16 must divide num_key_value_heads=8"),
    ("tiny-parallel", 1, 3, "ep=3 must divide num_local_experts=8"),
    ("tiny-d24", 2, 1, "tp=2 must divide num_key_value_heads=1"),
    ("tiny-parallel", 0, 1, "tp must be a positive int"),
])
def test_unsupported_splits_name_the_constraint(preset_name, tp, ep, needle):
    with pytest.raises(UnsupportedTopology, match=needle.replace("(", r"\(")):
        Topology(tp, ep).check(preset(preset_name))


def test_k_chunks_and_column_alignment():
    cfg = preset("tiny-parallel").replace(intermediate_size=60)
    msg = "; ".join(Topology(2, 1).problems(cfg))
    assert "intermediate_size (down input)=60 must be a multiple of the K chunk count 8" in msg
    cfg = preset("tiny-parallel").replace(vocab_size=520, eos_token_id=(517,), pad_token_id=516)
    assert "per-rank vocab slice (65 columns) must be a multiple of 4" in "; ".join(Topology(8, 1).problems(cfg))


@pytest.mark.parametrize("name", ["gpt-oss-20b", "gpt-oss-120b"])
def test_real_shapes_allow_every_d4_topology(name):
    for tp in (1, 2, 4, 8):
        for ep in (1, 2, 4):
            assert Topology(tp, ep).problems(preset(name)) == []


def test_no_process_group_for_a_larger_world():
    with pytest.raises(RuntimeError, match="not initialised"):
        ParallelContext(Topology(2, 1))


def test_shard_rejects_before_touching_weights():
    from lockstep.engine.checkpoint import synthetic_weights
    from lockstep.engine.model import ONE_DEVICE, GptOssModel
    from lockstep.engine.parallel import shard
    cfg = preset("tiny")
    model = GptOssModel(cfg, synthetic_weights(cfg, 0, False))
    ctx = ParallelContext(Topology(1, 1))
    object.__setattr__(ctx, "topology", Topology(4, 1))    # as a 4-rank context would carry
    with pytest.raises(UnsupportedTopology, match="num_key_value_heads=2"):
        shard(model, ctx)
    assert model.comm is ONE_DEVICE and model.embed.shape == (cfg.vocab_size, cfg.hidden_size)
    assert model.blocks[0].attn.kv_heads == cfg.num_key_value_heads


def test_shard_refuses_the_fast_ops_and_a_second_shard():
    from lockstep.engine.checkpoint import synthetic_weights
    from lockstep.engine.model import GptOssModel
    from lockstep.engine.parallel import shard
    cfg = preset("tiny")
    weights = synthetic_weights(cfg, 0, False)
    with pytest.raises(ValueError, match="fast ops have no row-parallel partials"):
        shard(GptOssModel(cfg, weights, backend="fast"), ParallelContext(Topology(1, 1)))
    model = shard(GptOssModel(cfg, weights), ParallelContext(Topology(1, 1)))
    with pytest.raises(ValueError, match="already sharded"):
        shard(model, ParallelContext(Topology(1, 1)))
