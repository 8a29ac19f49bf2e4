"""The one linear layer of the engine: y = x @ W^T + b, the same bits on every machine.

torch's matmul is neither batch invariant nor portable: MKL picks a different kernel (and
with it a different summation order over K) for M = 1 than for M >= 2, its blocking depends
on M, and its vector width on the CPU, so the same row comes out with different low bits
depending on how many rows share the call and on which CPU runs it.

Fix (DESIGN §2): the torch backend never calls a BLAS. `kernels.portable.matmul_nt` forms
each product x[m, k] * W[n, k] as one rounded fp32 multiply and adds the K products in one
fixed pairwise tree. Every output element is then the same sequence of IEEE operations
whatever M, the row's index, the other rows, the CPU's instruction set or the thread count,
so a whole batch goes in one call (D0, D2, D3). The Triton ops use fixed K tiles instead
(kernels/matmul.py; engine/ops.py picks one or the other once, when the model is built).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from kernels.portable import matmul_nt


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None,
           out_dtype: torch.dtype | None = None) -> torch.Tensor:
    """x [M, K], weight [N, K] (fp32 or bf16), bias [N] or None -> [M, N]; every row computed
    the same way. Products and sums in fp32 (a product of two bf16 values is exact in fp32),
    the bias added in fp32, the result rounded once to out_dtype (default: x's dtype)."""
    out_dtype = out_dtype or x.dtype
    if x.dim() != 2 or weight.dim() != 2 or x.shape[1] != weight.shape[1]:
        raise ValueError(f"linear: x {tuple(x.shape)} and weight {tuple(weight.shape)} do not fit [M, K] x [N, K]")
    y = matmul_nt(x.to(torch.float32), weight.to(torch.float32))   # [M, N], fixed-order K sums
    y = y if bias is None else torch.add(y, bias)
    return y.to(out_dtype)


def linear_fast(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None,
                out_dtype: torch.dtype | None = None) -> torch.Tensor:
    """F.linear (cuBLAS / MKL): no invariance promise (the "fast" ops, bench/e2e.py only)."""
    y = F.linear(x, weight, None if bias is None else bias.to(x.dtype))
    return y.to(out_dtype or x.dtype)


# ---------------------------------------------------------------- row-parallel layers (DESIGN §2, D4)
# Layers whose input dimension is split across tensor-parallel ranks (o_proj, the experts'
# down_proj) reduce over K in K_CHUNKS fixed chunks, on one device exactly as on N devices:
#     partial_c = x[:, chunk c] @ W[:, chunk c]^T          c = 0 .. K_CHUNKS - 1
#     y = ((p0 + p1) + (p2 + p3)) + ((p4 + p5) + (p6 + p7)) + bias
# A rank of a TP group owns K_CHUNKS / tp consecutive chunks; the partials are all-gathered
# and every rank adds all of them in this one tree (engine/parallel.py). Chunk c covers
# columns [c * K // K_CHUNKS, (c + 1) * K // K_CHUNKS): the bounds depend on K alone.

K_CHUNKS = 8   # the largest supported tensor-parallel degree


def k_chunk_bounds(K: int, chunks: int = K_CHUNKS) -> list[tuple[int, int]]:
    """Column ranges [lo, hi) of the `chunks` fixed K chunks of a length-K reduction."""
    return [(c * K // chunks, (c + 1) * K // chunks) for c in range(chunks)]


def k_chunk_partials(x: torch.Tensor, weight: torch.Tensor, bounds, prologue=None,
                     x_per_k: int = 1) -> list[torch.Tensor]:
    """One [M, N] partial product per (lo, hi) in `bounds` (columns of weight), no bias.

    The partials are fp32 whatever x's dtype (they are added in fp32 by tree_sum).
    Chunk c's input is x[:, x_per_k*lo : x_per_k*hi] passed through `prologue` if given (e.g.
    the clamped SwiGLU: x_per_k = 2 interleaved gate/up columns per K column; it is elementwise).
    Each chunk is reduced as one call on a fresh contiguous copy of it would reduce it, so the
    bits are the same whether the full K or one rank's slice of it is at hand (every TP degree).
    A portable matmul per chunk (all at once for equal adjacent chunks); the Triton ops' version
    is kernels.matmul.linear_chunks_triton (every chunk in one launch)."""
    bounds = list(bounds)
    if _equal_adjacent(bounds):
        return _partials_at_once(x, weight, bounds, prologue, x_per_k)
    parts = []
    for lo, hi in bounds:
        xc = x[:, x_per_k * lo:x_per_k * hi].clone(memory_format=torch.contiguous_format)  # fresh
        if prologue is not None:
            xc = prologue(xc).contiguous()
        wc = weight[:, lo:hi].clone(memory_format=torch.contiguous_format)
        parts.append(linear(xc, wc, None, out_dtype=torch.float32))
    return parts


def _equal_adjacent(bounds) -> bool:
    return bool(bounds) and bounds[0][1] > bounds[0][0] and all(
        hi - lo == bounds[0][1] - bounds[0][0] and lo == prev_hi
        for (lo, hi), (_, prev_hi) in zip(bounds[1:], bounds[:-1]))


def _partials_at_once(x, weight, bounds, prologue, x_per_k) -> list[torch.Tensor]:
    """The torch backend's partials of equal adjacent chunks in one batched product: every
    element is the same tree_sum as chunk by chunk (the prologue is elementwise), in far
    fewer calls."""
    lo, hi, n = bounds[0][0], bounds[-1][1], len(bounds)
    w0 = bounds[0][1] - lo
    xs = x[:, x_per_k * lo:x_per_k * hi]
    if prologue is not None:
        xs = prologue(xs)                                                   # [M, n * w0]
    xs = xs.to(torch.float32).reshape(x.shape[0], n, w0).transpose(0, 1)   # [n, M, w0]
    ws = weight[:, lo:hi].to(torch.float32).reshape(weight.shape[0], n, w0).transpose(0, 1)   # [n, N, w0]
    return list(matmul_nt(xs, ws).unbind(0))                                # n x [M, N]


def tree_sum(parts) -> torch.Tensor:
    """Adjacent pairs, level by level: 8 parts -> ((p0+p1)+(p2+p3))+((p4+p5)+(p6+p7)).
    The number of parts must be a power of two (it is always K_CHUNKS here)."""
    parts = list(parts)
    if not parts or len(parts) & (len(parts) - 1):
        raise ValueError(f"tree_sum: needs a power-of-two number of parts, got {len(parts)}")
    while len(parts) > 1:
        parts = [parts[i] + parts[i + 1] for i in range(0, len(parts), 2)]
    return parts[0]


def linear_k_chunked(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None,
                     prologue=None, x_per_k: int = 1) -> torch.Tensor:
    """y = prologue(x) @ W^T + b with the fixed K-chunk tree above: x [M, x_per_k * K],
    weight [N, K] -> [M, N]; the prologue (elementwise) runs per chunk (see k_chunk_partials).
    The one-device path of every row-parallel layer; bits equal those of any TP degree."""
    if x.dim() != 2 or weight.dim() != 2 or x.shape[1] != x_per_k * weight.shape[1]:
        raise ValueError(f"linear_k_chunked: x {tuple(x.shape)} and weight {tuple(weight.shape)} do not fit "
                         f"[M, {x_per_k} * K] x [N, K]")
    y = tree_sum(k_chunk_partials(x, weight, k_chunk_bounds(weight.shape[1]), prologue, x_per_k))
    return y if bias is None else y + bias
