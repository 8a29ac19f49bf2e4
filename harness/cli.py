"""The `lockstep` command line.

    lockstep list     [PATTERN ...] [--tag T]       the specs, one a line
    lockstep validate [PATTERN ...]                 check spec files only, run nothing
    lockstep check    [PATTERN ...] [--json] [--strict]   the CI gate
    lockstep diff     PATTERN ...                   run and explain against the golden
    lockstep regen    [PATTERN ...] [--dry-run] [--allow-ci]
    lockstep report   [PATTERN ...] [--target T ...] [--out docs/conformance.md]
    (list, check and diff take --target NAME: another implementation, see harness/targets)
    lockstep make-checkpoint --preset NAME --seed S --format bf16|mxfp4 OUT
    lockstep generate --checkpoint DIR --prompt-ids 1,2,3 [...] [--json]

Patterns are globs over spec ids (`'coins/*'`). Exit codes of `check` and `diff`:
0 every spec matches its golden, 1 a mismatch (or a failed expectation, a crash, a corrupt
golden, or with --strict a stale golden), 2 a spec or usage error, 3 a missing golden.
When several apply, the lowest-numbered failure wins in the order 2, 1, 3.
"""

from __future__ import annotations

import argparse
import fnmatch
import json
import os
import sys
import time
from pathlib import Path

import torch

from harness import runner
from harness.golden import GoldenStore
from harness.platform import detect
from harness.result import RunContext
from harness.specfile import load_specs, select, spec_files, spec_id_for

EXIT_OK, EXIT_MISMATCH, EXIT_USAGE, EXIT_MISSING = 0, 1, 2, 3


class UsageError(Exception):
    pass


# --------------------------------------------------------------------------- shared plumbing
def _common(p: argparse.ArgumentParser, patterns: str = "*") -> None:
    p.add_argument("patterns", nargs=patterns, metavar="PATTERN", help="spec id globs, e.g. 'coins/*'")
    p.add_argument("--tag", action="append", default=[], help="only specs carrying this tag (repeatable)")
    p.add_argument("--specs", type=Path, default=Path("specs"), help="spec directory (default: ./specs)")
    p.add_argument("--golden", type=Path, default=Path("golden"), help="golden directory (default: ./golden)")


def _running(p: argparse.ArgumentParser) -> None:
    p.add_argument("--device", choices=["cpu", "cuda"], help="default: cuda when available, else cpu")
    p.add_argument("--dtype", choices=["fp32", "bf16"], default="fp32", help="dtype policy (default fp32)")
    p.add_argument("--backend", choices=["torch", "triton"], default="torch", help="engine kernel backend")
    p.add_argument("--world-size", type=_int_list, default=[], metavar="W[,W...]",
                   help="also run generate specs at tensor parallel tp=W and expert parallel ep=W "
                        "(torch.distributed; gloo on CPU, NCCL on GPU) and require the one-device bits")


def _load(args) -> tuple[list, list]:
    if not args.specs.is_dir():
        raise UsageError(f"no spec directory at {args.specs} (run from the project root or pass --specs)")
    specs, errors = load_specs(args.specs)
    chosen = select(specs, args.patterns, args.tag)
    all_ids = [spec_id_for(f, args.specs) for f in spec_files(args.specs)]
    for pattern in args.patterns:
        if not any(fnmatch.fnmatchcase(i, pattern) for i in all_ids):
            raise UsageError(f"no spec matches {pattern!r} (see `lockstep list`)")
    if args.patterns:  # report the errors of the files the patterns name, not of every file
        errors = [e for e in errors
                  if any(fnmatch.fnmatchcase(spec_id_for(Path(e.file), args.specs), p) for p in args.patterns)]
    return chosen, errors


def _context(args) -> RunContext:
    try:
        return RunContext(platform=detect(args.device, args.dtype), backend=args.backend,
                          world_sizes=tuple(args.world_size))
    except ValueError as e:
        raise UsageError(str(e)) from None


def _stale(args, store: GoldenStore) -> list[str]:
    """Goldens whose spec file no longer exists, as 'platform/spec id'."""
    ids = {spec_id_for(f, args.specs) for f in spec_files(args.specs)}
    return [f"{platform}/{i}" for platform, found in store.ids().items() for i in found if i not in ids]


