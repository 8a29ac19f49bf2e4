"""Teacher-forced replay throughput: a batch of recorded rollouts fed back through the engine.

Times, in one process on one model, (a) plain greedy generation of R requests x N new tokens and
(b) teacher-forced replay of the same tokens (harness.replay: generate(..., forced=) with the
StepLog observing every step's logits digest, margin and routed experts, then the per-step
verdicts), decode-shaped (one forward per token) and prefill-shaped (every recorded token in
chunked forwards), and prints each and the ratios replay / generation (lower is better). The issue's target shape is 64 x 1024 at 20b on one H200 (the lead's figure); on the CPU
use the tiny presets:

    python bench/replay.py                                  # tiny preset, 64 x 1024 (slow on a CPU)
    python bench/replay.py --requests 8 --tokens 128        # a quick look
    python bench/replay.py --preset tiny --prompt 32 --max-batch 64

In memory (--shape): the model is built with random weights directly on --device (bench/e2e.py's
random_weights and engine_model: no checkpoint file, so the 20b shape needs no 13-40 GB write),
and the script times prefill-shaped teacher forcing (engine.teacher_forcing.teacher_force, as
`lockstep replay --mode teacher-forced --forced-shape prefill` runs it, then replay's per-step
verdicts against the recording) of R requests x N tokens, against baselines measured in the same
process on the same tokens, chunks and groups: a plain prefill (the logits of one row per request
per forward, as a server's prefill), and the same forwards with every row's logits (the lm_head
work teacher forcing cannot skip). The recording it judges against is the same tokens teacher-
forced once at half the chunk and half the group (D3: the same bits; the verdicts say whether they
are). Token ids are random (teacher forcing takes any tokens: a rollout's, a peer's); the routed
experts, logits digests and margins are not observed (host-side work per row that `lockstep replay`
adds on top; the CPU figures above include it). The issue's figure (target <= 4 s):

    python3 bench/replay.py --shape 20b                     # on one H200: 64 x 1024, bf16, dense bf16 experts
    python3 bench/replay.py --shape 20b --experts mxfp4 --repeat 1   # packed experts (slower prefills)
    python3 bench/replay.py --shape tiny --device cpu --requests 4 --tokens 32 --chunk 16 --max-batch 2

The in-memory path ends with two "memory" lines: the build's and the timed forwards' peak device
memory (CUDA) and host RSS against the model's own bytes (bench/_memory.py; target <= 1.15x).
"""

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from _util import DEVICE, device_line  # noqa: E402
from lockstep.engine.generate import Request  # noqa: E402
from lockstep.engine.sampling import SamplingParams  # noqa: E402
from lockstep.harness.replay.format import Trace  # noqa: E402
from lockstep.harness.replay.observe import StepLog  # noqa: E402
from lockstep.harness.replay.record import build_trace  # noqa: E402
from lockstep.harness.replay.rerun import Verdict, replay  # noqa: E402
from lockstep.engine.teacher_forcing import teacher_force  # noqa: E402
from lockstep.harness.replay.run import Setup, run  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--preset", default="tiny")
    ap.add_argument("--checkpoint", help="a checkpoint folder instead of a preset (e.g. the real gpt-oss-20b)")
    ap.add_argument("--requests", type=int, default=64)
    ap.add_argument("--tokens", type=int, default=1024)
    ap.add_argument("--prompt", type=int, default=32, help="prompt length")
    ap.add_argument("--max-batch", type=int, default=64)
    ap.add_argument("--chunk", type=int, default=256, help="prefill-shaped replay: positions per forward")
    ap.add_argument("--dtype", choices=["fp32", "bf16"], default=None,
                    help="compute dtype (default fp32; with --shape on CUDA bf16)")
    ap.add_argument("--backend", choices=["torch", "triton"], default=None,
                    help="default torch; with --shape on CUDA triton (the deterministic kernels)")
    ap.add_argument("--shape", help="in memory: 20b, 120b or an engine.config preset, random weights built on "
                                    "--device (no checkpoint file)")
    ap.add_argument("--device", default=DEVICE.type, help="with --shape: cuda or cpu")
    ap.add_argument("--experts", choices=["mxfp4", "bf16"], default="bf16",
                    help="with --shape: the experts dense in bf16 (default), or packed MXFP4 (the same values; "
                         "about 3x slower prefills, docs/history/benchmarks.md)")
    ap.add_argument("--repeat", type=int, default=3, help="with --shape: timed runs of each figure (the median)")
    args = ap.parse_args()
    if args.shape:
        return in_memory(args)
    args.dtype, args.backend = args.dtype or "fp32", args.backend or "torch"
    ckpt = {"path": str(Path(args.checkpoint).resolve())} if args.checkpoint else \
        {"preset": args.preset, "seed": 0, "format": "bf16"}
    setup = Setup(ckpt, dtype=args.dtype, backend=args.backend,
                  max_batch=args.max_batch, device=DEVICE.type)
    params = SamplingParams(greedy=True, max_new_tokens=args.tokens, stop_token_ids=())
    reqs = [Request([(7 * i + 3 * j) % 500 for j in range(args.prompt)], params) for i in range(args.requests)]
    run(setup, reqs[:1])                                              # load the model, warm up

    t0 = time.perf_counter()
    results = run(setup, reqs)
    t_gen = time.perf_counter() - t0

    tokens = [list(r.tokens) for r in results]
    flog = StepLog([len(r.prompt) for r in reqs], logits=True)         # a trace as record would write it,
    forced = run(setup, [Request(r.prompt, params) for r in reqs], flog, tokens)   # minus the second run
    trace: Trace = build_trace(setup, reqs, forced, StepLog([]), flog, source="bench")

    t0 = time.perf_counter()
    report = replay(trace, "teacher-forced", locate_first=False)
    t_replay = time.perf_counter() - t0
    t0 = time.perf_counter()
    report_p = replay(trace, "teacher-forced", {"forced_shape": "prefill", "prefill_chunk": args.chunk},
                      locate_first=False)
    t_prefill = time.perf_counter() - t0
    n = args.requests * args.tokens
    print(device_line())
    print(f"{args.checkpoint or 'preset ' + args.preset}, {args.requests} requests x {args.tokens} tokens (prompt {args.prompt}), "
          f"max_batch {args.max_batch}, {args.dtype}, {args.backend}")
    print(f"plain generation:       {t_gen:8.2f} s  ({n / t_gen:9.1f} tokens/s)")
    print(f"teacher-forced replay:  {t_replay:8.2f} s  ({n / t_replay:9.1f} tokens/s), "
          f"{report.counts().get('bitwise', 0)} of {n} steps bitwise")
    print(f"  prefill-shaped:       {t_prefill:8.2f} s  ({n / t_prefill:9.1f} tokens/s), "
          f"{report_p.counts().get('bitwise', 0)} of {n} steps bitwise (chunks of {args.chunk})")
    print(f"ratio replay / generation: {t_replay / t_gen:.2f} decode-shaped, {t_prefill / t_gen:.2f} prefill-shaped")



