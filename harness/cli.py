"""The `lockstep` command line.

    lockstep list     [PATTERN ...] [--tag T]       the specs, one a line
    lockstep validate [PATTERN ...]                 check spec files only, run nothing
    lockstep check    [PATTERN ...] [--json] [--strict]   the CI gate
    lockstep diff     PATTERN ...                   run and explain against the golden
    lockstep regen    [PATTERN ...] [--dry-run] [--allow-ci]
    lockstep report   [PATTERN ...] [--target T ...] --out PATH.md
    lockstep expectations [PATTERN ...] --target T --write FILE [--versions RANGE]
    lockstep suite                                  the installed suite's folder
    (list, check and diff take --target NAME: another implementation, see harness/targets)
    lockstep make-checkpoint --preset NAME --seed S --format bf16|mxfp4 OUT
    lockstep generate --checkpoint DIR --prompt-ids 1,2,3 [...] [--json]
    lockstep --version
    lockstep record OUT / replay TRACE / import-peer PEER / promote TRACE SPEC_ID   (harness/replay)

Without --dtype / --backend, check, diff and regen run each spec under every (dtype policy,
backend) pair it has goldens for here (regen: every pair it supports), one row each: harness/pairs.py.

Patterns are globs over spec ids (`'coins/*'`). Exit codes of `check` and `diff`:
0 every spec matches its golden, 1 a mismatch (or a failed expectation, a crash, a corrupt
golden, or with --strict a stale golden), 2 a spec or usage error, 3 a missing golden.
When several apply, the lowest-numbered failure wins in the order 2, 1, 3.

`main` is the one error boundary: a usage error is one line and exit 2, any other exception one
located line and exit 1 (its traceback with --debug), a closed stdout (`lockstep list | head`)
ends quietly. `--help`, `list` and `validate`'s parsing import neither torch nor the engine:
commands import what they run.
"""

from __future__ import annotations

import argparse
import fnmatch
import json
import os
import re
import sys
import time
from pathlib import Path

from harness.commands.options import (bound, int_at_least, int_in, int_list, per_prompt_seeds, seeds as seed_list,
                                      tag, token_ids, world_sizes)
from harness.errors import UsageError, full_traceback, located  # noqa: F401 - UsageError: also harness.cli's
from harness.limits import MAX_CHECKPOINT_GB, MAX_DOCTOR_INPUTS, MAX_GENERATE_SECONDS, WORLD_SIZES
from harness.specfile import load_headers, load_specs, select, spec_files, spec_id_for

EXIT_OK, EXIT_MISMATCH, EXIT_USAGE, EXIT_MISSING = 0, 1, 2, 3
EXIT_STDOUT_CLOSED = 141  # 128 + SIGPIPE, what a Unix tool killed by a closed pipe reports
EXIT_INTERRUPTED = 130  # 128 + SIGINT
MAX_COLUMN = 48  # a column of `list` wider than this is cut with "…", so one long tag cannot push every line


# --------------------------------------------------------------------------- argument types
# The types themselves are in harness/commands/options.py, shared with the replay commands.
def _attach_dash_values(argv: list[str]) -> list[str]:
    """`--prompt-ids -1,2` as `--prompt-ids=-1,2`: argparse takes a value that starts with '-' (and
    is not a plain negative number) for an option and says "expected one argument"; attached, the
    value reaches token_ids, which names what is wrong with it."""
    out = []
    for tok in argv:
        if out and out[-1] in ("--prompt-ids", "--stop-ids") and re.fullmatch(r"-\d[\d,\s+-]*", tok):
            out[-1] = f"{out[-1]}={tok}"
        else:
            out.append(tok)
    return out


# --------------------------------------------------------------------------- shared plumbing
def _debug(p: argparse.ArgumentParser) -> None:
    p.add_argument("--debug", action="store_true", default=argparse.SUPPRESS,
                   help="show tracebacks (of crashes of the code under test, and of lockstep itself)")


def _common(p: argparse.ArgumentParser, patterns: str = "*") -> None:
    p.add_argument("patterns", nargs=patterns, metavar="PATTERN", help="spec id globs, e.g. 'coins/*'")
    p.add_argument("--tag", action="append", default=[], type=tag, help="only specs carrying this tag (repeatable)")
    p.add_argument("--specs", type=Path, default=Path("specs"), help="spec directory (default: ./specs)")
    p.add_argument("--golden", type=Path, default=Path("golden"), help="golden directory (default: ./golden)")
    p.add_argument("--suite", type=Path, action=_SuiteAction, metavar="DIR",
                   help="the suite in DIR: --specs DIR/specs --golden DIR/golden (e.g. \"$(lockstep suite)\")")
    p.add_argument("--checkpoint-path", type=_checkpoint_mapping, action="append", default=[],
                   metavar="SPEC_PATH=DIR", help="read the checkpoint a spec names SPEC_PATH from DIR, outside the "
                                                 "suite (repeatable)")
    _debug(p)


