"""Where the conformance suite lives, and checkpoints a run may read from outside it.

The suite is a folder holding `specs/`, `golden/` and `models/` (the specs name checkpoints
relative to it). `installed_root()` finds the one of this installation: $LOCKSTEP_SUITE if set,
else the folder above the `harness` package when it holds specs/ (a clone, installed editable or
not). `lockstep suite` prints it; `--suite DIR` (CLI) and `--lockstep-suite DIR` / ini
`lockstep_suite` (pytest) run the suite in DIR from any directory.

A spec names its checkpoints by a path relative to its suite, and a path that leaves the suite
(`..`, an absolute path, a symbolic link out of it) is refused. A checkpoint that lives elsewhere
(a real gpt-oss-20b on a data disk) is named explicitly by whoever runs the suite — never by the
spec: `--checkpoint-path models/gpt-oss-20b=/data/gpt-oss-20b` (CLI, repeatable), the pytest ini
`lockstep_checkpoints` (one `SPEC_PATH = DIR` a line, DIR relative to the ini file), or
$LOCKSTEP_CHECKPOINT_PATHS (`SPEC_PATH=DIR` pairs separated by the path separator). A spec path
so mapped resolves to that folder.
"""

from __future__ import annotations

import os
import posixpath
from pathlib import Path

_HERE = Path(__file__).resolve().parent.parent
_MAPPED: dict[str, Path] = {}


def installed_root() -> Path | None:
    env = os.environ.get("LOCKSTEP_SUITE")
    if env:
        return Path(env)
    return _HERE if (_HERE / "specs").is_dir() else None


def parse_mapping(text: str, base: Path | None = None) -> tuple[str, Path]:
    """'models/x=/data/x' -> ('models/x', Path('/data/x')); DIR relative to `base` when given."""
    spec_path, sep, folder = text.partition("=")
    spec_path, folder = spec_path.strip(), folder.strip()
    if not sep or not spec_path or not folder:
        raise ValueError(f"expected SPEC_PATH=DIR, got {text!r}")
    key = posixpath.normpath(spec_path)
    if posixpath.isabs(key) or key.split("/")[0] == "..":
        raise ValueError(f"{spec_path!r}: the spec path is relative to the suite and stays inside it")
    path = Path(folder).expanduser()
    if base is not None and not path.is_absolute():
        path = base / path
    return key, path


def map_checkpoints(pairs) -> None:
    """Add explicit (spec path, folder) mappings (the command line's, the ini file's)."""
    for key, path in pairs:
        _MAPPED[key] = Path(os.path.abspath(path))


def explicit_mappings() -> dict[str, Path]:
    """The mappings added by map_checkpoints (a `check -j N` worker starts with the parent's)."""
    return dict(_MAPPED)


def _from_env() -> dict[str, Path]:
    out = {}
    for item in filter(None, os.environ.get("LOCKSTEP_CHECKPOINT_PATHS", "").split(os.pathsep)):
        key, path = parse_mapping(item)
        out[key] = Path(os.path.abspath(path))
    return out


def mapped_checkpoint(relative: str) -> Path | None:
    """The folder a spec's checkpoint path is explicitly mapped to, or None."""
    key = posixpath.normpath(relative)
    return _MAPPED.get(key) or _from_env().get(key)
