"""The last `check`'s failures, kept so that `check --failed` and `regen --failed` act on them.

The file is `.lockstep/last-check.json` in the golden folder's parent (the project root for the
default ./golden), git-ignored; it holds each failing or missing row as (spec id, dtype/backend
pair, status). Every `check` (and `diff`) over Lockstep's goldens rewrites it, a `--failed` run
included, so rerunning `check --failed` until it is green narrows to what still fails."""

from __future__ import annotations

import fnmatch
import json
import os
import sys
import tempfile
from datetime import datetime, timezone
from pathlib import Path

from lockstep.harness.errors import UsageError

FORMAT = 1
RERUN = ("mismatch", "failed", "crash", "corrupt", "stale", "missing")   # what --failed runs again


def state_file(golden: Path) -> Path:
    return Path(golden).absolute().parent / ".lockstep" / "last-check.json"


def record(golden: Path, outcomes) -> None:
    """Write the run's failing rows (atomically; a folder that cannot be written is skipped
    quietly: the state is a convenience, never a reason for check to fail)."""
    path = state_file(golden)
    rows = [{"id": o.spec.id, "pair": o.pair, "status": o.status, "golden_platform": o.golden_platform}
            for o in outcomes if o.status in RERUN]
    doc = {"format": FORMAT, "golden": str(Path(golden)), "written": datetime.now(timezone.utc).isoformat(
        timespec="seconds"), "failed": rows}
    try:
        path.parent.mkdir(exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name + ".", suffix=".tmp")
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump(doc, f, indent=1)
        os.replace(tmp, path)
    except OSError:
        pass


def failed(golden: Path) -> tuple[list[dict], str]:
    """The last check's failing rows and when it ran; a usage error when there is no such record."""
    path = state_file(golden)
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
        rows, when = doc["failed"], str(doc.get("written", "?"))
        if doc.get("format") != FORMAT or not all(isinstance(r, dict) and {"id", "pair"} <= set(r) for r in rows):
            raise ValueError("unexpected layout")
    except FileNotFoundError:
        raise UsageError(f"--failed: no earlier check recorded its failures in {path} (run `lockstep check` "
                         "first)") from None
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise UsageError(f"--failed: {path} cannot be read ({e}); run `lockstep check` again to rewrite it") from None
    return rows, when


def narrow(args) -> set[tuple[str, str]] | None:
    """With --failed: set args.patterns to the last check's failing specs (within the patterns
    given) and return the (spec id, pair) rows to run; None without --failed. An empty set means
    nothing failed last time."""
    if not getattr(args, "failed", False):
        return None

    rows, when = failed(args.golden)
    if args.patterns:
        rows = [r for r in rows if any(fnmatch.fnmatchcase(r["id"], p) for p in args.patterns)]
    known = {r["id"] for r in rows if (Path(args.specs) / f"{r['id']}.yaml").is_file()}
    args.patterns = sorted(known)
    print(f"--failed: {len(rows)} failing row(s) of the check at {when}"
          + (f" ({len(rows) - len([r for r in rows if r['id'] in known])} whose spec is gone left out)"
             if len(known) < len({r['id'] for r in rows}) else ""), file=sys.stderr, flush=True)
    return {(r["id"], r["pair"]) for r in rows if r["id"] in known}


def nothing_failed(args) -> int:
    """What a --failed run with nothing to run prints and exits with (0: nothing failed last time)."""
    print(f"--failed: the last check failed nothing{' matching the patterns' if args.patterns else ''}: "
          "nothing to run", file=sys.stderr)
    return 0


def keep(rows: list[tuple], wanted: set[tuple[str, str]] | None) -> list[tuple]:
    """The planned rows (spec, RunContext, folder) that --failed asks for (all without it)."""
    if wanted is None:
        return rows
    return [r for r in rows if (r[0].id, f"{r[1].platform.dtype}/{r[1].backend}") in wanted]
