"""A topology's op-level trace equals one device's, op by op, bit for bit: every sharded op
(q/k/v and attention heads, o_proj and down partials, the experts' per-slot outputs at EP) is
gathered to its one-device layout, so `lockstep diff` can compare a topology with one device."""

from __future__ import annotations

import torch

from lockstep.engine.launch import launch

from tests.parallel import trace_scenarios


def test_tp2_and_ep2_traces_equal_one_device_op_by_op(par_ckpt):
    want = trace_scenarios.one_device(par_ckpt)
    per_rank = launch(trace_scenarios.run, 2, args=(par_ckpt, [(2, 1), (1, 2)]), timeout_s=300,
                      collective_timeout_s=120)
    for tp, ep in ((2, 1), (1, 2)):
        for key, ref in want.items():
            got = per_rank[0][(tp, ep) + key]
            assert got.positions == ref.positions and list(got.ops) == list(ref.ops), (tp, ep, key)
            for name, t in ref.ops.items():
                assert got.ops[name].dtype == t.dtype and got.ops[name].shape == t.shape, (tp, ep, key, name)
                assert torch.equal(got.ops[name].view(torch.uint8), t.view(torch.uint8)), (tp, ep, key, name)
            assert "L0.experts" in ref.ops and ref.ops["L0.o_proj.partials"].shape[1] == 8
