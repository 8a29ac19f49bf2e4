"""`lockstep check` (the CI gate) and `lockstep diff` (the same run, each spec explained).

One pipeline whatever the target: load the selection, run the self-check, let the target choose
its judge (harness/judges.py: Lockstep's engine against its goldens, any other engine against its
expectations), plan the rows, run each (in worker processes with -j for the goldens,
harness/workers.py) and hand every outcome to a CheckSession (harness/commands/session.py), which
owns the verdicts, counts, stale goldens, temporary files, exit code and both reports.
"""

from __future__ import annotations

import sys

from lockstep.harness import runner, workers
from lockstep.harness.commands import laststate
from lockstep.harness.commands.display import Progress
from lockstep.harness.commands.selection import context, golden_exists, golden_ids, load, plan, stale_goldens
from lockstep.harness.commands.session import CheckSession
from lockstep.harness.commands.targets import judge_for
from lockstep.harness.errors import UsageError
from lockstep.harness.golden import GoldenStore
from lockstep.harness.jsonout import emit
from lockstep.harness.judges import warn_unrun


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
    judge, ctx = judge_for(args, ctx)           # the target's judge, and the run at the target's dtype policy
    rows = plan(args, specs, ctx) if judge.has_goldens else [(s, ctx, "") for s in specs]
    session = CheckSession(judge, args.golden, args.strict, specs, errors, rows=laststate.keep(rows, wanted))
    _run_rows(session, args)
    if judge.has_goldens:
        session.finish(stale_goldens(args, store), store.stale_temps())
        laststate.record(args.golden, session.outcomes)
    else:
        session.finish([], [])
        warn_unrun(judge, session.outcomes, everything=not (args.patterns or args.tag))
    if args.json:
        emit(session.json_document(ctx))
    else:
        print(session.text_report(ctx, lambda o: _explain_pass(o, store), getattr(args, "debug", False), explain))
    return session.exit_code()


def _run_rows(session: CheckSession, args) -> None:
    """Each planned row through the judge, its table row printed as it finishes (stderr progress
    lines instead under --json)."""
    jobs = getattr(args, "jobs", None) or workers.default_jobs()     # a bad $LOCKSTEP_JOBS: before any output
    table = session.table()
    session.processes = workers.processes(jobs, len(session.rows))
    progress = Progress(len(session.rows), lines=args.json)
    if session.rows and not args.json:
        print(table.header(), flush=True)
    checked = session.judge.outcomes(session.rows, jobs, waiting=progress.show)
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
