"""`lockstep report` (the conformance matrix of targets) and `lockstep expectations` (a target's
expectations file written from its observed failures); both run through harness/targets."""

from __future__ import annotations

from pathlib import Path

from lockstep.harness import workers
from lockstep.harness.commands.display import Progress
from lockstep.harness.commands.selection import context, golden_exists, load
from lockstep.harness.errors import check_output_file
from lockstep.harness.commands.targets import cmd_report as report_targets_cmd, cmd_write_expectations, report_out


def cmd_report(args) -> int:
    for path, what in ((Path(args.out), "--out"), (Path(args.out).with_suffix(".json"), "--out (its JSON)")):
        check_output_file(path, what)         # before any spec loads or any target runs
    report_out(args.out)
    jobs = args.jobs or workers.default_jobs()        # a bad $LOCKSTEP_JOBS: before any spec runs
    specs, errors = load(args)
    golden_exists(args)
    return report_targets_cmd(args, specs, errors, context(args), Progress(len(specs), True), jobs)


def cmd_expectations(args) -> int:
    jobs = args.jobs or workers.default_jobs()
    specs, errors = load(args)
    return cmd_write_expectations(args, specs, errors, context(args), Progress(len(specs), True), jobs)
