"""gpt-oss mixture of experts (DESIGN §7, §8 expert parallelism).

    router_top_k(logits [T, E], k)       -> routing [T, k] fp32, ids [T, k] int64
        top-k of the raw router logits, equal logits ranked by the lower expert id; softmax
        over the k selected logits only. Slot 0 holds the largest logit.
    clamped_swiglu(gate_up [R, 2I])      -> [R, I]
        gate = x[..., ::2] <= limit, up = x[..., 1::2] in [-limit, limit] (interleaved),
        gate * sigmoid(alpha * gate) * (up + 1)
    expert_linear(x [R, K], ids [R], weight [E_local, N, K], bias [E_local, N], expert_start)
        -> [R, N]: row r times expert ids[r]'s matrix plus its bias; rows whose expert is not
        local (outside [expert_start, expert_start + E_local)) are skipped and left at 0.
    moe(x [T, H], routing, ids, gate_up_w [E_l, 2I, H], gate_up_b [E_l, 2I], down_w [E_l, H, I],
        down_b [E_l, H], ..., expert_start) -> [T, H]
        per (token, slot): h = swiglu(x W_gu^T + b_gu); y = h W_d^T + b_d (bias before the
        routing weight); out[t] = sum over local slots in slot order of routing[t, s] * y.
        Non-local slots are skipped, never multiplied by zero (0 * inf = NaN).

Determinism: every expert row is one program reducing over K in fixed BLOCK_K chunks
(elementwise fp32 accumulation, one final tree over BLOCK_K), so a row's bits do not depend
on how many tokens share the call or which experts they picked; the slot sum is sequential.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels import check_backend, portable
from kernels._common import INTERPRET, PORTABLE_MATH, check_float, next_pow2
from kernels.portable_tl import exp_f32, sigmoid_f32

EXPERT_TILES = (128, 128) if INTERPRET else (64, 128)   # (BLOCK_N, BLOCK_K), fixed
BLOCK_H = 1024


# --------------------------------------------------------------------------- kernels
@triton.jit
def _router_top_k_kernel(logit_ptr, w_ptr, id_ptr, E, K_TOP: tl.constexpr,
                         E_PAD: tl.constexpr, K_PAD: tl.constexpr, PORTABLE: tl.constexpr):
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
    p = exp_f32(top - tl.max(top, axis=0), PORTABLE)                # padded slots: exp(-inf) = 0
    p = p / tl.sum(p, axis=0)
    tl.store(w_ptr + t * K_TOP + kk, p, mask=kk < K_TOP)


@triton.jit
def _swiglu_kernel(x_ptr, y_ptr, I, alpha, limit, BLOCK: tl.constexpr, PORTABLE: tl.constexpr):
    r = tl.program_id(0).to(tl.int64)
    i = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    ok = i < I
    gate = tl.load(x_ptr + r * 2 * I + 2 * i, mask=ok, other=0.0).to(tl.float32)
    up = tl.load(x_ptr + r * 2 * I + 2 * i + 1, mask=ok, other=0.0).to(tl.float32)
    gate = tl.minimum(gate, limit)
    up = tl.minimum(tl.maximum(up, -limit), limit)
    y = gate * sigmoid_f32(alpha * gate, PORTABLE) * (up + 1.0)
    tl.store(y_ptr + r * I + i, y.to(y_ptr.dtype.element_ty), mask=ok)


@triton.jit
def _expert_linear_kernel(x_ptr, id_ptr, w_ptr, b_ptr, y_ptr, N, K, E_START, E_LOCAL,
                          BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    # y[r, n] = sum_k x[r, k] * W[ids[r] - E_START, n, k] + b[...]; one row, BLOCK_N columns.
    r = tl.program_id(0).to(tl.int64)
    rn = (tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)).to(tl.int64)
    n_ok = rn < N
    e = tl.load(id_ptr + r) - E_START
    if (e >= 0) & (e < E_LOCAL):                       # program-uniform skip, before any load
        w_base = e * N * K
        acc = tl.zeros((BLOCK_N, BLOCK_K), dtype=tl.float32)
        for k0 in range(0, K, BLOCK_K):
            rk = k0 + tl.arange(0, BLOCK_K)
            k_ok = rk < K
            xk = tl.load(x_ptr + r * K + rk, mask=k_ok, other=0.0).to(tl.float32)          # [BK]
            w = tl.load(w_ptr + w_base + rn[:, None] * K + rk[None, :],
                        mask=n_ok[:, None] & k_ok[None, :], other=0.0).to(tl.float32)     # [BN, BK]
            acc += w * xk[None, :]
        y = tl.sum(acc, axis=1) + tl.load(b_ptr + e * N + rn, mask=n_ok, other=0.0).to(tl.float32)
        tl.store(y_ptr + r * N + rn, y.to(y_ptr.dtype.element_ty), mask=n_ok)


@triton.jit
def _combine_kernel(y_ptr, w_ptr, id_ptr, out_ptr, H, E_START, E_LOCAL,
                    K_TOP: tl.constexpr, BLOCK: tl.constexpr):
    # out[t, h] = sum over local slots s, in slot order, of w[t, s] * y[t * K_TOP + s, h]
    t = tl.program_id(0).to(tl.int64)
    h = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    ok = h < H
    acc = tl.zeros((BLOCK,), dtype=tl.float32)
    for s in tl.static_range(K_TOP):
        e = tl.load(id_ptr + t * K_TOP + s) - E_START
        if (e >= 0) & (e < E_LOCAL):
            w = tl.load(w_ptr + t * K_TOP + s).to(tl.float32)
            y = tl.load(y_ptr + (t * K_TOP + s) * H + h, mask=ok, other=0.0).to(tl.float32)
            acc += w * y
    tl.store(out_ptr + t * H + h, acc.to(out_ptr.dtype.element_ty), mask=ok)


# --------------------------------------------------------------------------- triton wrappers
def router_top_k_triton(logits: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    logits = _check_logits(logits, k)
    T, E = logits.shape
    w = torch.empty((T, k), dtype=torch.float32, device=logits.device)
    ids = torch.empty((T, k), dtype=torch.int64, device=logits.device)
    if T:
        _router_top_k_kernel[(T,)](logits, w, ids, E, K_TOP=k, E_PAD=next_pow2(E), K_PAD=next_pow2(k),
                                   PORTABLE=PORTABLE_MATH, num_warps=4)
    return w, ids


def clamped_swiglu_triton(gate_up: torch.Tensor, alpha: float = 1.702, limit: float = 7.0) -> torch.Tensor:
    gate_up = _check_gate_up(gate_up)
    R, I = gate_up.shape[0], gate_up.shape[1] // 2
    y = torch.empty((R, I), dtype=gate_up.dtype, device=gate_up.device)
    if R and I:
        _swiglu_kernel[(R, triton.cdiv(I, BLOCK_H))](gate_up, y, I, float(alpha), float(limit), BLOCK=BLOCK_H,
                                                         PORTABLE=PORTABLE_MATH, num_warps=4)
    return y


def expert_linear_triton(x, ids, weight, bias, expert_start: int = 0) -> torch.Tensor:
    x, ids, weight, bias = _check_expert(x, ids, weight, bias)
    R, K = x.shape
    E_local, N, _ = weight.shape
    y = torch.zeros((R, N), dtype=x.dtype, device=x.device)
    if R and N:
        bn, bk = EXPERT_TILES
        _expert_linear_kernel[(R, triton.cdiv(N, bn))](x, ids, weight, bias, y, N, K, int(expert_start), E_local,
                                                      BLOCK_N=bn, BLOCK_K=bk, num_warps=4)
    return y


def moe_triton(x, routing, ids, gate_up_w, gate_up_b, down_w, down_b, alpha=1.702, limit=7.0,
               expert_start: int = 0) -> torch.Tensor:
    T, H = x.shape
    k = ids.shape[1]
    flat_ids = ids.reshape(-1).contiguous()                                    # [T * k]
    rows = x.repeat_interleave(k, dim=0)                                       # [T * k, H]
    h = expert_linear_triton(rows, flat_ids, gate_up_w, gate_up_b, expert_start)   # [T * k, 2I]
    h = clamped_swiglu_triton(h, alpha, limit)                                 # [T * k, I]
    y = expert_linear_triton(h, flat_ids, down_w, down_b, expert_start)       # [T * k, H]
    out = torch.empty_like(x)
    if T and H:
        _combine_kernel[(T, triton.cdiv(H, BLOCK_H))](y, routing.to(torch.float32).contiguous(), flat_ids, out, H,
                                                      int(expert_start), gate_up_w.shape[0],
                                                      K_TOP=k, BLOCK=BLOCK_H, num_warps=4)
    return out


# --------------------------------------------------------------------------- torch references
def router_top_k_torch(logits: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    logits = _check_logits(logits, k)
    values, ids = torch.sort(logits.to(torch.float32), dim=-1, descending=True, stable=True)
    return portable.softmax(values[..., :k], dim=-1), ids[..., :k].contiguous()   # torch.softmax is not portable


def clamped_swiglu_torch(gate_up: torch.Tensor, alpha: float = 1.702, limit: float = 7.0) -> torch.Tensor:
    gate_up = _check_gate_up(gate_up)
    x = gate_up.to(torch.float32)
    gate = x[..., 0::2].clamp(max=limit)
    up = x[..., 1::2].clamp(min=-limit, max=limit)
    return (gate * torch.sigmoid(alpha * gate) * (up + 1)).to(gate_up.dtype)


def expert_linear_torch(x, ids, weight, bias, expert_start: int = 0) -> torch.Tensor:
    x, ids, weight, bias = _check_expert(x, ids, weight, bias)
    y = torch.zeros((x.shape[0], weight.shape[1]), dtype=x.dtype, device=x.device)
    for r in range(x.shape[0]):
        e = int(ids[r]) - expert_start
        if 0 <= e < weight.shape[0]:                       # non-local: skipped
            y[r] = (weight[e].to(torch.float32) @ x[r].to(torch.float32) + bias[e].to(torch.float32)).to(x.dtype)
    return y


def moe_torch(x, routing, ids, gate_up_w, gate_up_b, down_w, down_b, alpha=1.702, limit=7.0,
              expert_start: int = 0) -> torch.Tensor:
    T, k = ids.shape
    out = torch.zeros_like(x, dtype=torch.float32)
    for t in range(T):
        for s in range(k):                                  # slot order
            e = int(ids[t, s]) - expert_start
            if not 0 <= e < gate_up_w.shape[0]:
                continue                                    # skipped, not multiplied by zero
            xt = x[t].to(torch.float32)
            h = gate_up_w[e].to(torch.float32) @ xt + gate_up_b[e].to(torch.float32)
            h = clamped_swiglu_torch(h[None], alpha, limit)[0]
            y = down_w[e].to(torch.float32) @ h + down_b[e].to(torch.float32)
            out[t] += routing[t, s].to(torch.float32) * y
    return out.to(x.dtype)


# --------------------------------------------------------------------------- public API
def router_top_k(logits: torch.Tensor, k: int, backend: str = "torch") -> tuple[torch.Tensor, torch.Tensor]:
    """logits [T, E] -> (routing [T, k] fp32, ids [T, k] int64); ties to the lowest id."""
    if check_backend(backend) == "triton":
        return router_top_k_triton(logits, k)
    return router_top_k_torch(logits, k)


def clamped_swiglu(gate_up: torch.Tensor, alpha: float = 1.702, limit: float = 7.0,
                   backend: str = "torch") -> torch.Tensor:
    """gate_up [R, 2I] interleaved (gate even, up odd) -> [R, I] in gate_up's dtype."""
    if check_backend(backend) == "triton":
        return clamped_swiglu_triton(gate_up, alpha, limit)
    return clamped_swiglu_torch(gate_up, alpha, limit)


