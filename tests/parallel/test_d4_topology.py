"""D4: tokens, logprob bytes, logits and captured boundary states are bitwise identical at
TP 1/2/4/8, EP 1/2/4/8 and mixed TP × EP, greedy and seeded sampling; D2 and D3 still hold
at TP = 2 and TP × EP = 2 × 2; and the check is real: wrong reduction orders fail it."""

from __future__ import annotations

from lockstep.engine.launch import launch
from lockstep.engine.linear import tree_sum

from tests.parallel import scenarios

TIMEOUTS = dict(timeout_s=240, collective_timeout_s=120)

def check_all_ranks(per_rank: list[dict], one_device: dict, keys) -> None:
    tree = tree_sum(scenarios.sum_partials()).numpy().tobytes()
    for rank, res in enumerate(per_rank):                       # the bare reduction, both ways
        assert res["invariant_sum"] == {"gather": tree, "scatter": tree}, f"rank {rank}: invariant_sum"
    for key in keys:
        for rank, res in enumerate(per_rank):
            got = res[key]
            assert got["forward"][0] == one_device["forward"][0], f"{key} rank {rank}: logits differ"
            assert got["forward"][1] == one_device["forward"][1], f"{key} rank {rank}: captured states differ"
            assert got["generate"] == one_device["generate"], f"{key} rank {rank}: generate differs"
            if "alone" in got:                                          # D2, D3 at this topology
                assert got["alone"] == one_device["generate"], f"{key} rank {rank}: D2 (alone) differs"
                assert got["shuffled_chunked"] == one_device["generate"], f"{key} rank {rank}: D2/D3 differ"

def test_world_1_through_the_launcher(par_ckpt, one_device):
    per_rank = launch(scenarios.run, 1, args=(par_ckpt, [(1, 1)]), **TIMEOUTS)
    check_all_ranks(per_rank, one_device, [(1, 1)])

def test_world_2_tp2_ep2_and_d2_d3(par_ckpt, one_device):
    keys = [(2, 1), (1, 2), (2, 1, "rank_order"), (2, 1, "sequential")]
    per_rank = launch(scenarios.run, 2, args=(par_ckpt, keys, True), **TIMEOUTS)
    check_all_ranks(per_rank, one_device, keys[:2])
    assert "alone" in per_rank[0][(2, 1)]
    # Negative controls. With 8 chunks and two ranks, "each rank adds its 4 chunks, then rank 0
    # + rank 1" happens to be the fixed tree itself; left-to-right over all 8 chunks is not.
    assert per_rank[0][(2, 1, "rank_order")]["forward"] == one_device["forward"]
    assert per_rank[0][(2, 1, "sequential")]["forward"][0] != one_device["forward"][0]

def test_world_4_tp4_ep4_tp2xep2(par_ckpt, one_device):
    keys = [(4, 1), (1, 4), (2, 2), (4, 1, "rank_order"), (4, 1, "all_reduce")]
    per_rank = launch(scenarios.run, 4, args=(par_ckpt, keys, True), **TIMEOUTS)
    check_all_ranks(per_rank, one_device, keys[:3])
    assert "alone" in per_rank[0][(2, 2)]
    # Negative controls: at four ranks, rank-order addition ((r0 + r1) + r2) + r3 and gloo's
    # float all_reduce both leave the fixed tree, and the D4 comparison catches them.
    for variant in ("rank_order", "all_reduce"):
        assert per_rank[0][(4, 1, variant)]["forward"][0] != one_device["forward"][0], variant

def test_world_8_tp8_ep8_tp2xep4_tp4xep2(par_ckpt, one_device):
    keys = [(8, 1), (1, 8), (2, 4), (4, 2)]
    per_rank = launch(scenarios.run, 8, args=(par_ckpt, keys), **TIMEOUTS)
    check_all_ranks(per_rank, one_device, keys)

def test_generate_at_a_topology(par_ckpt, one_device):
    """The runner-facing call: generate at tp × ep, rank 0's results, ranks cross-checked."""
    from lockstep.engine.parallel import generate_at
    for tp, ep in ((1, 1), (1, 2)):
        results = generate_at(par_ckpt, tp, ep, scenarios.requests(), capture=scenarios.CAPTURE, timeout_s=240)
        assert scenarios.bits(results) == one_device["generate"], (tp, ep)

def test_gloo_host_copies_give_the_same_bits(par_ckpt, one_device):
    """The transport of ranks that share a GPU (every collective through fresh host buffers),
    here with CPU tensors standing in for the GPU's: the same bits as one device."""
    keys = [(2, 1), (1, 2)]
    per_rank = launch(scenarios.run, 2, args=(par_ckpt, keys), device="cpu", transport="gloo-host", **TIMEOUTS)
    assert [res["transport"] for res in per_rank] == ["gloo-host", "gloo-host"]
    check_all_ranks(per_rank, one_device, keys)
