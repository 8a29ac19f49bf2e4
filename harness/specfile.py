"""Spec files: YAML under `specs/`, loaded with safe_load semantics and line tracking.

A spec's id is its path below the specs directory without `.yaml`
(`specs/coins/verify-basic.yaml` → `coins/verify-basic`). Every error names the file, line
and column, the field path, what was expected and what was found:

    specs/coins/bad.yaml:4:10: inputs.seeds[2]: expected an integer, found str 'x'

Loading one spec never raises for a bad spec: `load_specs` returns the good specs and the
errors of the bad ones, so one bad file never hides the others.
"""

from __future__ import annotations

import fnmatch
import hashlib
import json
import re
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from harness import kinds
from harness.schema import Field, List, Map, Problem, Str, did_you_mean, describe

SPEC_SUFFIX = ".yaml"
# Ids become paths below golden/: plain names only, no '..', no absolute paths.
_ID_PART = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")


@dataclass(frozen=True)
class SpecError:
    file: str
    line: int  # 1-based; 0 when unknown
    column: int
    path: str  # dotted field path, "" for the document
    message: str

    def __str__(self):
        where = f"{self.file}:{self.line}:{self.column}" if self.line else self.file
        return f"{where}: {self.path + ': ' if self.path else ''}{self.message}"


class SpecErrors(Exception):
    """All the errors of one spec file."""

    def __init__(self, errors: list[SpecError]):
        super().__init__("\n".join(map(str, errors)))
        self.errors = errors


@dataclass(frozen=True)
class Spec:
    id: str
    file: Path
    kind: str
    description: str
    tags: tuple[str, ...]
    inputs: dict
    expect: dict
    extra: dict  # the kind's own top-level fields
    sha256: str  # of the canonical JSON of the parsed document
    lines: dict = field(default_factory=dict, compare=False, repr=False)  # field path → line

    def line_of(self, *path) -> int:
        """The 1-based line of a field (or of the closest enclosing field that has one)."""
        while path and tuple(path) not in self.lines:
            path = path[:-1]
        return self.lines.get(tuple(path), 1)


def format_path(path) -> str:
    out = ""
    for part in path:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


# --------------------------------------------------------------------------- YAML with marks
def _parse(text: str, file: str) -> tuple[object, dict]:
    """safe_load the text; also return {field path: (line, column)} of every key and value."""
    marks: dict = {}
    loader = None
    try:
        loader = yaml.SafeLoader(text)
        node = loader.get_single_node()
        if node is None:
            return None, marks
        _walk(node, (), marks, file)
        return loader.construct_document(node), marks
    except yaml.MarkedYAMLError as e:
        mark = e.problem_mark or e.context_mark
        problem = " ".join(p for p in (e.context, e.problem) if p)
        raise SpecErrors([SpecError(file, mark.line + 1 if mark else 0, mark.column + 1 if mark else 0,
                                    "", f"invalid YAML: {problem}")]) from None
    except yaml.YAMLError as e:
        raise SpecErrors([SpecError(file, 0, 0, "", f"invalid YAML: {e}")]) from None
    finally:
        if loader is not None:
            loader.dispose()


def _walk(node, path, marks, file):
    marks[path] = (node.start_mark.line + 1, node.start_mark.column + 1)
    if isinstance(node, yaml.MappingNode):
        seen = {}
        for key_node, value_node in node.value:
            key = key_node.value if isinstance(key_node, yaml.ScalarNode) else None
            if key in seen and key_node.tag != "tag:yaml.org,2002:merge":
                raise SpecErrors([SpecError(file, key_node.start_mark.line + 1, key_node.start_mark.column + 1,
                                            format_path(path + (key,)),
                                            f"duplicate key {key!r} (first defined on line {seen[key]})")])
            seen[key] = key_node.start_mark.line + 1
            marks[("key",) + path + (key,)] = (key_node.start_mark.line + 1, key_node.start_mark.column + 1)
            _walk(value_node, path + (key,), marks, file)
    elif isinstance(node, yaml.SequenceNode):
        for i, item in enumerate(node.value):
            _walk(item, path + (i,), marks, file)


def _located(problems: list[Problem], marks: dict, file: str) -> list[SpecError]:
    errors = []
    for p in problems:
        path = p.path
        mark = marks.get(("key",) + path) if p.at_key else None
        while mark is None:
            mark = marks.get(path)
            if mark is None:
                path = path[:-1]
        errors.append(SpecError(file, mark[0], mark[1], format_path(p.path), p.message))
    return errors


