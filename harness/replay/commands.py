"""The replay subcommands of `lockstep`: record, replay, import-peer, promote (harness/cli.py adds them).

    lockstep record OUT --checkpoint models/tiny-target --requests reqs.jsonl [--dtype --backend --tp --ep
                        --max-batch --prefill-chunk] [--draft models/tiny-eagle3 --convention sglang --topk 2 ...]
    lockstep record OUT --target hf --checkpoint models/tiny-target --requests reqs.jsonl [--max-batch
                        --prefill-chunk]      (through a target adapter: harness/replay/target_record.py)
    lockstep replay TRACE [--mode free-run|teacher-forced] [--tp --ep --backend --max-batch --prefill-chunk
                          --order 1,0] [--near-tie 1e-3] [--json]
    lockstep import-peer PEER.json --format vllm|sglang|rollouts|hf --checkpoint DIR [--threshold 1e-3] [--json]
    lockstep promote TRACE SPEC_ID [--requests 0,2] [--specs DIR]

A request file has one JSON object a line: {"prompt": [ids], "seed": 7, "sampling": {"temperature":
0.8, "max_new_tokens": 16, ...}} (engine.sampling.SamplingParams' fields). Exit codes: 0 bitwise
(replay; another engine's trace: every step within --threshold) or written, 1 a divergence, 2 a bad
trace, bad input or a target that cannot run here (one located line, never a traceback).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

EXIT_OK, EXIT_DIVERGED, EXIT_USAGE = 0, 1, 2


def _ints(text: str) -> list[int]:
    try:
        return [int(x) for x in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None


def _fail(msg: str) -> int:
    print(f"lockstep: error: {msg}", file=sys.stderr)
    return EXIT_USAGE


def add_commands(sub) -> None:
    p = sub.add_parser("record", help="run requests through the engine and write a replay trace")
    p.add_argument("out", type=Path, metavar="OUT")
    g = p.add_mutually_exclusive_group(required=True)
    g.add_argument("--checkpoint", help="a checkpoint folder (relative to the project root, or absolute)")
    g.add_argument("--preset", help="a synthetic checkpoint of this preset (with --ckpt-seed, --format)")
    p.add_argument("--ckpt-seed", type=int, default=0)
    p.add_argument("--format", choices=["bf16", "mxfp4"], default="bf16")
    p.add_argument("--requests", type=Path, help="JSONL: one request a line")
    p.add_argument("--prompt-ids", type=_ints, action="append", help="a prompt; repeat for a batch")
    p.add_argument("--seed", type=int, help="with --prompt-ids: seeded sampling (without: greedy)")
    p.add_argument("--temperature", type=float, default=1.0)
    p.add_argument("--max-new-tokens", type=int, default=16)
    _run_options(p)
    p.add_argument("--dtype", choices=["fp32", "bf16"], default="fp32")
    p.add_argument("--draft", help="an EAGLE3 draft folder (relative to the project root): speculative decoding")
    p.add_argument("--convention", choices=["boundary", "sglang", "output-index"], default="sglang")
    p.add_argument("--num-steps", type=int, default=3)
    p.add_argument("--topk", type=int, default=1)
    p.add_argument("--draft-token-num", type=int, default=4)
    p.add_argument("--verify", choices=["greedy", "target-only", "rejection"], default="target-only")
    p.add_argument("--target", help="record through this target adapter (sglang, vllm, hf, lockstep, or an outside "
                                    "engine's entry point) instead of Lockstep's engine")
    p.set_defaults(func=cmd_record)

    p = sub.add_parser("replay", help="replay a trace and judge it step by step (free-run or teacher-forced)")
    p.add_argument("trace", type=Path, metavar="TRACE")
    p.add_argument("--mode", choices=["free-run", "teacher-forced"], default="free-run")
    _run_options(p, defaults=False)
    p.add_argument("--order", type=_ints, help="the batch composition: request indices in run order, e.g. 2,0,1")
    p.add_argument("--forced-shape", choices=["decode", "prefill"], default=None,
                   help="teacher-forced: one token a step (generate), or every token in chunked forwards")
    p.add_argument("--checkpoint", help="the checkpoint folder here, when the trace's path does not hold it "
                                        "(its weight digests must match the trace's)")
    p.add_argument("--near-tie", type=float, default=None, help="margin under which a token flip is a near-tie")
    p.add_argument("--threshold", type=float, default=None,
                   help="another engine's trace (import-peer, record --target): the |Δlogprob| a step may "
                        "differ by (default 1e-3)")
    p.add_argument("--no-locate", action="store_true", help="do not re-run the first divergence with ops traced")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_replay)

    p = sub.add_parser("import-peer", help="import a peer engine's output as a trace and teacher-force it here")
    p.add_argument("peer", type=Path, metavar="PEER")
    p.add_argument("--format", dest="peer_format", choices=["vllm", "sglang", "rollouts", "hf"], required=True)
    p.add_argument("--checkpoint", required=True, help="the checkpoint the peer ran (folder)")
    p.add_argument("--prompt-ids", type=_ints, action="append", help="prompts, where the peer's file lacks them")
    p.add_argument("--threshold", type=float, default=1e-3, help="|Δlogprob| above which a token counts as off")
    p.add_argument("--out", type=Path, help="also write the imported trace here")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_import_peer)

    p = sub.add_parser("promote", help="turn a trace into a generate spec (then record its golden with regen)")
    p.add_argument("trace", type=Path, metavar="TRACE")
    p.add_argument("spec_id", metavar="SPEC_ID", help="e.g. replay/incident-42 (written under specs/)")
    p.add_argument("--requests", type=_ints, help="only these request indices")
    p.add_argument("--description", default=None)
    p.add_argument("--specs", type=Path, default=Path("specs"), help="spec directory (default: ./specs)")
    p.set_defaults(func=cmd_promote)


def _run_options(p, defaults: bool = True) -> None:
    p.add_argument("--backend", choices=["torch", "triton"], default="torch" if defaults else None)
    p.add_argument("--tp", type=int, default=1 if defaults else None)
    p.add_argument("--ep", type=int, default=1 if defaults else None)
    p.add_argument("--max-batch", type=int, default=8 if defaults else None)
    p.add_argument("--prefill-chunk", type=int, default=None)


def _checkpoint_ref(text: str) -> dict:
    from harness.replay.run import ROOT
    path = Path(text)
    full = (path if path.is_absolute() else Path.cwd() / path).resolve()
    if not full.is_dir():
        raise ValueError(f"no checkpoint folder at {text}")
    try:
        return {"path": str(full.relative_to(ROOT.resolve()))}
    except ValueError:
        return {"path": str(full)}


def _requests(args):
    from engine.request import Request, SamplingParams

    if args.requests is not None:
        out = []
        try:
            lines = args.requests.read_text().splitlines()
        except OSError as e:
            raise ValueError(f"{args.requests}: cannot be read ({e.strerror or e})") from None
        for n, line in enumerate(lines, 1):
            if not line.strip():
                continue
            try:
                d = json.loads(line)
                out.append(Request.from_dict(d))
            except (ValueError, KeyError, TypeError) as e:
                raise ValueError(f"{args.requests}:{n}: {type(e).__name__}: {e}") from None
        if not out:
            raise ValueError(f"{args.requests}: no requests")
        return out
    if not args.prompt_ids:
        raise ValueError("give --requests FILE or --prompt-ids")
    params = SamplingParams(temperature=args.temperature, max_new_tokens=args.max_new_tokens, greedy=args.seed is None)
    return [Request(prompt=ids, params=params, seed=args.seed) for ids in args.prompt_ids]


def cmd_record(args) -> int:
    from engine.checkpoint import CheckpointError
    from harness.replay.format import TraceError, write_trace
    from harness.replay.record import record
    from harness.replay.run import Setup

    try:
        ckpt = _checkpoint_ref(args.checkpoint) if args.checkpoint else \
            {"preset": args.preset, "seed": args.ckpt_seed, "format": args.format}
        spec = None
        draft = None
        if args.draft:
            draft = {**_checkpoint_ref(args.draft), "convention": args.convention}
            spec = {"num_steps": args.num_steps, "topk": args.topk, "draft_token_num": args.draft_token_num,
                    "verify": args.verify}
        if args.target is not None:
            _target_options(args)
        setup = Setup(ckpt, dtype=args.dtype, backend=args.backend, tp=args.tp, ep=args.ep, max_batch=args.max_batch,
                      prefill_chunk=args.prefill_chunk, draft=draft, speculative=spec)
        if args.target is not None:
            from harness.replay.target_record import record_target
            trace = record_target(args.target, setup, _requests(args))
        else:
            trace = record(setup, _requests(args))
        write_trace(trace, args.out)
    except (TraceError, CheckpointError, ValueError, OSError) as e:
        return _fail(str(e))
    n = sum(len(s) for s in trace.steps)
    via = f" from target {trace.manifest['engine']['name']}-{trace.manifest['engine']['version']}" if args.target else ""
    print(f"recorded {len(trace.requests)} requests, {n} steps{via} to {args.out}")
    return EXIT_OK


def _target_options(args) -> None:
    """What a target recording cannot take: the engine's own settings (the target runs as it runs)."""
    engine_only = [flag for flag, on in (("--draft", args.draft), ("--tp", args.tp != 1), ("--ep", args.ep != 1),
                                         ("--dtype", args.dtype != "fp32"), ("--backend", args.backend != "torch"))
                   if on]
    if engine_only:
        raise ValueError(f"--target {args.target}: {', '.join(engine_only)} set(s) Lockstep's own engine; a target "
                         f"runs as its adapter runs it (only --max-batch and --prefill-chunk reach it)")


