"""Triton MoE (router top-k, per-row expert GEMV kernels, SwiGLU, slot-ordered sum) vs the
torch reference (one F.linear per token and slot, as the engine's torch backend does).

    python bench/moe.py                 # gpt-oss-20b: H = I = 2880, 32 experts, top-4, fp32
Also prints router_top_k and clamped_swiglu alone against their torch references.
"""

import argparse

import torch

from _util import DEVICE, ON_GPU, device_line, timed
from kernels.moe import clamped_swiglu, moe, router_top_k


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--T", type=int, nargs="+", default=[1, 8, 64] if ON_GPU else [1, 2])
    ap.add_argument("--H", type=int, default=2880 if ON_GPU else 128)
    ap.add_argument("--I", type=int, default=2880 if ON_GPU else 128)
    ap.add_argument("--E", type=int, default=32 if ON_GPU else 4)
    ap.add_argument("--k", type=int, default=4 if ON_GPU else 2)
    ap.add_argument("--dtype", default="fp32")
    args = ap.parse_args()
    dt = {"fp32": torch.float32, "bf16": torch.bfloat16}[args.dtype]
    g = torch.Generator().manual_seed(0)
    H, I, E, k = args.H, args.I, args.E, args.k
    W = [(torch.randn(*s, generator=g) * sc).to(dt).to(DEVICE) for s, sc in
         (((E, 2 * I, H), H ** -0.5), ((E, 2 * I), 1.0), ((E, H, I), I ** -0.5), ((E, H), 1.0))]
    print(device_line(), f"H={H} I={I} E={E} k={k} {args.dtype}")
    print(f"{'op':<14}{'T':>6}{'triton ms':>11}{'torch ms':>10}{'ratio':>8}{'weight GB/s':>13}")
    for T in args.T:
        x = torch.randn(T, H, generator=g).to(dt).to(DEVICE)
        logits = torch.randn(T, E, generator=g).to(DEVICE)
        routing, ids = router_top_k(logits, k)
        for op, f in (("router_top_k", lambda be: router_top_k(logits, k, backend=be)),
                      ("swiglu", lambda be: clamped_swiglu(x.repeat(1, 2 * I // H + 1)[:, :2 * I].contiguous(), backend=be)),
                      ("moe", lambda be: moe(x, routing, ids, *W, backend=be))):
            t_tri = timed(lambda: f("triton"))
            t_ref = timed(lambda: f("torch"), repeat=3 if op == "moe" else None)
            extra = ""
            if op == "moe":
                used = ids.unique().numel()
                extra = f"{used * 3 * H * I * torch.finfo(dt).bits / 8 / t_tri / 1e9:>13.1f}"
            print(f"{op:<14}{T:>6}{t_tri * 1e3:>11.3f}{t_ref * 1e3:>10.3f}{t_tri / t_ref:>8.2f}{extra}")


if __name__ == "__main__":
    main()
