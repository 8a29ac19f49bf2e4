"""What a topology row's time is made of: its ranks' start, phase by phase, against the same work
in one process.

    python3 bench/rank_start.py                                   # cuda if there is a GPU, else cpu
    python3 bench/rank_start.py --device cpu --topologies 1,2 2,1 --repeat 3
    python3 bench/rank_start.py --device cuda --dtype bf16 --backend triton

Each phase is one launch of the topology's ranks (Lockstep's launcher, engine.launch, as `lockstep
check` starts them for a topology spec), and each does what the one before did and more, so the
increments below tell where a row's time goes:
  started   the ranks start, join their process group and return (nothing of the engine imported)
  engine    + import the engine (lockstep.engine.parallel and generate) and touch the rank's device
  model     + load the model's shard from models/tiny-target (engine.parallel.from_checkpoint)
  generate  + generate 3 seeded requests x 12 tokens (engine.parallel.generate_at: what a topology
            spec's row runs, its results compared across ranks)
Against: the same load and generate in this process, no ranks (world size 1). The best of --repeat
rounds is shown (a shared machine's load drifts); the first round also pays for cold caches.
"""

import argparse
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402    (the ranks import this module: nothing of the engine at the top)

CKPT = ROOT / "models" / "tiny-target"
PHASES = ("started", "engine", "model", "generate")


def _started() -> int:
    return 0


def _engine() -> int:
    import lockstep.engine.generate  # noqa: F401
    import lockstep.engine.parallel  # noqa: F401
    device = torch.device("cuda") if torch.cuda.is_available() else torch.device("cpu")
    torch.zeros(1, device=device).add_(1)
    return 0


def _model(ctx, run, trace=None) -> list:
    from lockstep.engine.parallel import from_checkpoint
    from_checkpoint(run.ckpt, ctx, backend=run.backend, dtype=run.dtype)
    return []                                  # no results for run_at to compare across the ranks


def requests():
    from lockstep.engine.request import Request, SamplingParams
    params = SamplingParams(temperature=0.8, max_new_tokens=12, stop_token_ids=())
    return [Request([(31 * i + 7 * j) % 500 for j in range(8)], params, seed=40 + i) for i in range(3)]


def phase_seconds(phase: str, tp: int, ep: int, args) -> float:
    from lockstep.engine.distributed import Topology
    from lockstep.engine.launch import launch
    from lockstep.engine.parallel import TopologyRun, generate_at, run_at
    t0 = time.perf_counter()
    if phase in ("started", "engine"):
        launch(_started if phase == "started" else _engine, tp * ep, device=args.device)
    elif phase == "model":
        run_at(_model, TopologyRun(str(CKPT), Topology(tp, ep), args.backend, args.dtype, args.device), (), "model")
    else:
        generate_at(CKPT, tp, ep, requests(), backend=args.backend, device=args.device, dtype=args.dtype)
    return time.perf_counter() - t0


def in_process_seconds(args) -> float:
    from lockstep.engine.generate import generate
    from lockstep.engine.model import GptOssModel
    t0 = time.perf_counter()
    model = GptOssModel.from_checkpoint(CKPT, backend=args.backend, device=args.device, dtype=args.dtype)
    generate(model, requests())
    if args.device == "cuda":
        torch.cuda.synchronize()
    return time.perf_counter() - t0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu", choices=("cpu", "cuda"))
    ap.add_argument("--topologies", nargs="+", default=["1,2", "2,1", "2,2"], help="tp,ep pairs")
    ap.add_argument("--backend", default="torch")
    ap.add_argument("--dtype", default="fp32", choices=("fp32", "bf16"))
    ap.add_argument("--repeat", type=int, default=2)
    args = ap.parse_args()
    try:
        splits = [tuple(int(v) for v in t.split(",")) for t in args.topologies]
        if any(len(s) != 2 or min(s) < 1 for s in splits):
            raise ValueError
    except ValueError:
        ap.error(f"--topologies: tp,ep pairs of positive integers, got {args.topologies}")
    print(f"device {args.device}, backend {args.backend}, dtype {args.dtype}, torch {torch.__version__}, "
          f"best of {args.repeat}")
    alone = min(in_process_seconds(args) for _ in range(args.repeat))
    print(f"in one process (load + generate, no ranks): {alone:.2f} s")
    print("| topology | started | + engine | + model | + generate (the row) | the row / one process |")
    print("| --- | ---: | ---: | ---: | ---: | ---: |")
    for tp, ep in splits:
        best = {p: min(phase_seconds(p, tp, ep, args) for _ in range(args.repeat)) for p in PHASES}
        steps = [best["started"]] + [best[b] - best[a] for a, b in zip(PHASES, PHASES[1:])]
        cells = " | ".join(f"{s:.2f} s" if i == 0 else f"{s:+.2f} s" for i, s in enumerate(steps))
        print(f"| tp={tp} ep={ep} | {cells} | {best['generate'] / alone:.1f}x |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
