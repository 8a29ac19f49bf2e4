"""The replay subcommands of `lockstep`: record, replay, import-peer, promote (harness/cli.py adds them).

    lockstep record OUT --checkpoint models/tiny-target --requests reqs.jsonl [--dtype --backend --tp --ep
                        --max-batch --prefill-chunk] [--draft models/tiny-eagle3 --convention sglang --topk 2 ...]
    lockstep record OUT --target hf --checkpoint models/tiny-target --requests reqs.jsonl [--max-batch
                        --prefill-chunk]      (through a target adapter: harness/targets/record.py)
    lockstep replay TRACE [--mode free-run|teacher-forced] [--tp --ep --backend --max-batch --prefill-chunk
                          --order 1,0] [--dp N] [--near-tie 1e-3] [--json]
    lockstep import-peer PEER.json --format vllm|sglang|rollouts|hf --checkpoint DIR [--threshold 1e-3] [--dp N]
                         [--json]
    lockstep promote TRACE SPEC_ID [--request-indices 0,2] [--specs DIR] [--threshold 1e-3]

A request file has one JSON object a line: {"prompt": [ids], "seed": 7, "sampling": {"temperature":
0.8, "max_new_tokens": 16, ...}} (engine.sampling.SamplingParams' fields). Exit codes: 0 bitwise
(replay; another engine's trace: every step within --threshold) or written, 1 a divergence, 2 a bad
trace, bad input or a target that cannot run here (one located line, never a traceback).

Every input is checked at this edge before any work: the output path of record and
import-peer, each request line (an object, a prompt of token ids), the files' encoding, a trace's
manifest and that it has something to replay, the numbers a peer gives as logprobs (NaN, > 0 and
values beyond float32 are not log-probabilities), token ids against the checkpoint's vocabulary,
and record's cost (the KV cache it allocates and its time, harness/estimates.py).
"""

from __future__ import annotations

import argparse
import json
import math
import shlex
import sys
from pathlib import Path

from lockstep.harness.commands.options import (bound, deprecated, int_at_least, int_list, per_prompt_seeds, seeds,
                                               token_ids)
from lockstep.harness.errors import check_output_file
from lockstep.harness.jsonout import emit, print_document, replay_document, tool_document
from lockstep.harness.limits import MAX_DATA_PARALLEL, MAX_GENERATE_SECONDS, MAX_RECORD_GB, MAX_RECORD_REQUESTS
from lockstep.harness.replay.format import Trace, TraceError, f32_from_bits, read_trace, write_trace

EXIT_OK, EXIT_DIVERGED, EXIT_USAGE = 0, 1, 2
# The errors caught below are ValueErrors (TraceError, engine.checkpoint.CheckpointError) and
# OSErrors; the engine is imported inside the commands so that `lockstep --help` loads no torch.
FLOAT32_MAX = 3.4028234663852886e38


def _fail(msg: str) -> int:
    print(f"lockstep: error: {msg}", file=sys.stderr)
    return EXIT_USAGE


# ---------------------------------------------------------------- the parsers
def add_commands(sub) -> None:
    """record, replay, import-peer, promote; each takes --debug after its name, as every command does."""
    _parsers(sub)
    for name in ("record", "replay", "import-peer", "promote"):
        sub.choices[name].add_argument("--debug", action="store_true", default=argparse.SUPPRESS,
                                       help="show tracebacks")