def expert_linear(x: torch.Tensor, ids: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor,
                  expert_start: int = 0, backend: str = "torch") -> torch.Tensor:
    """x [R, K], ids [R] int64, weight [E_local, N, K], bias [E_local, N] -> [R, N]."""
    if check_backend(backend) == "triton":
        return expert_linear_triton(x, ids, weight, bias, expert_start)
    return expert_linear_torch(x, ids, weight, bias, expert_start)


def moe(x: torch.Tensor, routing: torch.Tensor, ids: torch.Tensor, gate_up_w: torch.Tensor,
        gate_up_b: torch.Tensor, down_w: torch.Tensor, down_b: torch.Tensor, alpha: float = 1.702,
        limit: float = 7.0, expert_start: int = 0, backend: str = "torch") -> torch.Tensor:
    """x [T, H], routing [T, k], ids [T, k] int64; experts [expert_start, expert_start + E_local)
    are local: gate_up_w [E_l, 2I, H], gate_up_b [E_l, 2I], down_w [E_l, H, I], down_b [E_l, H]."""
    check_float("x", x, 2)
    if ids.dtype != torch.int64 or ids.dim() != 2 or ids.shape[0] != x.shape[0] or routing.shape != ids.shape:
        raise ValueError(f"moe: ids must be int64 [T, k] and routing the same shape, got {tuple(ids.shape)} "
                         f"{ids.dtype} and {tuple(routing.shape)}")
    if check_backend(backend) == "triton":
        return moe_triton(x, routing, ids, gate_up_w, gate_up_b, down_w, down_b, alpha, limit, expert_start)
    return moe_torch(x, routing, ids, gate_up_w, gate_up_b, down_w, down_b, alpha, limit, expert_start)


