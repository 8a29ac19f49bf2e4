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
"""

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from _util import DEVICE, device_line  # noqa: E402
from engine.generate import Request  # noqa: E402
from engine.sampling import SamplingParams  # noqa: E402
from harness.replay.format import Trace  # noqa: E402
from harness.replay.observe import StepLog  # noqa: E402
from harness.replay.record import build_trace  # noqa: E402
from harness.replay.replay import replay  # noqa: E402
from harness.replay.run import Setup, run  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--preset", default="tiny")
    ap.add_argument("--checkpoint", help="a checkpoint folder instead of a preset (e.g. the real gpt-oss-20b)")
    ap.add_argument("--requests", type=int, default=64)
    ap.add_argument("--tokens", type=int, default=1024)
    ap.add_argument("--prompt", type=int, default=32, help="prompt length")
    ap.add_argument("--max-batch", type=int, default=64)
    ap.add_argument("--chunk", type=int, default=256, help="prefill-shaped replay: positions per forward")
    ap.add_argument("--dtype", choices=["fp32", "bf16"], default="fp32")
    ap.add_argument("--backend", choices=["torch", "triton"], default="torch")
    args = ap.parse_args()
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


if __name__ == "__main__":
    main()
