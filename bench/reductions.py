"""The topology-invariant row-parallel reduction against a plain float all_reduce.

Each rank holds K_CHUNKS / world partial sums of a row-parallel layer's output [T, H]
(gpt-oss o_proj / down_proj: H = 2880, fp32). Two ways to finish the sum on every rank:

  invariant   add the rank's chunks as their subtree of the fixed tree, move the subtree sums
              (all_gather, or all_to_all + all_gather for large T), add the tree's top levels
  all_reduce  add the local partials, then dist.all_reduce(SUM)  (order depends on world size)

Prints the median time of each, their ratio, and whether each result has the same bits as
the one-device tree, measured in the same run (CPU/gloo here; NCCL on GPUs via --transport nccl).

    python bench/reductions.py                         # worlds 2 and 4, T in 1, 64, 1024
    python bench/reductions.py --worlds 2 --tokens 1 64 --repeat 50
"""

import argparse
import statistics
import time

import torch
import torch.distributed as dist

from lockstep.engine.distributed import invariant_sum
from lockstep.engine.launch import launch
from lockstep.engine.linear import K_CHUNKS, tree_sum


def partials(T: int, H: int) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(T)
    return [torch.randn(T, H, generator=g) for _ in range(K_CHUNKS)]


def rank_bench(tokens: list[int], H: int, repeat: int, algorithm: str) -> list[dict]:
    rank, world = dist.get_rank(), dist.get_world_size()
    dev = torch.device("cuda", rank) if dist.get_backend() == "nccl" else torch.device("cpu")
    per = K_CHUNKS // world
    rows = []
    for T in tokens:
        everything = [p.to(dev) for p in partials(T, H)]
        mine = everything[rank * per:(rank + 1) * per]
        reference = tree_sum(everything)

        def invariant():
            return invariant_sum(mine, world, None, algorithm)

        def plain():
            total = tree_sum(mine).contiguous()
            dist.all_reduce(total)
            return total

        row = {"T": T}
        for name, fn in (("invariant", invariant), ("all_reduce", plain)):
            out = fn()                                           # warm-up, and the bits
            row[name + "_bitwise"] = bool(out.equal(reference))
            times = []
            for _ in range(repeat):
                dist.barrier()
                if dev.type == "cuda":
                    torch.cuda.synchronize()
                t0 = time.perf_counter()
                fn()
                if dev.type == "cuda":
                    torch.cuda.synchronize()
                times.append(time.perf_counter() - t0)
            row[name] = statistics.median(times)
        rows.append(row)
    return rows


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--worlds", type=int, nargs="+", default=[2, 4])
    ap.add_argument("--tokens", type=int, nargs="+", default=[1, 64, 1024])
    ap.add_argument("--hidden", type=int, default=2880)
    ap.add_argument("--repeat", type=int, default=20)
    ap.add_argument("--algorithm", default="auto", choices=["auto", "gather", "scatter"],
                    help="how invariant_sum moves the subtree sums (same bits)")
    ap.add_argument("--transport", default=None, choices=["gloo", "gloo-host", "nccl"],
                    help="how the ranks move bytes (default: engine.launch's choice)")
    args = ap.parse_args()
    print(f"row-parallel reduction of [T, {args.hidden}] fp32 from {K_CHUNKS} K-chunk partials; "
          f"median of {args.repeat}; rank 0's time; invariant_sum algorithm {args.algorithm}")
    print(f"{'world':>5} {'T':>6} {'invariant ms':>13} {'all_reduce ms':>14} {'ratio':>6}  bitwise = one device?")
    for world in args.worlds:
        rows = launch(rank_bench, world, args=(args.tokens, args.hidden, args.repeat, args.algorithm), transport=args.transport,
                      timeout_s=600, collective_timeout_s=120)[0]
        for r in rows:
            print(f"{world:>5} {r['T']:>6} {r['invariant'] * 1e3:>13.3f} {r['all_reduce'] * 1e3:>14.3f} "
                  f"{r['invariant'] / r['all_reduce']:>6.2f}  invariant {r['invariant_bitwise']}, "
                  f"all_reduce {r['all_reduce_bitwise']}")


if __name__ == "__main__":
    main()
