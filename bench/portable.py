"""The CPU reference's hot ops (issue 38) against their previous implementations, kept here only
as the baseline: kernels.portable's matmul_nt and tree_sum, kernels.mxfp4.dequantize, the torch
attention's _attend and engine.experts' down-projection partials. Both sides run in this
process on the same inputs, every output is checked bit for bit (torch.equal, and the same NaN
places), and the ratio old / new of the median CPU time per call is printed (one torch thread, as
the check's workers run). Also portable.sqrt's float32 path (sqrt32, issue 38's check5 round)
against sqrt64 rounded to float32, which it replaced: `--sqrt32` compares the two on every float32
in [1, 4) (the 2^24 reduced arguments any float32 can have), on every float32 special and
subnormal class and on random bit patterns of the whole range, on the CPU or `--device cuda`.

    PYTHONPATH=. python3 bench/portable.py                 # the spec shapes and the 20b-ish ones
    PYTHONPATH=. python3 bench/portable.py --quick         # the spec shapes only
    PYTHONPATH=. python3 bench/portable.py --sqrt32 [--device cuda]   # the exhaustive sqrt32 proof
Exits non-zero if any output differs.
"""

import argparse
import math
import statistics
import sys
import time

import torch

from lockstep.engine.experts import _down_partials
from lockstep.engine.linear import k_chunk_bounds
from lockstep.kernels import mxfp4, portable
from lockstep.kernels.attention import KV_TILE, _attend

# ---------------------------------------------------------------- the baseline (before issue 38)


def old_tree_sum(x: torch.Tensor, dim: int = -1, keepdim: bool = False) -> torch.Tensor:
    dim = dim % x.dim()
    n = x.shape[dim]
    if n == 0:
        out = torch.zeros_like(x.narrow(dim, 0, 1))
        return out if keepdim else out.squeeze(dim)
    p = 1 << (n.bit_length() - 1)
    if p != n:
        head = x.narrow(dim, 0, p).clone()
        head.narrow(dim, 0, n - p).add_(x.narrow(dim, p, n - p))
        x = head
    while p > 1:
        p //= 2
        x = torch.add(x.narrow(dim, 0, p), x.narrow(dim, p, p))
    return x if keepdim else x.squeeze(dim)