def cmd_replay(args) -> int:
    from engine.checkpoint import CheckpointError
    from harness.replay.format import TraceError, read_trace
    from harness.replay.replay import NEAR_TIE, THRESHOLD, replay

    try:
        trace = read_trace(args.trace)
        overrides = {k: getattr(args, k) for k in ("backend", "tp", "ep", "max_batch", "prefill_chunk", "order",
                                                    "forced_shape")}
        if args.checkpoint:
            overrides["checkpoint"] = _checkpoint_ref(args.checkpoint)
        report = replay(trace, args.mode, overrides, near_tie=args.near_tie if args.near_tie is not None else NEAR_TIE,
                        locate_first=not args.no_locate,
                        threshold=args.threshold if args.threshold is not None else THRESHOLD)
    except (TraceError, CheckpointError, ValueError, OSError) as e:
        return _fail(f"{args.trace}: {e}" if not str(e).startswith(str(args.trace)) else str(e))
    print(json.dumps(report.to_json(), indent=2) if args.json else report.text())
    return EXIT_OK if report.ok else EXIT_DIVERGED


def cmd_import_peer(args) -> int:
    from engine.checkpoint import CheckpointError
    from harness.replay.format import TraceError, write_trace
    from harness.replay.peer import import_peer, teacher_force_peer

    try:
        trace = import_peer(args.peer, args.peer_format, _checkpoint_ref(args.checkpoint), args.prompt_ids)
        report = teacher_force_peer(trace, args.threshold)
        if args.out:
            write_trace(trace, args.out)
    except (TraceError, CheckpointError, ValueError, OSError) as e:
        return _fail(str(e))
    print(json.dumps(report.to_json(), indent=2) if args.json else report.text())
    return EXIT_OK


def cmd_promote(args) -> int:
    from harness.replay.format import TraceError, read_trace
    from harness.replay.promote import promote

    try:
        path = promote(read_trace(args.trace), args.spec_id, args.requests, args.description, args.specs)
    except (TraceError, ValueError, OSError) as e:
        return _fail(str(e))
    print(f"wrote {path}; record its golden with: lockstep regen '{args.spec_id}'")
    return EXIT_OK
