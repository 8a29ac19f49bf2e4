"""RMSNorm, RoPE and seeded Gumbel-max sampling: Triton vs torch (RMSNorm: the fast ops' eager
rms_norm_fast; RoPE and sampling: their torch references).

    python bench/norm_rope_sampling.py         # M = 1, 64, 4096 at N = 2880; vocab 201088
"""

import argparse

import torch

from _util import DEVICE, ON_GPU, device_line, timed
from lockstep.kernels.rmsnorm import rms_norm_fast, rms_norm_triton
from lockstep.kernels.rope import apply_rope_portable, apply_rope_triton
from lockstep.kernels.sampling import gumbel_argmax_torch, gumbel_argmax_triton


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--M", type=int, nargs="+", default=[1, 64, 4096] if ON_GPU else [1, 8])
    ap.add_argument("--N", type=int, default=2880)
    ap.add_argument("--V", type=int, default=201088)
    ap.add_argument("--rows", type=int, nargs="+", default=[1, 64] if ON_GPU else [1])
    args = ap.parse_args()
    g = torch.Generator().manual_seed(0)
    print(device_line())
    print(f"{'op':<10}{'rows':>6}{'triton ms':>11}{'torch ms':>10}{'ratio':>8}{'GB/s':>9}")
    w = torch.randn(args.N, generator=g).to(DEVICE)
    for M in args.M:
        x = torch.randn(M, args.N, generator=g).to(DEVICE)
        q = torch.randn(M, 64, 64, generator=g).to(DEVICE)
        ang = torch.randn(M, 32, generator=g).to(DEVICE)
        cos, sin = ang.cos(), ang.sin()
        for op, tri, ref, nbytes in (
                ("rmsnorm", lambda: rms_norm_triton(x, w, 1e-5), lambda: rms_norm_fast(x, w, 1e-5, x.dtype), 2 * x.numel() * 4),
                ("rope", lambda: apply_rope_triton(q, cos, sin), lambda: apply_rope_portable(q, cos, sin), 2 * q.numel() * 4)):
            t_tri, t_ref = timed(tri), timed(ref)
            print(f"{op:<10}{M:>6}{t_tri * 1e3:>11.3f}{t_ref * 1e3:>10.3f}{t_tri / t_ref:>8.2f}{nbytes / t_tri / 1e9:>9.1f}")
    for R in args.rows:
        logp = torch.log_softmax(torch.randn(R, args.V, generator=g, dtype=torch.float64), -1).to(DEVICE)
        seeds = torch.arange(R, dtype=torch.int64, device=DEVICE)
        pos = torch.full((R,), 1000, dtype=torch.int64, device=DEVICE)
        t_tri = timed(lambda: gumbel_argmax_triton(logp, seeds, pos))
        t_ref = timed(lambda: gumbel_argmax_torch(logp, seeds, pos))
        print(f"{'sampling':<10}{R:>6}{t_tri * 1e3:>11.3f}{t_ref * 1e3:>10.3f}{t_tri / t_ref:>8.2f}{logp.numel() * 8 / t_tri / 1e9:>9.1f}")


if __name__ == "__main__":
    main()