class _SuiteAction(argparse.Action):
    def __call__(self, parser, namespace, value, option_string=None):
        namespace.suite, namespace.specs, namespace.golden = value, value / "specs", value / "golden"


def _checkpoint_mapping(text: str):
    from harness.suite import parse_mapping
    try:
        return parse_mapping(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def _running(p: argparse.ArgumentParser) -> None:
    p.add_argument("--device", choices=["cpu", "cuda"], help="default: cuda when available, else cpu")
    p.add_argument("--dtype", choices=["fp32", "bf16"], help="dtype policy (default: every pair with goldens "
                                                             "here; regen: every pair the spec supports)")
    p.add_argument("--backend", choices=["torch", "triton"], help="engine kernel backend (default: as --dtype)")
    p.add_argument("--world-size", type=world_sizes, default=[], metavar="W[,W...]",
                   help="also run generate specs at tensor parallel tp=W and expert parallel ep=W, W in "
                        f"{{{', '.join(map(str, WORLD_SIZES))}}} (torch.distributed; gloo on CPU, NCCL on GPU) "
                        "and require the one-device bits")


def _check_dirs(args) -> None:
    from harness.suite import map_checkpoints
    map_checkpoints(getattr(args, "checkpoint_path", []))
    if not args.specs.is_dir():
        raise UsageError(f"no spec directory at {args.specs} (run from the project root or pass --specs)")
    golden = getattr(args, "golden", None)
    if golden is not None and golden.exists() and not golden.is_dir():
        raise UsageError(f"--golden {golden} is not a directory")


def _golden_exists(args) -> None:
    """Commands that compare with goldens need the folder: a mistyped --golden would otherwise report
    every spec MISSING, a result that looks vacuous rather than wrong."""
    if not args.golden.exists():
        raise UsageError(f"--golden {args.golden}: no such folder (goldens are recorded there by `lockstep regen`; "
                         "run from the project root or pass --golden)")


def _load(args, loader=load_specs, also_ids=()) -> tuple[list, list]:
    """The selected specs and the spec errors to report. A pattern must name a spec file (or one of
    `also_ids`: goldens whose spec is gone); a selection of nothing is a usage error, never a pass."""
    _check_dirs(args)
    specs, errors = loader(args.specs)
    chosen = select(specs, args.patterns, args.tag)
    all_ids = [spec_id_for(f, args.specs) for f in spec_files(args.specs)] + list(also_ids)
    for pattern in args.patterns:
        if not any(fnmatch.fnmatchcase(i, pattern) for i in all_ids):
            raise UsageError(f"no spec matches {pattern!r}{_not_spec_files(args.specs, pattern)} (see `lockstep list`)")
    if args.patterns:  # report the errors of the files the patterns name, not of every file
        errors = [e for e in errors if _matches(e.file, args)]
    goldens_named = [i for i in also_ids if any(fnmatch.fnmatchcase(i, p) for p in args.patterns)]
    if not chosen and not errors and not goldens_named:
        raise UsageError(_nothing_selected(args))
    return chosen, errors


def _not_spec_files(specs: Path, pattern: str) -> str:
    """Files the pattern would name but that are not spec files (`x.yml`, `x.json`): said, since
    "no spec matches" alone reads as a typo in the pattern."""
    near = sorted(str(f) for f in specs.rglob("*") if f.is_file() and f.suffix != ".yaml" and
                  fnmatch.fnmatchcase(f.relative_to(specs).with_suffix("").as_posix(), pattern))
    if not near:
        return ""
    return f"; {', '.join(near[:3])}{' …' if len(near) > 3 else ''} would match but spec files end in .yaml"


def _matches(file: str, args) -> bool:
    try:
        spec_id = spec_id_for(Path(file), args.specs)
    except ValueError:
        return True
    return any(fnmatch.fnmatchcase(spec_id, p) for p in args.patterns)


def _nothing_selected(args) -> str:
    if args.tag:
        return f"no spec{' matching the patterns' if args.patterns else ''} carries tag(s) {args.tag}"
    return f"no specs under {args.specs}"


def _context(args):
    from harness.platform import detect
    from harness.result import RunContext

    try:
        return RunContext(platform=detect(args.device, args.dtype or "fp32"), backend=args.backend or "torch",
                          world_sizes=tuple(args.world_size))
    except ValueError as e:
        raise UsageError(str(e)) from None


def _plan(args, specs, ctx, regen: bool = False) -> list[tuple]:
    """[(spec, RunContext, golden folder)]: each spec under each (dtype, backend) pair it runs here
    (harness/pairs.py: the pairs with goldens here, all it supports for regen; the options narrow)."""
    from harness import pairs

    device = ctx.platform.device
    chosen = pairs.chosen(device, args.golden, args.dtype, args.backend, regen=regen)
    rows = pairs.plan(specs, chosen, device, ctx.world_sizes, explicit=bool(args.dtype and args.backend))
    if specs and not rows:
        raise UsageError(f"no selected spec runs under {pairs.describe(chosen)} on {device} (Triton's interpreter "
                         f"runs the engine specs tagged {pairs.INTERPRETER_TAG!r}; give both --dtype and --backend "
                         "to run any spec under one pair)")
    return rows


def _ran_on(rows) -> str:
    """'cpu-fp32 (torch backend)', or for several pairs 'cpu-fp32 (torch), cpu-bf16 (torch), …'."""
    seen = list(dict.fromkeys((c.platform.name, c.backend) for _, c, _ in rows))
    if len(seen) == 1:
        return f"{seen[0][0]} ({seen[0][1]} backend)"
    return ", ".join(f"{name} ({backend})" for name, backend in seen)


def _golden_ids(store) -> list[str]:
    return [i for found in store.ids().values() for i in found]


def _stale(args, store) -> list[str]:
    """Goldens whose spec file no longer exists, as 'platform/spec id', within the patterns given
    (a tag selects nothing here: a golden without a spec has no tags)."""
    ids = {spec_id_for(f, args.specs) for f in spec_files(args.specs)}
    stale = [(platform, i) for platform, found in store.ids().items() for i in found if i not in ids]
    if args.patterns:
        stale = [(p, i) for p, i in stale if any(fnmatch.fnmatchcase(i, pat) for pat in args.patterns)]
    elif args.tag:
        stale = []
    return [f"{platform}/{i}" for platform, i in stale]


def _golden_folders(golden: Path, platforms) -> str:
    """'golden/shared (2), golden/cpu-fp32 (1)': the folders a run read or wrote, with counts."""
    counts: dict[str, int] = {}
    for p in platforms:
        counts[p] = counts.get(p, 0) + 1
    return ", ".join(f"{golden / p} ({n})" for p, n in counts.items()) or "none"


class Progress:
    """Per-spec progress: a one-line display on stderr when it is a terminal; with `lines`, one
    line per finished spec on stderr when it is not (a CI log shows progress as it happens)."""

    def __init__(self, total: int, lines: bool = False):
        self.total, self.start = total, time.perf_counter()
        self.live = sys.stderr.isatty()
        self.lines = lines and not self.live

    def show(self, i: int, spec_id: str) -> None:
        if self.live:
            line = f"[{i}/{self.total}] {time.perf_counter() - self.start:6.1f}s {spec_id}"
            sys.stderr.write("\r" + line[:100].ljust(100))
            sys.stderr.flush()

    def finished(self, i: int, text: str) -> None:
        if self.lines:
            print(f"[{i}/{self.total}] {text}", file=sys.stderr, flush=True)

    def clear(self) -> None:
        if self.live:
            sys.stderr.write("\r" + " " * 100 + "\r")
            sys.stderr.flush()


def _cut(text: str, width: int = MAX_COLUMN) -> str:
    return text if len(text) <= width else text[: width - 1] + "…"


def _columns(rows: list[list[str]]) -> list[str]:
    """Rows of cells as aligned lines: each column as wide as its widest cell (after _cut); the
    last column is left as it is."""
    rows = [[_cut(c) for c in row[:-1]] + row[-1:] for row in rows]
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]) - 1)]
    return ["  ".join(c.ljust(w) for c, w in zip(row, widths)) + "  " + row[-1] for row in rows]