# --------------------------------------------------------------------------- one spec
COMMON_FIELDS = {
    "kind": Field(Str(), required=True, doc="which runner executes the spec"),
    "description": Field(Str(), required=True, doc="what contract the spec pins, in a sentence"),
    "tags": Field(List(Str()), default=list),
}


def spec_id_for(file: Path, specs_dir: Path) -> str:
    rel = file.relative_to(specs_dir).with_suffix("")
    return rel.as_posix()


def check_spec_id(spec_id: str) -> str:
    parts = spec_id.split("/")
    if not spec_id or any(not _ID_PART.match(p) or p in (".", "..") for p in parts):
        raise ValueError(f"invalid spec id {spec_id!r}: each part of the path must match {_ID_PART.pattern}")
    return spec_id


def parse_spec(text: str, file: str, spec_id: str) -> Spec:
    """Parse and validate one spec; raise SpecErrors listing every problem found."""
    try:
        check_spec_id(spec_id)
    except ValueError as e:
        raise SpecErrors([SpecError(file, 0, 0, "", str(e))]) from None
    data, marks = _parse(text, file)
    if not isinstance(data, dict):
        raise SpecErrors([SpecError(file, 1, 1, "", f"expected a mapping with a 'kind' key, found {describe(data)}")])
    kind_name = data.get("kind")
    if not isinstance(kind_name, str) or kind_name not in kinds.KINDS:
        problems = [Problem(("kind",), "missing required key 'kind'")] if "kind" not in data else [
            Problem(("kind",), f"unknown spec kind {describe(kind_name)}"
                               f"{did_you_mean(str(kind_name), kinds.KINDS)}; known kinds: {', '.join(sorted(kinds.KINDS))}")]
        raise SpecErrors(_located(problems, marks, file))
    kind = kinds.KINDS[kind_name]
    schema = Map({**COMMON_FIELDS,
                  "inputs": Field(kind.INPUTS, required=True, doc="what the runner is given"),
                  "expect": Field(kind.EXPECT, default=dict, doc="what must hold besides the golden"),
                  **getattr(kind, "EXTRA_FIELDS", {})})
    problems: list[Problem] = []
    clean = schema.check(data, (), problems)
    if not problems and hasattr(kind, "validate"):
        problems.extend(kind.validate(clean))  # cross-field rules of the kind
    if problems:
        raise SpecErrors(_located(problems, marks, file))
    extra = {k: clean[k] for k in getattr(kind, "EXTRA_FIELDS", {})}
    canonical = json.dumps(data, sort_keys=True, separators=(",", ":"), default=str)
    lines = {path: mark[0] for path, mark in marks.items() if not (path and path[0] == "key")}
    return Spec(id=spec_id, file=Path(file), kind=kind_name, description=clean["description"],
                tags=tuple(clean["tags"]), inputs=clean["inputs"], expect=clean["expect"] or {},
                extra=extra, sha256=hashlib.sha256(canonical.encode()).hexdigest(), lines=lines)


def load_spec_file(file: Path, specs_dir: Path, shown_as: str | None = None) -> Spec:
    """Load one spec; errors name the file as `shown_as` (default: the path as given)."""
    name = shown_as or str(file)
    try:
        text = file.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise SpecErrors([SpecError(name, 0, 0, "", f"cannot read spec: {e}")]) from None
    return parse_spec(text, name, spec_id_for(file, specs_dir))


# --------------------------------------------------------------------------- the spec tree
def spec_files(specs_dir: Path) -> list[Path]:
    """Every spec file, sorted, so that every process (xdist workers too) sees one order."""
    return sorted(p for p in specs_dir.rglob("*" + SPEC_SUFFIX) if p.is_file())


def load_specs(specs_dir: Path) -> tuple[list[Spec], list[SpecError]]:
    specs, errors = [], []
    for file in spec_files(specs_dir):
        try:
            specs.append(load_spec_file(file, specs_dir))
        except SpecErrors as e:
            errors.extend(e.errors)
    return specs, errors


def select(specs: list[Spec], patterns=(), tags=()) -> list[Spec]:
    """Specs whose id matches any glob pattern (all when none) and that carry every tag."""
    chosen = []
    for spec in specs:
        if patterns and not any(fnmatch.fnmatchcase(spec.id, p) for p in patterns):
            continue
        if tags and not set(tags) <= set(spec.tags):
            continue
        chosen.append(spec)
    return chosen
