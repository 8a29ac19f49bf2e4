"""Sweep the Triton linear's fixed tiles at gpt-oss-20b shapes (GPU only), against cuBLAS.

    python bench/linear_tiles.py [--dtype bf16] [--M 1 32]
    python bench/linear_tiles.py --M 2048 --shapes qkv "o_proj chunk" --block-m 64 128 --block-n 64 128 \
        --block-k 64 --stages 3 --warps 4 8                # prefill: would larger M tiles help, same bits?

For each weight shape of the 20b decode step (fused qkv, one o_proj K chunk, router, lm_head,
one expert's gate_up and down chunk) and each candidate (BLOCK_M, BLOCK_N, BLOCK_K, warps,
stages), prints the time per call, the ratio against F.linear (cuBLAS) in the same process, the
weight bandwidth reached, and whether the output bits equal those of the first candidate (no
output bit may depend on the tile). Used to choose kernels/matmul.py's GPU tile table (by M, N,
K and dtype). The first candidate is the reference of the bits and of the "vs first" ratio (with
the defaults (16, 16, 64, 4, 3)): put the tiles in use first (--block-m 64 ...) to compare
against them. Times are GPU time per call, 20 calls captured in a CUDA graph (bench/_util.py
`graph_timed`: a decode step runs captured, so the host's launch cost is not the kernel's).
"""

import argparse
import itertools

import torch
import torch.nn.functional as F
import lockstep.kernels._common  # noqa: F401  (before triton: it picks the interpreter on a CPU)
import triton

from _util import graph_timed
from lockstep.kernels.matmul import _linear_kernel

SHAPES = {            # name: (N, K)
    "qkv": (5120, 2880),
    "o_proj chunk": (2880, 512),
    "router": (32, 2880),
    "lm_head": (201088, 2880),
    "expert gate_up": (5760, 2880),
    "expert down chunk": (2880, 360),
}


def run(x, w, b, tiles):
    M, K = x.shape
    N = w.shape[0]
    y = torch.empty((M, N), dtype=x.dtype, device=x.device)
    bm, bn, bk, warps, stages = tiles
    _linear_kernel[(triton.cdiv(N, bn), triton.cdiv(M, bm))](
        x, w, b, y, M, N, K, HAS_BIAS=True, USE_DOT=True, BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk,
        num_warps=warps, num_stages=stages, enable_fp_fusion=True)
    return y


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--dtype", default="bf16", choices=["bf16", "fp32"])
    ap.add_argument("--M", type=int, nargs="+", default=[1, 32])
    ap.add_argument("--shapes", nargs="+", default=list(SHAPES), choices=list(SHAPES))
    ap.add_argument("--block-m", type=int, nargs="+", default=[16, 64])
    ap.add_argument("--block-n", type=int, nargs="+", default=[16, 32, 64, 128])
    ap.add_argument("--block-k", type=int, nargs="+", default=[64, 128])
    ap.add_argument("--warps", type=int, nargs="+", default=[4])
    ap.add_argument("--stages", type=int, nargs="+", default=[3, 4])
    ap.add_argument("--top", type=int, default=5)
    args = ap.parse_args()
    candidates = list(itertools.product(args.block_m, args.block_n, args.block_k, args.warps, args.stages))
    dt = {"bf16": torch.bfloat16, "fp32": torch.float32}[args.dtype]
    print(f"device {torch.cuda.get_device_name()}, torch {torch.__version__}, triton {triton.__version__}, {args.dtype}")
    g = torch.Generator(device="cuda").manual_seed(0)
    for name in args.shapes:
        N, K = SHAPES[name]
        w = (torch.randn(N, K, generator=g, device="cuda") / K ** 0.5).to(dt)
        b = torch.randn(N, generator=g, device="cuda")
        for M in args.M:
            x = torch.randn(M, K, generator=g, device="cuda").to(dt)
            t_ref = graph_timed(lambda: F.linear(x, w, b.to(dt)))
            rows, first, t_first = [], None, None
            for tiles in candidates:
                try:
                    y = run(x, w, b, tiles)
                    t = graph_timed(lambda: run(x, w, b, tiles))
                except Exception as e:      # a config this Triton cannot build
                    rows.append((float("inf"), tiles, f"error {type(e).__name__}"))
                    continue
                same = "ref" if first is None else ("same bits" if torch.equal(y, first) else "OTHER BITS")
                first, t_first = (y, t) if first is None else (first, t_first)
                rows.append((t, tiles, same))
            rows.sort(key=lambda r: r[0])
            print(f"\n{name} N={N} K={K} M={M}: cuBLAS {t_ref * 1e6:.1f} us "
                  f"({w.numel() * w.element_size() / t_ref / 1e12:.2f} TB/s), first {candidates[0]}")
            for t, tiles, same in rows[:args.top]:
                print(f"  {tiles}  {t * 1e6:8.1f} us  ratio {t / t_ref:5.2f}  vs first {t / (t_first or t):5.2f}  "
                      f"{w.numel() * w.element_size() / t / 1e12:5.2f} TB/s  {same}")
            print("  bits across all candidates:", "all equal" if all(r[2] in ("ref", "same bits") for r in rows
                                                                      if not r[2].startswith("error")) else "DIFFER")


if __name__ == "__main__":
    main()