# --------------------------------------------------------------------------- commands
def cmd_list(args) -> int:
    """Ids, kinds, tags and descriptions, read from each spec's header only (no torch import):
    `lockstep validate` checks the rest."""
    if args.target != "lockstep":             # applicability needs whole specs
        from harness.targets.check import cmd_list_target
        specs, errors = _load(args)
        return cmd_list_target(args, specs) or (EXIT_USAGE if errors else EXIT_OK)
    specs, errors = _load(args, loader=load_headers)
    if specs:
        rows = [[s.id, s.kind, ",".join(s.tags) or "-", s.description.splitlines()[0][:80]] for s in specs]
        print("\n".join(_columns(rows)))
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
    from harness import runner

    if errors:
        return EXIT_USAGE
    if stale_failing or any(o.status in runner.FAILING for o in outcomes):
        return EXIT_MISMATCH
    if any(o.status == runner.MISSING for o in outcomes):
        return EXIT_MISSING
    return EXIT_OK


class StatusTable:
    """`check`'s table: a row printed as each spec finishes, aligned from the start (the widths
    come from the selected specs' ids and golden folders, known before anything runs)."""

    def __init__(self, ids: list[str], platforms: list[str]):
        self.id_width = max([len("SPEC")] + [len(i) for i in ids])
        self.golden_width = max([len("GOLDEN")] + [len(p) for p in platforms])

    def row(self, status: str, spec_id: str, golden: str, seconds: str) -> str:
        return f"{status:<9} {spec_id:<{self.id_width}}  {golden:<{self.golden_width}}  {seconds:>7}"

    def header(self) -> str:
        return self.row("STATUS", "SPEC", "GOLDEN", "TIME")

    def outcome(self, o) -> str:
        status = o.status if o.status == "pass" else o.status.upper()
        return self.row(status, o.spec.id, o.golden_platform, f"{o.seconds:6.2f}s")


