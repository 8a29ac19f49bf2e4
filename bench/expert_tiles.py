"""Sweep the grouped expert kernels' fixed tiles at gpt-oss-20b shapes (GPU only), against cuBLAS.

    python bench/expert_tiles.py [--dtype bf16] [--tokens 1 32 2048] [--top 6]

For the experts of one 20b MoE layer (32 experts, top-4, H = I = 2880; down in the engine's 8
fixed K chunks of 360) and each candidate (BLOCK_M rows per expert block, BLOCK_N, BLOCK_K,
warps, stages; for down also one program per chunk or one looping over the chunks), prints the
time per call, the ratio against the tiles in use now (kernels.moe.expert_block_m's rows per
block for the batch, and kernels.moe.EXPERT_GPU_TILES), the ratio against cuBLAS (F.linear on each routed expert's rows,
in the same process), the bandwidth over the routed experts' weight bytes, and whether the output
bits equal those of the tiles in use (the reduction order must not depend on the tiles: a
candidate with other bits cannot be chosen). Used to choose the expert tiles: BLOCK_N, BLOCK_K,
warps and stages by the weight's shape and dtype only; BLOCK_M follows the rows per expert
(expert_block_m), since no bit depends on it.
"""

import argparse
import itertools

import torch
import torch.nn.functional as F
import triton

from _util import timed
from kernels import moe
from kernels._common import PORTABLE_MATH
from kernels.matmul import bounds_tensor
from engine.linear import k_chunk_bounds

E, TOP_K, H, I = 32, 4, 2880, 2880
CANDIDATES = [(bm, bn, bk, w, 3) for bm, (bn, bk, w) in itertools.product(
    (16, 32, 64, 128), ((32, 64, 4), (64, 64, 4), (128, 64, 4), (128, 64, 8), (64, 128, 4)))]


def gate_up(x, groups, w, b, cfg):
    bm, bn, bk, warps, stages = cfg[:5]
    rows, bexp = groups
    R, N = x.shape[0] * TOP_K, w.shape[1]
    h = torch.zeros((R, N), dtype=x.dtype, device=x.device)
    moe._grouped_gate_up_kernel[(triton.cdiv(N, bn), bexp.shape[0])](
        x, rows, bexp, w, w, b, h, R, N, H, TOP_K, MXFP4=False, USE_DOT=True,
        BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, num_warps=warps, num_stages=stages)
    return h


def down(a, groups, w, bounds, cfg):
    bm, bn, bk, warps, stages, loop = cfg
    rows, bexp = groups
    R, N, C = a.shape[0], w.shape[1], bounds.shape[0]
    parts = torch.zeros((C, R, N), dtype=torch.float32, device=a.device)
    moe._grouped_down_kernel[(triton.cdiv(N, bn), bexp.shape[0], 1 if loop else C)](
        a, rows, bexp, w, w, bounds, parts, R, N, I, I, C, 0.0, 0.0, SWIGLU=False, MXFP4=False, USE_DOT=True,
        PORTABLE=PORTABLE_MATH, CHUNK_LOOP=loop, BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk,
        num_warps=warps, num_stages=stages)
    return parts


def cublas(x, ids, w, b):
    """Each routed expert's rows through F.linear (no chunks): the vendor baseline."""
    out = torch.empty((ids.numel(), w.shape[1]), dtype=x.dtype, device=x.device)
    rows = x.repeat_interleave(TOP_K, 0) if x.shape[0] * TOP_K == ids.numel() else x
    flat = ids.reshape(-1)
    for e in flat.unique().tolist():
        sel = (flat == e).nonzero()[:, 0]
        out[sel] = F.linear(rows[sel], w[e], None if b is None else b[e])
    return out


def sweep(name, run, base_cfg, candidates, bytes_, t_cublas, top):
    ref = run(base_cfg)
    t_base = timed(lambda: run(base_cfg))
    rows = []
    for cfg in candidates:
        try:
            y = run(cfg)
            t = timed(lambda: run(cfg))
        except Exception as e:                  # a config this Triton cannot build
            rows.append((float("inf"), cfg, f"error {type(e).__name__}"))
            continue
        rows.append((t, cfg, "same bits" if torch.equal(y, ref) else "OTHER BITS"))
    rows.sort(key=lambda r: r[0])
    print(f"\n{name}: in use {base_cfg} {t_base * 1e6:.1f} us ({bytes_ / t_base / 1e12:.2f} TB/s), "
          f"cuBLAS {t_cublas * 1e6:.1f} us")
    for t, cfg, same in rows[:top]:
        print(f"  {cfg}  {t * 1e6:8.1f} us  vs in use {t / t_base:5.2f}  vs cuBLAS {t / t_cublas:5.2f}  "
              f"{bytes_ / t / 1e12:5.2f} TB/s  {same}")
    print("  bits across all candidates:", "all equal" if all(r[2] == "same bits" for r in rows
                                                              if not r[2].startswith("error")) else "DIFFER")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--dtype", default="bf16", choices=["bf16", "fp32"])
    ap.add_argument("--tokens", type=int, nargs="+", default=[1, 32, 2048])
    ap.add_argument("--top", type=int, default=6)
    args = ap.parse_args()
    dt = {"bf16": torch.bfloat16, "fp32": torch.float32}[args.dtype]
    print(f"device {torch.cuda.get_device_name()}, torch {torch.__version__}, triton {triton.__version__}, "
          f"{args.dtype}, {E} experts, top-{TOP_K}, H = I = {H}")
    g = torch.Generator(device="cuda").manual_seed(0)
    gu_w = (torch.randn(E, 2 * I, H, generator=g, device="cuda") / H ** 0.5).to(dt)
    gu_b = torch.randn(E, 2 * I, generator=g, device="cuda").to(dt)
    dn_w = (torch.randn(E, H, I, generator=g, device="cuda") / I ** 0.5).to(dt)
    bounds = bounds_tensor(k_chunk_bounds(I), I, torch.device("cuda"))
    for T in args.tokens:
        x = torch.randn(T, H, generator=g, device="cuda").to(dt)
        ids = torch.argsort(torch.rand(T, E, generator=g, device="cuda"), dim=1)[:, :TOP_K].contiguous()
        a = torch.randn(T * TOP_K, I, generator=g, device="cuda").to(dt)
        routed = ids.unique().numel()
        groups = {bm: moe.group_by_expert(ids.reshape(-1), 0, E, bm) for bm in (16, 32, 64, 128)}
        bm = moe.expert_block_m(T * TOP_K, E, dt)                      # the engine's rows per block
        bn, bk, warps, stages = moe.expert_tiles("gate_up", 2 * I, H, dt)
        sweep(f"gate_up T={T} ({routed} experts routed)",
              lambda c: gate_up(x, groups[c[0]], gu_w, gu_b, c), (bm, bn, bk, warps, stages),
              CANDIDATES, routed * gu_w[0].numel() * gu_w.element_size(),
              timed(lambda: cublas(x, ids, gu_w, gu_b)), args.top)
        bn, bk, warps, stages = moe.expert_tiles("down", H, I, dt)
        sweep(f"down T={T} (8 chunks of {I // 8})",
              lambda c: down(a, groups[c[0]], dn_w, bounds, c),
              (bm, bn, bk, warps, stages, False),   # the engine's: chunk_loop off
              [c + (loop,) for c in CANDIDATES for loop in (False, True)],
              routed * dn_w[0].numel() * dn_w.element_size(),
              timed(lambda: cublas(a, ids, dn_w, None)), args.top)


if __name__ == "__main__":
    main()
