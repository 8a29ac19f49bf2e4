"""Who judges a check, chosen once by its target: Lockstep's engine against its goldens, bit for
bit (harness/runner.py), any other engine against its expectations file (the judges of
harness/targets/judge.py: exact properties, calibrated agreement, the kinds' own checks).

`lockstep check` (harness/commands/check.py) and the pytest suite (harness/pytest_suite.py) run
one pipeline: plan the rows, `run` each, ask the judge for its `Verdict`. A verdict's state is
what both report: pass, fail, an expected failure, n/a, an incomparable golden, a missing one.
"""

from __future__ import annotations

import shlex
import sys
from dataclasses import dataclass, field
from pathlib import Path

from lockstep.harness import runner, targets, workers
from lockstep.harness.golden import GoldenStore
from lockstep.harness.targets import expectations_path
from lockstep.harness.targets.expectfile import verdict as expectation_problem
from lockstep.harness.targets.judge import FAIL, NA, run_on_target

# A verdict's states, in the order of the exit code that each forces (DESIGN, exit codes): a
# failure (1) outranks an incomparable golden (4), which outranks a missing one (3).
PASSED, FAILED, EXPECTED, NOT_APPLICABLE, INCOMPARABLE, MISSING = (
    "pass", "fail", "expected failure", "n/a", "incomparable", "missing")


@dataclass
class Verdict:
    """What one spec's outcome means for the run; `report` is the text under the spec (a failure's
    cause first), `problem` the one line by which a target's outcome differs from its expectations."""
    state: str
    headline: str = ""
    report: str = ""
    problem: str | None = None
    properties: list[tuple[str, str]] = field(default_factory=list)   # JUnit properties (pytest)


class GoldenJudge:
    """Lockstep's engine: each planned row (spec, dtype/backend pair, golden folder) against its golden."""
    has_goldens = True

    def __init__(self, golden: Path, strict: bool = False, debug: bool = False):
        self.store, self.strict, self.debug = GoldenStore(golden), strict, debug

    def run(self, spec, ctx):
        return runner.check_spec(spec, ctx, self.store, self.strict)

    def outcomes(self, rows, jobs: int, waiting=None):
        """The rows' outcomes in the rows' order, checked in `jobs` worker processes."""
        return workers.check_rows(rows, self.store, self.strict, jobs, waiting=waiting)

    def verdict(self, o) -> Verdict:
        props = [("lockstep_status", o.status)]
        if o.status == runner.PASS:
            return Verdict(PASSED, properties=props)
        if o.status == runner.INCOMPARABLE:
            return Verdict(INCOMPARABLE, o.messages[0] if o.messages else "incomparable", o.report(self.debug),
                           properties=props)
        state = MISSING if o.status == runner.MISSING else FAILED
        text = o.report(self.debug)
        return Verdict(state, text.splitlines()[0], text, properties=props)


class ExpectationsJudge:
    """Another engine: each spec run on the target and judged by the target judges; a failure the
    expectations file lists, with its observed line, is expected; any other difference fails."""
    has_goldens = False

    def __init__(self, target, expected: dict, golden: Path, explicit: Path | None = None,
                 reproduce=None, debug: bool = False):
        self.target, self.expected, self.store = target, expected, GoldenStore(golden)
        self.explicit, self.reproduce, self.debug = explicit, reproduce, debug

    @property
    def expectations_file(self) -> Path | None:
        return expectations_path(self.target, self.explicit)

    def run(self, spec, ctx):
        return run_on_target(spec, ctx, self.target, self.store)

    def outcomes(self, rows, jobs: int | None, waiting=None):
        """The rows' outcomes in order, in `jobs` worker processes that each build the target again
        by its registry name and policy; a target the registry did not build runs in this process."""
        recipe, many = targets.recipe(self.target), workers.processes(jobs, len(rows)) > 1
        if recipe is not None and many:
            yield from workers.target_rows(rows, recipe, self.target.label, self.store, jobs, waiting)
            return
        if many:
            print(f"note: target {self.target.label} was not loaded by name (--target, the entry point group "
                  f"{targets.GROUP}), so no worker process can build it: its {len(rows)} spec(s) run in this "
                  "process", file=sys.stderr)
        for i, (spec, ctx, _) in enumerate(rows, 1):
            if waiting:
                waiting(i, spec.id)
            yield self.run(spec, ctx)

    def verdict(self, o) -> Verdict:
        want = self.expected.get(o.spec.id)
        problem = expectation_problem(o, want)
        props = [("lockstep_target", self.target.label), ("lockstep_status", o.status)]
        if o.status == FAIL:            # the cause, structured as in `check --json`: the first line leads
            props += [("lockstep_cause", o.message), ("lockstep_notes", "\n".join(o.notes))]
        text = self._report(o, want)
        if problem:
            return Verdict(FAILED, problem.splitlines()[0], text, problem, props)
        if o.status == FAIL:
            return Verdict(EXPECTED, f"expected on {self.target.label} ({want['judgement']}: {want['why']}): "
                           f"{o.message}", text, None, props)
        if o.status == NA:
            return Verdict(NOT_APPLICABLE, f"n/a on {self.target.label}: {o.message}", text, None, props)
        return Verdict(PASSED, properties=props)

    def _report(self, o, want) -> str:
        """The block under a spec that failed (or is n/a): the cause, the tensors, the notes, the
        command that reruns it."""
        lines = [f"{o.spec.id} on {self.target.label}: {o.status.upper()}"
                 + (f" (expected: {want['judgement']}: {want['why']})" if want and o.status == FAIL else "")]
        for m in (o.messages if o.status == FAIL else [o.message]):
            lines.append("  " + m.replace("\n", "\n  "))
        for n in o.notes:
            lines.append("  note: " + n)
        if o.traceback and self.debug:
            lines.append("  " + o.traceback.replace("\n", "\n  "))
        if o.status == FAIL and self.reproduce is not None:
            lines.append("  reproduce: " + self.reproduce(o.spec.id) + (" --debug" if o.traceback else ""))
        return "\n".join(lines)


def reproduce_command(args, target) -> callable:
    """spec id -> a command that reruns that spec on the target from any folder: absolute suite
    paths, the target and its dtype policy."""
    def command(spec_id: str) -> str:
        parts = ["lockstep", "check", "--specs", str(Path(args.specs).resolve()), "--golden",
                 str(Path(args.golden).resolve()), "--target", args.target, "--dtype", getattr(target, "dtype", "fp32")]
        if getattr(args, "expectations", None) is not None:
            parts += ["--expectations", str(Path(args.expectations).resolve())]
        return " ".join(shlex.quote(p) for p in parts + [spec_id])
    return command


def warn_unrun(judge: ExpectationsJudge, outcomes, everything: bool) -> None:
    """Expected failures of specs a run of the whole selection (`everything`) did not include, and
    entries nobody judged yet."""
    ran = {o.spec.id for o in outcomes}
    for sid in sorted(set(judge.expected) - ran) if everything else ():
        print(f"warning: {judge.expectations_file}: expects {sid} to fail, but no spec of that id ran here "
              f"(stale, or in another spec directory)", file=sys.stderr)
    unjudged = sorted(sid for sid, e in judge.expected.items() if e["judgement"] == "unjudged")
    if unjudged:
        print(f"warning: {len(unjudged)} expected failure(s) not judged yet (judgement: unjudged): "
              f"{', '.join(unjudged)}", file=sys.stderr)

