"""Sweep the grouped expert kernels' fixed tiles at gpt-oss-20b shapes (GPU only), against cuBLAS.

    python bench/expert_tiles.py [--dtype bf16|fp32|mxfp4] [--tokens 1 32 2048] [--block-m 16 32]
                                 [--stages 3 4] [--down-modes chunk loop] [--ops down]
                                 [--block-n 32 64] [--block-k 64] [--tiles 128,64,8 ...] [--top 6]

For the experts of one 20b MoE layer (32 experts, top-4, H = I = 2880; down in the engine's 8
fixed K chunks of 360) and each candidate (BLOCK_M rows per expert block, BLOCK_N, BLOCK_K,
warps, stages; for down the --down-modes: a program per chunk or one looping over the chunks),
prints the GPU time per call (20 calls captured in a CUDA graph, `graph_timed`: a decode step runs
captured, so the host's launch cost is not the kernel's), the ratio against the tiles in use now
(kernels.moe.expert_block_m's rows per block for the batch, kernels.moe.expert_tiles' tile), the
ratio against cuBLAS (F.linear on each routed expert's rows, bf16 dense weights for MXFP4), the
bandwidth over the routed experts' weight bytes (packed bytes and scales for MXFP4), and whether
the output bits equal those of the tiles in use (no bit may depend on the tile: a candidate with
other bits cannot be chosen). mxfp4: bf16 activations, packed weights with random codes and
scales 119-123 (the fast decode's range). Each launch runs kernels.moe.launched_blocks' programs,
as the engine's do. Used to choose EXPERT_GPU_TILES and MXFP4_GPU_TILES; BLOCK_M follows the rows per expert
(expert_block_m), since no bit depends on it. --block-m lists the rows per block to try (default:
the engine's pick for each batch).
"""

import argparse
import itertools

import torch
import torch.nn.functional as F
import lockstep.kernels._common  # noqa: F401  (before triton: it picks the interpreter on a CPU)
import triton

from _util import graph_timed
from lockstep.engine.linear import k_chunk_bounds
from lockstep.engine.mxfp4 import dequantize
from lockstep.kernels import moe
from lockstep.kernels._common import PORTABLE_MATH
from lockstep.kernels.matmul import bounds_tensor

E, TOP_K, H, I = 32, 4, 2880, 2880
TILES = ((16, 128, 4), (16, 256, 4), (32, 64, 4), (32, 128, 4), (32, 256, 4), (64, 64, 4), (64, 128, 4),
         (64, 256, 4), (128, 64, 4), (128, 64, 8))      # (BLOCK_N, BLOCK_K, warps)


def _weight(w):
    """-> (w, s) kernel pointers: an MXFP4 (blocks, scales) pair, or a dense weight twice."""
    return w if isinstance(w, tuple) else (w, w)


def gate_up(x, groups, w, b, cfg):
    bm, bn, bk, warps, stages = cfg[:5]
    rows, bexp = groups
    (w, s), R, N = _weight(w), x.shape[0] * TOP_K, b.shape[1]
    h = torch.empty((R, N), dtype=x.dtype, device=x.device)           # one device: every row stored
    moe._grouped_gate_up_kernel[(triton.cdiv(N, bn), moe.launched_blocks(R, bexp.shape[0], bm))](
        x, rows, bexp, w, s, b, h, R, N, H, TOP_K, MXFP4=s is not w, USE_DOT=True,
        BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, num_warps=warps, num_stages=stages, enable_fp_fusion=True)
    return h


