"""Sharded loading (engine.rank_weights): a rank built from the slices it holds has, tensor for
tensor, the weights `shard` cuts from the one-device model (MXFP4 kept packed), its bytes are what
memory_problem estimates, and MXFP4 topologies give the one-device model's bits."""

from __future__ import annotations

import types

import pytest
import torch

from lockstep.engine import parallel, rank_weights
from lockstep.engine.checkpoint import load_checkpoint, make_checkpoint
from lockstep.engine.distributed import Topology
from lockstep.engine.model import GptOssModel
from lockstep.engine.mxfp4 import Mxfp4Columns, Mxfp4Weight

from tests.parallel import scenarios

TOPOLOGIES = [(1, 1), (2, 1), (4, 1), (8, 1), (1, 2), (1, 4), (2, 2), (4, 2)]


@pytest.fixture(scope="module")
def mx_ckpt(tmp_path_factory) -> str:
    return str(make_checkpoint("tiny-parallel", 0, "mxfp4", tmp_path_factory.mktemp("mx") / "tiny-parallel-mxfp4"))


def _ctx(tp: int, ep: int, rank: int):
    """A rank's place without a process group (the weights do not need one)."""
    return types.SimpleNamespace(topology=Topology(tp, ep), rank=rank, tp=tp, ep=ep, tp_rank=rank % tp,
                                 ep_rank=rank // tp, device=torch.device("cpu"))


def _dense(w, act):
    return w.rows(torch.arange(w.shape[0]), act) if isinstance(w, (Mxfp4Weight, Mxfp4Columns)) else w


def _mlp_weight(mlp, name: str):
    """A MoE block's weight by name: the experts' from its LocalExperts record, the rest its own."""
    return getattr(mlp.held if name in ("gate_up_w", "gate_up_b", "down_w") else mlp, name)


def _tensors(model) -> dict[str, torch.Tensor]:
    out = {n: getattr(model, n) for n in ("embed", "lm_head", "norm")}
    for i, b in enumerate(model.blocks):
        for n in ("qkv_w", "qkv_b", "o_w", "o_b", "norm", "sinks"):
            out[f"{i}.attn.{n}"] = getattr(b.attn, n)
        for n in ("gate_up_w", "gate_up_b", "down_w", "down_b", "norm", "router_w", "router_b"):
            out[f"{i}.mlp.{n}"] = _dense(_mlp_weight(b.mlp, n), model.act)
    return out


def _weight_bytes(model) -> int:
    total = sum(getattr(model, n).nbytes for n in ("embed", "lm_head", "norm"))
    for b in model.blocks:
        total += sum(getattr(b.attn, n).nbytes for n in ("qkv_w", "qkv_b", "o_w", "o_b", "norm", "sinks"))
        for n in ("gate_up_w", "gate_up_b", "down_w", "down_b", "norm", "router_w", "router_b"):
            w = _mlp_weight(b.mlp, n)
            total += w.blocks.nbytes + w.scales.nbytes if isinstance(w, (Mxfp4Weight, Mxfp4Columns)) else w.nbytes
    return total


def _assert_same_rank(ckpt: str, tp: int, ep: int, dtype: str, windows: bool = True) -> set[str]:
    kinds = set()
    config, weights = load_checkpoint(ckpt, packed_mxfp4=True)
    for r in range(tp * ep):
        want = _tensors(parallel.shard(GptOssModel(config, weights, dtype=dtype), _ctx(tp, ep, r)))
        c, w = rank_weights.load_rank(ckpt, Topology(tp, ep), r, windows=windows)
        model = parallel.as_rank(GptOssModel(c, w, dtype=dtype), _ctx(tp, ep, r))
        kinds |= {type(b.mlp.held.down_w).__name__ for b in model.blocks}
        got = _tensors(model)
        for name, t in want.items():
            assert got[name].dtype == t.dtype and got[name].shape == t.shape, (name, tp, ep, r)
            assert torch.equal(got[name].view(torch.uint8), t.view(torch.uint8)), (name, tp, ep, r)
        assert _weight_bytes(model) == rank_weights.held_bytes(ckpt, Topology(tp, ep), r, dtype, windows)
    return kinds


@pytest.mark.parametrize("tp, ep", TOPOLOGIES)
def test_a_rank_read_from_its_slices_holds_what_shard_cuts(par_ckpt, mx_ckpt, tp, ep):
    """Bit for bit, both formats and both dtype policies; MXFP4 stays packed (a down range off the
    32-value block grid, tiny-parallel's at TP 4 and 8, as a window or decoded for the Triton ops);
    the bytes held are held_bytes' estimate exactly."""
    for dtype in ("fp32", "bf16"):
        assert _assert_same_rank(par_ckpt, tp, ep, dtype) == {"Tensor"}
        kinds = _assert_same_rank(mx_ckpt, tp, ep, dtype)
        assert kinds == ({"Mxfp4Columns"} if tp >= 4 else {"Mxfp4Weight"}), kinds
    if tp >= 4:
        assert _assert_same_rank(mx_ckpt, tp, ep, "bf16", windows=False) == {"Tensor"}


def test_a_wrong_slice_is_caught(par_ckpt, monkeypatch):
    """The comparison above is real: a rank that read its neighbour's query heads fails it."""
    right = rank_weights.RankShare.of

    def shifted(config, topology, rank):
        s = right(config, topology, rank)
        width = s.q_rows[1] - s.q_rows[0]
        return rank_weights.RankShare(**{**s.__dict__, "q_rows": ((s.q_rows[0] + width) % config.q_dim,
                                                                  (s.q_rows[0] + width) % config.q_dim + width)})
    monkeypatch.setattr(rank_weights.RankShare, "of", classmethod(lambda cls, *a: shifted(*a)))
    config, weights = load_checkpoint(par_ckpt, packed_mxfp4=True)
    c, w = rank_weights.load_rank(par_ckpt, Topology(2, 1), 0)
    monkeypatch.setattr(rank_weights.RankShare, "of", classmethod(lambda cls, *a: right(*a)))
    want = _tensors(parallel.shard(GptOssModel(config, weights), _ctx(2, 1, 0)))
    got = _tensors(parallel.as_rank(GptOssModel(c, w), _ctx(2, 1, 0)))
    assert not torch.equal(got["0.attn.qkv_w"], want["0.attn.qkv_w"])


def test_a_rank_holds_its_share_and_the_replicated_parts_once(mx_ckpt):
    """EP 4: every rank holds a quarter of the experts; the rest (attention, embedding, router)
    whole. TP 2: half of nearly everything."""
    one = rank_weights.held_bytes(mx_ckpt, Topology(1, 1), 0)
    ep4 = [rank_weights.held_bytes(mx_ckpt, Topology(1, 4), r) for r in range(4)]
    tp2 = [rank_weights.held_bytes(mx_ckpt, Topology(2, 1), r) for r in range(2)]
    assert len(set(ep4)) == 1 and len(set(tp2)) == 1
    assert ep4[0] < one and tp2[0] < 0.6 * one
    assert parallel.rank_weight_bytes(mx_ckpt, Topology(1, 4)) == ep4[0]


def test_a_nan_scale_a_rank_holds_is_refused(mx_ckpt, tmp_path):
    """A rank checks the MXFP4 scales it reads, as the whole-checkpoint load does."""
    import shutil

    from safetensors import safe_open
    from safetensors.torch import save_file

    from lockstep.engine.checkpoint import CheckpointError
    bad = tmp_path / "bad"
    shutil.copytree(mx_ckpt, bad)
    name = "model.layers.0.mlp.experts.down_proj_scales"
    for f in sorted(bad.glob("*.safetensors")):
        with safe_open(f, framework="pt") as h:
            tensors = {n: h.get_tensor(n) for n in h.keys()}
        if name in tensors:
            tensors[name][-1, 0, 0] = 255                                   # the last expert's
            save_file(tensors, str(f), metadata={"format": "pt"})
    rank_weights.load_rank(bad, Topology(1, 2), 0)                          # experts 0-3: clean
    with pytest.raises(CheckpointError, match=f"tensor {name}: block"):
        rank_weights.load_rank(bad, Topology(1, 2), 1)


@pytest.mark.parametrize("tp, ep", [(2, 1), (4, 1), (1, 2), (2, 2)])
def test_mxfp4_topologies_give_the_one_device_bits(mx_ckpt, tp, ep):
    """Through the launcher, ranks loading their packed slices: the packed one-device model's bits."""
    want = scenarios.bits(_generate(GptOssModel.from_checkpoint(mx_ckpt)))
    got = parallel.generate_at(mx_ckpt, tp, ep, scenarios.requests(), capture=scenarios.CAPTURE, timeout_s=240)
    assert scenarios.bits(got) == want


def _generate(model):
    from lockstep.engine.generate import generate
    return generate(model, scenarios.requests(), capture=scenarios.CAPTURE)