# ====================================================================== in memory (--shape)
def _sync(device):
    import torch
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _median_seconds(fn, device, repeat):
    """The median wall time of `repeat` calls (synchronized on CUDA), after one warm-up call."""
    import statistics
    fn()
    times = []
    for _ in range(repeat):
        _sync(device)
        t0 = time.perf_counter()
        fn()
        _sync(device)
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def _forwards(model, seqs, chunk, group, all_rows):
    """The forwards of a prefill of `seqs` in chunks of `chunk` positions, `group` sequences per
    forward (teacher_force's schedule), without reading logprobs: the logits of every row
    (all_rows) or of one row per sequence per forward."""
    import torch
    dev = model.device
    for g0 in range(0, len(seqs), group):
        members = seqs[g0:g0 + group]
        longest = max(len(s) for s in members)
        cache = model.new_cache(len(members), longest)
        for start in range(0, longest, chunk):
            tok, pos, slot, rows = [], [], [], []
            for j, s in enumerate(members):
                span = range(start, min(start + chunk, len(s)))
                if not span:
                    continue
                first = len(tok)
                tok += s[span.start:span.stop]
                pos += list(span)
                slot += [j] * len(span)
                rows += list(range(first, len(tok))) if all_rows else [len(tok) - 1]
            model.forward(torch.tensor(tok, device=dev), torch.tensor(pos, device=dev), torch.tensor(slot, device=dev),
                          cache, logit_rows=torch.tensor(rows, dtype=torch.int64, device=dev))


