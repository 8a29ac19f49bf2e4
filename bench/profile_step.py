"""Where a decode step's (or a prefill's) GPU time goes: the kernels of one eager forward, by
total time (GPU only).

    python bench/profile_step.py [--shape 20b] [--dtype bf16|mxfp4] [--batch 1] [--backend triton]
                                 [--prefill 2048] [--expert-block-m 64]

Builds bench/e2e.py's random weights, prefills a 128-token context per request, then records
one decode step with torch.profiler and prints the top kernels and the launch count. With
--prefill P it records one P-token prefill into an empty cache instead. --expert-block-m fixes
the rows per grouped expert block (else kernels.moe.expert_block_m picks them from the launch's
rows) to compare block sizes.
Used to find what to fuse next; the figures that count are bench/e2e.py's.
"""

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch  # noqa: E402

import e2e  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--shape", default="20b")
    ap.add_argument("--dtype", default="bf16", choices=["bf16", "mxfp4"])
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--backend", default="triton")
    ap.add_argument("--top", type=int, default=25)
    ap.add_argument("--prefill", type=int, default=0, help="profile a prefill of this many tokens instead")
    ap.add_argument("--expert-block-m", type=int, default=0, help="fix the grouped experts' rows per block")
    args = ap.parse_args()
    if args.expert_block_m:
        import lockstep.engine.experts
        lockstep.engine.experts.expert_block_m = lambda *_, **__: args.expert_block_m
    config = e2e.preset(e2e.SHAPES.get(args.shape, args.shape))
    floats, packed = e2e.random_weights(config, "cuda")
    weights = floats | (e2e.dense_experts(packed) if args.dtype == "bf16" else packed)
    model = e2e.engine_model(config, weights, args.backend, "cuda", "bf16")
    B, ctx = args.batch, 128
    if args.prefill:
        P = args.prefill
        cache = model.new_cache(1, P)
        toks = torch.randint(0, config.vocab_size, (P,), device="cuda")
        step = lambda: model.forward(toks, torch.arange(P, device="cuda"),    # noqa: E731
                                     torch.zeros(P, dtype=torch.int64, device="cuda"), cache)
        profile(step, f"{args.shape} {args.dtype} prefill {P} backend {args.backend}", args.top)
        return
    cache = model.new_cache(B, ctx + 8)
    for s in range(B):
        toks = torch.randint(0, config.vocab_size, (ctx,), device="cuda")
        model.forward(toks, torch.arange(ctx, device="cuda"), torch.full((ctx,), s, device="cuda"), cache)
    step = lambda: model.forward(torch.zeros(B, dtype=torch.int64, device="cuda"),    # noqa: E731
                                 torch.full((B,), ctx, device="cuda"), torch.arange(B, device="cuda"), cache)
    profile(step, f"{args.shape} {args.dtype} batch {B} backend {args.backend}", args.top)


def profile(step, what: str, top: int):
    step()
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        step()
        torch.cuda.synchronize()
    events = prof.key_averages()
    kernels = [e for e in events if e.device_type == torch.autograd.DeviceType.CUDA]
    total = sum(e.self_device_time_total for e in kernels)
    print(f"{what}: {sum(e.count for e in kernels)} kernel launches, {total / 1e3:.2f} ms of GPU time "
          f"in one eager forward")
    for e in sorted(kernels, key=lambda e: -e.self_device_time_total)[:top]:
        print(f"  {e.self_device_time_total / 1e3:8.3f} ms  {e.count:5d}x  {e.key[:90]}")


if __name__ == "__main__":
    main()