def cmd_check(args, explain: bool = False) -> int:
    from harness import runner
    from harness.golden import GoldenStore

    if getattr(args, "expectations", None) is not None and args.target == "lockstep":
        raise UsageError("--expectations goes with --target (Lockstep's own engine has no expected failures)")
    store = GoldenStore(args.golden)
    specs, errors = _load(args, also_ids=_golden_ids(store) if args.strict else ())
    _golden_exists(args)
    ctx = _context(args)
    runner.self_check()  # a comparator or loader that calls -0.0 == 0.0 would pass everything: refuse first
    if args.target != "lockstep":             # another implementation: harness/targets
        from harness.targets.check import cmd_check_target
        return cmd_check_target(args, specs, errors, ctx, explain, Progress(len(specs), lines=args.json))
    start = time.perf_counter()
    rows = _plan(args, specs, ctx)
    table = StatusTable([s.id for s, _, _ in rows], [folder for _, _, folder in rows])
    progress = Progress(len(rows), lines=args.json)
    if rows and not args.json:
        print(table.header(), flush=True)
    outcomes = []
    for i, (spec, row_ctx, _) in enumerate(rows, 1):
        progress.show(i, spec.id)
        outcomes.append(runner.check_spec(spec, row_ctx, store, strict=args.strict))
        progress.clear()
        progress.finished(i, table.outcome(outcomes[-1]))
        if not args.json:
            print(table.outcome(outcomes[-1]), flush=True)
    stale = _stale(args, store)
    temps = [str(t) for t in store.stale_temps()]     # debris of a killed write: fails under --strict
    code = _exit_code(outcomes, errors, args.strict and bool(stale or temps))
    counts = {s: sum(o.status == s for o in outcomes) for s in runner.STATUSES}
    elapsed = time.perf_counter() - start
    folders = _golden_folders(args.golden, [o.golden_platform for o in outcomes])
    if args.json:
        from harness.jsonout import check_document
        from harness.version import version
        print(json.dumps(check_document(
            target=f"lockstep-{version()}", platform=ctx.platform.name, backend=ctx.backend, exit_code=code,
            pairs=list(dict.fromkeys(o.pair for o in outcomes)),
            seconds=elapsed, golden_folders=sorted({str(args.golden / o.golden_platform) for o in outcomes}),
            summary=counts | {"spec_errors": len(errors), "stale_goldens": len(stale)},
            specs=[o.to_json() for o in outcomes], spec_errors=[str(e) for e in errors],
            stale_goldens=stale), indent=2))
        return code
    debug = getattr(args, "debug", False)
    for o in outcomes:
        if o.status != runner.PASS or o.stale_golden or explain:
            print()
            print(o.report(debug) if o.status != runner.PASS or not explain else _explain_pass(o, store))
    if errors:
        print("\nspec errors:")
        for e in errors:
            print(f"  {e}")
    if stale:
        print(f"\nstale goldens (their spec no longer exists){' — failing under --strict' if args.strict else ''}:")
        for s in stale:
            print(f"  {args.golden / s}")
    if temps:
        print(f"\n{len(temps)} stale temporary file(s) (left by a killed golden write; `lockstep regen` removes them)"
              f"{' — failing under --strict' if args.strict else ''}:")
        for t in temps:
            print(f"  {t}")
    summary = ", ".join(f"{n} {s}" for s, n in counts.items() if n or s == runner.PASS)
    extra = (f", {len(errors)} spec error(s)" if errors else "") + (f", {len(stale)} stale golden(s)" if stale else "")
    checks = f"{len(outcomes)} spec(s)" if len(outcomes) == len(specs) else \
        f"{len(outcomes)} check(s) of {len(specs)} spec(s)"
    print(f"\n{checks}: {summary}{extra} in {elapsed:.1f}s, run on {_ran_on(rows) if rows else ctx.platform.name}; "
          f"goldens: {folders}")
    return code


