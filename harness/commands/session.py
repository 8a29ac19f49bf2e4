"""A check session: what one `lockstep check` (or `diff`) run has seen and what it exits with.

It owns the outcomes (pass / fail / missing / … counts), the spec errors, the stale goldens and
the temporary files a killed write left, and computes the exit code from them; it writes both
reports (the text summary and the --json document). syrupy's SnapshotSession is the model: the
command runs specs and hands each outcome to the session, the session decides what it all means.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from pathlib import Path

from lockstep.harness import runner
from lockstep.harness.commands.display import StatusTable
from lockstep.harness.commands.exits import EXIT_INCOMPARABLE, EXIT_MISMATCH, EXIT_MISSING, EXIT_OK, EXIT_USAGE
from lockstep.harness.commands.selection import golden_folders, ran_on
from lockstep.harness.jsonout import check_document
from lockstep.harness.version import version


@dataclass
class CheckSession:
    golden: Path                          # the golden folder (args.golden)
    strict: bool
    specs: list                           # the selected specs
    errors: list                          # their spec errors
    rows: list = field(default_factory=list)          # the plan: [(spec, RunContext, golden folder)]
    outcomes: list = field(default_factory=list)
    stale: list[str] = field(default_factory=list)    # 'platform/spec id' of goldens whose spec is gone
    temps: list[str] = field(default_factory=list)    # debris of a killed golden write
    start: float = field(default_factory=time.perf_counter)

    def add(self, outcome) -> None:
        self.outcomes.append(outcome)

    def finish(self, stale: list[str], temps: list) -> None:
        """The goldens without a spec and the temporary files, found once every spec has run."""
        self.stale, self.temps = stale, [str(t) for t in temps]
        self.elapsed = time.perf_counter() - self.start

    def counts(self) -> dict[str, int]:
        return {s: sum(o.status == s for o in self.outcomes) for s in runner.STATUSES}

    def exit_code(self) -> int:
        """2 a spec error, 1 a failing outcome (or, with --strict, a stale golden or temporary file),
        3 a missing golden, 0 otherwise: in the order 2, 1, 4 (INCOMPARABLE), 3."""
        if self.errors:
            return EXIT_USAGE
        if (self.strict and (self.stale or self.temps)) or any(o.status in runner.FAILING for o in self.outcomes):
            return EXIT_MISMATCH
        if any(o.status == runner.INCOMPARABLE for o in self.outcomes):
            return EXIT_INCOMPARABLE
        if any(o.status == runner.MISSING for o in self.outcomes):
            return EXIT_MISSING
        return EXIT_OK

    # ------------------------------------------------------------ the two reports
    def json_document(self, ctx) -> str:
        return json.dumps(check_document(
            target=f"lockstep-{version()}", platform=ctx.platform.name, backend=ctx.backend,
            exit_code=self.exit_code(), pairs=list(dict.fromkeys(o.pair for o in self.outcomes)),
            seconds=self.elapsed, golden_folders=sorted({str(self.golden / o.golden_platform) for o in self.outcomes}),
            summary=self.counts() | {"spec_errors": len(self.errors), "stale_goldens": len(self.stale)},
            specs=[o.to_json() for o in self.outcomes], spec_errors=[str(e) for e in self.errors],
            stale_goldens=self.stale), indent=2)

    def text_report(self, ctx, explain_pass, debug: bool, explain: bool) -> str:
        """The details after the table: each failure (every spec with `explain`), the spec errors,
        the stale goldens and temporary files, and the summary line."""
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
        parts.append("\n" + self.summary(ctx))
        return "\n".join(parts)

    def summary(self, ctx) -> str:
        counts = self.counts()
        text = ", ".join(f"{n} {s}" for s, n in counts.items() if n or s == runner.PASS)
        extra = (f", {len(self.errors)} spec error(s)" if self.errors else "") + \
            (f", {len(self.stale)} stale golden(s)" if self.stale else "")
        n = len(self.outcomes)
        checks = f"{n} spec(s)" if n == len(self.specs) else f"{n} check(s) of {len(self.specs)} spec(s)"
        on = ran_on(self.rows) if self.rows else ctx.platform.name
        folders = golden_folders(self.golden, [o.golden_platform for o in self.outcomes])
        return f"{checks}: {text}{extra} in {self.elapsed:.1f}s, run on {on}; goldens: {folders}"

    def table(self) -> StatusTable:
        return StatusTable([s.id for s, _, _ in self.rows], [folder for _, _, folder in self.rows])