def _parsers(sub) -> None:
    _record_parser(sub)
    p = sub.add_parser("replay", help="replay a trace and judge it step by step (free-run or teacher-forced)")
    p.add_argument("trace", type=Path, metavar="TRACE", help="a trace file written by record or import-peer --out")
    p.add_argument("--mode", choices=["free-run", "teacher-forced"], default="free-run",
                   help="free-run: sample again and compare; teacher-forced: feed the trace's tokens (default free-run)")
    _run_options(p, defaults=False)
    _dp(p)
    _device(p, "default: the trace's; Lockstep's own trace replays only on its own platform")
    p.add_argument("--dtype", choices=["fp32", "bf16"], default=None,
                   help="dtype policy (default: the trace's; another dtype only for another engine's trace)")
    p.add_argument("--order", type=int_list, help="the batch composition: request indices in run order, e.g. 2,0,1")
    p.add_argument("--forced-shape", choices=["decode", "prefill"], default=None,
                   help="teacher-forced: one token a step (generate), or every token in chunked forwards")
    p.add_argument("--checkpoint", help="the checkpoint folder here, when the trace's path does not hold it "
                                        "(its weight digests must match the trace's)")
    p.add_argument("--near-tie", type=float, default=None, help="margin under which a token flip is a near-tie")
    p.add_argument("--threshold", type=float, default=None,
                   help="another engine's trace (import-peer, record --target): the |Δlogprob| a step may "
                        "differ by (default 1e-3)")
    _clip(p)
    p.add_argument("--no-locate", action="store_true", help="do not re-run the first divergence with ops traced")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=cmd_replay)

    p = sub.add_parser("import-peer", help="import a peer engine's output as a trace and teacher-force it here")
    p.add_argument("peer", type=Path, metavar="PEER", help="the peer's output: one JSON document, or JSONL")
    p.add_argument("--format", dest="peer_format", choices=["vllm", "sglang", "rollouts", "hf"], required=True,
                   help="the layout of PEER (harness/replay/peer.py)")
    p.add_argument("--checkpoint", required=True, help="the checkpoint the peer ran (folder)")
    p.add_argument("--prompt-ids", type=token_ids, action="append", help="prompts, where the peer's file lacks them")
    p.add_argument("--threshold", type=bound, default=1e-3,
                   help="|Δlogprob| above which a token is a divergence (exit 1; default 1e-3)")
    _clip(p)
    _dp(p)
    _device(p, "default: cuda when available, else cpu")
    p.add_argument("--dtype", choices=["fp32", "bf16"], default="fp32", help="Lockstep's dtype policy for the "
                                                                             "teacher-forced run (default fp32)")
    p.add_argument("--peer-logprobs", choices=["raw", "temperature", "top-p"], default="raw",
                   help="what the peer's logprobs are: raw log softmax(logits) (default), temperature-scaled, or "
                        "temperature-scaled and top-p renormalised; compared with the same quantity here")
    p.add_argument("--temperature", type=bound, default=1.0, help="with --peer-logprobs temperature or top-p")
    p.add_argument("--top-p", type=float, default=1.0, help="with --peer-logprobs top-p")
    p.add_argument("--max-seconds", type=bound, default=MAX_GENERATE_SECONDS, metavar="S",
                   help=f"on the CPU, refuse a run estimated above S seconds (default {MAX_GENERATE_SECONDS})")
    p.add_argument("--max-gb", type=bound, default=MAX_RECORD_GB, metavar="GB",
                   help=f"refuse a KV cache larger than this (default {MAX_RECORD_GB:g})")
    p.add_argument("--out", type=Path, help="also write the imported trace here")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=cmd_import_peer)

    p = sub.add_parser("promote", help="turn a trace into a regression spec (then record its golden with regen)")
    p.add_argument("trace", type=Path, metavar="TRACE", help="a trace file written by record, or by import-peer --out")
    p.add_argument("spec_id", metavar="SPEC_ID", help="e.g. replay/incident-42 (written under specs/)")
    p.add_argument("--request-indices", dest="requests", type=int_list, metavar="I[,I...]",
                   help="only these request indices, e.g. 0,2")
    deprecated(p, "--requests", "--request-indices", "requests", type=int_list)
    p.add_argument("--description", default=None, help="the spec's description (default: names the trace)")
    p.add_argument("--specs", type=Path, default=Path("specs"), help="spec directory (default: ./specs)")
    p.add_argument("--threshold", type=bound, default=1e-3,
                   help="another engine's trace: the |Δlogprob| the teacher-forced spec accepts (default 1e-3)")
    p.add_argument("--json", action="store_true", help="machine-readable output, one document on stdout")
    p.set_defaults(func=cmd_promote)


def _dp(p) -> None:
    p.add_argument("--dp", type=int_at_least(1, MAX_DATA_PARALLEL), default=None, metavar="N",
                   help="spread the requests over N data-parallel ranks on this host, a whole model each (the "
                        "same report; default 1, or under torchrun every rank of its world)")


