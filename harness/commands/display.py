"""What the spec commands print while they run: per-spec progress on stderr, `list`'s aligned
columns and `check`'s status table."""

from __future__ import annotations

import sys
import time

MAX_COLUMN = 48  # a column of `list` wider than this is cut with "…", so one long tag cannot push every line


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


def columns(rows: list[list[str]]) -> list[str]:
    """Rows of cells as aligned lines: each column as wide as its widest cell (after _cut); the
    last column is left as it is."""
    rows = [[_cut(c) for c in row[:-1]] + row[-1:] for row in rows]
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]) - 1)]
    return ["  ".join(c.ljust(w) for c, w in zip(row, widths)) + "  " + row[-1] for row in rows]


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


class TargetTable:
    """`check --target`'s table: each spec's status, whether its expectations say it fails, how it
    was compared (bitwise, tolerance, calibrated), and its time."""

    def __init__(self, ids: list[str], expected: dict):
        self.width, self.expected = max([len(i) for i in ids] + [4]), expected

    def header(self) -> str:
        return f"{'STATUS':<7} {'SPEC':<{self.width}}  {'EXPECTED':<8} {'HOW':<9} {'TIME':>7}"

    def outcome(self, o) -> str:
        exp = "fail" if o.spec.id in self.expected else ("" if o.status == "n/a" else "pass")
        return f"{o.status:<7} {o.spec.id:<{self.width}}  {exp:<8} {o.compare:<9} {o.seconds:6.2f}s"