def old_matmul_nt(x: torch.Tensor, w: torch.Tensor, chunk: int = 1 << 22) -> torch.Tensor:
    *lead, M, K = x.shape
    N = w.shape[-2]
    out = x.new_empty((*lead, M, N))
    if out.numel() == 0:
        return out
    if K == 0:
        return out.zero_()
    batch = math.prod(lead)
    n_step = max(1, min(N, chunk // (K * batch)))
    m_step = max(1, chunk // (K * batch * n_step))
    for m0 in range(0, M, m_step):
        xm = x[..., m0:m0 + m_step, None, :]
        for n0 in range(0, N, n_step):
            prod = torch.mul(xm, w[..., None, n0:n0 + n_step, :])
            out[..., m0:m0 + m_step, n0:n0 + n_step] = old_tree_sum(prod, -1)
    return out


def old_dequantize(blocks: torch.Tensor, scales: torch.Tensor, dtype=torch.float32) -> torch.Tensor:
    lut = torch.tensor(mxfp4.E2M1_VALUES, dtype=torch.float32)
    lo = lut[(blocks & 0x0F).long()]
    hi = lut[(blocks >> 4).long()]
    values = torch.stack([lo, hi], dim=-1).flatten(-2)
    values = torch.mul(values, mxfp4._power_of_two(scales).unsqueeze(-1))
    values = values.masked_fill((scales == mxfp4.NAN_SCALE).unsqueeze(-1), float("nan"))
    return values.flatten(-2).to(dtype)


def old_attend(q, k_cache, v_cache, slots, positions, sinks, window, scale) -> torch.Tensor:
    T, Hq, D = q.shape
    Hkv, S = k_cache.shape[1], k_cache.shape[2]
    G = Hq // Hkv
    keys = k_cache.index_select(0, slots).to(torch.float32)
    values = v_cache.index_select(0, slots).to(torch.float32)
    qg = q.to(torch.float32).reshape(T, Hkv, G, 1, D)
    s = old_tree_sum(torch.mul(qg, keys[:, :, None]), -1)
    s = torch.mul(s, scale)
    j = torch.arange(S, dtype=torch.int64, device=q.device)
    pos = positions[:, None]
    visible = j[None, :] <= pos
    if window > 0:
        visible = visible & (j[None, :] > pos - window)
    visible = visible[:, None, None, :]
    sink = sinks.to(torch.float32).reshape(1, Hkv, G, 1)
    s = torch.where(visible, s, float("-inf"))
    m = torch.maximum(s.amax(dim=-1, keepdim=True), sink)
    m = torch.where(m == float("-inf"), 0.0, m)
    p = torch.where(visible, portable.exp(torch.sub(s, m)), 0.0)
    n_tiles = S // KV_TILE
    p_tiles = p.reshape(T, Hkv, G, n_tiles, KV_TILE)
    pv = torch.mul(p_tiles[..., None], values.reshape(T, Hkv, 1, n_tiles, KV_TILE, D))
    l_tiles = old_tree_sum(p_tiles, -1)
    acc_tiles = old_tree_sum(pv, -2)
    l = portable.exp(torch.sub(sink, m))[..., 0]
    acc = acc_tiles[..., 0, :]
    for t in range(n_tiles):
        l = torch.add(l, l_tiles[..., t])
        if t > 0:
            acc = torch.add(acc, acc_tiles[..., t, :])
    l = torch.where(l == 0.0, 1.0, l)
    return torch.div(acc, l[..., None]).reshape(T, Hq, D).to(q.dtype)


def old_down_partials(a: torch.Tensor, w: torch.Tensor, bounds) -> torch.Tensor:
    return torch.stack([old_matmul_nt(a[:, None, lo:hi], w[:, :, lo:hi])[:, 0] for lo, hi in bounds])


def old_horner(r: torch.Tensor, coeffs) -> torch.Tensor:
    p = torch.full_like(r, coeffs[-1])
    for c in reversed(coeffs[:-1]):
        p = torch.add(torch.mul(p, r), c)
    return p


def old_sqrt32(x: torch.Tensor) -> torch.Tensor:
    return portable.sqrt64(x.to(torch.float64)).to(torch.float32)


# ------------------------------------------------------------------------------- the cases
# (name, x shape, w shape, slice of w's last dim or None): the spec shapes are what the torch
# backend's forwards call matmul_nt with (tiny/small presets: linears, the 8 K-chunk partials of
# o_proj at once, the per-row experts' gate_up and down chunks); the 20b-ish ones gpt-oss-20b's
# (hidden 2880, 64 query / 8 KV heads of 64, intermediate 2880) at decode and short-prefill M.

SPEC_MATMULS = [
    ("linear qkv M=2", (2, 160), (384, 160), None),
    ("linear qkv M=8", (8, 160), (384, 160), None),
    ("linear qkv M=63", (63, 160), (384, 160), None),
    ("lm_head M=2", (2, 160), (1024, 160), None),
    ("o_proj partials M=2", (8, 2, 32), (8, 160, 32), None),
    ("o_proj partials M=63", (8, 63, 32), (8, 160, 32), None),
    ("expert gate_up R=8", (8, 1, 160), (8, 192, 160), None),
    ("expert gate_up R=136", (136, 1, 160), (136, 192, 160), None),
    ("expert down chunk R=32", (32, 1, 96), (32, 160, 96), (12, 24)),
    ("expert down chunk R=136", (136, 1, 96), (136, 160, 96), (12, 24)),
    ("tiny linear M=1", (1, 96), (192, 96), None),
]
BIG_MATMULS = [
    ("20b qkv M=1", (1, 2880), (5120, 2880), None),
    ("20b qkv M=8", (8, 2880), (5120, 2880), None),
    ("20b o_proj partials M=4", (8, 4, 512), (8, 2880, 512), None),
    ("20b expert gate_up R=1", (1, 1, 2880), (1, 5760, 2880), None),
    ("20b expert down chunk R=4", (4, 1, 2880), (4, 2880, 2880), (360, 720)),
    ("K=2881 M=3", (3, 2881), (300, 2881), None),
]
SPEC_SUMS = [   # (name, shape, dim, dtype)
    ("rmsnorm T=63 H=160", (63, 160), -1, torch.float32),
    ("softmax vocab 1024 R=2 f64", (2, 1024), -1, torch.float64),
    ("attention scores", (8, 2, 4, 64, 32), -1, torch.float32),
    ("attention p.v tiles", (8, 2, 4, 2, 32, 32), -2, torch.float32),
    ("router softmax k=4", (63, 4), -1, torch.float32),
    ("bf16 rows K=2881", (16, 2881), -1, torch.bfloat16),
]
DEQUANT = [   # (name, blocks shape [..., G, 16]): experts' rows as engine/experts.py decodes them
    ("small gate_up 8 experts", (8, 192, 5, 16)),
    ("small gate_up 136 rows", (136, 192, 5, 16)),
    ("20b gate_up 1 expert", (1, 5760, 90, 16)),
]
ATTENTION = [   # (name, T, Hq, Hkv, S, D, window): decode and prefill rows of the tiny/small presets, 20b decode
    ("tiny decode S=64", 1, 8, 2, 64, 32, 0),
    ("small prefill T=63 S=64", 63, 8, 2, 64, 32, 16),
    ("long prompt T=64 S=320", 64, 8, 2, 320, 32, 0),
    ("20b decode S=1024", 1, 64, 8, 1024, 64, 128),
]
DOWN = [   # (name, R rows, H, I): the per-row experts' down projection over the 8 K chunks
    ("tiny decode R=4", 4, 96, 96),
    ("small prefill R=136", 136, 160, 96),
    ("20b decode R=4", 4, 2880, 2880),
]
SQRTS = [   # (name, shape): RMSNorm's [T, 1] mean squares (decode and prefill rows), a wide row
    ("rmsnorm T=1", (1, 1)),
    ("rmsnorm T=8", (8, 1)),
    ("rmsnorm T=63", (63, 1)),
    ("4096 values", (4096,)),
]
BIG_SUMS = [
    ("softmax vocab 201088 R=1 f64", (1, 201088), -1, torch.float64),
    ("rmsnorm T=64 H=2880", (64, 2880), -1, torch.float32),
]


def _inputs(shape, seed, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    return (torch.rand(shape, generator=g, dtype=torch.float64) * 4 - 2).to(dtype)


def _median_s(fn, budget_s):
    fn()
    times = []
    start = time.process_time()
    while len(times) < 3 or (time.process_time() - start < budget_s and len(times) < 200):
        t0 = time.process_time()
        fn()
        times.append(time.process_time() - t0)
    return statistics.median(times)


def _same(a, b):
    return a.shape == b.shape and a.dtype == b.dtype and bool(torch.equal(a.nan_to_num(0.5), b.nan_to_num(0.5))) \
        and bool(torch.equal(a.isnan(), b.isnan()))


def _row(name, old, new, budget_s):
    same = _same(old(), new())
    t_old, t_new = _median_s(old, budget_s), _median_s(new, budget_s)
    print(f"{name:<48}{t_old * 1e3:>10.3f}{t_new * 1e3:>10.3f}{t_old / t_new:>8.2f}  {'yes' if same else 'NO'}",
          flush=True)
    return same, t_old, t_new


def matmul_cases(quick):
    for i, (name, xs, ws, ks) in enumerate(SPEC_MATMULS + ([] if quick else BIG_MATMULS)):
        for dtype in (torch.float32,) if "20b" in name and "R=" in name else (torch.float32, torch.bfloat16):
            x, w = _inputs(xs, 2 * i, dtype), _inputs(ws, 2 * i + 1, dtype)
            if ks is not None:
                x, w = x[..., ks[0]:ks[1]], w[..., ks[0]:ks[1]]     # a K chunk: strided, as engine/experts.py
            yield f"matmul {name} {str(dtype)[6:]}", lambda: old_matmul_nt(x, w), lambda: portable.matmul_nt(x, w)


def sum_cases(quick):
    for i, (name, shape, dim, dtype) in enumerate(SPEC_SUMS + ([] if quick else BIG_SUMS)):
        x = _inputs(shape, 100 + i, dtype)
        for keep in (False, True):
            yield (f"tree_sum {name}{' keepdim' if keep else ''}", lambda: old_tree_sum(x, dim, keep),
                   lambda: portable.tree_sum(x, dim, keep))


def dequant_cases(quick):
    g = torch.Generator().manual_seed(3)
    for name, shape in DEQUANT[:2] if quick else DEQUANT:
        blocks = torch.randint(0, 256, shape, generator=g, dtype=torch.uint8)
        scales = torch.randint(100, 256, shape[:-1], generator=g, dtype=torch.uint8)   # 255: NaN blocks too
        yield f"dequantize {name}", lambda: old_dequantize(blocks, scales), lambda: mxfp4.dequantize(blocks, scales)


def attention_cases(quick):
    for i, (name, T, Hq, Hkv, S, D, window) in enumerate(ATTENTION[:2] if quick else ATTENTION):
        q, k, v = _inputs((T, Hq, D), 200 + i), _inputs((2, Hkv, S, D), 300 + i), _inputs((2, Hkv, S, D), 400 + i)
        slots = torch.arange(T, dtype=torch.int64) % 2
        positions = torch.arange(S - T, S, dtype=torch.int64)
        sinks = _inputs((Hq,), 500 + i)
        args = (q, k, v, slots, positions, sinks, window, D ** -0.5)
        yield f"attention {name}", lambda: old_attend(*args), lambda: _attend(*args)


def down_cases(quick):
    for i, (name, R, H, I) in enumerate(DOWN[:2] if quick else DOWN):
        a, w = _inputs((R, I), 600 + i), _inputs((R, H, I), 700 + i)
        bounds = k_chunk_bounds(I)
        yield f"experts down {name}", lambda: old_down_partials(a, w, bounds), lambda: _down_partials(a, w, bounds)


def horner_cases(quick):
    """exp64's polynomial (the attention, router, sampling and sigmoid exps): the old Horner (a new
    tensor per step) against kernels.portable's (one accumulator, in place)."""
    for i, n in enumerate((1, 64, 1024) if quick else (1, 64, 1024, 201088)):
        r = _inputs((n,), 900 + i, torch.float64) * 0.17
        yield f"horner exp n={n}", lambda: old_horner(r, portable._EXP_COEFFS), \
            lambda: portable._horner(r, portable._EXP_COEFFS)


def sqrt_cases(quick):
    for i, (name, shape) in enumerate(SQRTS):
        x = _inputs(shape, 800 + i).abs().add(1e-5)
        yield f"sqrt float32 {name}", lambda: old_sqrt32(x), lambda: portable.sqrt(x)


def sqrt32_proof(device: str) -> bool:
    """sqrt32 == sqrt64 rounded to float32 on every float32 in [1, 4) (each reduced argument X),
    on the specials and subnormal classes and on 2^24 random float32 bit patterns; prints a line
    per set."""
    one = int(torch.tensor(1.0, dtype=torch.float32).view(torch.int32))           # 0x3F800000
    step = 1 << 21
    every = (torch.arange(lo, lo + step, dtype=torch.int32).view(torch.float32) for lo in range(one, one + (1 << 24), step))
    specials = torch.tensor([0.0, -0.0, math.inf, -math.inf, math.nan, -1.0, -1e-45, 1e-45, 1.1754942e-38,
                             1.1754944e-38, 3.4028235e38, 2.0 ** -126, 2.0 ** -149], dtype=torch.float32)
    subnormals = torch.arange(1, 1 << 23, 997, dtype=torch.int32).view(torch.float32)   # 0 < x < 2^-126
    g = torch.Generator().manual_seed(38)
    randoms = torch.randint(-(1 << 31), 1 << 31, (1 << 24,), generator=g, dtype=torch.int64).to(torch.int32)
    ok = True
    for name, chunks in [(f"every float32 in [1, 4) ({1 << 24} values)", every),
                         ("specials and subnormals", [torch.cat([specials, subnormals])]),
                         ("2^24 random float32 bit patterns", [randoms.view(torch.float32)])]:
        n = bad = 0
        for x in chunks:
            x = x.to(device)
            old, new = old_sqrt32(x), portable.sqrt(x)
            same = (old.view(torch.int32) == new.view(torch.int32)) | (old.isnan() & new.isnan())
            n, bad = n + x.numel(), bad + int((~same).sum())
        print(f"sqrt32 {name} on {device}: {n} values, {bad} differ from sqrt64 rounded to float32", flush=True)
        ok = ok and bad == 0
    return ok


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="the spec shapes only")
    ap.add_argument("--budget", type=float, default=0.5, help="seconds of timing per case and side")
    ap.add_argument("--sqrt32", action="store_true", help="only the exhaustive sqrt32 comparison")
    ap.add_argument("--device", default="cpu", help="where --sqrt32 runs (cpu or cuda)")
    args = ap.parse_args()
    torch.set_num_threads(1)       # as `lockstep check -j N` workers run
    if args.sqrt32:
        return 0 if sqrt32_proof(args.device) else 1
    print(f"torch {torch.__version__}, 1 thread; medians of CPU time, ms per call")
    print(f"{'case':<48}{'old ms':>10}{'new ms':>10}{'ratio':>8}  same bits")
    ok, tot_old, tot_new = True, 0.0, 0.0
    for cases in (matmul_cases, sum_cases, dequant_cases, attention_cases, down_cases, horner_cases, sqrt_cases):
        for name, old, new in cases(args.quick):
            same, a, b = _row(name, old, new, args.budget)
            ok, tot_old, tot_new = ok and same, tot_old + a, tot_new + b
    print(f"{'sum of the medians':<48}{tot_old * 1e3:>10.3f}{tot_new * 1e3:>10.3f}{tot_old / tot_new:>8.2f}  "
          f"{'all identical' if ok else 'SOME DIFFER'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