def _device(p, default: str) -> None:
    p.add_argument("--device", choices=["cpu", "cuda"], default=None, help=f"where Lockstep's engine runs ({default})")


def _device_name(device: str | None) -> str:
    """'cpu' or 'cuda' for Setup (a torch device, not the platform's name 'cuda-sm90'): None is cuda
    when available; cuda without a GPU is refused (ValueError)."""
    from lockstep.harness.platform import detect
    return detect(device).torch_device.type


def _clip(p) -> None:
    p.add_argument("--clip", type=bound, default=0.2, metavar="EPS",
                   help="another engine's trace: the importance-ratio clip range 1±EPS whose outside share is "
                        "reported (default 0.2)")


def _record_parser(sub) -> None:
    p = sub.add_parser("record", help="run requests through the engine and write a replay trace")
    p.add_argument("out", type=Path, metavar="OUT", help="the trace file to write (its folder must exist)")
    g = p.add_mutually_exclusive_group(required=True)
    g.add_argument("--checkpoint", help="a checkpoint folder (relative to the project root, or absolute)")
    g.add_argument("--preset", help="a synthetic checkpoint of this preset (with --ckpt-seed, --format)")
    p.add_argument("--ckpt-seed", type=int_at_least(0), default=0, help="with --preset: the weights' seed (default 0)")
    p.add_argument("--format", choices=["bf16", "mxfp4"], default="bf16", help="with --preset: the experts' format")
    p.add_argument("--requests", type=Path, help="JSONL: one request a line")
    p.add_argument("--prompt-ids", type=token_ids, action="append", help="a prompt; repeat for a batch")
    p.add_argument("--seed", type=seeds, metavar="S[,S...]",
                   help="with --prompt-ids: seeded sampling, one seed for every prompt or one per --prompt-ids "
                        "(without: greedy)")
    p.add_argument("--temperature", type=float, default=1.0, help="with --prompt-ids and --seed (default 1.0)")
    p.add_argument("--max-new-tokens", type=int_at_least(1), default=16, help="with --prompt-ids (default 16)")
    _run_options(p)
    p.add_argument("--dtype", choices=["fp32", "bf16"], default="fp32", help="dtype policy (default fp32)")
    _device(p, "default: cuda when available, else cpu")
    p.add_argument("--draft", help="an EAGLE3 draft folder (relative to the project root): speculative decoding")
    p.add_argument("--convention", choices=["boundary", "sglang", "output-index"], default="sglang",
                   help="with --draft: which layers' hidden states the draft reads (default sglang)")
    p.add_argument("--num-steps", type=int_at_least(1), default=3, help="with --draft: draft steps a round (default 3)")
    p.add_argument("--draft-topk", dest="topk", type=int_at_least(1), default=1,
                   help="with --draft: children per tree node (default 1; not sampling's top-k)")
    deprecated(p, "--topk", "--draft-topk", "topk", type=int_at_least(1))
    p.add_argument("--draft-token-num", type=int_at_least(1), default=4,
                   help="with --draft: tree nodes verified a round (default 4)")
    p.add_argument("--verify", choices=["greedy", "target-only", "rejection"], default="target-only",
                   help="with --draft: the acceptance rule (default target-only)")
    p.add_argument("--target", help="record through this target adapter (sglang, vllm, hf, lockstep, or an outside "
                                    "engine's entry point) instead of Lockstep's engine")
    p.add_argument("--max-seconds", type=bound, default=MAX_GENERATE_SECONDS, metavar="S",
                   help=f"on the CPU, refuse a recording estimated above S seconds (default {MAX_GENERATE_SECONDS})")
    p.add_argument("--max-gb", type=bound, default=MAX_RECORD_GB, metavar="GB",
                   help=f"refuse a KV cache larger than this (default {MAX_RECORD_GB:g})")
    p.add_argument("--json", action="store_true", help="machine-readable output, one document on stdout")
    p.set_defaults(func=cmd_record)


