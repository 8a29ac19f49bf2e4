"""Expectations files: which specs fail on a target, for which of its versions, and why.

    target: myengine
    versions: ">=0.3,<0.4"        # a PEP 440 specifier set (or `version: 0.3.1`, that one only)
    failures:
      layer_ids/error-count:
        observed: the resolver accepted the ids (boundaries [24, 30, 36]); the spec expects an error
        judgement: peer bug       # peer bug | contract gap | unjudged (written by `lockstep expectations`)
        why: no check of the id count against the draft's fc width

A file applies to a target when `target` is its name and its version lies in `versions` (pre-
and dev releases included: 0.3.2.dev4+g1a2b3c is in >=0.3,<0.4). Anything wrong with a file is an
`ExpectationsError` naming the file and line: a user error, never an internal one.

Which file a run uses: the one given explicitly (`--expectations FILE`, the pytest option
`--lockstep-expectations` or ini `lockstep_expectations`), else the target's own
`Target.expectations`, else the shipped file under harness/targets/expectations/ that applies
(`<name>-<version>.yaml` first, then any whose range holds the version). None: no failure expected.
"""

from __future__ import annotations

import os
import re
import tempfile
from pathlib import Path

import yaml
from packaging.specifiers import InvalidSpecifier, SpecifierSet
from packaging.version import InvalidVersion, Version

from lockstep.harness.limits import MAX_EXPECTATIONS_BYTES
from lockstep.harness.readers import ReadError, read_text
from lockstep.harness import specfile
from lockstep.harness.specfile import SpecErrors

JUDGEMENTS = ("peer bug", "contract gap", "unjudged")
SHIPPED = Path(__file__).parent / "expectations"


class ExpectationsError(ValueError):
    """A bad or inapplicable expectations file: `path:line: what`."""


def _compose(path: Path) -> tuple[object, dict]:
    """The file's value and {field path: (line, column)}: read bounded (harness/readers.py), a
    duplicate key refused where it is, as in spec files."""

    try:
        doc, marks = specfile.parse_yaml(read_text(path, MAX_EXPECTATIONS_BYTES, "expectations file"), str(path))
    except ReadError as e:
        raise ExpectationsError(str(e)) from None
    except SpecErrors as e:
        err = e.errors[0]
        at = f":{err.line}:{err.column}" if err.line else ""
        raise ExpectationsError(f"{err.file}{at}: {err.path + ': ' if err.path else ''}{err.message}") from None
    return ({} if doc is None else doc), marks


def _line(marks: dict, *keys) -> int:
    """1-based line of the last of `keys` (the nearest one found)."""
    for n in range(len(keys), 0, -1):
        at = marks.get(("key",) + keys[:n]) or marks.get(keys[:n])
        if at:
            return at[0]
    return 1


# Each top-level key and entry key with the type its value must have.
_TOP = {"target": (str,), "versions": (str,), "version": (str, int, float), "failures": (object,)}          # its shape: checked in load()
_ENTRY = {"observed": (str,), "judgement": (str,), "why": (str, type(None))}


def _types(path: Path, marks: dict, doc: dict) -> None:
    """Refuse an unknown key or a value of the wrong type, naming its line."""
    for key, value in doc.items():
        _typed(path, marks, (key,), value, _TOP)
    failures = doc.get("failures")
    for sid, entry in (failures.items() if isinstance(failures, dict) else ()):
        if not isinstance(sid, str):
            raise ExpectationsError(f"{path}:{_line(marks, 'failures', sid)}: a spec id is a string, got {sid!r}")
        if isinstance(entry, dict):
            for key, value in entry.items():
                _typed(path, marks, ("failures", sid, key), value, _ENTRY)