def down(a, groups, w, bounds, bounds_list, cfg):
    bm, bn, bk, warps, stages, mode = cfg                  # mode: "chunk" or "loop"
    loop = mode == "loop"
    rows, bexp = groups
    (w, s), R, N, C = _weight(w), a.shape[0], H, bounds.shape[0]
    parts = torch.empty((C, R, N), dtype=torch.float32, device=a.device)   # as experts_one_device
    hints = moe.down_hints(bounds_list, s is not w)                 # the engine's
    moe._grouped_down_kernel[(1 if loop else C, triton.cdiv(N, bn), moe.launched_blocks(R, bexp.shape[0], bm))](
        a, rows, bexp, w, s, bounds, parts, R, N, I, I, C, 0.0, 0.0, SWIGLU=False, MXFP4=s is not w, USE_DOT=True,
        PORTABLE=PORTABLE_MATH, CHUNK_LOOP=loop, BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk,
        num_warps=warps, num_stages=stages, enable_fp_fusion=True, **hints)
    return parts


def cublas(x, ids, w, b):
    """-> fn(): each routed expert's rows through F.linear (no chunks), the vendor baseline; the
    rows of each expert found here, once, so fn reads nothing on the host (a graph captures it)."""
    out = torch.empty((ids.numel(), w.shape[1]), dtype=x.dtype, device=x.device)
    rows = x.repeat_interleave(TOP_K, 0) if x.shape[0] * TOP_K == ids.numel() else x
    flat = ids.reshape(-1)
    sel = [(e, (flat == e).nonzero()[:, 0]) for e in flat.unique().tolist()]

    def fn():
        for e, r in sel:
            out[r] = F.linear(rows[r], w[e], None if b is None else b[e])
        return out
    return fn


def sweep(name, run, base_cfg, candidates, bytes_, t_cublas, top):
    ref = run(base_cfg)
    t_base = graph_timed(lambda: run(base_cfg))
    rows = []
    for cfg in candidates:
        try:
            y = run(cfg)
            t = graph_timed(lambda: run(cfg))
        except Exception as e:                  # a config this Triton cannot build
            rows.append((float("inf"), cfg, f"error {type(e).__name__}"))
            continue
        rows.append((t, cfg, "same bits" if torch.equal(y, ref) else "OTHER BITS"))
    rows.sort(key=lambda r: r[0])
    print(f"\n{name}: in use {base_cfg} {t_base * 1e6:.1f} us ({bytes_ / t_base / 1e12:.2f} TB/s), "
          f"cuBLAS {t_cublas * 1e6:.1f} us", flush=True)
    for t, cfg, same in rows[:top]:
        print(f"  {cfg}  {t * 1e6:8.1f} us  vs in use {t / t_base:5.2f}  vs cuBLAS {t / t_cublas:5.2f}  "
              f"{bytes_ / t / 1e12:5.2f} TB/s  {same}", flush=True)
    built = [r for r in rows if not r[2].startswith("error")]
    print(f"  bits across the {len(built)} built candidates ({len(rows) - len(built)} did not build):",
          "all equal" if all(r[2] == "same bits" for r in built) else "DIFFER", flush=True)