def _run_options(p, defaults: bool = True) -> None:
    p.add_argument("--backend", choices=["torch", "triton"], default="torch" if defaults else None,
                   help="engine kernel backend" + (" (default torch)" if defaults else " (default: the trace's)"))
    p.add_argument("--tp", type=int_at_least(1), default=1 if defaults else None, help="tensor-parallel degree")
    p.add_argument("--ep", type=int_at_least(1), default=1 if defaults else None, help="expert-parallel degree")
    p.add_argument("--max-batch", type=int_at_least(1), default=8 if defaults else None,
                   help="requests decoded together" + (" (default 8)" if defaults else ""))
    p.add_argument("--prefill-chunk", type=int_at_least(1), default=None, help="prefill in chunks of this many tokens")


# ---------------------------------------------------------------- inputs, checked at the edge
def _checkpoint_ref(text: str) -> dict:
    from lockstep.harness.replay.run import ROOT
    path = Path(text)
    full = (path if path.is_absolute() else Path.cwd() / path).resolve()
    if not full.is_dir():
        raise ValueError(f"no checkpoint folder at {text}")
    try:
        return {"path": str(full.relative_to(ROOT.resolve()))}
    except ValueError:
        return {"path": str(full)}


def _config(ckpt: dict):
    """The checkpoint's config, read before any weights load (its vocabulary, its KV cache's shape)."""
    from lockstep.engine.config import GptOssConfig, preset
    from lockstep.harness.replay.run import Setup, checkpoint_folder

    if "preset" in ckpt:
        return preset(ckpt["preset"])
    file = checkpoint_folder(Setup(ckpt)) / "config.json"
    try:
        data = json.loads(file.read_text(encoding="utf-8"))
        return GptOssConfig.from_hf_dict(data)
    except (OSError, UnicodeDecodeError, ValueError, TypeError, KeyError, AttributeError) as e:
        raise ValueError(f"{file}: cannot read the checkpoint's config ({e})") from None


def _text(path: Path, what: str) -> str:
    from lockstep.harness.readers import read_text
    from lockstep.harness.replay.format import MAX_TRACE_BYTES

    return read_text(path, MAX_TRACE_BYTES, what)   # bounded on the bytes read; refuses a FIFO or device


def _request_line(d, where: str):
    from lockstep.engine.request import Request

    if not isinstance(d, dict):
        raise ValueError(f"{where}: expected an object {{\"prompt\": [ids], ...}}, found a {type(d).__name__}")
    prompt = d.get("prompt")
    if not isinstance(prompt, list) or not prompt or not all(type(t) is int and t >= 0 for t in prompt):
        raise ValueError(f"{where}: \"prompt\" must be a non-empty list of token ids (integers >= 0), "
                         f"found {json.dumps(prompt)[:60]}")
    sampling, seed = d.get("sampling", {}), d.get("seed")
    if not isinstance(sampling, dict):
        raise ValueError(f"{where}: \"sampling\" must be an object, found a {type(sampling).__name__}")
    if seed is not None and not (type(seed) is int and -2**63 <= seed < 2**64):
        raise ValueError(f"{where}: \"seed\" must be an int in [-2^63, 2^64) or null, found {json.dumps(seed)[:40]}")
    try:
        return Request.from_dict(d)
    except (ValueError, TypeError) as e:
        raise ValueError(f"{where}: {type(e).__name__}: {e}") from None


def _requests(args):
    from lockstep.engine.request import Request, SamplingParams

    if args.requests is not None:
        out = []
        for n, line in enumerate(_text(args.requests, "the request file").splitlines(), 1):
            if not line.strip():
                continue
            if len(out) == MAX_RECORD_REQUESTS:
                raise ValueError(f"{args.requests}:{n}: more than {MAX_RECORD_REQUESTS} requests; a recording holds "
                                 "at most that many (harness/limits.py), split the file")
            from lockstep.harness.readers import json_value
            d = json_value(line, f"{args.requests}:{n}")
            out.append(_request_line(d, f"{args.requests}:{n}"))
        if not out:
            raise ValueError(f"{args.requests}: no requests")
        return out
    if not args.prompt_ids:
        raise ValueError("give --requests FILE or --prompt-ids")
    return [Request(prompt=ids, seed=seed, params=SamplingParams(temperature=args.temperature,
                                                                 max_new_tokens=args.max_new_tokens,
                                                                 greedy=seed is None))
            for ids, seed in zip(args.prompt_ids, per_prompt_seeds(args.seed, len(args.prompt_ids)))]