def _explain_pass(o, store) -> str:
    golden = store.load(o.golden_platform, o.spec.id)
    lines = [f"{o.spec.id} on {o.golden_platform}: identical to the golden, bit for bit"]
    for name, entry in sorted(golden.manifest["tensors"].items()):
        lines.append(f"  {name}: {entry['dtype']} {entry['shape']} sha256 {entry['sha256'][:16]}…")
    prov = golden.manifest.get("provenance", {})
    prov = prov if isinstance(prov, dict) else {}
    lines.append(f"  recorded {prov.get('created', '?')} at {prov.get('lockstep_revision', '?')} "
                 f"on {prov.get('device', '?')} (torch {prov.get('torch', '?')})")
    lines += ["  " + w for w in o.warnings]
    lines += ["  note: " + n for n in o.notes]
    return "\n".join(lines)


def cmd_regen(args) -> int:
    from harness.ci import ci_value, under_ci
    if under_ci() and not args.allow_ci and not args.dry_run:     # a dry run writes nothing: allowed
        print(f"refusing to regenerate goldens under CI={ci_value()}: goldens are recorded by people and reviewed; "
              "pass --allow-ci to override (--dry-run is allowed)", file=sys.stderr)
        return EXIT_USAGE
    from harness.golden import GoldenLocked, GoldenStore

    store = GoldenStore(args.golden)
    specs, errors = _load(args)
    ctx = _context(args)
    if args.dry_run:
        _stale_temps(store, remove=False)
        return _regen(args, specs, errors, ctx, store)
    try:
        with store.writer_lock():
            _stale_temps(store, remove=True)   # under the exclusive lock: no write is in flight
            return _regen(args, specs, errors, ctx, store)
    except GoldenLocked as e:
        raise UsageError(str(e)) from None
    except OSError as e:  # the golden folder cannot be created or opened
        raise UsageError(f"cannot record goldens in {args.golden}: {e.strerror or e}") from None


def _stale_temps(store, remove: bool) -> None:
    for t in (store.remove_stale_temps() if remove else store.stale_temps()):
        print(f"{'removed' if remove else 'would remove'} stale temporary file {t} (left by a killed write)")


def _regen(args, specs, errors, ctx, store) -> int:
    from harness import runner

    rows = _plan(args, specs, ctx, regen=True)
    progress = Progress(len(rows))
    debug = getattr(args, "debug", False)
    outcomes = []
    for i, (spec, row_ctx, _) in enumerate(rows, 1):
        progress.show(i, spec.id)
        outcomes.append(runner.regen_spec(spec, row_ctx, store, write=not args.dry_run))
        progress.clear()
        print(outcomes[-1].report(debug), flush=True)
    for e in errors:
        print(f"spec error: {e}")
    for s in _stale(args, store):
        print(f"stale     {args.golden / s} (its spec no longer exists; delete it by hand if intended)")
    counts = {s: sum(o.status == s for o in outcomes) for s in (runner.NEW, runner.CHANGED, runner.UNCHANGED,
                                                                runner.REFUSED)}
    verb = "would write" if args.dry_run else "wrote"
    written = [o.golden_platform for o in outcomes if o.status in (runner.NEW, runner.CHANGED)]
    where = f" to {_golden_folders(args.golden, written)}" if written else ""
    checks = f"{len(outcomes)} spec(s)" if len(outcomes) == len(specs) else \
        f"{len(outcomes)} recording(s) of {len(specs)} spec(s)"
    print(f"\n{checks}: " + ", ".join(f"{n} {s}" for s, n in counts.items()) +
          f"; {verb} {len(written)} golden(s){where}, run on {_ran_on(rows) if rows else ctx.platform.name}")
    if errors:
        return EXIT_USAGE
    return EXIT_MISMATCH if counts[runner.REFUSED] else EXIT_OK


def cmd_report(args) -> int:
    from harness.errors import check_output_file
    from harness.targets.check import cmd_report, report_out
    for path, what in ((Path(args.out), "--out"), (Path(args.out).with_suffix(".json"), "--out (its JSON)")):
        check_output_file(path, what)         # before any spec loads or any target runs
    report_out(args.out)
    specs, errors = _load(args)
    _golden_exists(args)
    return cmd_report(args, specs, errors, _context(args), Progress(len(specs), True))


def _expectations(p: argparse.ArgumentParser) -> None:
    p.add_argument("--expectations", type=Path, metavar="FILE",
                   help="the target's expectations file (default: the target's own, or the shipped one whose "
                        "version range holds the target's version)")


def cmd_expectations(args) -> int:
    from harness.targets.check import cmd_write_expectations
    specs, errors = _load(args)
    return cmd_write_expectations(args, specs, errors, _context(args), Progress(len(specs), True))


