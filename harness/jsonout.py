"""The documents `--json` prints, in one place, each with a `schema_version`.

The schemas are docs/schemas/*.schema.json (JSON Schema draft 2020-12); tests/test_json_schemas.py
validates real outputs against them. `schema_version` changes only when a field is removed or
changes meaning; new fields may appear without a bump (the schemas allow extra properties).

`check` prints one shape with or without `--target`: `target` is `lockstep-<version>` for
Lockstep's own engine, and `expectation_problems` is empty there (the default target has none).
"""

from __future__ import annotations

from contextlib import contextmanager

SCHEMA_VERSION = 1

# While a --json command runs (harness.cli), sys.stdout is stderr, so that nothing but the document
# reaches stdout (a plugin's or a target's print); `emit` writes the document to the real stdout.
_document_out = None


def non_finite(value, path: str = ""):
    """(path, number) of each NaN or infinity in a JSON-like value, in document order (iterative):
    JSON has none, so whoever meets one names where it is."""
    import math
    todo = [(path, value)]
    while todo:
        at, v = todo.pop()
        if isinstance(v, float) and not math.isfinite(v):
            yield at, v
        elif isinstance(v, dict):
            todo.extend(reversed([(f"{at}.{k}" if at else str(k), x) for k, x in v.items()]))
        elif isinstance(v, (list, tuple)):
            todo.extend(reversed([(f"{at}[{i}]", x) for i, x in enumerate(v)]))


def where_in_trace(record) -> str:
    """`request R, step S` (or round) of a trace record, '' for others."""
    if not isinstance(record, dict):
        return ""
    parts = [f"{k} {record[k]}" for k in ("request", "step", "round") if isinstance(record.get(k), int)]
    return f" ({', '.join(parts)})" if parts else ""


def emit(text: str) -> None:
    """Print a --json document on the real stdout."""
    import sys
    print(text, file=_document_out or sys.stdout, flush=True)


@contextmanager
def documents_only():
    """Within: sys.stdout is stderr; `emit` alone writes to the real stdout."""
    import sys
    global _document_out
    saved, _document_out = _document_out, sys.stdout
    sys.stdout = sys.stderr
    try:
        yield
    finally:
        sys.stdout, _document_out = _document_out, saved


def _header(command: str) -> dict:
    from lockstep.harness.version import version
    return {"schema_version": SCHEMA_VERSION, "command": command, "lockstep_version": version()}


def check_document(*, target: str, platform: str, backend: str, exit_code: int, seconds: float,
                   summary: dict, specs: list[dict], spec_errors: list[str], stale_goldens: list[str] = (),
                   golden_folders: list[str] = (), expectation_problems: list[str] = (),
                   expectations_file: str | None = None, pairs: list[str] = (), compile: dict | None = None) -> dict:
    """`compile`: Triton's compile figures of Lockstep's own runs (CheckSession.compile_figures)."""
    return _header("check") | {
        "target": target, "platform": platform, "backend": backend, "exit_code": exit_code,
        "seconds": round(seconds, 3), "summary": summary, "specs": specs, "spec_errors": list(spec_errors),
        "stale_goldens": list(stale_goldens), "golden_folders": list(golden_folders),
        "expectations_file": expectations_file, "expectation_problems": list(expectation_problems),
        "pairs": list(pairs)} | ({"compile": compile} if compile is not None else {})


def generate_document(*, checkpoint: str, checkpoint_digest: str, platform: str, backend: str,
                      results: list[dict]) -> dict:
    return _header("generate") | {"checkpoint": checkpoint, "checkpoint_digest": checkpoint_digest,
                                  "platform": platform, "backend": backend, "results": results}


def report_document(matrix: dict) -> dict:
    """No lockstep_version here: the committed docs/conformance.json would change with every release."""
    return {"schema_version": SCHEMA_VERSION, "command": "report"} | matrix


def show_document(*, goldens: list[dict]) -> dict:
    return _header("show") | {"goldens": goldens}


def replay_document(command: str, report: dict) -> dict:
    """`replay --json` and `import-peer --json`: the report with the header (both carry `ok`)."""
    return _header(command) | report


def list_document(*, specs: list[dict], spec_errors: list[str]) -> dict:
    return _header("list") | {"specs": specs, "spec_errors": list(spec_errors)}


def validate_document(*, valid: list[str], invalid_files: int, spec_errors: list[str]) -> dict:
    return _header("validate") | {"valid": valid, "invalid_files": invalid_files, "spec_errors": list(spec_errors)}


def regen_document(*, dry_run: bool, exit_code: int, summary: dict, goldens: list[dict], spec_errors: list[str],
                   stale_goldens: list[str], removed_temps: list[str]) -> dict:
    return _header("regen") | {"dry_run": dry_run, "exit_code": exit_code, "summary": summary, "goldens": goldens,
                               "spec_errors": list(spec_errors), "stale_goldens": list(stale_goldens),
                               "removed_temps": list(removed_temps)}


def tool_document(command: str, ok: bool, **fields) -> dict:
    """The documents of suite, doctor, make-checkpoint, diff-driver, record and promote: the header,
    `ok` (the command did what it was asked; the exit code is 0 exactly then), and their fields
    (docs/schemas/COMMAND.schema.json)."""
    return _header(command) | {"ok": ok} | fields


def print_document(doc: dict) -> None:
    import json
    emit(json.dumps(doc, indent=2))
