"""Triton attention (sinks, window, GQA; 64-key tiles in 1024-key splits) vs its single walk and torch.

    python bench/attention.py                   # decode at gpt-oss heads (64 q / 8 kv, D 64), contexts 128 … 32768
    python bench/attention.py --batch 1 --dtype bf16          # the recorded figure: batch 1, bf16
    python bench/attention.py --prefill 1024    # one 1024-token prefill instead
Columns, all in this process on the same tensors:
  triton ms   the product kernel (kernels.attention.attention_triton): split-K (one program per
              token, KV head and 1024-key split, then a merge) for decode with a walk longer
              than one split, one program per (block of tokens, KV head) otherwise
  walk ms     the same kernel with one split for the whole cache (_split=WALK): the single 64-key
              walk of old, each program going through every tile itself
  torch ms    an eager torch baseline (attention_eager below: whole score rows, torch's softmax)
  walk/tri    the split-K speed-up (> 1: faster); tri/torch as before
Decode prints the achieved fraction of H200 HBM bandwidth: bytes = the visible K and V rows
each token must read (Hkv x keys x D x 2 x element size) plus q and out.
On the CPU (Triton's interpreter) the defaults are tiny and --split defaults to 128, so that a
smoke run goes through split-K too; the ratios mean little there.
"""

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))      # this checkout, not an installed copy
from _util import DEVICE, HBM_BYTES_PER_S, ON_GPU, device_line, timed  # noqa: E402
from lockstep.kernels.attention import SPLIT, attention_triton  # noqa: E402

WALK = 1 << 30      # a split larger than any cache: the one-split walk


def attention_eager(q, k_cache, v_cache, slots, positions, sinks, window, scale):
    """A speed baseline only (values, torch's own kernels; the bit-exact reference is
    kernels.attention.attention_portable): whole score rows, mask, sink column, softmax, times V."""
    T, Hq, D = q.shape
    _, Hkv, S, _ = k_cache.shape
    G = Hq // Hkv
    k = k_cache.index_select(0, slots).to(torch.float32)                       # [T, Hkv, S, D]
    v = v_cache.index_select(0, slots).to(torch.float32)
    s = torch.einsum("thgd,thsd->thgs", q.to(torch.float32).reshape(T, Hkv, G, D), k) * scale
    j = torch.arange(S, device=q.device)
    vis = j[None, :] <= positions[:, None]                                      # [T, S]
    if window > 0:
        vis = vis & (j[None, :] > positions[:, None] - window)
    s = s.masked_fill(~vis[:, None, None, :], float("-inf"))
    sink = sinks.to(torch.float32).reshape(1, Hkv, G, 1).expand(T, Hkv, G, 1)
    probs = torch.softmax(torch.cat([s, sink], dim=-1), dim=-1)
    return torch.einsum("thgs,thsd->thgd", probs[..., :S], v).reshape(T, Hq, D).to(q.dtype)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--batch", type=int, nargs="+", default=[1, 8] if ON_GPU else [1])
    ap.add_argument("--context", type=int, nargs="+", default=[128, 2048, 8192, 32768] if ON_GPU else [300])
    ap.add_argument("--window", type=int, nargs="+", default=[0, 128])
    ap.add_argument("--dtype", nargs="+", default=["fp32", "bf16"])
    ap.add_argument("--prefill", type=int, default=0)
    ap.add_argument("--split", type=int, default=SPLIT if ON_GPU else 128,
                    help=f"keys per split of the product kernel (the product's: {SPLIT})")
    ap.add_argument("--heads", type=int, nargs=3, default=[64, 8, 64] if ON_GPU else [8, 1, 64], metavar=("HQ", "HKV", "D"))
    args = ap.parse_args()
    Hq, Hkv, D = args.heads
    print(device_line(), f"| split {args.split} keys")
    print(f"{'dtype':<6}{'mode':>8}{'batch':>6}{'ctx':>7}{'win':>5}{'triton ms':>11}{'walk ms':>9}{'torch ms':>10}"
          f"{'walk/tri':>9}{'tri/torch':>10}{'GB/s':>9}{'HBM %':>7}")
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
                    run = (q, k, v, slots, pos, sinks, W, 0.125)
                    t_tri = timed(lambda: attention_triton(*run, _split=args.split))
                    t_walk = timed(lambda: attention_triton(*run, _split=WALK))
                    t_ref = timed(lambda: attention_eager(*run))
                    keys = min(ctx, W) if W else ctx
                    nbytes = (B * Hkv * keys * D * 2 + 2 * T * Hq * D) * el
                    mode = "prefill" if args.prefill else "decode"
                    bw = nbytes / t_tri
                    print(f"{name:<6}{mode:>8}{B:>6}{ctx:>7}{W:>5}{t_tri * 1e3:>11.3f}{t_walk * 1e3:>9.3f}"
                          f"{t_ref * 1e3:>10.3f}{t_walk / t_tri:>9.2f}{t_tri / t_ref:>10.2f}{bw / 1e9:>9.1f}"
                          f"{100 * bw / HBM_BYTES_PER_S:>7.1f}"
                          + ("  (prefill: bytes of one pass, not a bound)" if args.prefill else ""))


if __name__ == "__main__":
    main()
