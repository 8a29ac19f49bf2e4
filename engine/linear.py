"""Row-parallel layers: the fixed K chunks and the fixed tree that adds them (DESIGN §2, D4).

The linear layer itself is kernels/matmul.py's: linear_triton (fixed K tiles) and its bit-exact
torch reference linear_portable (kernels.portable's fixed-tree matmul, the same bits on every
machine and batch), and the fast ops' linear_fast; engine/ops.py picks one once, when the model
is built. This module holds what the engine adds on top: where the K chunks of a row-parallel
layer lie and the one order in which their partials are added, on one device and across ranks.
"""

from __future__ import annotations

import torch

from lockstep.kernels.matmul import linear_chunks_portable


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
    weight [N, K] -> [M, N]; the prologue (elementwise) runs per chunk (kernels.matmul.linear_chunks_portable).
    The one-device path of every row-parallel layer; bits equal those of any TP degree."""
    if x.dim() != 2 or weight.dim() != 2 or x.shape[1] != x_per_k * weight.shape[1]:
        raise ValueError(f"linear_k_chunked: x {tuple(x.shape)} and weight {tuple(weight.shape)} do not fit "
                         f"[M, {x_per_k} * K] x [N, K]")
    y = tree_sum(linear_chunks_portable(x, weight, k_chunk_bounds(weight.shape[1]), prologue, x_per_k))
    return y if bias is None else y + bias
