"""One-line, located descriptions of exceptions, for reports and the CLI's error boundary."""

from __future__ import annotations

import os
import traceback
from pathlib import Path

PROJECT = Path(__file__).resolve().parent.parent


class UsageError(Exception):
    """Bad input from the user (exit 2); harness.cli re-exports it."""


def located(e: BaseException) -> str:
    """`Type: message (at file:line in function)`: the innermost frame, relative to the project."""
    text = f"{type(e).__name__}: {e}".strip().rstrip(":")
    frames = traceback.extract_tb(e.__traceback__)
    if not frames:
        return text
    f = frames[-1]
    name = os.path.relpath(f.filename, PROJECT) if f.filename.startswith(str(PROJECT) + os.sep) else f.filename
    return f"{text} (at {name}:{f.lineno} in {f.name})"


def full_traceback(e: BaseException) -> str:
    return "".join(traceback.format_exception(type(e), e, e.__traceback__)).rstrip()
