"""Triton MoE (router top-k, SwiGLU, the grouped experts up to the down partials) vs eager torch
baselines (the router: its portable reference; the SwiGLU with torch.sigmoid; the experts: one
torch matmul per (token, slot) row, chunk by chunk: below, a speed baseline only), then the grouped
expert kernels the engine runs (kernels.moe expert_gate_up_triton and
expert_down_partials_triton over group_by_expert's groups) with MXFP4 packed weights (fast decode,
and the exact decode everywhere: fast_decode=False) against dense bf16 weights holding the same
values, bf16 activations, each in blocks of the old fixed 16 rows and of the engine's choice
(kernels.moe.expert_block_m), all measured here. Exits 3 when a pair that must share its bits
does not.

    python bench/moe.py                 # gpt-oss-20b: H = I = 2880, 32 experts, top-4, fp32
    python bench/moe.py --only grouped --grouped-T 1 32 2048   # just the grouped table
    python bench/moe.py --only grouped --block-m-T 256 2048    # + every block size at those batches
Also prints router_top_k and clamped_swiglu alone against those baselines.
On the CPU (Triton's interpreter) the defaults are a tiny shape, for a smoke test only.
"""

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))      # this checkout, not an installed copy

import torch  # noqa: E402

from _util import DEVICE, ON_GPU, device_line, timed  # noqa: E402
from lockstep.engine.linear import k_chunk_bounds  # noqa: E402
from lockstep.engine.mxfp4 import dequantize  # noqa: E402
from lockstep.kernels.moe import (EXPERT_BLOCK_M, EXPERT_BLOCK_SIZES, MXFP4_MAX_BLOCK_M, clamped_swiglu_triton, expert_block_m,  # noqa: E402
                         expert_down_partials_triton, expert_gate_up_triton, group_by_expert,
                         router_top_k_portable, router_top_k_triton)


# Eager torch baselines: torch's own kernels, values only (the bit-exact references are kernels.moe's
# `_portable` functions and engine.experts.experts_per_row; these time what plain torch takes).
def swiglu_eager(gate_up, alpha=1.702, limit=7.0):
    x = gate_up.to(torch.float32)
    gate = x[..., 0::2].clamp(max=limit)
    up = x[..., 1::2].clamp(min=-limit, max=limit)
    return (gate * torch.sigmoid(alpha * gate) * (up + 1)).to(gate_up.dtype)


