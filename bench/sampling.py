"""The fused sampling kernel (kernels.sampling.sample_fused_triton) against the torch path it
replaces (engine.sampling's portable float64 log-softmax, hash, Gumbel and argmax, then the fp32
chosen logprob), in one process on the same logits, with the bits checked equal first.

    python3 bench/sampling.py                       # V = 201088 (gpt-oss), batches 1, 8, 32
    python3 bench/sampling.py --vocab 4096 --batches 1,4 --repeat 1   # CPU smoke (interpreter)

Rows: seeded sampling at temperature 0.8 (no filters: generate's common case), greedy, and the
replay's forced chosen logprobs. Each figure is the time of one batched call; ratio = torch /
fused (> 1: the kernel is faster).

    python3 bench/sampling.py --chunks 1,4,8,16,32,64   # programs per row (speed only)

--chunks times kernels.sampling.sample_fused_triton with each row split over that many programs
against one program per row (chunks 1, the baseline), per mode, and checks every split's bits
equal to the baseline's; "default" is kernels.sampling.chunks_per_row's choice for the batch.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))        # this checkout's engine, not an installed copy

import torch  # noqa: E402

from _util import DEVICE, device_line, timed  # noqa: E402
from lockstep.engine.sampling import (SamplingParams, chosen_logprobs, chosen_logprobs_fused, row_settings,  # noqa: E402
                                      sample_fused, sample_with)


def case(name, logits, params, positions, repeat):
    settings = row_settings(params, list(range(len(params))), logits.device)
    want = sample_with(logits, settings, positions)
    want_lp = chosen_logprobs(logits, want)
    got, got_lp = sample_fused(logits, settings, positions)
    forced = chosen_logprobs_fused(logits, want)
    same = torch.equal(got, want) and torch.equal(got_lp.view(torch.int32), want_lp.view(torch.int32)) \
        and torch.equal(forced.view(torch.int32), want_lp.view(torch.int32))
    if not same:
        print(f"{name}: the fused kernel's bits differ from the torch path")
        sys.exit(3)
    t_torch = timed(lambda: chosen_logprobs(logits, sample_with(logits, settings, positions)), repeat)
    t_fused = timed(lambda: sample_fused(logits, settings, positions), repeat)
    t_lp_torch = timed(lambda: chosen_logprobs(logits, want), repeat)
    t_lp_fused = timed(lambda: chosen_logprobs_fused(logits, want), repeat)
    R = logits.shape[0]
    print(f"{name:>8} {R:>4} {t_torch * 1e3:>10.3f}ms {t_fused * 1e3:>9.3f}ms {t_torch / t_fused:>7.1f}x"
          f" | chosen logprobs {t_lp_torch * 1e3:>9.3f}ms {t_lp_fused * 1e3:>9.3f}ms {t_lp_torch / t_lp_fused:>7.1f}x")


def sweep_chunks(R, V, chunks, repeat):
    """One row of the --chunks table per mode: time per split, ratio against chunks = 1."""
    from lockstep.kernels.sampling import FORCED, GREEDY, SEEDED, _tree_shape, chunks_per_row, fused_temperature, \
        sample_fused_triton
    g = torch.Generator().manual_seed(R)
    x = (torch.randn(R, V, generator=g) * 3).to(DEVICE)
    Q = _tree_shape(V)["Q"]
    sizes = [c for c in chunks if c <= Q]
    for mode, name in ((SEEDED, "seeded"), (GREEDY, "greedy"), (FORCED, "forced")):
        args = (x, torch.full((R,), mode, dtype=torch.int32, device=DEVICE),
                torch.full((R,), fused_temperature(0.8, DEVICE), dtype=torch.float64, device=DEVICE),
                torch.arange(R, device=DEVICE) * 7919 + 1, torch.arange(R, device=DEVICE) + 100,
                torch.arange(R, device=DEVICE) * 13)
        want = sample_fused_triton(*args, chunks=1)
        cells = []
        for c in sizes:
            got = sample_fused_triton(*args, chunks=c)
            if not (torch.equal(got[0], want[0]) and torch.equal(got[1].view(torch.int32), want[1].view(torch.int32))):
                print(f"{name} R={R}: chunks {c} changed the bits")
                sys.exit(3)
            cells.append(timed(lambda: sample_fused_triton(*args, chunks=c), repeat))
        base = cells[0] if sizes[0] == 1 else float("nan")
        row = " ".join(f"{t * 1e3:>8.3f}ms ({base / t:>4.1f}x)" for t in cells)
        print(f"{name:>8} {R:>4} default {chunks_per_row(R, Q):>3} | {row}")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--vocab", type=int, default=201088)
    ap.add_argument("--batches", default="1,8,32")
    ap.add_argument("--repeat", type=int)
    ap.add_argument("--chunks", help="programs per row to sweep, e.g. 1,4,8,16,32,64 (1 first: the baseline)")
    args = ap.parse_args(argv)
    if args.chunks:
        sizes = [int(c) for c in args.chunks.split(",")]
        print(f"fused sampler, V = {args.vocab}, {device_line()}; time per call at chunks {sizes} "
              f"(ratio: chunks 1 / this); bits checked equal to chunks 1")
        for R in [int(b) for b in args.batches.split(",")]:
            sweep_chunks(R, args.vocab, sizes, args.repeat)
        return
    print(f"sampling, V = {args.vocab}, {device_line()}; bits checked equal before timing")
    print(f"{'rows':>8} {'R':>4} {'torch':>12} {'fused':>11} {'ratio':>8} | {'':15} {'torch':>11} {'fused':>11}")
    g = torch.Generator().manual_seed(0)
    for R in [int(b) for b in args.batches.split(",")]:
        logits = (torch.randn(R, args.vocab, generator=g) * 3).to(DEVICE)
        positions = torch.arange(R, device=DEVICE) + 100
        case("seeded", logits, [SamplingParams(temperature=0.8)] * R, positions, args.repeat)
        case("greedy", logits, [SamplingParams(greedy=True)] * R, positions, args.repeat)


if __name__ == "__main__":
    main()