def _target(p: argparse.ArgumentParser, many: bool = False) -> None:
    if many:
        p.add_argument("--target", action="append", help="a target to report (repeatable; default: those of sglang, "
                                                         "vllm, hf that load here, the others listed as not run)")
    else:
        p.add_argument("--target", default="lockstep", help="the implementation under test: lockstep (default), "
                                                            "sglang, vllm, hf, or one registered under the entry "
                                                            "point group lockstep.targets")


def cmd_suite(args) -> int:
    from harness.suite import installed_root
    root = installed_root()
    if os.environ.get("LOCKSTEP_SUITE") and not (root / "specs").is_dir():
        raise UsageError(f"LOCKSTEP_SUITE={os.environ['LOCKSTEP_SUITE']} holds no specs/ folder (set it to a folder "
                         "holding specs/ and golden/, or unset it to use the installed suite)")
    if root is None or not (root / "specs").is_dir():
        raise UsageError("no suite installed with this lockstep (install it from a clone: pip install -e CLONE, or "
                         "set LOCKSTEP_SUITE to a folder holding specs/ and golden/)")
    print(root)
    return EXIT_OK


def cmd_make_checkpoint(args) -> int:
    from engine.checkpoint import make_checkpoint
    from harness.estimates import CheckpointProgress, checkpoint_size

    checkpoint_size(args)                      # refused above --max-gb before anything is made
    try:
        out = make_checkpoint(args.preset, args.seed, args.format, args.out, overwrite=args.overwrite,
                              progress=CheckpointProgress())
    except FileExistsError:
        raise UsageError(f"{args.out} exists and is not empty; use --overwrite to replace it") from None
    except ValueError as e:
        raise UsageError(str(e)) from None
    except OSError as e:
        raise UsageError(f"cannot write {args.out}: {e.strerror or e}") from None
    print(f"wrote {args.format} checkpoint of preset {args.preset!r} (seed {args.seed}) to {out}")
    return EXIT_OK


def _generate_settings(args) -> tuple[list, dict]:
    """Per-prompt seeds and the sampling settings, refusing silent fallbacks: a sampling setting
    without --seed (generation would be greedy), --logprobs without --json (nowhere to print them)."""
    sampling = {"temperature": args.temperature, "top_k": args.top_k, "top_p": args.top_p, "min_p": args.min_p}
    given = [f"--{k.replace('_', '-')}" for k, v in sampling.items() if v is not None]
    if args.seed is None and given:
        raise UsageError(f"{', '.join(given)} without --seed: generation without a seed is greedy; pass --seed S "
                         "(one, or one per --prompt-ids) to sample")
    if args.logprobs and not args.json:
        raise UsageError("--logprobs is printed only in --json output; add --json")
    defaults = {"temperature": 1.0, "top_k": 0, "top_p": 1.0, "min_p": 0.0}
    return per_prompt_seeds(args.seed, len(args.prompt_ids)), {k: defaults[k] if v is None else v
                                                               for k, v in sampling.items()}


def cmd_generate(args) -> int:
    import torch

    from engine.checkpoint import CheckpointError
    from engine.generate import Request, generate
    from engine.model import GptOssModel
    from engine.sampling import SamplingParams
    from harness.estimates import generate_time
    from harness.platform import detect

    seeds, sampling = _generate_settings(args)
    try:
        platform = detect(args.device)                                # refuses cuda without a GPU
        model = GptOssModel.from_checkpoint(args.checkpoint, backend=args.backend, device=platform.torch_device)
        generate_time(args, model.config, platform.torch_device)   # refused above --max-seconds before it runs
        requests = [Request(prompt=ids, seed=seed, params=SamplingParams(
            **sampling, max_new_tokens=args.max_new_tokens, greedy=seed is None,
            stop_token_ids=tuple(args.stop_ids) if args.stop_ids is not None else None))
            for ids, seed in zip(args.prompt_ids, seeds)]
        results = generate(model, requests)
    except (CheckpointError, ValueError, OSError) as e:
        raise UsageError(str(e)) from None
    out = []
    for req, res in zip(requests, results):
        p = req.params
        item = {"prompt": req.prompt, "seed": req.seed,
                "sampling": {"greedy": p.greedy, "temperature": p.temperature, "top_k": p.top_k, "top_p": p.top_p,
                             "min_p": p.min_p, "max_new_tokens": p.max_new_tokens,
                             "stop_token_ids": list(p.stop_token_ids) if p.stop_token_ids is not None else None},
                "tokens": res.tokens, "finish_reason": res.finish_reason}
        if args.logprobs:
            item["logprobs"] = res.logprobs.tolist()
            item["logprobs_bits"] = [f"{b & 0xFFFFFFFF:08x}" for b in res.logprobs.contiguous().view(torch.int32).tolist()]
        out.append(item)
    if args.json:
        from harness.jsonout import generate_document
        print(json.dumps(generate_document(checkpoint=str(args.checkpoint), checkpoint_digest=_digest(args.checkpoint),
                                           platform=platform.name, backend=args.backend, results=out), indent=2))
    else:
        for item in out:
            print(" ".join(map(str, item["tokens"])) + f"   ({item['finish_reason']})")
    return EXIT_OK


