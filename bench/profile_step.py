"""Where a decode step's (or a prefill's) GPU time goes: the kernels of one eager forward, by
total time (GPU only).

    python bench/profile_step.py [--shape 20b] [--dtype bf16|mxfp4] [--batch 1] [--backend triton]
                                 [--prefill 2048] [--generate 128] [--expert-block-m 64] [--device cuda]

Builds bench/e2e.py's random weights, prefills a 128-token context per request, then records
one decode step with torch.profiler and prints the top kernels and the launch count. With
--prefill P it records one P-token prefill into an empty cache instead. With --generate N it
times engine.generate as bench/e2e.py's generate figure does (N new tokens for each of --batch
requests of 128 prompt tokens) against the captured decode step, and splits generate's wall time
into the GPU's kernel time and the time the GPU waits on the host. --expert-block-m fixes
the rows per grouped expert block (else kernels.moe.expert_block_m picks them from the launch's
rows) to compare block sizes.
Used to find what to fuse next; the figures that count are bench/e2e.py's. `--device cpu` (no
kernel times: the profile sees host ops only) is the smoke path tests/test_bench_profile_step.py runs.
"""

import argparse
import sys
import time
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
    ap.add_argument("--generate", type=int, default=0, help="split a generate call of this many new tokens instead")
    ap.add_argument("--expert-block-m", type=int, default=0, help="fix the grouped experts' rows per block")
    ap.add_argument("--device", default="cuda")
    args = ap.parse_args()
    dev = torch.device(args.device)
    if args.expert_block_m:
        import lockstep.engine.experts
        lockstep.engine.experts.expert_block_m = lambda *_, **__: args.expert_block_m
    config = e2e.preset(e2e.SHAPES.get(args.shape, args.shape))
    floats, packed = e2e.random_weights(config, dev)
    weights = floats | (e2e.dense_experts(packed) if args.dtype == "bf16" else packed)
    model = e2e.engine_model(config, weights, args.backend, dev, "bf16")
    B, ctx = args.batch, 128
    if args.prefill:
        P = args.prefill
        cache = model.new_cache(1, P)
        toks = torch.randint(0, config.vocab_size, (P,), device=dev)
        step = lambda: model.forward(toks, torch.arange(P, device=dev),    # noqa: E731
                                     torch.zeros(P, dtype=torch.int64, device=dev), cache)
        profile(step, f"{args.shape} {args.dtype} prefill {P} backend {args.backend}", args.top, dev)
        return
    if args.generate:
        generate_split(model, config, args)
        return
    cache = model.new_cache(B, ctx + 8)
    for s in range(B):
        toks = torch.randint(0, config.vocab_size, (ctx,), device=dev)
        model.forward(toks, torch.arange(ctx, device=dev), torch.full((ctx,), s, device=dev), cache)
    step = lambda: model.forward(torch.zeros(B, dtype=torch.int64, device=dev),    # noqa: E731
                                 torch.full((B,), ctx, device=dev), torch.arange(B, device=dev), cache)
    profile(step, f"{args.shape} {args.dtype} batch {B} backend {args.backend}", args.top, dev)


def profile(step, what: str, top: int, dev: torch.device):
    """One call of `step` under torch.profiler: its kernels by GPU time (on the CPU: its ops by
    CPU time, self time only, so nested ops are not counted twice)."""
    cuda = dev.type == "cuda"
    activity = torch.profiler.ProfilerActivity.CUDA if cuda else torch.profiler.ProfilerActivity.CPU
    step()
    e2e.sync(dev)
    with torch.profiler.profile(activities=[activity]) as prof:
        step()
        e2e.sync(dev)
    events = prof.key_averages()
    if cuda:
        kernels = [e for e in events if e.device_type == torch.autograd.DeviceType.CUDA]
        spent, what_ran, clock = (lambda e: e.self_device_time_total), "kernel launches", "GPU"
    else:
        kernels = list(events)
        spent, what_ran, clock = (lambda e: e.self_cpu_time_total), "ops", "CPU"
    total = sum(spent(e) for e in kernels)
    print(f"{what}: {sum(e.count for e in kernels)} {what_ran}, {total / 1e3:.2f} ms of {clock} time "
          f"in one eager forward")
    for e in sorted(kernels, key=lambda e: -spent(e))[:top]:
        print(f"  {spent(e) / 1e3:8.3f} ms  {e.count:5d}x  {e.key[:90]}")


def generate_split(model, config, args):
    """generate's wall time against the captured step: its kernels' GPU time and the rest (the GPU
    idle between kernels while the host prepares, launches and reads back a step)."""
    B, N, ctx, dev = args.batch, args.generate, 128, model.device
    g = torch.Generator().manual_seed(e2e.SEED + 1)
    prompts = torch.randint(0, config.vocab_size, (B, ctx), generator=g).tolist()
    call = e2e.engine_generate(model, prompts, N)
    call()                                                   # warm-up: compiles, captures
    walls = []
    for _ in range(2):
        e2e.sync(dev)
        t0 = time.perf_counter()
        call()
        walls.append(time.perf_counter() - t0)
    wall = min(walls)
    cache = model.new_cache(B, ctx + N + 8)
    slots = torch.arange(B, device=dev)
    e2e.engine_forward(model, torch.tensor(prompts, device=dev).reshape(-1), torch.arange(ctx, device=dev).repeat(B),
                       slots.repeat_interleave(ctx), cache, rows=slots * ctx + ctx - 1)
    step = e2e.engine_decoder(model, cache, B, use_graph=True)
    tokens = torch.zeros(B, dtype=torch.int64, device=dev)
    step_s = e2e.time_per_call(lambda i: step(tokens, torch.full((B,), ctx + i, device=dev), slots), dev, N)
    activities = [torch.profiler.ProfilerActivity.CPU]
    if dev.type == "cuda":
        activities.append(torch.profiler.ProfilerActivity.CUDA)
    with torch.profiler.profile(activities=activities) as prof:
        call()
        e2e.sync(dev)
    events = prof.key_averages()
    kernels = [e for e in events if e.device_type == torch.autograd.DeviceType.CUDA]
    busy = sum(e.self_device_time_total for e in kernels) / 1e6
    rate, step_rate = B * N / wall, B / step_s
    print(f"{args.shape} {args.dtype} generate b={B}, {N} new tokens after {ctx} prompt tokens: {wall:.3f} s "
          f"({rate:,.1f} tok/s) = {rate / step_rate:.3f}x the captured step ({step_s * 1e3:.3f} ms, "
          f"{step_rate:,.1f} tok/s); N captured steps {N * step_s:.3f} s")
    print(f"  in one profiled call: kernels {busy:.3f} s of GPU time ({busy / N * 1e3:.3f} ms a token), "
          f"the rest of the unprofiled wall {wall - busy:.3f} s ({(wall - busy) / N * 1e3:.3f} ms a token) "
          f"the GPU waiting (host work, copies, syncs)")
    print("  host calls by self CPU time:")
    host = [e for e in events if e.device_type == torch.autograd.DeviceType.CPU]
    for e in sorted(host, key=lambda e: -e.self_cpu_time_total)[:args.top]:
        print(f"  {e.self_cpu_time_total / 1e3:8.3f} ms  {e.count:6d}x  {e.key[:90]}")
    print("  kernels by GPU time:")
    for e in sorted(kernels, key=lambda e: -e.self_device_time_total)[:args.top]:
        print(f"  {e.self_device_time_total / 1e3:8.3f} ms  {e.count:6d}x  {e.key[:90]}")


if __name__ == "__main__":
    main()
