"""`lockstep regen`: record goldens, two identical runs each, shown, then written atomically under
the golden folder's writer lock (refused under CI without --allow-ci)."""

from __future__ import annotations

import sys

from lockstep.harness import parallel, runner
from lockstep.harness.ci import ci_value, under_ci
from lockstep.harness.commands import laststate
from lockstep.harness.commands.display import Progress
from lockstep.harness.commands.exits import EXIT_MISMATCH, EXIT_OK, EXIT_USAGE
from lockstep.harness.commands.selection import context, golden_folders, load, plan, ran_on, stale_goldens
from lockstep.harness.errors import UsageError
from lockstep.harness.golden import GoldenLocked, GoldenStore


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
        _stale_temps(store, remove=False)
        return _regen(args, specs, errors, ctx, store, wanted)
    try:
        with store.writer_lock():
            _stale_temps(store, remove=True)   # under the exclusive lock: no write is in flight
            return _regen(args, specs, errors, ctx, store, wanted)
    except GoldenLocked as e:
        raise UsageError(str(e)) from None
    except OSError as e:  # the golden folder cannot be created or opened
        raise UsageError(f"cannot record goldens in {args.golden}: {e.strerror or e}") from None


def _stale_temps(store, remove: bool) -> None:
    for t in (store.remove_stale_temps() if remove else store.stale_temps()):
        print(f"{'removed' if remove else 'would remove'} stale temporary file {t} (left by a killed write)")


def _regen(args, specs, errors, ctx, store, wanted=None) -> int:
    rows = laststate.keep(plan(args, specs, ctx, regen=True), wanted)
    progress = Progress(len(rows))         # each outcome's report line is the CI log's progress
    debug = getattr(args, "debug", False)
    outcomes = []
    for i, outcome in enumerate(parallel.regen_rows(rows, store, not args.dry_run, getattr(args, "jobs", 1),
                                                    waiting=progress.show), 1):
        outcomes.append(outcome)
        progress.clear()
        print(outcome.report(debug), flush=True)
    for e in errors:
        print(f"spec error: {e}")
    for s in stale_goldens(args, store):
        print(f"stale     {args.golden / s} (its spec no longer exists; delete it by hand if intended)")
    print(_what_moved(outcomes), end="")
    counts = {s: sum(o.status == s for o in outcomes) for s in (runner.NEW, runner.CHANGED, runner.UNCHANGED,
                                                                runner.REFUSED)}
    verb = "would write" if args.dry_run else "wrote"
    written = [o.golden_platform for o in outcomes if o.status in (runner.NEW, runner.CHANGED)]
    where = f" to {golden_folders(args.golden, written)}" if written else ""
    checks = f"{len(outcomes)} spec(s)" if len(outcomes) == len(specs) else \
        f"{len(outcomes)} recording(s) of {len(specs)} spec(s)"
    print(f"\n{checks}: " + ", ".join(f"{n} {s}" for s, n in counts.items()) +
          f"; {verb} {len(written)} golden(s){where}, run on {ran_on(rows) if rows else ctx.platform.name}")
    if errors:
        return EXIT_USAGE
    return EXIT_MISMATCH if counts[runner.REFUSED] else EXIT_OK


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
