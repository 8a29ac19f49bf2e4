"""`lockstep regen`: record goldens, two identical runs each, shown, then written atomically under
the golden folder's writer lock (refused under CI without --allow-ci)."""

from __future__ import annotations

import json
import sys

from lockstep.harness import runner, workers
from lockstep.harness.ci import ci_value, under_ci
from lockstep.harness.commands import laststate
from lockstep.harness.commands.display import Progress
from lockstep.harness.commands.exits import EXIT_MISMATCH, EXIT_OK, EXIT_USAGE
from lockstep.harness.commands.selection import context, golden_folders, load, plan, ran_on, stale_goldens
from lockstep.harness.errors import UsageError
from lockstep.harness.golden import GoldenLocked, GoldenStore
from lockstep.harness.jsonout import emit, regen_document


def cmd_regen(args) -> int:
    if under_ci() and not args.allow_ci and not args.dry_run:     # a dry run writes nothing: allowed
        print(f"refusing to regenerate goldens under CI={ci_value()}: goldens are recorded by people and reviewed; "
              "pass --allow-ci to override (--dry-run is allowed)", file=sys.stderr)
        return EXIT_USAGE
    store = GoldenStore(args.golden)
    wanted = laststate.narrow(args)             # --failed: the last check's failing rows only
    if wanted == set():
        return laststate.nothing_failed(args)
    specs, errors = load(args)
    ctx = context(args)
    if args.dry_run:
        temps = _stale_temps(store, False, _text_stream(args))
        return _regen(args, specs, errors, ctx, store, wanted, temps)
    try:
        with store.writer_lock():
            temps = _stale_temps(store, True, _text_stream(args))   # under the exclusive lock: no write in flight
            return _regen(args, specs, errors, ctx, store, wanted, temps)
    except GoldenLocked as e:
        raise UsageError(str(e)) from None
    except OSError as e:  # the golden folder cannot be created or opened
        raise UsageError(f"cannot record goldens in {args.golden}: {e.strerror or e}") from None


def _text_stream(args):
    """Where the text report goes: stdout, or stderr under --json (stdout holds the one document)."""
    return sys.stderr if getattr(args, "json", False) else sys.stdout


def _stale_temps(store, remove: bool, stream) -> list[str]:
    temps = store.remove_stale_temps() if remove else store.stale_temps()
    for t in temps:
        print(f"{'removed' if remove else 'would remove'} stale temporary file {t} (left by a killed write)",
              file=stream)
    return [str(t) for t in temps]


def _regen(args, specs, errors, ctx, store, wanted=None, temps=()) -> int:
    rows = laststate.keep(plan(args, specs, ctx, regen=True), wanted)
    progress = Progress(len(rows))         # each outcome's report line is the CI log's progress
    debug, stream = getattr(args, "debug", False), _text_stream(args)
    outcomes = []
    for outcome in workers.regen_rows(rows, store, not args.dry_run, getattr(args, "jobs", 1), waiting=progress.show):
        outcomes.append(outcome)
        progress.clear()
        print(outcome.report(debug), file=stream, flush=True)
    for e in errors:
        print(f"spec error: {e}", file=stream)
    stale = stale_goldens(args, store)
    for s in stale:
        print(f"stale     {args.golden / s} (its spec no longer exists; delete it by hand if intended)", file=stream)
    print(_what_moved(outcomes), end="", file=stream)
    counts = {s: sum(o.status == s for o in outcomes) for s in (runner.NEW, runner.CHANGED, runner.UNCHANGED,
                                                                runner.REFUSED)}
    verb = "would write" if args.dry_run else "wrote"
    written = [o.golden_platform for o in outcomes if o.status in (runner.NEW, runner.CHANGED)]
    where = f" to {golden_folders(args.golden, written)}" if written else ""
    checks = f"{len(outcomes)} spec(s)" if len(outcomes) == len(specs) else \
        f"{len(outcomes)} recording(s) of {len(specs)} spec(s)"
    print(f"\n{checks}: " + ", ".join(f"{n} {s}" for s, n in counts.items()) +
          f"; {verb} {len(written)} golden(s){where}, run on {ran_on(rows) if rows else ctx.platform.name}",
          file=stream)
    code = EXIT_USAGE if errors else EXIT_MISMATCH if counts[runner.REFUSED] else EXIT_OK
    if getattr(args, "json", False):
        emit(json.dumps(regen_document(dry_run=args.dry_run, exit_code=code, summary=counts,
                                        goldens=[_golden_json(o) for o in outcomes], spec_errors=[str(e) for e in errors],
                                        stale_goldens=stale, removed_temps=list(temps)), indent=2))
    return code


def _golden_json(o) -> dict:
    return {"id": o.spec.id, "golden_platform": o.golden_platform, "status": o.status, "written": o.written,
            "moved": o.moved.to_json() if o.moved is not None else None, "explanation": o.explanation}


def _what_moved(outcomes) -> str:
    """The reviewer's summary: one line per changed golden (tokens, max ULP, requests), and the
    new and refused ones named; empty when nothing changed."""
    lines = []
    for o in outcomes:
        if o.status == runner.CHANGED:
            what = o.moved.sentence() if o.moved is not None else "replaces a corrupt golden"
            if o.moved is not None and not (o.moved.floats or o.moved.other or o.moved.tokens_changed
                                            or o.moved.data_changed):
                what = "same bits; only the spec hash in the manifest moves"
            lines.append(f"  changed {o.spec.id} ({o.golden_platform}): {what}")
        elif o.status in (runner.NEW, runner.REFUSED):
            lines.append(f"  {o.status} {o.spec.id} ({o.golden_platform})")
    return "\nwhat moved:\n" + "\n".join(lines) + "\n" if lines else ""
