"""`lockstep check` (the CI gate) and `lockstep diff` (the same run, each spec explained).

`cmd_check` is the one place the check command's logic lives: it loads the selection, runs the
self-check, forks to another target (harness/targets) or runs each planned row through
harness.runner (in worker processes with -j, harness/workers.py), and hands every outcome to a CheckSession (harness/commands/session.py), which
owns the counts, stale goldens, temporary files, exit code and both reports.
"""

from __future__ import annotations

import sys

from lockstep.harness import runner, workers
from lockstep.harness.commands import laststate
from lockstep.harness.commands.display import Progress
from lockstep.harness.commands.selection import context, golden_exists, golden_ids, load, plan, stale_goldens
from lockstep.harness.commands.session import CheckSession
from lockstep.harness.errors import UsageError
from lockstep.harness.golden import GoldenStore
from lockstep.harness.jsonout import emit
from lockstep.harness.commands.targets import check_against_expectations, target_context, target_for


def cmd_check(args, explain: bool = False) -> int:
    if getattr(args, "expectations", None) is not None and args.target == "lockstep":
        raise UsageError("--expectations goes with --target (Lockstep's own engine has no expected failures)")
    store = GoldenStore(args.golden)
    wanted = laststate.narrow(args)             # --failed: the last check's failing rows only
    if wanted == set():
        return laststate.nothing_failed(args)
    specs, errors = load(args, also_ids=golden_ids(store) if args.strict else ())
    golden_exists(args)
    ctx = context(args)
    runner.self_check()  # a comparator or loader that calls -0.0 == 0.0 would pass everything: refuse first
    target = target_for(args.target, ctx)     # lockstep: its engine, judged against the goldens below
    if not target.has_goldens:                # another implementation: against its expectations
        target, ctx = target_context(target, args, ctx)
        return check_against_expectations(target, args, specs, errors, ctx, explain,
                                          Progress(len(specs), lines=True))   # its table comes at the end
    session = CheckSession(args.golden, args.strict, specs, errors,
                           rows=laststate.keep(plan(args, specs, ctx), wanted))
    _run_rows(session, store, args)
    session.finish(stale_goldens(args, store), store.stale_temps())
    laststate.record(args.golden, session.outcomes)
    if args.json:
        emit(session.json_document(ctx))
    else:
        print(session.text_report(ctx, lambda o: _explain_pass(o, store), getattr(args, "debug", False), explain))
    return session.exit_code()


def _run_rows(session: CheckSession, store: GoldenStore, args) -> None:
    """Each planned row through the runner, its table row printed as it finishes (stderr progress
    lines instead under --json)."""
    jobs = getattr(args, "jobs", None) or workers.default_jobs()     # a bad $LOCKSTEP_JOBS: before any output
    table = session.table()
    progress = Progress(len(session.rows), lines=args.json)
    if session.rows and not args.json:
        print(table.header(), flush=True)
    checked = workers.check_rows(session.rows, store, args.strict, jobs, waiting=progress.show)
    for i, outcome in enumerate(checked, 1):   # in the serial order, whatever order the workers finish in
        session.add(outcome)
        progress.clear()
        progress.finished(i, table.outcome(session.outcomes[-1]))
        if not args.json:
            print(table.outcome(session.outcomes[-1]), flush=True)
    sys.stdout.flush()


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