class Progress:
    """A one-line progress display on stderr, shown only on a terminal."""

    def __init__(self, total: int, enabled: bool):
        self.total, self.enabled, self.start = total, enabled and sys.stderr.isatty(), time.perf_counter()

    def show(self, i: int, spec_id: str) -> None:
        if self.enabled:
            line = f"[{i}/{self.total}] {time.perf_counter() - self.start:6.1f}s {spec_id}"
            sys.stderr.write("\r" + line[:100].ljust(100))
            sys.stderr.flush()

    def done(self) -> None:
        if self.enabled:
            sys.stderr.write("\r" + " " * 100 + "\r")


# --------------------------------------------------------------------------- commands
def cmd_list(args) -> int:
    specs, errors = _load(args)
    if args.target != "lockstep":
        from harness.targets.check import cmd_list_target
        return cmd_list_target(args, specs) or (EXIT_USAGE if errors else EXIT_OK)
    for s in specs:
        tags = ",".join(s.tags)
        print(f"{s.id:<44} {s.kind:<10} {tags:<28} {s.description.splitlines()[0][:80]}")
    for e in errors:
        print(f"error: {e}", file=sys.stderr)
    return EXIT_USAGE if errors else EXIT_OK


def cmd_validate(args) -> int:
    specs, errors = _load(args)
    for e in errors:
        print(e)
    bad = len({e.file for e in errors})
    print(f"{len(specs)} spec(s) valid, {bad} invalid")
    return EXIT_USAGE if errors else EXIT_OK


def _exit_code(outcomes, errors, stale_failing: bool) -> int:
    if errors:
        return EXIT_USAGE
    if stale_failing or any(o.status in runner.FAILING for o in outcomes):
        return EXIT_MISMATCH
    if any(o.status == runner.MISSING for o in outcomes):
        return EXIT_MISSING
    return EXIT_OK


def cmd_check(args, explain: bool = False) -> int:
    specs, errors = _load(args)
    ctx = _context(args)
    if args.target != "lockstep":             # another implementation: harness/targets
        from harness.targets.check import cmd_check_target
        return cmd_check_target(args, specs, errors, ctx, explain, Progress(len(specs), not args.json))
    store = GoldenStore(args.golden)
    start = time.perf_counter()
    progress = Progress(len(specs), not args.json)
    outcomes = []
    for i, spec in enumerate(specs, 1):
        progress.show(i, spec.id)
        outcomes.append(runner.check_spec(spec, ctx, store))
    progress.done()
    stale = _stale(args, store) if not args.patterns and not args.tag else []
    code = _exit_code(outcomes, errors, args.strict and bool(stale))
    counts = {s: sum(o.status == s for o in outcomes) for s in
              (runner.PASS, runner.MISMATCH, runner.FAILED, runner.CRASH, runner.CORRUPT, runner.MISSING)}
    elapsed = time.perf_counter() - start
    if args.json:
        print(json.dumps({
            "platform": ctx.platform.name, "backend": ctx.backend, "exit_code": code, "seconds": round(elapsed, 3),
            "summary": counts | {"spec_errors": len(errors), "stale_goldens": len(stale)},
            "specs": [o.to_json() for o in outcomes], "spec_errors": [str(e) for e in errors],
            "stale_goldens": stale}, indent=2))
        return code
    if outcomes:
        width = max(len(o.spec.id) for o in outcomes)
        print(f"{'STATUS':<9} {'SPEC':<{width}}  {'GOLDEN':<14} {'TIME':>7}")
        for o in outcomes:
            status = o.status if o.status == runner.PASS else o.status.upper()
            print(f"{status:<9} {o.spec.id:<{width}}  {o.golden_platform:<14} {o.seconds:6.2f}s")
    for o in outcomes:
        if o.status != runner.PASS or explain:
            print()
            print(o.report() if o.status != runner.PASS else _explain_pass(o, store))
    if errors:
        print("\nspec errors:")
        for e in errors:
            print(f"  {e}")
    if stale:
        print(f"\nstale goldens (their spec no longer exists){' — failing under --strict' if args.strict else ''}:")
        for s in stale:
            print(f"  golden/{s}")
    summary = ", ".join(f"{n} {s}" for s, n in counts.items() if n or s == runner.PASS)
    extra = (f", {len(errors)} spec error(s)" if errors else "") + (f", {len(stale)} stale golden(s)" if stale else "")
    print(f"\n{len(outcomes)} spec(s): {summary}{extra} on {ctx.platform.name} in {elapsed:.1f}s")
    return code