def _typed(path: Path, marks: dict, keys: tuple, value, allowed: dict) -> None:
    key = keys[-1]
    if key not in allowed:
        raise ExpectationsError(f"{path}:{_line(marks, *keys)}: unknown key {key!r} (known: {', '.join(allowed)})")
    if isinstance(value, bool) or not isinstance(value, allowed[key]):
        want = " or ".join("null" if t is type(None) else {"str": "a string"}.get(t.__name__, "a number")
                           for t in allowed[key])
        raise ExpectationsError(f"{path}:{_line(marks, *keys)}: {'.'.join(map(str, keys))} must be {want}, "
                                f"got {type(value).__name__} {value!r:.60}")


def version_range(doc: dict):
    """The file's versions as a packaging SpecifierSet (an exact `version` is `==version`)."""

    if doc.get("versions") is not None:
        try:
            return SpecifierSet(str(doc["versions"]))
        except InvalidSpecifier:
            raise ValueError(f"versions {doc['versions']!r} is not a PEP 440 specifier set (e.g. '>=0.3,<0.4')")
    if doc.get("version") is not None:
        return SpecifierSet(f"=={doc['version']}")
    raise ValueError("names no 'versions' (a PEP 440 range such as '>=0.3,<0.4') or 'version'")


def applies(doc: dict, name: str, version: str) -> bool:
    if doc.get("target") != name:
        return False
    if doc.get("versions") is None and doc.get("version") is not None and str(doc["version"]) == version:
        return True                         # an exact version holds itself, PEP 440 or not
    spec = version_range(doc)
    try:
        return spec.contains(Version(version), prereleases=True)
    except InvalidVersion:                  # not PEP 440: only the exact match above can hold it
        return False


def load(path: Path, name: str, version: str) -> dict:
    """The failures of `path` for target `name` at `version`; ExpectationsError otherwise."""
    path = Path(path)
    doc, root = _compose(path)
    if not isinstance(doc, dict):
        raise ExpectationsError(f"{path}:1: expected a mapping with target, versions and failures")
    _types(path, root, doc)
    try:
        ok = applies(doc, name, version)
    except ValueError as e:
        raise ExpectationsError(f"{path}:{_line(root, 'versions') if 'versions' in doc else _line(root, 'version')}: "
                                f"{e}") from None
    if not ok:
        shown = doc.get("versions") if doc.get("versions") is not None else doc.get("version")
        raise ExpectationsError(f"{path}:{_line(root, 'target')}: is for {doc.get('target')} {shown}, not "
                                f"{name} {version} (widen its 'versions' range, or pass another --expectations)")
    failures = doc.get("failures") or {}
    if not isinstance(failures, dict):
        raise ExpectationsError(f"{path}:{_line(root, 'failures')}: 'failures' must map spec ids to entries")
    for sid, entry in failures.items():
        where = f"{path}:{_line(root, 'failures', sid)}: {sid}"
        if not isinstance(entry, dict):
            raise ExpectationsError(f"{where}: expected observed, judgement and why")
        for key in ("observed", "judgement"):
            if not entry.get(key):
                raise ExpectationsError(f"{where}: missing {key!r}")
        if entry["judgement"] not in JUDGEMENTS:
            raise ExpectationsError(f"{path}:{_line(root, 'failures', sid, 'judgement')}: {sid}: judgement "
                                    f"{entry['judgement']!r} is not one of {', '.join(JUDGEMENTS)}")
        if entry["judgement"] != "unjudged" and not entry.get("why"):
            raise ExpectationsError(f"{where}: missing 'why' (one line: why it fails)")
        entry.setdefault("why", "")
    return failures


def find(name: str, version: str, own: str | None = None, explicit: Path | None = None) -> Path | None:
    """The expectations file a run of target `name` at `version` uses (see the module docstring)."""
    if explicit is not None:
        if not Path(explicit).is_file():
            raise ExpectationsError(f"--expectations {explicit}: no such file")
        return Path(explicit)
    if own:
        return Path(own)
    exact = SHIPPED / f"{name}-{version}.yaml"
    if exact.is_file():
        return exact
    for path in sorted(SHIPPED.glob(f"{name}-*.yaml")):
        doc, _ = _compose(path)
        try:
            if applies(doc, name, version):
                return path
        except ValueError:
            continue
    return None