def experts_eager(x, flat_ids, k, gu_w, gu_b, dn_w, bounds):
    """Row by row: gate_up, the SwiGLU, then each K chunk of down with torch's matmul."""
    f32 = torch.float32
    h = torch.zeros((x.shape[0] * k, gu_w.shape[1]), dtype=x.dtype, device=x.device)
    for r in range(h.shape[0]):
        e = int(flat_ids[r])
        h[r] = (gu_w[e].to(f32) @ x[r // k].to(f32) + gu_b[e].to(f32)).to(x.dtype)
    a = swiglu_eager(h)
    parts = torch.zeros((len(bounds), h.shape[0], dn_w.shape[1]), dtype=f32, device=x.device)
    for r in range(h.shape[0]):
        w = dn_w[int(flat_ids[r])].to(f32)
        for c, (lo, hi) in enumerate(bounds):
            parts[c, r] = w[:, lo:hi] @ a[r, lo:hi].to(f32)
    return parts


def reference_table(args):
    dt = {"fp32": torch.float32, "bf16": torch.bfloat16}[args.dtype]
    g = torch.Generator().manual_seed(0)
    H, I, E, k = args.H, args.I, args.E, args.k
    gu_w, gu_b, dn_w = [(torch.randn(*s, generator=g) * sc).to(dt).to(DEVICE) for s, sc in
                        (((E, 2 * I, H), H ** -0.5), ((E, 2 * I), 1.0), ((E, H, I), I ** -0.5))]
    bounds = k_chunk_bounds(I)

    def experts_triton(x, ids):                      # engine.experts.experts_grouped's launches
        groups = group_by_expert(ids.reshape(-1), 0, E, expert_block_m(ids.numel(), E, dt))
        a = clamped_swiglu_triton(expert_gate_up_triton(x, k, groups, gu_w, gu_b))
        return expert_down_partials_triton(a, groups, dn_w, bounds)

    def experts_torch(x, ids):
        return experts_eager(x, ids.reshape(-1), k, gu_w, gu_b, dn_w, bounds)

    print(f"{'op':<14}{'T':>6}{'triton ms':>11}{'torch ms':>10}{'ratio':>8}{'weight GB/s':>13}")
    for T in args.T:
        x = torch.randn(T, H, generator=g).to(dt).to(DEVICE)
        logits = torch.randn(T, E, generator=g).to(DEVICE)
        _, ids = router_top_k_portable(logits, k)
        gate_up = x.repeat(1, 2 * I // H + 1)[:, :2 * I].contiguous()
        for op, tri, ref in (("router_top_k", lambda: router_top_k_triton(logits, k), lambda: router_top_k_portable(logits, k)),
                             ("swiglu", lambda: clamped_swiglu_triton(gate_up), lambda: swiglu_eager(gate_up)),
                             ("experts", lambda: experts_triton(x, ids), lambda: experts_torch(x, ids))):
            t_tri = timed(tri)
            t_ref = timed(ref, repeat=3 if op == "experts" else None)
            extra = ""
            if op == "experts":
                used = ids.unique().numel()
                extra = f"{used * 3 * H * I * torch.finfo(dt).bits / 8 / t_tri / 1e9:>13.1f}"
            print(f"{op:<14}{T:>6}{t_tri * 1e3:>11.3f}{t_ref * 1e3:>10.3f}{t_tri / t_ref:>8.2f}{extra}")


def grouped_table(args):
    """gate_up [E, 2I, H] and down [E, H, I] as MXFP4 (random codes, scales 2^-8 .. 2^-4) and as
    their dequantized bf16 copies; the engine's calls (down over its fixed K chunks, after the
    separate SwiGLU as engine.experts runs it). Each weight at two block sizes, in this process:
    the old fixed 16 rows a block and the engine's choice (kernels.moe.expert_block_m, "bm": it
    follows the rows an expert); MXFP4 with the fast decode (what the engine runs) and, at the
    engine's size, the exact per-element decode everywhere (fast_decode=False). ratios: bm time /
    16-row time, fast / exact and MXFP4 / bf16 (at bm); GB/s = weight bytes of the routed experts
    (bf16: 2 per value, MXFP4: 0.5 + 1/32) per second at bm; bits: bm vs 16 (bf16, MXFP4: must be
    equal), fast vs exact (must be equal)."""
    H, I, E, k = args.H, args.I, args.E, args.k
    bf16 = torch.bfloat16
    g = torch.Generator(DEVICE).manual_seed(1)

    def packed(N, K):
        return (torch.randint(0, 256, (E, N, K // 32, 16), generator=g, dtype=torch.uint8, device=DEVICE),
                torch.randint(119, 124, (E, N, K // 32), generator=g, dtype=torch.uint8, device=DEVICE))

    gu_mx, dn_mx = packed(2 * I, H), packed(H, I)
    weights = {"gate_up": (dequantize(*gu_mx, dtype=bf16), gu_mx), "down": (dequantize(*dn_mx, dtype=bf16), dn_mx)}
    gu_b = torch.randn(E, 2 * I, generator=g, device=DEVICE).to(bf16)
    bounds = k_chunk_bounds(I)
    ok = True
    print(f"grouped experts, bf16 activations: dense bf16 and MXFP4 packed weights (same values), in blocks of "
          f"16 rows and of the engine's bm (expert_block_m); down over {len(bounds)} K chunks")
    print(f"{'op':<9}{'T':>5}{'experts':>8}{'bm':>4}{'bf16 16':>9}{'bf16 bm':>9}{'bm/16':>7}{'mx bm':>6}"
          f"{'fast 16':>9}{'fast bm':>9}{'bm/16':>7}{'exact bm':>9}{'f/exact':>8}{'f/bf16':>7}{'bf16 GB/s':>10}"
          f"{'fast GB/s':>10}  bits bm=16 (bf16, mxfp4), fast=exact   (ms)")
    for T in args.grouped_T:
        x = torch.randn(T, H, generator=g, device=DEVICE).to(bf16)
        _, ids = router_top_k_portable(torch.randn(T, E, generator=g, device=DEVICE), k)
        bm, bm_mx = expert_block_m(T * k, E, bf16), expert_block_m(T * k, E, bf16, mxfp4=True)
        groups = {b: group_by_expert(ids.reshape(-1), 0, E, b) for b in {EXPERT_BLOCK_M, bm, bm_mx}}
        a = clamped_swiglu_triton(expert_gate_up_triton(x, k, groups[bm], weights["gate_up"][0], gu_b))   # [T * k, I]
        used = ids.unique().numel()
        for op, f in (("gate_up", lambda w, b, fast=True: expert_gate_up_triton(x, k, groups[b], w, gu_b,
                                                                                fast_decode=fast)),
                      ("down", lambda w, b, fast=True: expert_down_partials_triton(a, groups[b], w, bounds,
                                                                                   fast_decode=fast))):
            dense, mx = weights[op]
            t = {"d16": timed(lambda: f(dense, EXPERT_BLOCK_M)), "d": timed(lambda: f(dense, bm)),
                 "f16": timed(lambda: f(mx, EXPERT_BLOCK_M)), "f": timed(lambda: f(mx, bm_mx)),
                 "e": timed(lambda: f(mx, bm_mx, False))}
            view = torch.int16 if op == "gate_up" else torch.int32
            same = lambda u, v: torch.equal(u.view(view), v.view(view))   # noqa: E731
            bits = (same(f(dense, bm), f(dense, EXPERT_BLOCK_M)), same(f(mx, bm_mx), f(mx, EXPERT_BLOCK_M)),
                    same(f(mx, bm_mx), f(mx, bm_mx, False)))
            values = used * dense.shape[1] * dense.shape[2]
            ok = ok and all(bits)
            print(f"{op:<9}{T:>5}{used:>8}{bm:>4}{t['d16'] * 1e3:>9.3f}{t['d'] * 1e3:>9.3f}{t['d'] / t['d16']:>7.3f}"
                  f"{bm_mx:>6}{t['f16'] * 1e3:>9.3f}{t['f'] * 1e3:>9.3f}{t['f'] / t['f16']:>7.3f}{t['e'] * 1e3:>9.3f}"
                  f"{t['f'] / t['e']:>8.3f}{t['f'] / t['d']:>7.2f}{values * 2 / t['d'] / 1e9:>10.1f}"
                  f"{values * (0.5 + 1 / 32) / t['f'] / 1e9:>10.1f}  "
                  + ", ".join("yes" if b else "NO" for b in bits))
    return ok


def block_m_table(args):
    """Each grouped kernel at every block size of EXPERT_BLOCK_SIZES (bf16 dense; MXFP4 with the
    fast decode), batches --block-m-T: ms per call and the ratio to 16 rows a block, to check the
    thresholds of expert_block_m (its pick is marked *); "!" marks a size whose output bits differ
    from 16's. MXFP4 stops at MXFP4_MAX_BLOCK_M ("n/a" past it): on the H200 (triton 3.6) its fast
    decode at 64 and 128 rows aborts the compiler (LLVM ERROR: Illegal shared layout) and the exact
    decode there gives other bits than 16's (docs/history/benchmarks.md). In the interpreter up to 64 rows
    (its largest tensor)."""
    sizes = EXPERT_BLOCK_SIZES if ON_GPU else EXPERT_BLOCK_SIZES[:3]
    H, I, E, k = args.H, args.I, args.E, args.k
    bf16 = torch.bfloat16
    g = torch.Generator(DEVICE).manual_seed(2)
    mx = {"gate_up": (torch.randint(0, 256, (E, 2 * I, H // 32, 16), generator=g, dtype=torch.uint8, device=DEVICE),
                      torch.randint(119, 124, (E, 2 * I, H // 32), generator=g, dtype=torch.uint8, device=DEVICE)),
          "down": (torch.randint(0, 256, (E, H, I // 32, 16), generator=g, dtype=torch.uint8, device=DEVICE),
                   torch.randint(119, 124, (E, H, I // 32), generator=g, dtype=torch.uint8, device=DEVICE))}
    dense = {op: dequantize(*w, dtype=bf16) for op, w in mx.items()}
    gu_b = torch.randn(E, 2 * I, generator=g, device=DEVICE).to(bf16)
    bounds = k_chunk_bounds(I)
    print(f"grouped experts by block size (ms per call; x16 = time / time at 16 rows; * = expert_block_m's pick)")
    print(f"{'op':<9}{'T':>6}{'rows/expert':>12}" + "".join(f"{f'bf16 {b}':>10}{'x16':>6}" for b in sizes)
          + "".join(f"{f'mxfp4 {b}':>11}{'x16':>6}" for b in sizes))
    for T in args.block_m_T:
        x = torch.randn(T, H, generator=g, device=DEVICE).to(bf16)
        _, ids = router_top_k_portable(torch.randn(T, E, generator=g, device=DEVICE), k)
        groups = {b: group_by_expert(ids.reshape(-1), 0, E, b) for b in sizes}
        a = clamped_swiglu_triton(expert_gate_up_triton(x, k, groups[16], dense["gate_up"], gu_b))
        run = {"gate_up": lambda w, b: expert_gate_up_triton(x, k, groups[b], w, gu_b),
               "down": lambda w, b: expert_down_partials_triton(a, groups[b], w, bounds)}
        for op in ("gate_up", "down"):
            cells = []
            for w, mxfp4 in ((dense[op], False), (mx[op], True)):
                ok = [b for b in sizes if not mxfp4 or b <= MXFP4_MAX_BLOCK_M]
                t = {b: timed(lambda: run[op](w, b)) for b in ok}
                out = {b: run[op](w, b) for b in ok}
                same = {b: torch.equal(out[b].view(torch.int16 if op == "gate_up" else torch.int32),
                                       out[16].view(torch.int16 if op == "gate_up" else torch.int32)) for b in ok}
                pick = expert_block_m(T * k, E, bf16, mxfp4)
                width = 9 if not mxfp4 else 10
                cells += [f"{t[b] * 1e3:>{width}.3f}{'' if same[b] else '!':1}{t[b] / t[16]:>5.2f}"
                          f"{'*' if b == pick else ' '}" if b in ok else f"{'n/a':>{width + 7}}" for b in sizes]
            print(f"{op:<9}{T:>6}{T * k / E:>12.1f}" + "".join(cells))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--T", type=int, nargs="+", default=[1, 8, 64] if ON_GPU else [1, 2])
    ap.add_argument("--grouped-T", type=int, nargs="+", default=[1, 32],
                    help="batches of the grouped MXFP4 vs bf16 table")
    ap.add_argument("--block-m-T", type=int, nargs="*", default=[],
                    help="also time the grouped kernels at every block size for these batches")
    ap.add_argument("--H", type=int, default=2880 if ON_GPU else 128)
    ap.add_argument("--I", type=int, default=2880 if ON_GPU else 128)
    ap.add_argument("--E", type=int, default=32 if ON_GPU else 4)
    ap.add_argument("--k", type=int, default=4 if ON_GPU else 2)
    ap.add_argument("--dtype", default="fp32", help="of the first table (the grouped one is bf16)")
    ap.add_argument("--only", choices=["reference", "grouped"], help="print one of the two tables")
    args = ap.parse_args()
    print(device_line(), f"H={args.H} I={args.I} E={args.E} k={args.k}")
    if args.only != "grouped":
        print(f"Triton vs torch reference, {args.dtype}")
        reference_table(args)
    ok = args.only == "reference" or grouped_table(args)
    if args.block_m_T:
        block_m_table(args)
    if not ok:
        sys.exit(3)


if __name__ == "__main__":
    main()
