"""Data-parallel replay throughput: one trace replayed on 1, 2 and 4 CPU ranks (`replay --dp N`).

Records a synthetic trace with Lockstep's own code (harness.replay.record.record on the `tiny`
preset, whose checkpoint harness.checkpoints makes with engine.checkpoint.make_checkpoint), then
replays it in this process at each degree (harness.replay.rerun.replay(..., dp=N): 1 runs here,
N > 1 starts N ranks with Lockstep's launcher, gloo, each rank a whole model and
max(1, threads // N) torch threads; `--threads`, default 1, so that the ratio measures the ranks,
not torch's intra-op threads), and prints each run's time, its throughput and the ratio to
1 rank, and whether its report equals 1 rank's (it must: D2). `--repeat R`: R rounds over the
degrees, each degree's best time (a shared machine's load drifts). A rank's start (a process, the
model's load) is inside its time: what a user of `--dp` waits for.

    python3 bench/replay_ranks.py                          # 4,096 requests x 4 tokens, free-run
    python3 bench/replay_ranks.py --mode teacher-forced
    python3 bench/replay_ranks.py --requests 256 --ranks 1,2   # a quick look
    python3 bench/replay_ranks.py --trace /tmp/t4096.jsonl     # record once, re-run on the same trace
"""

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402

from lockstep.engine.request import Request  # noqa: E402
from lockstep.engine.sampling import SamplingParams  # noqa: E402
from lockstep.harness.replay.format import read_trace, write_trace  # noqa: E402
from lockstep.harness.replay.record import record  # noqa: E402
from lockstep.harness.replay.rerun import replay  # noqa: E402
from lockstep.harness.replay.run import Setup  # noqa: E402


def requests(n: int, prompt: int, tokens: int) -> list[Request]:
    """Seeded sampled requests with prompts of prompt .. prompt + 7 ids (a synthetic workload)."""
    params = SamplingParams(temperature=0.9, max_new_tokens=tokens, stop_token_ids=())
    return [Request([(7 * i + 3 * j + 1) % 500 for j in range(prompt + i % 8)], params, seed=i) for i in range(n)]


def recorded(args):
    """(the trace, seconds its recording took; 0 when read from --trace)."""
    if args.trace is not None and args.trace.exists():
        return read_trace(args.trace), 0.0
    setup = Setup({"preset": "tiny", "seed": 0, "format": "bf16"}, max_batch=args.max_batch)
    with tempfile.TemporaryDirectory() as tmp:
        t0 = time.perf_counter()
        path = write_trace(record(setup, requests(args.requests, args.prompt, args.tokens)),
                           args.trace or Path(tmp) / "t.jsonl")
        t_record = time.perf_counter() - t0
        return read_trace(path), t_record


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--requests", type=int, default=4096)
    ap.add_argument("--tokens", type=int, default=4, help="new tokens a request")
    ap.add_argument("--prompt", type=int, default=8, help="the shortest prompt")
    ap.add_argument("--max-batch", type=int, default=64)
    ap.add_argument("--mode", choices=["free-run", "teacher-forced"], default="free-run")
    ap.add_argument("--ranks", default="1,2,4", help="data-parallel degrees, the first the baseline")
    ap.add_argument("--repeat", type=int, default=1, help="rounds over the degrees; each degree's best time")
    ap.add_argument("--threads", type=int, default=1,
                    help="torch threads of this process (default 1: 1 rank runs on one thread, as each of N ranks "
                         "does; 0 leaves torch's default, split over the ranks)")
    ap.add_argument("--trace", type=Path, help="read the trace from here if it exists, else record it and write it "
                                               "here (a re-run skips the recording)")
    args = ap.parse_args()
    degrees = [int(x) for x in args.ranks.split(",")]
    if args.threads:
        torch.set_num_threads(args.threads)
    trace, t_record = recorded(args)
    steps = sum(len(s) for s in trace.steps)
    print(f"cpu: {torch.get_num_threads()} torch threads; preset tiny, {len(trace.requests)} requests x {args.tokens} "
          f"tokens (prompts {args.prompt}-{args.prompt + 7}), max_batch {args.max_batch}; "
          + (f"recorded in {t_record:.1f} s" if t_record else f"trace read from {args.trace}"))
    best, docs = {}, {}
    for _ in range(args.repeat):                 # rounds over the degrees, so load drifts hit each alike
        for dp in degrees:
            t0 = time.perf_counter()
            report = replay(trace, args.mode, locate_first=False, dp=dp)
            best[dp] = min(best.get(dp, float("inf")), time.perf_counter() - t0)
            docs[dp] = report, json.dumps(report.command_json(), sort_keys=True)
    base, first = best[degrees[0]], docs[degrees[0]][1]
    for dp in degrees:
        t, (report, doc) = best[dp], docs[dp]
        print(f"{args.mode} replay, {dp} rank{'s' if dp > 1 else ' '}: {t:7.2f} s  {args.requests / t:8.1f} requests/s "
              f"{steps / t:9.1f} steps/s  x{base / t:.2f} of {degrees[0]} rank(s)  "
              f"{report.counts().get('bitwise', 0)} of {steps} steps bitwise, report "
              f"{'the same' if doc == first else 'DIFFERENT'}")
    return 0 if all(doc == first for _, doc in docs.values()) else 1      # another report is a bug, not a figure


if __name__ == "__main__":
    sys.exit(main())