def _explain_pass(o, store: GoldenStore) -> str:
    golden = store.load(o.golden_platform, o.spec.id)
    lines = [f"{o.spec.id} on {o.golden_platform}: identical to the golden, bit for bit"]
    for name, entry in sorted(golden.manifest["tensors"].items()):
        lines.append(f"  {name}: {entry['dtype']} {entry['shape']} sha256 {entry['sha256'][:16]}…")
    prov = golden.manifest.get("provenance", {})
    lines.append(f"  recorded {prov.get('created', '?')} at {prov.get('lockstep_revision', '?')} "
                 f"on {prov.get('device', '?')} (torch {prov.get('torch', '?')})")
    lines += ["  note: " + n for n in o.notes]
    return "\n".join(lines)


def cmd_regen(args) -> int:
    if os.environ.get("CI", "").lower() == "true" and not args.allow_ci:
        print("refusing to regenerate goldens under CI=true: goldens are recorded by people and reviewed; "
              "pass --allow-ci to override", file=sys.stderr)
        return EXIT_USAGE
    specs, errors = _load(args)
    ctx = _context(args)
    store = GoldenStore(args.golden)
    progress = Progress(len(specs), True)
    outcomes = []
    for i, spec in enumerate(specs, 1):
        progress.show(i, spec.id)
        outcomes.append(runner.regen_spec(spec, ctx, store, write=not args.dry_run))
        progress.done()
        print(outcomes[-1].report(), flush=True)
    for e in errors:
        print(f"spec error: {e}")
    stale = _stale(args, store)
    for s in stale:
        print(f"stale     golden/{s} (its spec no longer exists; delete it by hand if intended)")
    counts = {s: sum(o.status == s for o in outcomes) for s in (runner.NEW, runner.CHANGED, runner.UNCHANGED,
                                                                runner.REFUSED)}
    verb = "would write" if args.dry_run else "wrote"
    written = counts[runner.NEW] + counts[runner.CHANGED]
    print(f"\n{len(outcomes)} spec(s): " + ", ".join(f"{n} {s}" for s, n in counts.items()) +
          f"; {verb} {written} golden(s) on {ctx.platform.name}")
    if errors:
        return EXIT_USAGE
    return EXIT_MISMATCH if counts[runner.REFUSED] else EXIT_OK


def cmd_report(args) -> int:
    from harness.targets.check import cmd_report
    specs, errors = _load(args)
    return cmd_report(args, specs, errors, _context(args), Progress(len(specs), True))


def _target(p: argparse.ArgumentParser, many: bool = False) -> None:
    if many:
        p.add_argument("--target", action="append", help="a target to report (repeatable; default: sglang, vllm, hf)")
    else:
        p.add_argument("--target", default="lockstep", help="the implementation under test: lockstep (default), "
                                                            "sglang, vllm, hf, or one registered under the entry "
                                                            "point group lockstep.targets")


def cmd_make_checkpoint(args) -> int:
    from engine.checkpoint import make_checkpoint

    try:
        out = make_checkpoint(args.preset, args.seed, args.format, args.out, overwrite=args.overwrite)
    except FileExistsError as e:
        raise UsageError(f"{e}; use --overwrite to replace it") from None
    except ValueError as e:
        raise UsageError(str(e)) from None
    print(f"wrote {args.format} checkpoint of preset {args.preset!r} (seed {args.seed}) to {out}")
    return EXIT_OK