def in_memory(args):
    import torch

    import e2e
    from _memory import Meter, model_bytes
    from lockstep.engine.config import PRESETS, preset
    from lockstep.harness.replay.format import f32_bits
    from lockstep.harness.replay.rerun import _forced_verdicts

    device = torch.device(args.device)
    cuda = device.type == "cuda"
    name = e2e.SHAPES.get(args.shape, args.shape)
    if name not in PRESETS:
        sys.exit(f"bench/replay.py: --shape {args.shape!r}: choose 20b, 120b or one of {sorted(PRESETS)}")
    dtype = args.dtype or ("bf16" if cuda else "fp32")
    backend = args.backend or ("triton" if cuda else "torch")
    config = preset(name)
    meter = Meter(device)
    t0 = time.perf_counter()
    floats, packed = e2e.random_weights(config, device)
    weights = {**floats, **(packed if args.experts == "mxfp4" else e2e.dense_experts(packed, consume=True))}
    del floats, packed                                   # `weights` holds each tensor once, handed over
    model = e2e.engine_model(config, weights, backend, device, dtype, take=True)
    del weights
    e2e.free_memory(device)
    _sync(device)
    t_build = time.perf_counter() - t0
    nbytes = model_bytes(model)
    build_memory = meter.line("model build (random weights made and handed over)", nbytes)
    meter.start()

    R, N, P = args.requests, args.tokens, args.prompt
    g = torch.Generator().manual_seed(24)
    prompts = torch.randint(0, config.vocab_size, (R, P), generator=g).tolist()
    forced = torch.randint(0, config.vocab_size, (R, N), generator=g).tolist()
    params = SamplingParams(greedy=True, max_new_tokens=N, stop_token_ids=())
    reqs = [Request(p, params) for p in prompts]
    seqs = [p + t[:-1] for p, t in zip(prompts, forced)]
    chunk, group = args.chunk, args.max_batch

    with torch.inference_mode():
        # the recording: the same tokens teacher-forced at half the chunk and half the group
        rec = teacher_force(model, reqs, forced, max(1, chunk // 2), max(1, group // 2))
        trace = Trace({}, [], [[{"request": i, "step": k, "token": t, "logprob_bits": f32_bits(float(lp)),
                                 "logits_sha256": None, "experts": []}
                                for k, (t, lp) in enumerate(zip(forced[i], r.logprobs.tolist()))]
                               for i, r in enumerate(rec)], [])
        flog = StepLog([P] * R)
        verdicts = []

        def replay_once():
            res = teacher_force(model, reqs, forced, chunk, group)
            verdicts[:] = [v for i, r in enumerate(res) for v in _forced_verdicts(trace, i, r, flog)]

        t_plain = _median_seconds(lambda: _forwards(model, seqs, chunk, group, False), device, args.repeat)
        t_logits = _median_seconds(lambda: _forwards(model, seqs, chunk, group, True), device, args.repeat)
        t_replay = _median_seconds(replay_once, device, args.repeat)
    n = R * N
    # the in-memory recording holds logprobs only (no digest, no experts): a step whose logprob bits
    # match is `not recorded` for the rest, and that is all this bench compares
    same_bits = (Verdict.BITWISE, Verdict.NOT_RECORDED)
    bitwise = sum(v.status in same_bits for v in verdicts)
    print(device_line() if device == DEVICE else f"device {device}")
    print(f"{name} (random weights built on {device} in {t_build:.1f} s, {args.experts} experts), {dtype}, backend "
          f"{backend}; {R} requests x {N} tokens, prompt {P}; forwards of {chunk} positions x {group} requests; "
          f"median of {args.repeat} after a warm-up")
    print(f"plain prefill (one logits row per request per forward): {t_plain:8.3f} s  ({R * (P + N - 1) / t_plain:10.1f} "
          f"positions/s)")
    print(f"  the same forwards, every row's logits:                {t_logits:8.3f} s")
    print(f"teacher-forced replay (logprob of every recorded token, "
          f"verdicts): {t_replay:8.3f} s  ({n / t_replay:10.1f} tokens/s); {bitwise} of {n} steps bitwise to the "
          f"recording (chunks of {max(1, chunk // 2)} x {max(1, group // 2)})")
    print(f"ratio replay / plain prefill: {t_replay / t_plain:.2f}; replay / every-row forwards: "
          f"{t_replay / t_logits:.2f}")
    print(build_memory)
    print(meter.line("the timed forwards (caches, activations on top)", nbytes))
    if bitwise != n:
        first = next(v for v in verdicts if v.status not in same_bits)
        print(f"NOT BITWISE: first at request {first.request}, step {first.step}: {first.status}: {first.detail}")
        sys.exit(3)


if __name__ == "__main__":
    main()
