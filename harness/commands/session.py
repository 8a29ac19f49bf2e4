"""A check session: what one `lockstep check` (or `diff`) run has seen and what it exits with.

It owns the outcomes and their verdicts (harness/judges.py: the judge the target chose), the spec
errors, the stale goldens and the temporary files a killed write left, and computes the exit code
from them; it writes both reports (the text summary and the --json document). syrupy's
SnapshotSession is the model: the command runs specs and hands each outcome to the session, the
session decides what it all means.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from pathlib import Path

from lockstep.harness import judges, runner
from lockstep.harness.commands.display import StatusTable, TargetTable
from lockstep.harness.commands.exits import EXIT_INCOMPARABLE, EXIT_MISMATCH, EXIT_MISSING, EXIT_OK, EXIT_USAGE
from lockstep.harness.commands.selection import golden_folders, ran_on
from lockstep.harness.jsonout import check_document
from lockstep.harness.targets.judge import FAIL, NA, PASS
from lockstep.harness.version import version
from lockstep.kernels import compile_time


@dataclass
class CheckSession:
    judge: object                         # judges.GoldenJudge or judges.ExpectationsJudge
    golden: Path                          # the golden folder (args.golden)
    strict: bool
    specs: list                           # the selected specs
    errors: list                          # their spec errors
    rows: list = field(default_factory=list)          # the plan: [(spec, RunContext, golden folder)]
    outcomes: list = field(default_factory=list)
    verdicts: list = field(default_factory=list)      # the judge's, one per outcome
    stale: list[str] = field(default_factory=list)    # 'platform/spec id' of goldens whose spec is gone
    temps: list[str] = field(default_factory=list)    # debris of a killed golden write
    start: float = field(default_factory=time.perf_counter)
    processes: int = 1                    # the processes the rows ran in (-j N: N workers)

    def add(self, outcome) -> None:
        self.outcomes.append(outcome)
        self.verdicts.append(self.judge.verdict(outcome))

    def finish(self, stale: list[str], temps: list) -> None:
        """The goldens without a spec and the temporary files, found once every spec has run."""
        self.stale, self.temps = stale, [str(t) for t in temps]
        self.elapsed = time.perf_counter() - self.start

    def counts(self) -> dict[str, int]:
        statuses = runner.STATUSES if self.judge.has_goldens else (PASS, FAIL, NA)
        return {s: sum(o.status == s for o in self.outcomes) for s in statuses}

    def exit_code(self) -> int:
        """2 a spec error, 1 a failing verdict (or, with --strict, a stale golden or temporary file),
        4 an incomparable golden, 3 a missing one, 0 otherwise: in the order 2, 1, 4, 3."""
        states = {v.state for v in self.verdicts}
        if self.errors:
            return EXIT_USAGE
        if (self.strict and (self.stale or self.temps)) or judges.FAILED in states:
            return EXIT_MISMATCH
        if judges.INCOMPARABLE in states:
            return EXIT_INCOMPARABLE
        if judges.MISSING in states:
            return EXIT_MISSING
        return EXIT_OK

    def problems(self) -> list[str]:
        """How a target's outcomes differ from its expectations (one line each; none for goldens)."""
        return [v.problem for v in self.verdicts if v.problem]

    # ------------------------------------------------------------ the two reports
    def json_document(self, ctx) -> str:
        specs = [o.to_json() | {"verdict": v.state} for o, v in zip(self.outcomes, self.verdicts)]
        if self.judge.has_goldens:
            return json.dumps(check_document(
                target=f"lockstep-{version()}", platform=ctx.platform.name, backend=ctx.backend,
                exit_code=self.exit_code(), pairs=list(dict.fromkeys(o.pair for o in self.outcomes)),
                seconds=self.elapsed, golden_folders=sorted({str(self.golden / o.golden_platform) for o in self.outcomes}),
                summary=self.counts() | {"spec_errors": len(self.errors), "stale_goldens": len(self.stale)},
                specs=specs, spec_errors=[str(e) for e in self.errors], stale_goldens=self.stale,
                compile=self.compile_figures()), indent=2)
        judge = self.judge
        for o, entry in zip(self.outcomes, specs):
            if o.status == FAIL and judge.reproduce is not None:
                entry["reproduce"] = judge.reproduce(o.spec.id)
        return json.dumps(check_document(
            target=judge.target.label, platform=ctx.platform.name, backend=ctx.backend, exit_code=self.exit_code(),
            seconds=self.elapsed, summary=self.counts() | {"spec_errors": len(self.errors)}, specs=specs,
            spec_errors=[str(e) for e in self.errors], expectation_problems=self.problems(),
            expectations_file=_shown(judge.expectations_file)), indent=2)

    def text_report(self, ctx, explain_pass, debug: bool, explain: bool) -> str:
        """The details after the table: each failure (every spec with `explain`), the spec errors,
        the stale goldens and temporary files, and the summary line."""
        if not self.judge.has_goldens:
            return self._target_report(explain)
        parts = []
        for o in self.outcomes:
            if o.status != runner.PASS or o.stale_golden or explain:
                parts.append("\n" + (o.report(debug) if o.status != runner.PASS or not explain else explain_pass(o)))
        if self.errors:
            parts.append("\nspec errors:\n" + "\n".join(f"  {e}" for e in self.errors))
        failing = " — failing under --strict" if self.strict else ""
        if self.stale:
            parts.append(f"\nstale goldens (their spec no longer exists){failing}:\n" +
                         "\n".join(f"  {self.golden / s}" for s in self.stale))
        if self.temps:
            parts.append(f"\n{len(self.temps)} stale temporary file(s) (left by a killed golden write; `lockstep "
                         f"regen` removes them){failing}:\n" + "\n".join(f"  {t}" for t in self.temps))
        parts += self.topologies(ctx)
        parts.append("\n" + self.summary(ctx))
        return "\n".join(parts)

    def topologies(self, ctx) -> list[str]:
        """Under --world-size: which splits ran on how many specs, and which did not, with why (each
        spec's notes say it per spec)."""
        if not any(w > 1 for w in getattr(ctx, "world_sizes", ())):
            return []
        ran, left = {}, {}
        for o in self.outcomes:
            for n in o.notes:
                if n.startswith("checked at "):
                    for t in n.removeprefix("checked at ").split(", "):
                        ran[t.removeprefix("topology ")] = ran.get(t.removeprefix("topology "), 0) + 1
                elif n.startswith("not run at "):
                    split, _, why = n.removeprefix("not run at ").partition(": ")
                    left.setdefault(f"{split}: {why}", []).append(o.spec.id)
        lines = ["\n--world-size " + ",".join(map(str, ctx.world_sizes)) + ": "
                 + ("; ".join(f"{t} on {k} spec(s)" for t, k in ran.items()) or "no split ran")]
        lines += [f"  not run at {why} ({len(ids)} spec(s))" for why, ids in left.items()]
        return lines

    def summary(self, ctx) -> str:
        counts = self.counts()
        text = ", ".join(f"{n} {s}" for s, n in counts.items() if n or s == runner.PASS)
        extra = (f", {len(self.errors)} spec error(s)" if self.errors else "") + \
            (f", {len(self.stale)} stale golden(s)" if self.stale else "")
        n = len(self.outcomes)
        checks = f"{n} spec(s)" if n == len(self.specs) else f"{n} check(s) of {len(self.specs)} spec(s)"
        on = ran_on(self.rows) if self.rows else ctx.platform.name
        folders = golden_folders(self.golden, [o.golden_platform for o in self.outcomes])
        return f"{checks}: {text}{extra} in {self.elapsed:.1f}s ({self.compile_text()}), run on {on}; goldens: {folders}"

    def compile_figures(self) -> dict:
        """Triton's compile time apart from the rest of the rows' time, summed over the processes the
        rows ran in, and the distinct kernel specializations compiled (kernels/compile_time.py)."""
        mode = compile_time.mode()
        tallies = [o.compile for o in self.outcomes if getattr(o, "compile", None) is not None]
        busy = sum(o.seconds for o in self.outcomes)
        if mode != "compiled" or not tallies:
            return {"mode": mode if mode != "compiled" else "unmeasured", "seconds": None, "load_seconds": None,
                    "run_seconds": round(busy, 3), "processes": self.processes, "specializations": None,
                    "compiles": None, "cache_hits": None, "kernels": {}}
        compiling = sum(t.seconds for t in tallies)
        loading = sum(t.load_seconds for t in tallies)
        keys = set().union(*(t.keys for t in tallies))
        hits = [t.cache_hits for t in tallies]
        kernels: dict[str, int] = {}
        for key in sorted(keys):
            name = key.split("#")[0]
            kernels[name] = kernels.get(name, 0) + 1
        return {"mode": mode, "seconds": round(compiling, 3), "load_seconds": round(loading, 3),
                "run_seconds": round(max(0.0, busy - compiling - loading), 3), "processes": self.processes,
                "specializations": len(keys), "compiles": sum(t.compiles for t in tallies),
                "cache_hits": None if None in hits else sum(hits), "kernels": kernels}

    def compile_text(self) -> str:
        """The summary's part on compile time: "Triton compile 41.0s, run 35.2s; 140 kernel specializations …"."""
        c = self.compile_figures()
        if c["mode"] == "interpreter":
            return "Triton compile n/a: interpreter"
        if c["mode"] == "unmeasured":
            return "Triton compile not measured"
        over = f" over {c['processes']} processes" if c["processes"] > 1 else ""
        hits = f", {c['cache_hits']} from the disk cache" if c["cache_hits"] is not None else ""
        return (f"Triton compile {c['seconds'] + c['load_seconds']:.1f}s, run {c['run_seconds']:.1f}s{over}; "
                f"{c['specializations']} kernel specializations, {c['compiles']} compiles{hits}")

    def table(self):
        if not self.judge.has_goldens:
            return TargetTable([s.id for s, _, _ in self.rows], self.judge.expected)
        return StatusTable([s.id for s, _, _ in self.rows], [folder for _, _, folder in self.rows])

    def _target_report(self, explain: bool) -> str:
        """Another target's details: each failure (each n/a with `explain`) cause first, how the run
        differs from its expectations file, the spec errors, and the summary line."""
        judge, label = self.judge, self.judge.target.label
        parts = ["\n" + v.report for o, v in zip(self.outcomes, self.verdicts)
                 if o.status == FAIL or (explain and o.status == NA)]
        if self.problems():
            parts.append(f"\n{label}: results differ from {_shown(judge.expectations_file) or 'its expectations (none)'}:")
            parts += ["  " + p for p in self.problems()]
        parts += [f"spec error: {e}" for e in self.errors]
        counts = self.counts()
        unexpected = sum(1 for o in self.outcomes if o.status == FAIL and o.spec.id not in judge.expected)
        parts.append(f"\n{len(self.outcomes)} spec(s) on {label}: {counts[PASS]} pass, {counts[FAIL]} fail "
                     f"({counts[FAIL] - unexpected} expected), {counts[NA]} n/a in {self.elapsed:.1f}s"
                     + ("; matches its expectations" if not self.problems() else "; DOES NOT match its expectations"))
        return "\n".join(parts)


def _shown(path) -> str | None:
    return None if path is None else str(path)
