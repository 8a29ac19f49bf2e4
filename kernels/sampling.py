"""Seeded Gumbel-max sampling over the vocabulary (DESIGN §5), fused with the coin hash.

    logp [R, V] float64 (temperature-scaled, masked with -inf, log-softmaxed: engine.sampling)
    seeds, positions [R] int64                         -> token ids [R] int64

    g_v   = -log(-clamp(log u_v, -DBL_MAX, -2^-32)),  u_v = murmur_hash32(seed, pos, SAMPLE_COLUMNS + v) / (2^32 - 1)
    token = argmax_v(logp_v + g_v), the lowest id on ties

One program per row walks the vocabulary in fixed BLOCK_V chunks, first to last, keeping the
best score and its id; a later chunk replaces it only if strictly greater, and inside a chunk
the lowest id among equal maxima wins. The hash is kernels.coins's; the log is float64:
kernels.portable's in the interpreter (so the noise equals the torch path's bit for bit), the
GPU's own when compiled (it may differ in the last bit, as DESIGN §5 allows).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels._common import PORTABLE_MATH
from kernels.coins import SAMPLE_COLUMNS, _fmix, _mix, gumbel_noise
from kernels.portable_tl import log_f64

BLOCK_V = 1024
DBL_MAX = 1.7976931348623157e308


@triton.jit
def _gumbel_argmax_kernel(logp_ptr, seed_ptr, pos_ptr, out_ptr, V, col_base,
                          BLOCK_V: tl.constexpr, PORTABLE: tl.constexpr):
    r = tl.program_id(0).to(tl.int64)
    seed = tl.load(seed_ptr + r)
    pos = tl.load(pos_ptr + r)
    h0 = tl.zeros((BLOCK_V,), dtype=tl.uint32)
    h0 = _mix(h0, (seed & 0xFFFFFFFF).to(tl.uint32))
    h0 = _mix(h0, ((seed >> 32) & 0xFFFFFFFF).to(tl.uint32))
    h0 = _mix(h0, (pos & 0xFFFFFFFF).to(tl.uint32))
    best = tl.full((), float("-inf"), tl.float64)
    best_id = tl.full((), -1, tl.int64)
    for v0 in range(0, V, BLOCK_V):
        v = v0 + tl.arange(0, BLOCK_V).to(tl.int64)
        ok = v < V
        col = ((col_base + v) & 0xFFFFFFFF).to(tl.uint32)
        h = _fmix(_mix(h0, col))
        u = h.to(tl.float64) / 4294967295.0
        log_u = tl.minimum(tl.maximum(log_f64(u, PORTABLE), -1.7976931348623157e308), -2.3283064365386963e-10)
        g = -log_f64(-log_u, PORTABLE)
        lp = tl.load(logp_ptr + r * V + v, mask=ok, other=float("-inf")).to(tl.float64)
        score = tl.where(ok, lp + g, float("-inf"))
        m = tl.max(score, axis=0)
        idx = tl.min(tl.where(ok & (score == m), v, V + BLOCK_V), axis=0)
        take = (m > best) | (best_id < 0)
        best_id = tl.where(take, idx, best_id)
        best = tl.where(take, m, best)
    tl.store(out_ptr + r, best_id)


def gumbel_argmax_triton(logp: torch.Tensor, seeds: torch.Tensor, positions: torch.Tensor,
                         col_base: int = SAMPLE_COLUMNS) -> torch.Tensor:
    logp, seeds, positions = _check(logp, seeds, positions)
    out = torch.empty(logp.shape[0], dtype=torch.int64, device=logp.device)
    if logp.shape[0]:
        _gumbel_argmax_kernel[(logp.shape[0],)](logp, seeds, positions, out, logp.shape[1], int(col_base),
                                                BLOCK_V=BLOCK_V, PORTABLE=PORTABLE_MATH, num_warps=4)
    return out


def gumbel_argmax_torch(logp: torch.Tensor, seeds: torch.Tensor, positions: torch.Tensor,
                        col_base: int = SAMPLE_COLUMNS) -> torch.Tensor:
    """engine.sampling.sample's seeded path after the masks: argmax(logp + gumbel_noise)."""
    logp, seeds, positions = _check(logp, seeds, positions)
    cols = col_base + torch.arange(logp.shape[1], dtype=torch.int64, device=logp.device)
    g = gumbel_noise(seeds, positions, cols)                         # [R, V] float64
    return torch.argmax(logp.to(torch.float64) + g, dim=-1)          # first maximum


def _check(logp, seeds, positions):
    if not isinstance(logp, torch.Tensor) or logp.dim() != 2 or not logp.dtype.is_floating_point:
        raise ValueError(f"gumbel_argmax: logp must be a 2-D float tensor, got {getattr(logp, 'shape', logp)}")
    for name, t in (("seeds", seeds), ("positions", positions)):
        if t.dtype != torch.int64 or t.shape != (logp.shape[0],):
            raise ValueError(f"gumbel_argmax: {name} must be int64 [{logp.shape[0]}], got {t.dtype} {tuple(t.shape)}")
    return logp.contiguous(), seeds.contiguous(), positions.contiguous()
