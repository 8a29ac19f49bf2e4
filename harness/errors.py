"""The error boundary's vocabulary: usage errors, and one-line, located descriptions of exceptions.

Every entry point (the CLI's commands, a target's loading and running, the pytest plugin's hooks)
turns what goes wrong into one of two things: a `UsageError`, a mistake in what the user asked
for (one line naming it, exit 2; pytest's usage-error path in the plugin), or one `located` line
for a crash (its traceback only with --debug, or in pytest's own report).
"""

from __future__ import annotations

import errno
import os
import traceback
from pathlib import Path

PROJECT = Path(__file__).resolve().parent.parent


class UsageError(Exception):
    """A mistake in the command line, a setting or an input file: reported as one line, exit 2.
    `cause`: the exception behind it when that is someone's code crashing (a target's factory),
    whose traceback --debug shows."""

    def __init__(self, message: str, cause: BaseException | None = None):
        super().__init__(message)
        self.cause = cause


# A write that failed for the place written to, not for Lockstep: the disk is full or read-only.
_WRITE_ERRNOS = {errno.ENOSPC, errno.EROFS, errno.EDQUOT, errno.EFBIG}
_WRITE_WORDS = ("No space left on device", "Read-only file system", "Disk quota exceeded", "File too large")


def write_failure(e: BaseException) -> str | None:
    """`path: reason` when `e` is a write refused by the file system (ENOSPC, EROFS, EDQUOT, EFBIG;
    also as safetensors words it), else None."""
    if isinstance(e, OSError) and e.errno in _WRITE_ERRNOS:
        return f"{e.filename}: {e.strerror}" if e.filename else str(e.strerror or e)
    text = str(e)
    word = next((w for w in _WRITE_WORDS if w in text), None)
    return word if word is not None and not isinstance(e, OSError) else None


def where(e: BaseException) -> str:
    """`file:line in function` of the innermost frame, relative to the project ('' without a traceback)."""
    frames = traceback.extract_tb(e.__traceback__)
    if not frames:
        return ""
    f = frames[-1]
    name = os.path.relpath(f.filename, PROJECT) if f.filename.startswith(str(PROJECT) + os.sep) else f.filename
    return f"{name}:{f.lineno} in {f.name}"


def located(e: BaseException) -> str:
    """`Type: message (at file:line in function)`: the innermost frame, relative to the project."""
    text = f"{type(e).__name__}: {e}".strip().rstrip(":")
    at = where(e)
    return f"{text} (at {at})" if at else text


def full_traceback(e: BaseException) -> str:
    return "".join(traceback.format_exception(type(e), e, e.__traceback__)).rstrip()


def yaml_error(path, e: Exception) -> str:
    """`path:line:column: problem` for an error of yaml.safe_load on the file at `path` (PyYAML's own
    text names "<unicode string>" and takes seven lines)."""
    mark = getattr(e, "problem_mark", None) or getattr(e, "context_mark", None)
    problem = getattr(e, "problem", None) or str(e).splitlines()[0]
    at = f":{mark.line + 1}:{mark.column + 1}" if mark is not None else ""
    context, cmark = getattr(e, "context", None), getattr(e, "context_mark", None)
    if context and cmark is not None and cmark is not mark:
        problem += f" ({context} at line {cmark.line + 1}, column {cmark.column + 1})"
    return f"{path}{at}: malformed YAML: {problem}"


def check_output_file(path: Path, what: str) -> None:
    """Refuse, before any work runs, an output file that cannot be written: its folder missing or
    not a folder, the path itself a folder, or a folder we may not write in."""
    path = Path(path)
    folder = path.parent
    if path.is_dir():
        raise UsageError(f"{what} {path} is a directory; give a file path")
    if not folder.exists():
        raise UsageError(f"{what} {path}: the directory {folder} does not exist (create it first)")
    if not folder.is_dir():
        raise UsageError(f"{what} {path}: {folder} is not a directory")
    if not os.access(folder, os.W_OK | os.X_OK) or (path.exists() and not os.access(path, os.W_OK)):
        raise UsageError(f"{what} {path}: not writable")
