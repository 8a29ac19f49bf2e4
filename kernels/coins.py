"""Seeded randomness by hashing: the coin contract of DESIGN §5.

Every random number Lockstep uses is a pure function of (seed, pos, col):

    h = murmur_hash32(seed, pos, col)       MurmurHash3_x86_32, hash seed 0, over the
                                            16-byte key  seed:u64 ‖ pos:u32 ‖ col:u32
    u = float64(h) / 4294967295             u ∈ [0, 1]  (note: 2^32 − 1, not 2^32)

From u we derive
    verify coins   coin = min(float32(u), 1 − 2^−24)           [verify_coins]
    Gumbel noise   g = −log(−clamp(log u, −DBL_MAX, −2^−32))   [gumbel_noise]

Hash columns keep only their low 32 bits, so giving each random stream its own column range
guarantees no two streams ever share a key (DESIGN §5 "Streams"):
    verify coins          columns 0 … N (seed as-is; SGLang compatible)
    target token sampling SAMPLE_COLUMNS + vocab id
    draft token sampling  DRAFT_COLUMNS + draft vocab id

The hash has one Triton kernel and one plain-torch reference; they are bitwise identical.
Everything after the hash is plain torch float64 arithmetic (IEEE division and casts), so
coins are the same bits on every platform. Gumbel noise goes through `log`: the torch path
uses kernels.portable.log64 (range reduction and a fixed polynomial from IEEE operations), so
it too is the same on every CPU and on CUDA; the Triton kernel uses the same polynomial in
the interpreter and the GPU's own `log` when compiled.
"""

import torch
from lockstep.kernels import _common  # noqa: F401  (first: it sets TRITON_INTERPRET before triton is imported)
import triton
import triton.language as tl

from lockstep.kernels.portable import log64

SAMPLE_COLUMNS = 1 << 31
DRAFT_COLUMNS = 1 << 30

UINT32_MAX = 0xFFFFFFFF
U_DIVISOR = 4294967295  # 2^32 − 1, so that the largest hash maps to exactly 1.0
COIN_MAX = 1.0 - 2.0**-24  # the largest float32 below 1.0

# MurmurHash3_x86_32 constants.
_C1, _C2 = 0xCC9E2D51, 0x1B873593
_F1, _F2 = 0x85EBCA6B, 0xC2B2AE35
_N = 0xE6546B64


# --------------------------------------------------------------------------- torch reference
def _rotl32(x: torch.Tensor, r: int) -> torch.Tensor:
    return ((x << r) | (x >> (32 - r))) & UINT32_MAX


def _mix_block(h: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    # int64 products of two 32-bit values may wrap past 2^63; the low 32 bits stay exact.
    k = (k * _C1) & UINT32_MAX
    k = _rotl32(k, 15)
    k = (k * _C2) & UINT32_MAX
    h = _rotl32(h ^ k, 13)
    return (h * 5 + _N) & UINT32_MAX


def _fmix32(h: torch.Tensor) -> torch.Tensor:
    h = h ^ (h >> 16)
    h = (h * _F1) & UINT32_MAX
    h = h ^ (h >> 13)
    h = (h * _F2) & UINT32_MAX
    return h ^ (h >> 16)


def murmur_hash32_torch(seed: torch.Tensor, pos: torch.Tensor, col: torch.Tensor) -> torch.Tensor:
    """seed [n], pos [n], col [m] int64 → [n, m] int64 holding uint32 hash values."""
    seed, pos, col = _check_keys(seed, pos, col)
    seed_lo = (seed & UINT32_MAX)[:, None]          # [n, 1]; & on int64 two's complement
    seed_hi = ((seed >> 32) & UINT32_MAX)[:, None]  # wraps negative seeds mod 2^64
    pos_lo = (pos & UINT32_MAX)[:, None]
    col_lo = (col & UINT32_MAX)[None, :]            # [1, m]
    h = torch.zeros((seed.shape[0], col.shape[0]), dtype=torch.int64, device=seed.device)
    for k in (seed_lo, seed_hi, pos_lo, col_lo):
        h = _mix_block(h, k.expand_as(h))
    return _fmix32(h ^ 16)  # 16 = key length in bytes


# --------------------------------------------------------------------------- Triton kernel
@triton.jit
def _rotl(x, r: tl.constexpr):
    return (x << r) | (x >> (32 - r))


@triton.jit
def _mix(h, k):
    k = k * 0xCC9E2D51
    k = _rotl(k, 15)
    k = k * 0x1B873593
    h = _rotl(h ^ k, 13)
    return h * 5 + 0xE6546B64


@triton.jit
def _fmix(h):
    # the finaliser over a 16-byte key (length 16 mixed in first)
    h = h ^ 16
    h = h ^ (h >> 16)
    h = h * 0x85EBCA6B
    h = h ^ (h >> 13)
    h = h * 0xC2B2AE35
    return h ^ (h >> 16)


# Integers only: the row count n is not specialized (m, the columns, stays: vector stores).
@triton.jit(do_not_specialize=["n"])
def _murmur_kernel(seed_ptr, pos_ptr, col_ptr, out_ptr, n, m,
                   BLOCK_N: tl.constexpr, BLOCK_M: tl.constexpr):
    # One program hashes a [BLOCK_N, BLOCK_M] tile of (row, column) keys. All arithmetic is
    # uint32, which wraps mod 2^32 exactly as MurmurHash3 wants.
    rows = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    cols = tl.program_id(1) * BLOCK_M + tl.arange(0, BLOCK_M)
    row_ok = rows < n
    col_ok = cols < m
    seed = tl.load(seed_ptr + rows, mask=row_ok, other=0)
    pos = tl.load(pos_ptr + rows, mask=row_ok, other=0)
    col = tl.load(col_ptr + cols, mask=col_ok, other=0)
    seed_lo = (seed & 0xFFFFFFFF).to(tl.uint32)
    seed_hi = ((seed >> 32) & 0xFFFFFFFF).to(tl.uint32)
    pos_lo = (pos & 0xFFFFFFFF).to(tl.uint32)
    col_lo = (col & 0xFFFFFFFF).to(tl.uint32)

    h = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.uint32)
    h = _mix(h, seed_lo[:, None])
    h = _mix(h, seed_hi[:, None])
    h = _mix(h, pos_lo[:, None])
    h = _fmix(_mix(h, col_lo[None, :]))

    out = out_ptr + rows[:, None] * m + cols[None, :]
    tl.store(out, h.to(tl.int64), mask=row_ok[:, None] & col_ok[None, :])


