"""The routed experts of a gpt-oss MoE layer, up to the down projection's K-chunk partials.

    expert_partials(x [T, H], top_ids [T, k], gate_up_w [E_l, 2I', H], gate_up_b [E_l, 2I'],
                    down_w [E_l, H, I'], bounds, expert_lo, n_local, alpha, limit, backend)
        -> parts [C, T * k, H]

Row r = t * k + s is token t's slot s; its expert is top_ids[t, s]. For a local expert
(id in [expert_lo, expert_lo + n_local), local index e = id - expert_lo):

    h = x[t] @ gate_up_w[e]^T + gate_up_b[e]                     [2I'], gate/up interleaved
    a = clamped_swiglu(h)                                        [I'], elementwise
    parts[c, r] = a[lo_c:hi_c] @ down_w[e][:, lo_c:hi_c]^T       c = 0 .. C-1, no bias

Rows of non-local experts are 0 (skipped, never multiplied by zero: DESIGN §8). I' is the
intermediate range held here (all of I on one device; a TP rank's K chunks in engine/parallel.py,
`bounds` relative to it). The caller adds the C partials in the fixed tree (engine.linear.tree_sum
on one device, the gathered tree across a TP group), then the down bias: the same bits at any TP
and EP degree (DESIGN §2, D4).

Both the one-device model (engine/model.py, Triton backend) and every rank of engine/parallel.py
call this one function, so they compute each row the same way.

Triton backend: group_by_expert sorts the rows by expert on the device, then one launch for
gate_up, one for the SwiGLU (elementwise, all rows at once) and one for every (expert block,
chunk) of the down projection: no tensor value is read on the host and every shape depends on
T, k, n_local and the weights only, so a decode step can be captured in a CUDA graph. Each
element is reduced exactly as linear_triton reduces it on the row's expert (gate_up) and on the
chunk's fresh copy (down), the per-expert loop this replaced, so its bits do not change.

Torch backend: a loop over the local experts with engine.linear's portable matmuls (it reads
which experts were routed on the host; the one-device torch model uses its own per-row gather,
GptOssModel._experts_per_row, which has the same bits).
"""

from __future__ import annotations

import torch

from engine.linear import k_chunk_partials, linear
from kernels import check_backend

# Fuse the clamped SwiGLU into the down kernel's loads (kernels/matmul.py `_load_a_tile`) instead
# of running it as its own elementwise launch first. Both give the same bits in Triton's interpreter
# (tests/kernels/test_grouped_moe.py); compiled, the fused path is the same operations in another
# kernel, so keep it off until a GPU run shows the goldens unchanged with it on.
FUSED_SWIGLU = False


def expert_partials(x: torch.Tensor, top_ids: torch.Tensor, gate_up_w: torch.Tensor, gate_up_b: torch.Tensor,
                    down_w: torch.Tensor, bounds, expert_lo: int, n_local: int, alpha: float, limit: float,
                    backend: str = "torch") -> torch.Tensor:
    """x [T, H], top_ids [T, k] int64 -> down partials [C, T * k, H] (see the module docstring)."""
    T, H = x.shape
    k = top_ids.shape[1]
    bounds = list(bounds)
    if backend == "fast":                          # bench only: the same kernels on a GPU
        backend = "triton" if x.is_cuda else "torch"
    if check_backend(backend) == "triton":
        from kernels.moe import (EXPERT_BLOCK_M, clamped_swiglu_triton, expert_down_partials_triton,
                                 expert_gate_up_triton, group_by_expert)
        groups = group_by_expert(top_ids.reshape(-1), expert_lo, n_local, EXPERT_BLOCK_M)   # on the device
        h = expert_gate_up_triton(x, k, groups, gate_up_w, gate_up_b)                     # [T * k, 2I']
        if FUSED_SWIGLU:
            return expert_down_partials_triton(h, groups, down_w, bounds, prologue_swiglu=(alpha, limit))
        a = clamped_swiglu_triton(h, alpha, limit)                                         # [T * k, I']
        return expert_down_partials_triton(a, groups, down_w, bounds)                      # [C, T * k, H]

    from engine.model import clamped_swiglu
    act = lambda g: clamped_swiglu(g, alpha, limit, backend)  # noqa: E731
    parts = x.new_zeros((len(bounds), T * k, H), dtype=torch.float32)   # non-local rows stay zero
    flat_ids = top_ids.reshape(-1)                 # [T * k], token-major (token, slot) pairs
    for e in range(n_local):                       # local experts; the rest are skipped, not x 0
        rows = (flat_ids == e + expert_lo).nonzero()[:, 0]
        if rows.numel() == 0:
            continue
        xe = x.index_select(0, torch.div(rows, k, rounding_mode="floor"))           # [n, H]
        h = linear(xe, gate_up_w[e], gate_up_b[e], backend)                          # [n, 2I']
        for c, p in enumerate(k_chunk_partials(h, down_w[e], bounds, backend,
                                               prologue=act, x_per_k=2)):           # SwiGLU per chunk
            parts[c].index_copy_(0, rows, p)
    return parts
