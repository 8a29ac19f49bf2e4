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
    if check_backend(backend) != "torch":
        raise NotImplementedError("linear: only the 'torch' backend exists so far")
    if x.dim() != 2 or weight.dim() != 2 or x.shape[1] != weight.shape[1]:
        raise ValueError(f"linear: x {tuple(x.shape)} and weight {tuple(weight.shape)} do not fit [M, K] x [N, K]")
    out = x.new_empty((x.shape[0], weight.shape[0]))
    for i in range(x.shape[0]):
        out[i] = F.linear(x[i:i + 1], weight, bias)[0]     # [1, K] -> [1, N]; same shape every row
    return out
