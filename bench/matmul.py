"""Batch-invariant Triton linear vs torch (F.linear, i.e. cuBLAS / MKL) at gpt-oss shapes.

    python bench/matmul.py                     # M = 1, 8, 64, 1024 at K = N = 2880, fp32 and bf16
    python bench/matmul.py --M 1 4096 --K 2880 --N 201088    # lm_head
Prints time per call, TFLOP/s and the ratio triton / torch, measured in one process.
"""

import argparse

import torch
import torch.nn.functional as F

from _util import DEVICE, ON_GPU, device_line, timed
from lockstep.kernels.matmul import linear_triton, tiles


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--M", type=int, nargs="+", default=[1, 8, 64, 1024] if ON_GPU else [1, 8])
    ap.add_argument("--K", type=int, default=2880 if ON_GPU else 256)
    ap.add_argument("--N", type=int, default=2880 if ON_GPU else 256)
    ap.add_argument("--dtype", nargs="+", default=["fp32", "bf16"])
    args = ap.parse_args()
    print(device_line())
    print(f"{'dtype':<6}{'M':>6}{'K':>7}{'N':>8}{'triton ms':>11}{'torch ms':>10}{'TFLOP/s':>9}{'ratio':>8}"
          f"  tile (BM, BN, BK, warps, stages)")
    g = torch.Generator().manual_seed(0)
    for name in args.dtype:
        dt = {"fp32": torch.float32, "bf16": torch.bfloat16}[name]
        w = (torch.randn(args.N, args.K, generator=g) / args.K ** 0.5).to(dt).to(DEVICE)
        b = torch.randn(args.N, generator=g).to(dt).to(DEVICE)
        for M in args.M:
            x = torch.randn(M, args.K, generator=g).to(dt).to(DEVICE)
            t_tri = timed(lambda: linear_triton(x, w, b))
            t_ref = timed(lambda: F.linear(x, w, b))
            flops = 2 * M * args.K * args.N
            print(f"{name:<6}{M:>6}{args.K:>7}{args.N:>8}{t_tri * 1e3:>11.3f}{t_ref * 1e3:>10.3f}"
                  f"{flops / t_tri / 1e12:>9.2f}{t_tri / t_ref:>8.2f}  {tiles(args.N, args.K, dt, M)}")


if __name__ == "__main__":
    main()
