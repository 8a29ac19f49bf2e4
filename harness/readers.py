"""The one way Lockstep reads a JSON, JSONL or YAML file a user hands it: bounded and located.

Every read refuses what is not a regular file (a FIFO would block, a device never ends) before
opening it, counts the bytes it actually reads (a device's st_size is 0) against a limit, and
parses with bounded nesting (json's decoder and every walk over the result recurse). Problems are
a `ReadError`, a ValueError whose text is one line naming the file (and line, and column where the
parser knows them); a command reports it as a usage error, exit 2.
"""

from __future__ import annotations

import json
import os
import stat
from collections.abc import Iterator
from pathlib import Path

from lockstep.harness.limits import MAX_JSON_NESTING

_KINDS = ((stat.S_ISFIFO, "a FIFO"), (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
          (stat.S_ISSOCK, "a socket"), (stat.S_ISDIR, "a folder"))


class ReadError(ValueError):
    """`path[:line[:column]]: what is wrong`, one line."""


class Unreadable(ReadError):
    """Parsed, but refused: nested too deep, or holding a non-finite number."""


class TooLarge(ReadError):
    """The file holds more bytes than the limit."""


def read_bytes(path: str | Path, limit: int, what: str = "file") -> bytes:
    """The bytes of the regular file at `path` (a link is followed), at most `limit` of them."""
    path = Path(path)
    try:
        st = os.stat(path)
    except FileNotFoundError:
        dangling = " (a dangling symbolic link)" if os.path.islink(path) else ""
        raise ReadError(f"{path}: no such {what}{dangling}") from None
    except OSError as e:
        raise ReadError(f"{path}: cannot be read ({e.strerror or e})") from None
    _regular(path, st.st_mode, what)
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))   # never wait on a FIFO swapped in
        with os.fdopen(fd, "rb") as f:
            _regular(path, os.fstat(f.fileno()).st_mode, what)
            raw = f.read(limit + 1)
    except OSError as e:
        raise ReadError(f"{path}: cannot be read ({e.strerror or e})") from None
    if len(raw) > limit:
        raise TooLarge(f"{path}: larger than {limit} bytes; refused")
    return raw


def _regular(path: Path, mode: int, what: str) -> None:
    if not stat.S_ISREG(mode):
        kind = next((name for test, name in _KINDS if test(mode)), "not a regular file")
        raise ReadError(f"{path}: {kind}, not a regular {what}: refused")


def read_text(path: str | Path, limit: int, what: str = "file") -> str:
    raw = read_bytes(path, limit, what)
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ReadError(f"{path}: not UTF-8 text ({e.reason} at byte {e.start})") from None


def json_value(text: str | bytes, where: str, depth: int = MAX_JSON_NESTING):
    """One JSON value, nested at most `depth` levels; problems name `where` (path or path:line)."""
    try:
        value = json.loads(text)
    except RecursionError:
        raise Unreadable(f"{where}: nested deeper than {depth} levels: refused") from None
    except (ValueError, UnicodeDecodeError) as e:
        at = f" (line {e.lineno}, column {e.colno})" if isinstance(e, json.JSONDecodeError) and "\n" in str(text) else ""
        raise ReadError(f"{where}: not JSON{at}: {getattr(e, 'msg', None) or e}") from None
    if nesting(value) > depth:
        raise Unreadable(f"{where}: nested deeper than {depth} levels: refused")
    from lockstep.harness.jsonout import non_finite, where_in_trace
    for at, number in non_finite(value):
        raise Unreadable(f"{where}: {at or 'the value'}{where_in_trace(value)} is {number}, not a finite number "
                        f"(JSON has no NaN or infinity): refused")
    return value


def nesting(value) -> int:
    """How deep lists and objects nest in a parsed JSON/YAML value (a scalar: 0); iterative."""
    deepest, todo = 0, [(value, 1)]
    while todo:
        v, d = todo.pop()
        if isinstance(v, dict):
            items = v.values()
        elif isinstance(v, list):
            items = v
        else:
            continue
        deepest = max(deepest, d)
        todo.extend((x, d + 1) for x in items)
    return deepest


def load_json(path: str | Path, limit: int, what: str = "JSON file"):
    return json_value(read_text(path, limit, what), str(path))


def jsonl_lines(path: str | Path, limit: int, what: str = "JSONL file") -> Iterator[tuple[int, object]]:
    """(line number, value) of every non-blank line."""
    for n, line in enumerate(read_text(path, limit, what).splitlines(), 1):
        if line.strip():
            yield n, json_value(line, f"{path}:{n}")
