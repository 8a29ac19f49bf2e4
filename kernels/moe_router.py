"""gpt-oss's MoE router (DESIGN §7): a Triton kernel beside its bit-exact `_portable` reference
(the callers pick one; nothing here dispatches).

    router_top_k_triton / _portable(logits [T, E], k)  -> routing [T, k] fp32, ids [T, k] int64
        top-k of the raw router logits, equal logits ranked by the lower expert id; softmax
        over the k selected logits only. Slot 0 holds the largest logit.
"""

from __future__ import annotations

import torch
from lockstep.kernels import _common  # noqa: F401  (first: it sets TRITON_INTERPRET before triton is imported)
import triton
import triton.language as tl

from lockstep.kernels import portable
from lockstep.kernels._common import PORTABLE_MATH, check_float, next_pow2
from lockstep.kernels.portable_tl import exp64, exp_f32


@triton.jit
def _halves_sum(x, N: tl.constexpr):
    """lockstep.kernels.portable.tree_sum of x [N] (N a power of two, at most 16): x[i] + x[i + N/2], level
    by level (a zero-padded tail folds onto the head exactly as tree_sum folds it)."""
    if N >= 16:
        x = tl.sum(tl.reshape(x, (2, 8)), axis=0)
    if N >= 8:
        x = tl.sum(tl.reshape(x, (2, 4)), axis=0)
    if N >= 4:
        x = tl.sum(tl.reshape(x, (2, 2)), axis=0)
    if N >= 2:
        x = tl.sum(tl.reshape(x, (2, 1)), axis=0)
    return tl.sum(x, axis=0)


@triton.jit
def _router_top_k_kernel(logit_ptr, w_ptr, id_ptr, E, K_TOP: tl.constexpr,
                         E_PAD: tl.constexpr, K_PAD: tl.constexpr, PORTABLE: tl.constexpr,
                         PORTABLE_SOFTMAX: tl.constexpr = False):
    t = tl.program_id(0).to(tl.int64)
    e = tl.arange(0, E_PAD)
    vals = tl.load(logit_ptr + t * E + e, mask=e < E, other=float("-inf")).to(tl.float32)
    taken = e >= E                                       # padding can never be picked
    kk = tl.arange(0, K_PAD)
    top = tl.full((K_PAD,), float("-inf"), tl.float32)
    for i in tl.static_range(K_TOP):
        cand = tl.where(taken, float("-inf"), vals)
        m = tl.max(cand, axis=0)
        idx = tl.min(tl.where((~taken) & (cand == m), e, E_PAD), axis=0)   # lowest id on ties
        tl.store(id_ptr + t * K_TOP + i, idx.to(tl.int64))
        top = tl.where(kk == i, m, top)
        taken = taken | (e == idx)
    if PORTABLE_SOFTMAX:        # kernels.portable.softmax, op for op: float64 exp, the fixed tree, IEEE /
        p = exp64(top - tl.max(top, axis=0)).to(tl.float32)         # padded slots: exp(-inf) = 0
        p = tl.div_rn(p, _halves_sum(p, K_PAD))
    else:
        p = exp_f32(top - tl.max(top, axis=0), PORTABLE)            # padded slots: exp(-inf) = 0
        p = p / tl.sum(p, axis=0)
    tl.store(w_ptr + t * K_TOP + kk, p, mask=kk < K_TOP)


def router_top_k_triton(logits: torch.Tensor, k: int, portable_softmax: bool = False
                        ) -> tuple[torch.Tensor, torch.Tensor]:
    """portable_softmax: the routing weights are kernels.portable.softmax of the k logits, bit for
    bit (the engine's contract on every backend); else the kernel's own exp and sum (k <= 16)."""
    logits = _check_logits(logits, k)
    if portable_softmax and k > 16:
        raise ValueError(f"router_top_k: the portable softmax takes k <= 16, got {k}")
    T, E = logits.shape
    w = torch.empty((T, k), dtype=torch.float32, device=logits.device)
    ids = torch.empty((T, k), dtype=torch.int64, device=logits.device)
    if T:
        _router_top_k_kernel[(T,)](logits, w, ids, E, K_TOP=k, E_PAD=next_pow2(E), K_PAD=next_pow2(k),
                                   PORTABLE=PORTABLE_MATH, PORTABLE_SOFTMAX=portable_softmax, num_warps=4,
                                   enable_fp_fusion=False)
    return w, ids


def top_k_lowest_index(logits: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Top-k along the last dim; equal values rank by lower index. -> (values, ids) [..., k]."""
    values, ids = torch.sort(logits, dim=-1, descending=True, stable=True)
    return values[..., :k], ids[..., :k]


def routing_weights(top_logits: torch.Tensor) -> torch.Tensor:
    """top_logits [T, k] fp32 -> softmax over the k selected logits, [T, k] (portable exp, fixed tree)."""
    return portable.softmax(top_logits, dim=-1)


def router_top_k_portable(logits: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The bit-exact reference (the same bits on every machine): logits [T, E] -> (routing [T, k]
    fp32, ids [T, k]): the top k (ties to the lower id) and kernels.portable.softmax over them
    (torch.softmax is not portable). The torch ops table's `route`; router_top_k_triton with
    portable_softmax=True gives its bits, and the router kernel specs compare against it."""
    _check_k(logits, k)
    top_logits, top_ids = top_k_lowest_index(logits.to(torch.float32), k)
    return routing_weights(top_logits), top_ids


def router_top_k_fast(logits: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Values only: torch.topk and torch.softmax (no tie rule, no invariance promise). The fast
    ops table's route (bench/e2e.py); no spec uses it."""
    top_logits, top_ids = torch.topk(logits, k, dim=-1)
    return torch.softmax(top_logits, dim=-1), top_ids


def _check_logits(logits, k):
    _check_k(logits, k)
    return logits.contiguous()


def _check_k(logits, k):
    check_float("logits", logits, 2)
    if isinstance(k, bool) or not isinstance(k, int) or not 1 <= k <= logits.shape[1]:
        raise ValueError(f"router_top_k: k must be an int in [1, {logits.shape[1]}], got {k!r}")
