"""The one linear layer of the engine: y = x @ W^T + b, batch invariant.

torch's CPU matmul is not batch invariant: MKL picks a different kernel (and with it a
different summation order over K) for M = 1 than for M >= 2, and its blocking depends on
M, so the same row can come out with different low bits depending on how many rows share
the call (tests/engine/test_linear_invariance.py shows it for M in {2, 3, 8, 17, 64}).

Fix: every row is computed by its own call with the identical shape [1, K] x [K, N]. The
result of a row then depends only on that row and W, never on M, the row's index, or the
other rows (DESIGN §2, D2/D3). This costs speed, which a CPU reference can afford; the
Triton backend will use fixed K tiles instead and slot in here.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from kernels import check_backend


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None,
           backend: str = "torch") -> torch.Tensor:
    """x [M, K], weight [N, K], bias [N] or None -> [M, N], each row computed alone."""
    if check_backend(backend) == "triton":
        from kernels.matmul import linear_triton          # fixed tiles, no split-K: batch invariant
        return linear_triton(x, weight, bias)
    if x.dim() != 2 or weight.dim() != 2 or x.shape[1] != weight.shape[1]:
        raise ValueError(f"linear: x {tuple(x.shape)} and weight {tuple(weight.shape)} do not fit [M, K] x [N, K]")
    out = x.new_empty((x.shape[0], weight.shape[0]))
    for i in range(x.shape[0]):
        out[i] = F.linear(x[i:i + 1], weight, bias)[0]     # [1, K] -> [1, N]; same shape every row
    return out


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


def k_chunk_partials(x: torch.Tensor, weight: torch.Tensor, bounds, backend: str = "torch",
                     prologue=None, x_per_k: int = 1) -> list[torch.Tensor]:
    """One [M, N] partial product per (lo, hi) in `bounds` (columns of weight), no bias.

    Chunk c's input is a fresh contiguous copy of x[:, x_per_k*lo : x_per_k*hi], passed
    through `prologue` if given (e.g. the clamped SwiGLU: x_per_k = 2 interleaved gate/up
    columns per K column). Every chunk is its own call with the same shapes, strides and
    alignment whether the full K or one rank's slice of it is at hand. That matters for the
    prologue too: torch's CPU sigmoid gives an element different bits in the vectorised body
    and in the scalar tail, so an activation evaluated over all of I would not match the same
    activation over one rank's I / tp (tests/parallel/test_reductions.py shows it)."""
    check_backend(backend)
    bounds = list(bounds)
    ws = None
    if backend == "torch" and x.shape[0] == 1 and bounds:
        lo0, hi_end, w0 = bounds[0][0], bounds[-1][1], bounds[0][1] - bounds[0][0]
        if w0 > 0 and all(hi - lo == w0 for lo, hi in bounds) and hi_end - lo0 == len(bounds) * w0:
            # equal adjacent chunks: one copy of W into an [n, N, Kc] stack
            ws = weight[:, lo0:hi_end].reshape(weight.shape[0], len(bounds), w0).transpose(0, 1).contiguous()
    parts = []
    for c, (lo, hi) in enumerate(bounds):
        xc = x[:, x_per_k * lo:x_per_k * hi].clone(memory_format=torch.contiguous_format)  # fresh
        if prologue is not None:
            xc = prologue(xc).contiguous()
        wc = ws[c] if ws is not None else weight[:, lo:hi].clone(memory_format=torch.contiguous_format)
        if backend == "torch" and xc.shape[0] == 1:
            parts.append(F.linear(xc, wc))      # what linear() does for its one row, minus overhead
        else:
            parts.append(linear(xc, wc, None, backend))
    return parts


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
                     backend: str = "torch", prologue=None, x_per_k: int = 1) -> torch.Tensor:
    """y = prologue(x) @ W^T + b with the fixed K-chunk tree above: x [M, x_per_k * K],
    weight [N, K] -> [M, N]; the prologue (elementwise) runs per chunk (see k_chunk_partials).
    The one-device path of every row-parallel layer; bits equal those of any TP degree."""
    if x.dim() != 2 or weight.dim() != 2 or x.shape[1] != x_per_k * weight.shape[1]:
        raise ValueError(f"linear_k_chunked: x {tuple(x.shape)} and weight {tuple(weight.shape)} do not fit "
                         f"[M, {x_per_k} * K] x [N, K]")
    y = tree_sum(k_chunk_partials(x, weight, k_chunk_bounds(weight.shape[1]), backend, prologue, x_per_k))
    return y if bias is None else y + bias