def _digest(checkpoint: Path) -> str:
    """One sha256 over the checkpoint folder's files (name and sha256 of each, sorted by name)."""
    import hashlib

    from engine.checkpoint import checkpoint_digest
    lines = "".join(f"{name} {sha}\n" for name, sha in checkpoint_digest(checkpoint).items())
    return "sha256:" + hashlib.sha256(lines.encode()).hexdigest()


def cmd_doctor(args) -> int:
    """Run the IEEE oracle on this CPU: which primitives of the reference are not IEEE here."""
    import torch

    from harness import oracle
    from harness.platform import cpu_description

    print(f"cpu: {cpu_description()}; torch {torch.__version__} (capability "
          f"{torch.backends.cpu.get_cpu_capability()})")
    findings = oracle.check_all(args.inputs)
    wrong = [f for f in findings if not f.ok]
    for f in wrong:
        print(f"NOT IEEE  {f.op}: {f.wrong} of {f.checked} results differ {f.example}")
    for dtype in (torch.float32, torch.float64):        # what the reference avoids, for the record
        f = oracle.check_torch_sqrt(args.inputs, dtype)
        print(f"info      {f.op}: {f.wrong} of {f.checked} results are not correctly rounded here")
    print(f"{len(findings) - len(wrong)} of {len(findings)} primitive checks are IEEE on this CPU "
          f"({args.inputs} inputs each)")
    return EXIT_OK if not wrong else EXIT_MISMATCH


# --------------------------------------------------------------------------- entry point
def _version() -> str:
    from harness.version import DISTRIBUTION, version
    return f"{version()} ({DISTRIBUTION})"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="lockstep", description="Deterministic-replay conformance harness "
                                                                  "for gpt-oss + EAGLE3 inference.")
    parser.add_argument("--debug", action="store_true", help="show tracebacks (also accepted after the command)")
    parser.add_argument("--version", action="version", version=f"lockstep {_version()}",
                        help="the installed lockstep-harness version")
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
    p.add_argument("--strict", action="store_true", help="fail on stale goldens (whose spec is gone, or was edited "
                                                         "after they were recorded)")
    _target(p)
    _expectations(p)
    p.set_defaults(func=cmd_check)
    p = sub.add_parser("diff", help="run specs and explain each against its golden")
    _common(p, patterns="+")
    _running(p)
    _target(p)
    _expectations(p)
    p.set_defaults(func=lambda a: cmd_check(a, explain=True), json=False, strict=False)
    p = sub.add_parser("regen", help="record goldens: two identical runs, shown, then written atomically")
    _common(p)
    _running(p)
    p.add_argument("--dry-run", action="store_true", help="show what would change, write nothing")
    p.add_argument("--allow-ci", action="store_true", help="allow regeneration under CI (any truthy CI value)")
    p.set_defaults(func=cmd_regen)
    p = sub.add_parser("report", help="run targets and write the conformance matrix (Markdown and JSON)")
    _common(p)
    _running(p)
    _target(p, many=True)
    p.add_argument("--out", required=True, help="Markdown path (required: nothing is written where you did not "
                                               "say); the JSON goes beside it")
    _expectations(p)
    p.set_defaults(func=cmd_report)
    p = sub.add_parser("expectations", help="run specs on a target and write its expectations file from the "
                                            "observed failures, for review")
    _common(p)
    _running(p)
    p.add_argument("--target", required=True, help="the target (not lockstep: it has no expected failures)")
    p.add_argument("--write", type=Path, required=True, metavar="FILE", help="the expectations file to write")
    p.add_argument("--versions", help="the PEP 440 range the file holds for (default: ==the target's version)")
    p.set_defaults(func=cmd_expectations)
    p = sub.add_parser("suite", help="print the installed suite's folder (its specs/, golden/ and models/)")
    _debug(p)
    p.set_defaults(func=cmd_suite)
    p = sub.add_parser("doctor", help="check that every primitive of the CPU reference is IEEE on this machine")
    p.add_argument("--inputs", type=int_at_least(1024, MAX_DOCTOR_INPUTS), default=65536,
                   help=f"inputs per op (default 65536, at most {MAX_DOCTOR_INPUTS})")
    _debug(p)
    p.set_defaults(func=cmd_doctor)
    p = sub.add_parser("make-checkpoint", help="write a synthetic checkpoint in the HF layout")
    p.add_argument("--preset", required=True, help="engine preset, e.g. tiny, small, tiny-d36")
    p.add_argument("--seed", type=int_in(0, 2**63, "[0, 2^63)"), default=0)
    p.add_argument("--format", choices=["bf16", "mxfp4"], default="bf16")
    p.add_argument("--overwrite", action="store_true", help="replace a non-empty OUT")
    p.add_argument("--max-gb", type=bound, default=MAX_CHECKPOINT_GB, metavar="GB",
                   help=f"refuse to write more parameter bytes than this (default {MAX_CHECKPOINT_GB:g})")
    p.add_argument("out", type=Path, metavar="OUT")
    _debug(p)
    p.set_defaults(func=cmd_make_checkpoint)
    p = sub.add_parser("generate", help="generate from a checkpoint with the reference engine")
    p.add_argument("--checkpoint", type=Path, required=True)
    p.add_argument("--prompt-ids", type=token_ids, action="append", required=True,
                   help="comma-separated token ids; repeat for a batch")
    p.add_argument("--seed", type=seed_list, metavar="S[,S...]",
                   help="seeded sampling: one seed for every prompt, or one per --prompt-ids (without: greedy)")
    p.add_argument("--temperature", type=float, help="default 1.0; needs --seed")
    p.add_argument("--top-k", type=int, help="default 0 (off); needs --seed")
    p.add_argument("--top-p", type=float, help="default 1.0 (off); needs --seed")
    p.add_argument("--min-p", type=float, help="default 0.0 (off); needs --seed")
    p.add_argument("--max-new-tokens", type=int, default=16)
    p.add_argument("--stop-ids", type=token_ids, help="replace the EOS list, e.g. --stop-ids 509,510")
    p.add_argument("--logprobs", action="store_true", help="include each token's logprob (and its float32 bits)")
    p.add_argument("--max-seconds", type=bound, default=MAX_GENERATE_SECONDS, metavar="S",
                   help=f"on the CPU, refuse a run estimated above S seconds (default {MAX_GENERATE_SECONDS})")
    p.add_argument("--backend", choices=["torch", "triton"], default="torch")
    p.add_argument("--device", choices=["cpu", "cuda"], help="default: cuda when available, else cpu")
    p.add_argument("--json", action="store_true")
    _debug(p)
    p.set_defaults(func=cmd_generate)
    from harness.replay.commands import add_commands      # record, replay, import-peer, promote
    add_commands(sub)
    return parser