def _check_logits(logits, k):
    check_float("logits", logits, 2)
    if isinstance(k, bool) or not isinstance(k, int) or not 1 <= k <= logits.shape[1]:
        raise ValueError(f"router_top_k: k must be an int in [1, {logits.shape[1]}], got {k!r}")
    return logits.contiguous()


def _check_gate_up(gate_up):
    check_float("gate_up", gate_up, 2)
    if gate_up.shape[1] % 2:
        raise ValueError(f"clamped_swiglu: gate_up width {gate_up.shape[1]} is odd")
    return gate_up.contiguous()


def _check_expert(x, ids, weight, bias):
    check_float("x", x, 2)
    check_float("weight", weight, 3)
    if weight.shape[2] != x.shape[1] or bias.shape != weight.shape[:2] or weight.dtype != x.dtype:
        raise ValueError(f"expert_linear: x {tuple(x.shape)}, weight {tuple(weight.shape)} ({weight.dtype}) "
                         f"and bias {tuple(bias.shape)} do not fit [R, K], [E, N, K], [E, N]")
    if ids.dtype != torch.int64 or ids.shape != (x.shape[0],):
        raise ValueError(f"expert_linear: ids must be int64 [{x.shape[0]}], got {ids.dtype} {tuple(ids.shape)}")
    return x.contiguous(), ids.contiguous(), weight.contiguous(), bias.contiguous()
