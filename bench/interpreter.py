"""Triton's interpreter as kernels/_interpret.py runs it, against Triton as shipped, in the same run:
microseconds per interpreted operation of three one-program kernels (two tensors of one type, a
broadcast operand, a number operand), one engine kernel launch, the ratio of each, and whether the
bytes agree (they must: the patches change no numpy operation).

    python3 bench/interpreter.py [--ops N]        (CPU; TRITON_INTERPRET=1 is set when there is no GPU)

It exits 3 when any case's bytes differ.

Run it on a quiet machine: on a shared one the ratio measures the neighbours.
"""

from __future__ import annotations

import argparse
import time

import torch

from lockstep.kernels import _interpret, portable
from lockstep.kernels._common import INTERPRET

import lockstep.kernels._common  # noqa: F401  (before triton: it picks the interpreter on a CPU)
import triton
import triton.language as tl


@triton.jit
def _same_type(x_ptr, y_ptr, N: tl.constexpr, B: tl.constexpr):
    x = tl.load(x_ptr + tl.arange(0, B))
    acc = tl.zeros((B,), dtype=tl.float32)
    for _ in range(N):
        acc = acc + x                             # [B] + [B], both fp32: no cast, no broadcast
    tl.store(y_ptr + tl.arange(0, B), acc)


@triton.jit
def _broadcast(x_ptr, y_ptr, N: tl.constexpr, B: tl.constexpr):
    x = tl.load(x_ptr + tl.arange(0, B))
    acc = tl.zeros((B, B), dtype=tl.float32)
    for _ in range(N):
        acc = acc + x[:, None]                    # [B, B] + [B, 1]: a broadcast
    tl.store(y_ptr + tl.arange(0, B), tl.sum(acc, axis=1))


@triton.jit
def _number(x_ptr, y_ptr, N: tl.constexpr, B: tl.constexpr):
    acc = tl.load(x_ptr + tl.arange(0, B))
    for _ in range(N):
        acc = acc * 0.5                           # a number: Triton's own path (a constant, splat)
    tl.store(y_ptr + tl.arange(0, B), acc)


def _per_op(kernel, ops: int):
    x, y = torch.linspace(-1, 1, 64), torch.empty(64)
    kernel[(1,)](x, y, 8, 64)                     # warm: the kernel's function is parsed once
    start = time.perf_counter()
    kernel[(1,)](x, y, ops, 64)
    return (time.perf_counter() - start) / ops * 1e6, y


def _linear():
    from lockstep.kernels.matmul import linear_triton
    g = torch.Generator().manual_seed(0)
    x, w, b = (portable.normal(s, g) for s in ((5, 300), (200, 300), (200,)))
    linear_triton(x, w, b)
    start = time.perf_counter()
    y = linear_triton(x, w, b)
    return (time.perf_counter() - start) * 1e6, y


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--ops", type=int, default=3000, help="interpreted operations per micro kernel")
    args = p.parse_args(argv)
    if not INTERPRET:
        raise SystemExit("bench/interpreter.py measures Triton's interpreter: run it without a GPU "
                         "(or with TRITON_INTERPRET=1)")
    cases = {"a + b (one type)": lambda: _per_op(_same_type, args.ops),
             "a + x[:, None]": lambda: _per_op(_broadcast, args.ops),
             "a * 0.5 (a number)": lambda: _per_op(_number, args.ops),
             "linear_triton 5x300 @ 300x200 (us a launch)": _linear}
    print(f"{'case':46s} {'shipped':>10s} {'ours':>10s} {'ratio':>7s}  bytes")
    differ = 0
    for name, run in cases.items():
        with _interpret.triton_as_shipped():
            shipped_us, shipped = run()
        ours_us, ours = run()
        same = torch.equal(shipped.view(torch.int32), ours.view(torch.int32))
        differ += not same
        print(f"{name:46s} {shipped_us:10.1f} {ours_us:10.1f} {ours_us / shipped_us:6.2f}x  "
              f"{'identical' if same else 'DIFFER'}")
    return 3 if differ else 0             # the patches must change no byte


if __name__ == "__main__":
    raise SystemExit(main())