_SETTINGS = ("dtype", "backend", "tp", "ep", "max_batch", "prefill_chunk", "device")


def _check_manifest(trace: Trace, path: Path) -> None:
    """What replay and promote read from a manifest, present and of the right type (line 1)."""
    m = trace.manifest
    for key in ("settings", "platform", "checkpoint"):
        if not isinstance(m.get(key), dict):
            raise TraceError(f"{path}:1: the manifest has no {key!r} object (found {json.dumps(m.get(key))[:40]}); "
                             "it was not written by lockstep record")
    missing = [k for k in _SETTINGS if k not in m["settings"]]
    if missing:
        raise TraceError(f"{path}:1: the manifest's settings lack {', '.join(missing)}")
    if not isinstance(m["checkpoint"].get("ref"), dict):
        raise TraceError(f"{path}:1: the manifest's checkpoint has no 'ref' object")
    if not trace.requests or not any(trace.steps):
        raise TraceError(f"{path}: the trace holds {len(trace.requests)} request(s) and no steps: nothing to replay "
                         "(a replay of nothing would pass vacuously)")


def _step_lines(trace: Trace) -> dict[tuple[int, int], int]:
    """(request, step) -> the line of the trace file that holds it (records() is the file's order)."""
    return {(r["request"], r["step"]): n for n, r in enumerate(trace.records(), 1) if r["kind"] == "step"}


def _check_steps(trace: Trace, vocab: int, where) -> None:
    """Token ids inside the vocabulary; logprobs that are log-probabilities (not NaN, not > 0).
    `where(i, k)` names a step in the file it came from."""
    for i, steps in enumerate(trace.steps):
        for k, s in enumerate(steps):
            token = s.get("token")
            if type(token) is not int or not 0 <= token < vocab:
                raise TraceError(f"{where(i, k)}: token id {token!r} is outside the checkpoint's vocabulary "
                                 f"[0, {vocab})")
            try:
                lp = f32_from_bits(s["logprob_bits"])
            except (KeyError, TypeError, ValueError):
                raise TraceError(f"{where(i, k)}: logprob_bits {s.get('logprob_bits')!r} is not 8 hex digits") from None
            if math.isnan(lp) or lp > 0:
                raise TraceError(f"{where(i, k)}: logprob {lp} is not a log-probability (it must be <= 0)")


def _peer_value_error(e: Exception, path: Path) -> TraceError:
    """A peer file's number that float32 cannot hold (struct's OverflowError; int too large for a float)."""
    return TraceError(f"{path}: a logprob is beyond float32's range (|x| > {FLOAT32_MAX:.4g}): not a "
                      f"log-probability float32 can hold ({e})")