# A failure's first line is its cause (judge, class, request, step) and, after DETAIL, its numbers.
# Two failures are the same when their causes are, with every float masked: an engine that is not
# bitwise run to run keeps matching its expectations (DESIGN §11).
DETAIL = " — "
_FLOAT = re.compile(r"[-+]?(?:\d+\.\d*|\.\d+|\d+(?=[eE][-+]?\d))(?:[eE][-+]?\d+)?|\b(?:nan|inf)\b")


def signature(text: str) -> str:
    """What an expectation is matched by: the cause before DETAIL, floats masked (ids, indices,
    requests and steps are kept: they are the location)."""
    return _FLOAT.sub("…", str(text).split(DETAIL)[0]).strip()


def same(observed: str, message: str) -> bool:
    return signature(observed) == signature(message)


def write(path: Path, name: str, version: str, versions: str | None, outcomes, previous: dict) -> int:
    """Write the observed failures of `outcomes` into an expectations file for review, merged with
    `previous`: entries of specs this run did not include are kept as they were; each new or
    changed failure is `unjudged`; one that fails as `previous` recorded (`same`) keeps its
    judgement and why. Returns how many entries are unjudged. Written atomically."""

    ran = {o.spec.id for o in outcomes}
    failures = {sid: dict(e) for sid, e in previous.items() if sid not in ran}
    unjudged = sum(e["judgement"] == "unjudged" for e in failures.values())
    for o in outcomes:
        if o.status != "fail":
            continue
        was = previous.get(o.spec.id)
        if was and same(was["observed"], o.message) and was["judgement"] != "unjudged":
            failures[o.spec.id] = {"observed": o.message, "judgement": was["judgement"], "why": was["why"]}
        else:
            failures[o.spec.id] = {"observed": o.message, "judgement": "unjudged", "why": ""}
            unjudged += 1
    doc = {"target": name, "versions": versions or f"=={version}", "failures": failures}
    head = ("# Specs that fail on this target, written by `lockstep expectations` from observed results.\n"
            "# Review each `unjudged` entry: judge it `peer bug` or `contract gap` and say why in one line.\n")
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(head + yaml.safe_dump(doc, sort_keys=False, allow_unicode=True, width=100))
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return unjudged


_FAIL, _PASS = "fail", "pass"      # a target outcome's statuses (harness/targets/judge.py)


def verdict(outcome, want: dict | None) -> str | None:
    """How one outcome differs from its expectation (`want`: its entry in the expectations file,
    or None), or None when it matches. The CLI (`compare`) and the pytest plugin share this."""
    o = outcome
    if o.status == _FAIL and want is None:
        return f"NEW FAILURE {o.spec.id}: {o.message}"
    if o.status == _FAIL and not same(want["observed"], o.message):
        return f"FAILS DIFFERENTLY {o.spec.id}: {o.message}\n    expected: {want['observed']}"
    if o.status != _FAIL and want is not None:
        what = "now passes" if o.status == _PASS else f"is now n/a ({o.message})"
        return f"EXPECTED FAILURE {what}: {o.spec.id} (remove it from the expectations)"
    return None


def compare(outcomes, expected: dict) -> list[str]:
    """Differences between the outcomes and the expectations (empty: they match exactly).
    Entries for specs that did not run (not selected, or in another spec directory) are not
    differences: `unrun` lists them, and the CLI warns."""
    return [p for p in (verdict(o, expected.get(o.spec.id)) for o in outcomes) if p]


def unrun(outcomes, expected: dict) -> list[str]:
    """Expected failures of specs this run did not include."""
    return sorted(set(expected) - {o.spec.id for o in outcomes})
