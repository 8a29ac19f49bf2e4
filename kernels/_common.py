"""Small helpers shared by the kernel modules (no kernels here).

INTERPRET is fixed when this module is imported (it sets TRITON_INTERPRET on a machine without
CUDA). Kernels take it as a constexpr, USE_DOT = not INTERPRET:

In Triton's interpreter `tl.dot` is a numpy matmul of the whole tile. Measured here (numpy's
OpenBLAS, 2 cores, triton 3.9): the bits of one output row change with the contents of the
other rows of the tile (a row alone vs the same row in a tile holding 8+ real rows differs in
~60 of 70 columns at K = 300), and for bf16 tiles the interpreter's matmul returns garbage
(max error 3.7e11). So on the interpreter every kernel reduces with an explicit broadcast
multiply and `tl.sum` over a fixed BLOCK_K, which numpy evaluates per element in an order that
depends only on BLOCK_K (checked row alone vs every position in tiles of M = 2..64: equal).
Compiled on a GPU the kernels use `tl.dot` with fixed tiles, fixed num_warps / num_stages
and input_precision="ieee" (no TF32), so each output element is one fixed MMA sequence.

PORTABLE_MATH = INTERPRET likewise: in the interpreter, exp / log / sigmoid are numpy's, which
picks an implementation by the CPU's instruction set, so kernels take kernels.portable_tl's
float64 polynomials there (the same bits on every CPU); compiled, the GPU's own functions.

Every launch states Triton's enable_fp_fusion: whether ptxas may contract a multiply and an add
into one fma moves a compiled kernel's bits (the PTX does not show it, the SASS does), and
Triton's default is changing (3.9 warns that 3.10 turns it off). True where the CUDA goldens were
recorded with the old default; False where a kernel rounds each operation on its own.
"""

from __future__ import annotations

import os

import torch

# Triton reads TRITON_INTERPRET as each kernel is decorated, and every kernel module imports this one
# first (directly or through portable_tl): on a machine without CUDA the interpreter is on unless
# the user chose otherwise. Here, not in an entry point: the kernels are also imported as a library
# (bench/, users' scripts, forked ranks) with no CLI or conftest before them.
if "TRITON_INTERPRET" not in os.environ and not torch.cuda.is_available():
    os.environ["TRITON_INTERPRET"] = "1"

INTERPRET = os.environ.get("TRITON_INTERPRET", "0") == "1"
USE_DOT = not INTERPRET
PORTABLE_MATH = INTERPRET

if INTERPRET:                      # before any kernel runs: the interpreter without its per-call re-patching
    from lockstep.kernels import _interpret
    _interpret.install()


def next_pow2(n: int) -> int:
    return 1 if n <= 1 else 1 << (n - 1).bit_length()


def check_float(name: str, t: torch.Tensor, dims: int) -> None:
    if not isinstance(t, torch.Tensor) or t.dim() != dims:
        got = f"shape {tuple(t.shape)}" if isinstance(t, torch.Tensor) else type(t).__name__
        raise ValueError(f"{name} must be a {dims}-D tensor, got {got}")
    if t.dtype not in (torch.float32, torch.bfloat16, torch.float16):
        raise ValueError(f"{name} must be float32, bfloat16 or float16, got {t.dtype}")