# ---------------------------------------------------------------- the commands
def cmd_record(args) -> int:
    from lockstep.harness.estimates import record_cost
    from lockstep.harness.replay.record import record
    from lockstep.harness.replay.run import Setup

    check_output_file(args.out, "OUT")              # before the recording runs, not after it
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
                      prefill_chunk=args.prefill_chunk, draft=draft, speculative=spec,
                      device=_device_name(args.device))
        requests = _requests(args)
        record_cost(_config(ckpt), [(len(r.prompt), r.params.max_new_tokens) for r in requests], args.dtype,
                    args.max_seconds, args.max_gb, device=setup.device)
        if args.target is not None:
            from lockstep.harness.targets.record import record_target
            trace = record_target(args.target, setup, requests)
        else:
            trace = record(setup, requests)
        write_trace(trace, args.out)
    except (ValueError, OSError) as e:
        return _fail(str(e))
    n = sum(len(s) for s in trace.steps)
    if args.json:
        m = trace.manifest
        print_document(tool_document("record", True, out=str(args.out), source=m["source"], engine=m["engine"],
                                     settings=m["settings"], platform=m["platform"]["name"],
                                     checkpoint_sha256=m["checkpoint"]["sha256"], requests=len(trace.requests),
                                     steps=n, finish_reasons=[r["finish_reason"] for r in trace.requests]))
        return EXIT_OK
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
    from lockstep.harness.replay.rerun import NEAR_TIE, THRESHOLD, check_identity, replay, replay_setup

    try:
        trace = read_trace(args.trace)
        _check_manifest(trace, args.trace)
        overrides = {k: getattr(args, k) for k in ("backend", "tp", "ep", "max_batch", "prefill_chunk", "order",
                                                    "forced_shape", "dtype")}
        overrides["device"] = _device_name(args.device) if args.device else None
        if args.checkpoint:
            overrides["checkpoint"] = _checkpoint_ref(args.checkpoint)
        check_identity(trace, replay_setup(trace, overrides))   # another checkpoint is named before its vocabulary
        lines = _step_lines(trace)
        _check_steps(trace, _config(overrides.get("checkpoint") or trace.manifest["checkpoint"]["ref"]).vocab_size,
                     lambda i, k: f"{args.trace}:{lines[i, k]}")
        report = replay(trace, args.mode, overrides, near_tie=args.near_tie if args.near_tie is not None else NEAR_TIE,
                        locate_first=not args.no_locate,
                        threshold=args.threshold if args.threshold is not None else THRESHOLD, clip=args.clip,
                        dp=args.dp)
    except (ValueError, OSError) as e:
        return _fail(f"{args.trace}: {e}" if not str(e).startswith(str(args.trace)) else str(e))
    (emit if args.json else print)(json.dumps(replay_document("replay", report.command_json()), indent=2) if args.json
                                   else report.command_text())
    return EXIT_OK if report.ok else EXIT_DIVERGED


def cmd_import_peer(args) -> int:
    from lockstep.harness.estimates import record_cost
    from lockstep.harness.replay.peer import import_peer, teacher_force_peer
    from lockstep.harness.replay.processed import Processing
    from lockstep.harness.replay.run import Setup

    if args.out is not None:
        check_output_file(args.out, "--out")
    try:
        _text(args.peer, "the peer file")            # named here: the importer's read would not say which file
        ckpt = _checkpoint_ref(args.checkpoint)
        processing = Processing(args.peer_logprobs, args.temperature, args.top_p)
        setup = Setup(ckpt, dtype=args.dtype, device=_device_name(args.device))
        try:
            trace = import_peer(args.peer, args.peer_format, ckpt, args.prompt_ids, setup, processing)
        except OverflowError as e:
            raise _peer_value_error(e, args.peer) from None
        config = _config(ckpt)
        _check_steps(trace, config.vocab_size, lambda i, k: f"{args.peer}: request {i}, token {k}")
        record_cost(config, [(len(r["prompt"]), r["tokens"]) for r in trace.requests], args.dtype, args.max_seconds,
                    args.max_gb, verb="import-peer", runs=1, device=setup.device)
        report = teacher_force_peer(trace, args.threshold, setup=setup, clip=args.clip, dp=args.dp)
        if args.out:
            write_trace(trace, args.out)
    except (ValueError, OSError) as e:
        return _fail(str(e))
    (emit if args.json else print)(json.dumps(replay_document("import-peer", report.to_json()), indent=2) if args.json
                                   else report.text())
    return EXIT_OK if report.ok else EXIT_DIVERGED


def cmd_promote(args) -> int:
    from lockstep.harness.replay.promote import promote

    try:
        trace = read_trace(args.trace)
        _check_manifest(trace, args.trace)
        path = promote(trace, args.spec_id, args.requests, args.description, args.specs, threshold=args.threshold)
    except (ValueError, OSError) as e:
        return _fail(str(e))
    specs = "" if args.specs == Path("specs") else f" --specs {shlex.quote(str(args.specs))}"
    regen = f"lockstep regen{specs} {shlex.quote(args.spec_id)}"
    if args.json:
        import yaml
        doc = yaml.safe_load(path.read_text(encoding="utf-8"))
        print_document(tool_document("promote", True, spec_id=args.spec_id, path=str(path), kind=doc["kind"],
                                     source=trace.manifest.get("source"), requests=len(doc["inputs"]["requests"]),
                                     expect=doc["expect"], regen=regen))
        return EXIT_OK
    print(f"wrote {path}; record its golden with: {regen}")
    return EXIT_OK