def weights(mxfp4: bool, dt, g):
    """gate_up [E, 2I, H], its bias, down [E, H, I]: dense in dt, or MXFP4 (blocks, scales) pairs;
    and their dense bf16 copies for cuBLAS."""
    def packed(N, K):
        return (torch.randint(0, 256, (E, N, K // 32, 16), generator=g, dtype=torch.uint8, device="cuda"),
                torch.randint(119, 124, (E, N, K // 32), generator=g, dtype=torch.uint8, device="cuda"))
    gu_b = torch.randn(E, 2 * I, generator=g, device="cuda").to(dt)
    if mxfp4:
        gu, dn = packed(2 * I, H), packed(H, I)
        return gu, gu_b, dn, dequantize(*gu, dt), dequantize(*dn, dt)
    gu_w = (torch.randn(E, 2 * I, H, generator=g, device="cuda") / H ** 0.5).to(dt)
    dn_w = (torch.randn(E, H, I, generator=g, device="cuda") / I ** 0.5).to(dt)
    return gu_w, gu_b, dn_w, gu_w, dn_w


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--dtype", default="bf16", choices=["bf16", "fp32", "mxfp4"])
    ap.add_argument("--tokens", type=int, nargs="+", default=[1, 32, 2048])
    ap.add_argument("--block-m", type=int, nargs="*", default=[], help="rows per block to try (default: the engine's)")
    ap.add_argument("--stages", type=int, nargs="+", default=[3])
    ap.add_argument("--down-modes", nargs="+", default=["chunk"], choices=["chunk", "loop"],
                    help="down's programs: one per chunk (the engine's), or one looping over the chunks")
    ap.add_argument("--ops", nargs="+", default=["gate_up", "down"], choices=["gate_up", "down"])
    ap.add_argument("--block-n", type=int, nargs="*", default=[], help="only these BLOCK_N of TILES")
    ap.add_argument("--block-k", type=int, nargs="*", default=[], help="only these BLOCK_K of TILES")
    ap.add_argument("--tiles", nargs="*", default=[], metavar="BN,BK,WARPS",
                    help="candidate (BLOCK_N, BLOCK_K, warps) instead of TILES, e.g. 128,64,8")
    ap.add_argument("--top", type=int, default=6)
    args = ap.parse_args()
    mxfp4 = args.dtype == "mxfp4"
    dt = torch.float32 if args.dtype == "fp32" else torch.bfloat16
    print(f"device {torch.cuda.get_device_name()}, torch {torch.__version__}, triton {triton.__version__}, "
          f"{args.dtype}, {E} experts, top-{TOP_K}, H = I = {H}")
    g = torch.Generator(device="cuda").manual_seed(0)
    gu_w, gu_b, dn_w, gu_dense, dn_dense = weights(mxfp4, dt, g)
    w_bytes = {op: (N * K // 2 + N * K // 32 if mxfp4 else N * K * dt.itemsize)
               for op, (N, K) in (("gate_up", (2 * I, H)), ("down", (H, I)))}
    bounds_list = k_chunk_bounds(I)
    bounds = bounds_tensor(bounds_list, I, torch.device("cuda"))
    for T in args.tokens:
        x = torch.randn(T, H, generator=g, device="cuda").to(dt)
        ids = torch.argsort(torch.rand(T, E, generator=g, device="cuda"), dim=1)[:, :TOP_K].contiguous()
        a = torch.randn(T * TOP_K, I, generator=g, device="cuda").to(dt)
        routed = ids.unique().numel()
        bm = moe.expert_block_m(T * TOP_K, E, dt, mxfp4)                 # the engine's rows per block
        sizes = args.block_m or [bm]
        groups = {b: moe.group_by_expert(ids.reshape(-1), 0, E, b) for b in set(sizes) | {bm}}
        tiles = [t for t in ([tuple(map(int, t.split(","))) for t in args.tiles] or TILES) if (not args.block_n or t[0] in args.block_n)
                 and (not args.block_k or t[1] in args.block_k)]
        cands = [(b, bn, bk, w, st) for b, (bn, bk, w), st in itertools.product(sizes, tiles, args.stages)]
        if "gate_up" in args.ops:
            bn, bk, warps, stages = moe.expert_tiles("gate_up", 2 * I, H, dt, mxfp4, bm)
            sweep(f"gate_up T={T} ({routed} experts routed)",
                  lambda c: gate_up(x, groups[c[0]], gu_w, gu_b, c), (bm, bn, bk, warps, stages), cands,
                  routed * w_bytes["gate_up"], graph_timed(cublas(x, ids, gu_dense, gu_b)), args.top)
        if "down" in args.ops:
            bn, bk, warps, stages = moe.expert_tiles("down", H, I, dt, mxfp4, bm)
            sweep(f"down T={T} (8 chunks of {I // 8})",
                  lambda c: down(a, groups[c[0]], dn_w, bounds, bounds_list, c),
                  (bm, bn, bk, warps, stages, "chunk"),
                  [c + (mode,) for c in cands for mode in args.down_modes],
                  routed * w_bytes["down"], graph_timed(cublas(a, ids, dn_dense, None)), args.top)


if __name__ == "__main__":
    main()