def main(argv=None) -> int:
    parser = build_parser()
    try:
        args = parser.parse_args(_attach_dash_values(sys.argv[1:] if argv is None else list(argv)))
    except SystemExit as e:  # argparse exits 2 on usage errors, as our contract wants, and 0 for --help
        return e.code if isinstance(e.code, int) else EXIT_USAGE
    try:
        try:
            code = args.func(args)
        except ModuleNotFoundError as e:         # a third-party dependency missing: name it and its install
            missing = _missing_package(e)
            if missing is None:
                raise
            raise UsageError(f"this command needs the Python package {missing!r}, which is not installed here: "
                             f"pip install {missing}") from None
        sys.stdout.flush()  # inside the boundary: a closed pipe is noticed here, not at interpreter exit
        return code
    except UsageError as e:
        if args.debug and e.cause is not None:
            print(full_traceback(e.cause), file=sys.stderr)
        print(f"lockstep: error: {e}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        print("\nlockstep: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except BrokenPipeError:
        return _stdout_closed()
    except Exception as e:  # noqa: BLE001 - the one boundary: nothing escapes as a traceback
        if args.debug:
            print(full_traceback(e), file=sys.stderr)
        print(f"lockstep: internal error: {located(e)}" + ("" if args.debug else "; --debug shows the traceback"),
              file=sys.stderr)
        return EXIT_MISMATCH


# Modules whose pip package has another name; any other third-party module is its own package's name.
PACKAGES = {"yaml": "pyyaml", "packaging": "packaging"}
OWN_PACKAGES = ("harness", "engine", "kernels", "models", "tests")


def _missing_package(e: ModuleNotFoundError) -> str | None:
    """The pip package behind a missing module; None for one of Lockstep's own (an internal error)."""
    top = (e.name or "").split(".")[0]
    if not top or top in OWN_PACKAGES:
        return None
    return PACKAGES.get(top, top)


def _stdout_closed() -> int:
    """The reader went away (`lockstep list | head -1`): stop quietly. Point stdout at /dev/null so
    the interpreter's final flush does not complain, and exit as a SIGPIPE-killed tool would."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError, AttributeError):  # stdout replaced by one without a file descriptor
        pass
    return EXIT_STDOUT_CLOSED


if __name__ == "__main__":
    sys.exit(main())