def murmur_hash32_triton(seed: torch.Tensor, pos: torch.Tensor, col: torch.Tensor) -> torch.Tensor:
    seed, pos, col = _check_keys(seed, pos, col)
    n, m = seed.shape[0], col.shape[0]
    out = torch.empty((n, m), dtype=torch.int64, device=seed.device)
    if n == 0 or m == 0:
        return out
    block_n, block_m = 16, 64
    grid = (triton.cdiv(n, block_n), triton.cdiv(m, block_m))
    _murmur_kernel[grid](seed, pos, col, out, n, m, BLOCK_N=block_n, BLOCK_M=block_m, enable_fp_fusion=True)
    return out


# --------------------------------------------------------------------------- public API
def uniform_from_hash(h: torch.Tensor) -> torch.Tensor:
    """u = h / (2^32 − 1) in float64; u ∈ [0, 1], both ends reachable."""
    return h.to(torch.float64) / U_DIVISOR


def coins_from_hash(h: torch.Tensor) -> torch.Tensor:
    """float32 coins in [0, 1): the cast rounds the top 129 hashes to 1.0, the clamp undoes it."""
    return uniform_from_hash(h).to(torch.float32).clamp(max=COIN_MAX)


def gumbel_from_hash(h: torch.Tensor) -> torch.Tensor:
    """float64 Gumbel noise, finite for every hash: h = 0 gives log 0, h = 2^32 − 1 gives u = 1."""
    log_u = log64(uniform_from_hash(h))                      # portable: libm and SLEEF differ
    log_u = log_u.clamp(min=-torch.finfo(torch.float64).max, max=-(2.0**-32))
    return -log64(-log_u)


def verify_coins(seeds: torch.Tensor, seq_lens: torch.Tensor, draft_token_num: int,
                 murmur=None) -> tuple[torch.Tensor, torch.Tensor]:
    """Verify coins of DESIGN §5 → (coins [n, N] float32, final [n] float32).

    Row i uses the request's seed and its committed sequence length n_i as the hash position.
    Columns 0 … N−1 are the per-node rejection coins, column N the final-sampling coin.
    """
    if isinstance(draft_token_num, bool) or not isinstance(draft_token_num, int) or draft_token_num < 1:
        raise ValueError(f"draft_token_num must be a positive int, got {draft_token_num!r}")
    cols = torch.arange(draft_token_num + 1, dtype=torch.int64, device=seeds.device)
    coins = coins_from_hash((murmur or murmur_hash32_torch)(seeds, seq_lens, cols))
    return coins[:, :draft_token_num].contiguous(), coins[:, draft_token_num].contiguous()


def gumbel_noise(seed: torch.Tensor, pos: torch.Tensor, col: torch.Tensor, murmur=None) -> torch.Tensor:
    """Gumbel noise [n, m] float64 for keys (seed[i], pos[i], col[j]); `murmur`: the hash
    (murmur_hash32_torch, the default, or murmur_hash32_triton: the same bits)."""
    return gumbel_from_hash((murmur or murmur_hash32_torch)(seed, pos, col))


def _check_keys(seed, pos, col):
    for name, t in (("seed", seed), ("pos", pos), ("col", col)):
        if not isinstance(t, torch.Tensor) or t.dtype != torch.int64 or t.dim() != 1:
            got = f"{t.dtype} tensor of shape {tuple(t.shape)}" if isinstance(t, torch.Tensor) else type(t).__name__
            raise ValueError(f"{name} must be a 1-D int64 tensor, got {got}")
    if seed.shape != pos.shape:
        raise ValueError(f"seed and pos must have the same length, got {seed.shape[0]} and {pos.shape[0]}")
    if not (seed.device == pos.device == col.device):
        raise ValueError(f"seed, pos and col must be on one device, got {seed.device}, {pos.device}, {col.device}")
    return seed.contiguous(), pos.contiguous(), col.contiguous()
