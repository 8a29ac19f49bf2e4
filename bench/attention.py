"""Triton attention (sinks, window, GQA, fixed 64-key split) vs the plain torch reference.

    python bench/attention.py                   # decode at gpt-oss heads (64 q / 8 kv, D 64)
    python bench/attention.py --prefill 1024    # one 1024-token prefill instead
Decode prints the achieved fraction of H200 HBM bandwidth: bytes = the visible K and V rows
each token must read (Hkv x keys x D x 2 x element size) plus q and out.
"""

import argparse

import torch

from _util import DEVICE, HBM_BYTES_PER_S, ON_GPU, device_line, timed
from kernels.attention import attention


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--batch", type=int, nargs="+", default=[1, 8, 64] if ON_GPU else [1, 2])
    ap.add_argument("--context", type=int, nargs="+", default=[1024, 8192] if ON_GPU else [200])
    ap.add_argument("--window", type=int, nargs="+", default=[0, 128])
    ap.add_argument("--dtype", nargs="+", default=["fp32", "bf16"])
    ap.add_argument("--prefill", type=int, default=0)
    ap.add_argument("--heads", type=int, nargs=3, default=[64, 8, 64] if ON_GPU else [8, 1, 64], metavar=("HQ", "HKV", "D"))
    args = ap.parse_args()
    Hq, Hkv, D = args.heads
    print(device_line())
    print(f"{'dtype':<6}{'mode':>8}{'batch':>6}{'ctx':>7}{'win':>5}{'triton ms':>11}{'torch ms':>10}{'ratio':>8}{'GB/s':>9}{'HBM %':>7}")
    g = torch.Generator().manual_seed(0)
    for name in args.dtype:
        dt = {"fp32": torch.float32, "bf16": torch.bfloat16}[name]
        el = torch.finfo(dt).bits // 8
        for ctx in ([args.prefill] if args.prefill else args.context):
            for B in ([1] if args.prefill else args.batch):
                S = -(-ctx // 64) * 64
                k = torch.randn(B, Hkv, S, D, generator=g).to(dt).to(DEVICE)
                v = torch.randn(B, Hkv, S, D, generator=g).to(dt).to(DEVICE)
                sinks = torch.randn(Hq, generator=g).to(DEVICE)
                if args.prefill:
                    T, pos, slots = ctx, torch.arange(ctx), torch.zeros(ctx, dtype=torch.int64)
                else:
                    T, pos, slots = B, torch.full((B,), ctx - 1), torch.arange(B)
                pos, slots = pos.to(DEVICE), slots.to(DEVICE)
                q = torch.randn(T, Hq, D, generator=g).to(dt).to(DEVICE)
                for W in args.window:
                    t_tri = timed(lambda: attention(q, k, v, slots, pos, sinks, W, 0.125, backend="triton"))
                    t_ref = timed(lambda: attention(q, k, v, slots, pos, sinks, W, 0.125))
                    keys = min(ctx, W) if W else ctx
                    nbytes = (B * Hkv * keys * D * 2 + 2 * T * Hq * D) * el
                    mode = "prefill" if args.prefill else "decode"
                    bw = nbytes / t_tri
                    print(f"{name:<6}{mode:>8}{B:>6}{ctx:>7}{W:>5}{t_tri * 1e3:>11.3f}{t_ref * 1e3:>10.3f}"
                          f"{t_tri / t_ref:>8.2f}{bw / 1e9:>9.1f}{100 * bw / HBM_BYTES_PER_S:>7.1f}"
                          + ("  (prefill: bytes of one pass, not a bound)" if args.prefill else ""))


if __name__ == "__main__":
    main()