def _int_list(text: str) -> list[int]:
    try:
        return [int(t, 0) for t in text.split(",") if t.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None


def cmd_generate(args) -> int:
    from engine.checkpoint import CheckpointError
    from engine.generate import Request, generate
    from engine.model import GptOssModel
    from engine.sampling import SamplingParams

    try:
        device = detect(args.device).torch_device                   # refuses cuda without a GPU
        model = GptOssModel.from_checkpoint(args.checkpoint, backend=args.backend, device=device)
        params = SamplingParams(temperature=args.temperature, top_k=args.top_k, top_p=args.top_p, min_p=args.min_p,
                                max_new_tokens=args.max_new_tokens, greedy=args.seed is None,
                                stop_token_ids=tuple(args.stop_ids) if args.stop_ids is not None else None)
        requests = [Request(prompt=ids, params=params, seed=args.seed) for ids in args.prompt_ids]
        results = generate(model, requests)
    except (CheckpointError, ValueError, FileNotFoundError) as e:
        raise UsageError(str(e)) from None
    out = []
    for req, res in zip(requests, results):
        item = {"prompt": req.prompt, "tokens": res.tokens, "finish_reason": res.finish_reason}
        if args.logprobs:
            item["logprobs"] = res.logprobs.tolist()
            item["logprobs_bits"] = [f"{b & 0xFFFFFFFF:08x}" for b in res.logprobs.contiguous().view(torch.int32).tolist()]
        out.append(item)
    if args.json:
        print(json.dumps(out if len(out) > 1 else out[0], indent=2))
    else:
        for item in out:
            print(" ".join(map(str, item["tokens"])) + f"   ({item['finish_reason']})")
    return EXIT_OK


# --------------------------------------------------------------------------- entry point
def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="lockstep", description="Deterministic-replay conformance harness "
                                                                  "for gpt-oss + EAGLE3 inference.")
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("list", help="list the specs")
    _common(p)
    _target(p)
    p.set_defaults(func=cmd_list)
    p = sub.add_parser("validate", help="check spec files without running them")
    _common(p)
    p.set_defaults(func=cmd_validate)
    p = sub.add_parser("check", help="run specs and compare with their goldens bit for bit (the CI gate)")
    _common(p)
    _running(p)
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.add_argument("--strict", action="store_true", help="fail on stale goldens (whose spec is gone)")
    _target(p)
    p.set_defaults(func=cmd_check)
    p = sub.add_parser("diff", help="run specs and explain each against its golden")
    _common(p, patterns="+")
    _running(p)
    _target(p)
    p.set_defaults(func=lambda a: cmd_check(a, explain=True), json=False, strict=False)
    p = sub.add_parser("regen", help="record goldens: two identical runs, shown, then written atomically")
    _common(p)
    _running(p)
    p.add_argument("--dry-run", action="store_true", help="show what would change, write nothing")
    p.add_argument("--allow-ci", action="store_true", help="allow regeneration when CI=true")
    p.set_defaults(func=cmd_regen)
    p = sub.add_parser("report", help="run targets and write the conformance matrix (Markdown and JSON)")
    _common(p)
    _running(p)
    _target(p, many=True)
    p.add_argument("--out", default="docs/conformance.md", help="Markdown path; the JSON goes beside it")
    p.set_defaults(func=cmd_report)
    p = sub.add_parser("make-checkpoint", help="write a synthetic checkpoint in the HF layout")
    p.add_argument("--preset", required=True, help="engine preset, e.g. tiny, small, tiny-d36")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--format", choices=["bf16", "mxfp4"], default="bf16")
    p.add_argument("--overwrite", action="store_true", help="replace a non-empty OUT")
    p.add_argument("out", type=Path, metavar="OUT")
    p.set_defaults(func=cmd_make_checkpoint)
    p = sub.add_parser("generate", help="generate from a checkpoint with the reference engine")
    p.add_argument("--checkpoint", type=Path, required=True)
    p.add_argument("--prompt-ids", type=_int_list, action="append", required=True,
                   help="comma-separated token ids; repeat for a batch")
    p.add_argument("--seed", type=int, help="seeded sampling (without: greedy)")
    p.add_argument("--temperature", type=float, default=1.0)
    p.add_argument("--top-k", type=int, default=0)
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--min-p", type=float, default=0.0)
    p.add_argument("--max-new-tokens", type=int, default=16)
    p.add_argument("--stop-ids", type=_int_list, help="replace the EOS list, e.g. --stop-ids 509,510")
    p.add_argument("--logprobs", action="store_true", help="include each token's logprob (and its float32 bits)")
    p.add_argument("--backend", choices=["torch", "triton"], default="torch")
    p.add_argument("--device", choices=["cpu", "cuda"], help="default: cuda when available, else cpu")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_generate)
    return parser


def main(argv=None) -> int:
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as e:  # argparse exits 2 on usage errors, as our contract wants
        return int(e.code or 0)
    try:
        return args.func(args)
    except UsageError as e:
        print(f"lockstep: error: {e}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        print("\nlockstep: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
