"""MXFP4 grouped experts two ways at gpt-oss-20b shapes (GPU only): the packed kernels (weights
decoded in registers, at most kernels.moe.MXFP4_MAX_BLOCK_M rows a block) against the dense tiles
over the weights decoded once into the packed kernels' MMA order (kernels.moe `mxfp4_dense`,
`mma_order_triton`), by tokens; the ratio is dense / packed (below 1: the dense tiles are faster)
and each row says whether the two gave the same bits (they must: a different bit is a bug).

    python bench/mxfp4_dense.py [--tokens 256 512 1024 2048 8192]

One 20b MoE layer (32 experts, top-4, H = I = 2880, down in 8 chunks of 360), random codes and
scales 119-123, bf16 activations; `engine.experts.experts_grouped` on one device, 5 calls in a CUDA
graph (`graph_timed`), the path forced each way through MXFP4_DENSE_MIN_ROWS. Used to set
MXFP4_DENSE_MIN_ROWS. First, the decode into MMA order alone (both weights of the layer).
"""

import argparse

import torch

from _util import graph_timed
from lockstep.engine.experts import LocalExperts, experts_grouped
from lockstep.engine.linear import k_chunk_bounds
from lockstep.kernels import moe_mxfp4_order as moe

E, TOP_K, H, I = 32, 4, 2880, 2880


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokens", type=int, nargs="+", default=[256, 512, 1024, 2048, 8192])
    args = ap.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("bench/mxfp4_dense.py: needs a GPU (the MMA order is the compiled kernels')")
    g = torch.Generator(device="cuda").manual_seed(0)

    def packed(N, K):
        return (torch.randint(0, 256, (E, N, K // 32, 16), generator=g, dtype=torch.uint8, device="cuda"),
                torch.randint(119, 124, (E, N, K // 32), generator=g, dtype=torch.uint8, device="cuda"))

    gu, dn = packed(2 * I, H), packed(H, I)
    gu_b = torch.randn(E, 2 * I, generator=g, device="cuda").bfloat16()
    bounds = k_chunk_bounds(I)
    print(f"device {torch.cuda.get_device_name()}, MXFP4 experts {E}, top-{TOP_K}, H = I = {H}; "
          f"engine threshold MXFP4_DENSE_MIN_ROWS = {moe.MXFP4_DENSE_MIN_ROWS} rows an expert")
    order = lambda: (moe.mma_order_triton(gu, ((0, H),), torch.bfloat16),  # noqa: E731
                     moe.mma_order_triton(dn, bounds, torch.bfloat16))
    t = graph_timed(order, repeat=5)
    moved = sum(w.numel() + s.numel() for w, s in (gu, dn)) + sum(o.numel() * 2 for o in order())
    print(f"mma_order_triton, both weights of the layer: {t * 1e3:.3f} ms ({moved / t / 1e12:.2f} TB/s read + written)")
    threshold = moe.MXFP4_DENSE_MIN_ROWS
    try:
        for T in args.tokens:
            x = (torch.randn(T, H, generator=g, device="cuda") / 64).bfloat16()
            ids = torch.argsort(torch.rand(T, E, generator=g, device="cuda"), dim=1)[:, :TOP_K].contiguous()
            held = LocalExperts(gu, gu_b, dn, tuple(bounds), 0, E, 1.702, 7.0)
            run = lambda: experts_grouped(x, ids, held, every_expert_local=True)  # noqa: E731
            res = {}
            for name, rows in (("packed", 10 ** 12), ("dense", 1)):
                moe.MXFP4_DENSE_MIN_ROWS = rows
                res[name] = (graph_timed(run, repeat=5), run())
            same = torch.equal(torch.nan_to_num(res["packed"][1]), torch.nan_to_num(res["dense"][1]))
            print(f"T={T} ({T * TOP_K // E} rows an expert): packed {res['packed'][0] * 1e3:.3f} ms, "
                  f"dense {res['dense'][0] * 1e3:.3f} ms ({res['dense'][0] / res['packed'][0]:.2f}x), "
                  f"{'same bits' if same else 'OTHER BITS'}", flush=True)
    finally:
        moe.MXFP4_DENSE_MIN_ROWS = threshold


if __name__ == "__main__":
    main()
