"""Spec files: YAML under `specs/`, loaded with safe_load semantics and line tracking.

A spec's id is its path below the specs directory without `.yaml`
(`specs/coins/verify-basic.yaml` → `coins/verify-basic`). Every error names the file, line
and column, the field path, what was expected and what was found:

    specs/coins/bad.yaml:4:10: inputs.seeds[2]: expected an integer, found str 'x'

Loading one spec never raises for a bad spec: `load_specs` returns the good specs and the
errors of the bad ones, so one bad file never hides the others. The loader is bounded (file
size, nesting depth, aliases, nodes after alias expansion: harness/limits.py), so no file can
make it hang, exhaust memory or overflow the stack.
"""

from __future__ import annotations

import copy
import fnmatch
import hashlib
import json
import re
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from lockstep.harness.limits import MAX_ALIASES, MAX_INT_CHARS, MAX_NESTING, MAX_YAML_NODES, MAX_SPEC_BYTES
from lockstep.harness.schema import Field, List, Map, Problem, Str, did_you_mean, describe

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
    sha256: str  # of the canonical JSON of the parsed document (what goldens recorded before 0.3 store)
    content_sha256: str = ""  # the same, less what no run reads (RUN_IGNORES): what new goldens store
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
# Tags a spec may hold: YAML's plain types. Timestamps, sets, binary and ordered pairs are refused
# (no spec field takes them, and a set would hash differently from run to run).
_PLAIN_TAGS = {f"tag:yaml.org,2002:{t}" for t in ("str", "int", "float", "bool", "null", "seq", "map")}
_MERGE_TAG = "tag:yaml.org,2002:merge"
_INT_TAG = "tag:yaml.org,2002:int"


class _Refused(Exception):
    """A document past one of the loader's limits, at a YAML mark."""

    def __init__(self, mark, message: str):
        super().__init__(message)
        self.mark, self.message = mark, message


class _BoundedLoader(yaml.SafeLoader):
    """yaml.SafeLoader that counts nesting depth and alias uses while it composes the document,
    so a deeply nested or alias-heavy file is refused before it costs time or memory."""

    def __init__(self, text: str):
        super().__init__(text)
        self.depth = 0
        self.aliases = 0

    # The scanner looks ahead over a whole run of opening brackets (each may start a simple key)
    # and over deeper and deeper indentation, at a cost quadratic in the depth: count both where
    # they start, so a file of 60 000 '[' is refused at the 33rd rather than after minutes.
    def fetch_flow_collection_start(self, TokenClass):
        if self.flow_level >= MAX_NESTING:
            raise _Refused(self.get_mark(), f"nested deeper than {MAX_NESTING} levels")
        super().fetch_flow_collection_start(TokenClass)

    def add_indent(self, column):
        if len(self.indents) >= MAX_NESTING:
            raise _Refused(self.get_mark(), f"nested deeper than {MAX_NESTING} levels")
        return super().add_indent(column)

    def compose_node(self, parent, index):
        event = self.peek_event()
        if isinstance(event, yaml.AliasEvent):
            self.aliases += 1
            if self.aliases > MAX_ALIASES:
                raise _Refused(event.start_mark, f"more than {MAX_ALIASES} aliases (*name): refused, as a "
                                                 "document that multiplies its size through aliases")
        self.depth += 1
        try:
            if self.depth > MAX_NESTING:
                raise _Refused(event.start_mark, f"nested deeper than {MAX_NESTING} levels")
            return super().compose_node(parent, index)
        finally:
            self.depth -= 1


def _children(node) -> list:
    if isinstance(node, yaml.MappingNode):
        return [n for pair in node.value for n in pair]
    if isinstance(node, yaml.SequenceNode):
        return list(node.value)
    return []


def _check_expansion(root) -> None:
    """Refuse a recursive alias, or a document of more than MAX_YAML_NODES nodes once every alias is
    expanded (what validation, hashing and the runner will walk). Iterative, memoised per node."""
    size: dict[int, int] = {}
    open_nodes: set[int] = set()  # nodes whose children are being expanded: meeting one again is a cycle
    stack = [(root, False)]
    while stack:
        node, children_done = stack.pop()
        if children_done:
            open_nodes.discard(id(node))
            size[id(node)] = 1 + sum(size[id(c)] for c in _children(node))
            if size[id(node)] > MAX_YAML_NODES:
                raise _Refused(node.start_mark, f"more than {MAX_YAML_NODES} values once its aliases are expanded")
            continue
        if id(node) in size:
            continue
        if id(node) in open_nodes:
            raise _Refused(node.start_mark, "a recursive alias (a node that contains itself)")
        open_nodes.add(id(node))
        stack.append((node, True))
        stack.extend((child, False) for child in _children(node))


def _short_tag(tag: str) -> str:
    return tag.replace("tag:yaml.org,2002:", "!!")


def _check_scalars(root) -> None:
    """Refuse the YAML types no spec uses, non-string mapping keys, and huge integer literals."""
    seen: set[int] = set()
    stack = [root]
    while stack:
        node = stack.pop()
        if id(node) in seen:
            continue
        seen.add(id(node))
        if node.tag not in _PLAIN_TAGS and node.tag != _MERGE_TAG:
            raise _Refused(node.start_mark, f"invalid YAML for a spec: type {_short_tag(node.tag)} is not used by "
                                            "specs (only strings, numbers, booleans, null, lists and mappings; "
                                            "quote the value for a string)")
        if node.tag == _INT_TAG and len(node.value) > MAX_INT_CHARS:
            raise _Refused(node.start_mark, f"an integer literal of {len(node.value)} characters "
                                            f"(at most {MAX_INT_CHARS})")
        if isinstance(node, yaml.MappingNode):
            for key, _ in node.value:
                if key.tag not in ("tag:yaml.org,2002:str", _MERGE_TAG):
                    raise _Refused(key.start_mark, f"mapping key {key.value!r} is not a string "
                                                   f"(YAML reads it as {_short_tag(key.tag)}); quote it")
        stack.extend(_children(node))


# Parsed YAML by the file's text, per process: a test process loads the repository's specs again
# for each in-process CLI call, and parsing (pure Python YAML) is most of loading (~0.6 s for the
# repository's specs). What is cached is a pure function of the text (the
# limits are constants); each hit is a deep copy, so no caller shares or edits the cached values;
# errors are not cached (they are raised afresh, naming the file).
_PARSED: dict[str, tuple[object, dict]] = {}
_PARSED_MAX = 512


def _parse(text: str, file: str) -> tuple[object, dict]:
    """safe_load the text within the limits; also return {field path: (line, column)} of every
    key and value."""
    hit = _PARSED.get(text)
    if hit is None:
        hit = _parse_text(text, file)
        if len(_PARSED) >= _PARSED_MAX:
            _PARSED.pop(next(iter(_PARSED)))           # the oldest: hostile-input tests parse thousands
        _PARSED[text] = hit
    return copy.deepcopy(hit[0]), dict(hit[1])


def parse_yaml(text: str, file: str) -> tuple[object, dict]:
    """Any YAML document Lockstep reads (spec files, expectations files), within the spec files'
    limits: (value, {field path: (line, column)}); SpecErrors, located, otherwise."""
    return _parse_text(text, file)


def _parse_text(text: str, file: str) -> tuple[object, dict]:
    marks: dict = {}
    loader = None
    try:
        loader = _BoundedLoader(text)
        node = loader.get_single_node()
        if node is None:
            return None, marks
        _check_expansion(node)
        _check_scalars(node)
        _walk(node, (), marks, file)
        return loader.construct_document(node), marks
    except _Refused as e:
        raise SpecErrors([SpecError(file, e.mark.line + 1, e.mark.column + 1, "", e.message)]) from None
    except yaml.MarkedYAMLError as e:
        mark = e.problem_mark or e.context_mark
        problem = " ".join(p for p in (e.context, e.problem) if p)
        raise SpecErrors([SpecError(file, mark.line + 1 if mark else 0, mark.column + 1 if mark else 0,
                                    "", f"invalid YAML: {problem}")]) from None
    except yaml.YAMLError as e:
        raise SpecErrors([SpecError(file, 0, 0, "", f"invalid YAML: {e}")]) from None
    except (ValueError, OverflowError) as e:  # a scalar the constructor cannot convert
        raise SpecErrors([SpecError(file, 0, 0, "", f"invalid YAML value: {e}")]) from None
    finally:
        if loader is not None:
            loader.dispose()


def _walk(node, path, marks, file):
    marks[path] = (node.start_mark.line + 1, node.start_mark.column + 1)
    if isinstance(node, yaml.MappingNode):
        seen = {}
        for key_node, value_node in node.value:
            key = key_node.value if isinstance(key_node, yaml.ScalarNode) else None
            if key in seen and key_node.tag != _MERGE_TAG:
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


@dataclass(frozen=True)
class SpecHeader:
    """What `lockstep list` shows of a spec: its common fields, read without the kind's schema
    (so without importing the kinds, torch and the engine)."""

    id: str
    file: Path
    kind: str
    description: str
    tags: tuple[str, ...]


def spec_id_for(file: Path, specs_dir: Path) -> str:
    rel = file.relative_to(specs_dir).with_suffix("")
    return rel.as_posix()


def check_spec_id(spec_id: str) -> str:
    parts = spec_id.split("/")
    if not spec_id or any(not _ID_PART.match(p) or p in (".", "..") for p in parts):
        raise ValueError(f"invalid spec id {spec_id!r}: each part of the path must match {_ID_PART.pattern}")
    return spec_id


def _document(text: str, file: str, spec_id: str) -> tuple[dict, dict]:
    """The parsed mapping of a spec file and its marks; SpecErrors for a bad id or document."""
    try:
        check_spec_id(spec_id)
    except ValueError as e:
        raise SpecErrors([SpecError(file, 0, 0, "", str(e))]) from None
    data, marks = _parse(text, file)
    if not isinstance(data, dict):
        raise SpecErrors([SpecError(file, 1, 1, "", f"expected a mapping with a 'kind' key, found {describe(data)}")])
    return data, marks


def parse_header(text: str, file: str, spec_id: str) -> SpecHeader:
    """The common fields of one spec (kind, description, tags), checked; the rest is not read."""
    data, marks = _document(text, file, spec_id)
    problems: list[Problem] = []
    clean = Map(COMMON_FIELDS).check({k: v for k, v in data.items() if k in COMMON_FIELDS}, (), problems)
    if problems:
        raise SpecErrors(_located(problems, marks, file))
    return SpecHeader(id=spec_id, file=Path(file), kind=clean["kind"], description=clean["description"],
                      tags=tuple(clean["tags"]))


def parse_spec(text: str, file: str, spec_id: str, root: Path | None = None) -> Spec:
    """Parse and validate one spec; raise SpecErrors listing every problem found. `root` is the
    project folder (the one holding specs/) that paths in the spec are relative to; without it,
    paths are checked as text only."""
    from lockstep.harness import kinds  # the kinds import torch and the engine: only full validation needs them

    data, marks = _document(text, file, spec_id)
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
    if not problems:
        problems.extend(_kind_rules(kind, clean, root))
    if problems:
        raise SpecErrors(_located(problems, marks, file))
    extra = {k: clean[k] for k in getattr(kind, "EXTRA_FIELDS", {})}
    lines = {path: mark[0] for path, mark in marks.items() if not (path and path[0] == "key")}
    return Spec(id=spec_id, file=Path(file), kind=kind_name, description=clean["description"],
                tags=tuple(clean["tags"]), inputs=clean["inputs"], expect=clean["expect"] or {},
                extra=extra, sha256=document_sha256(data), content_sha256=document_sha256(data, RUN_IGNORES),
                lines=lines)


# The fields no run reads: an edit to them alone leaves every golden of the spec current.
RUN_IGNORES = ("description",)


def document_sha256(data: dict, ignoring: tuple = ()) -> str:
    """sha256 of the parsed document's canonical JSON, less the top-level keys `ignoring`."""
    kept = {k: v for k, v in data.items() if k not in ignoring}
    return hashlib.sha256(json.dumps(kept, sort_keys=True, separators=(",", ":"), default=str).encode()).hexdigest()


def _kind_rules(kind, clean: dict, root: Path | None) -> list[Problem]:
    """The kind's cross-field rules. A validator that raises is a bug in lockstep, reported at the
    spec's kind rather than as a traceback that would stop every other spec from loading."""
    if not hasattr(kind, "validate"):
        return []
    try:
        return kind.validate(clean, root)
    except Exception as e:  # noqa: BLE001 - the boundary between one spec and all the others
        return [Problem(("kind",), f"the validator of kind {kind.NAME!r} failed on this spec "
                                   f"({type(e).__name__}: {e}); this is a bug in lockstep, please report it")]


def _read(file: Path, name: str) -> str:
    """The text of a spec file, refusing one larger than MAX_SPEC_BYTES before reading it whole."""
    from lockstep.harness.readers import ReadError, TooLarge, read_bytes

    try:
        raw = read_bytes(file, MAX_SPEC_BYTES, "spec file")     # refuses a FIFO or device unopened
    except TooLarge:
        raw = b" " * (MAX_SPEC_BYTES + 1)
    except ReadError as e:
        raise SpecErrors([SpecError(name, 0, 0, "", f"cannot read spec: {str(e).split(': ', 1)[-1]}")]) from None
    if len(raw) > MAX_SPEC_BYTES:
        raise SpecErrors([SpecError(name, 0, 0, "", f"larger than {MAX_SPEC_BYTES} bytes: refused (the largest "
                                                    "spec shipped is under 2 KB; generate long sequences with "
                                                    "arange or hashed)")])
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise SpecErrors([SpecError(name, 0, 0, "", f"cannot read spec: not UTF-8 ({e.reason} at byte "
                                                    f"{e.start})")]) from None


def load_spec_file(file: Path, specs_dir: Path, shown_as: str | None = None) -> Spec:
    """Load one spec; errors name the file as `shown_as` (default: the path as given)."""
    name = shown_as or str(file)
    return parse_spec(_read(file, name), name, spec_id_for(file, specs_dir), root=Path(specs_dir).resolve().parent)


def load_spec_header(file: Path, specs_dir: Path) -> SpecHeader:
    return parse_header(_read(file, str(file)), str(file), spec_id_for(file, specs_dir))


# --------------------------------------------------------------------------- the spec tree
def spec_files(specs_dir: Path) -> list[Path]:
    """Every spec file, sorted, so that every process (xdist workers too) sees one order."""
    return sorted(p for p in specs_dir.rglob("*" + SPEC_SUFFIX) if p.is_file())


def stray_files(specs_dir: Path) -> list[SpecError]:
    """Files under specs/ that look like specs but would be skipped, each an error."""
    return [e for e in map(stray_error, sorted(specs_dir.rglob("*"))) if e is not None]


def stray_error(p: Path) -> SpecError | None:
    """The error of a file that looks like a spec but would be skipped: another YAML suffix
    (`.yml`), a broken symbolic link, something that is not a regular file, or a symbolic link to a
    folder (whose specs the walk would skip); else None."""
    if p.suffix.lower() in (".yaml", ".yml") and p.suffix != SPEC_SUFFIX:
        return SpecError(str(p), 0, 0, "", f"spec files end in {SPEC_SUFFIX}: this file would be ignored; "
                                           f"rename it to {p.stem}{SPEC_SUFFIX}")
    if p.is_symlink() and p.is_dir():   # the walk does not follow it: say so rather than skip its specs
        return SpecError(str(p), 0, 0, "", "a symbolic link to a folder: the specs under it are not loaded (links "
                                           "are not followed); move or copy the folder into the spec directory")
    if p.suffix == SPEC_SUFFIX and not p.is_file():
        what = "a broken symbolic link" if p.is_symlink() and not p.exists() else "not a regular file"
        return SpecError(str(p), 0, 0, "", f"{what}: it cannot be read as a spec")
    return None


def _load_all(specs_dir: Path, load_one) -> tuple[list, list[SpecError]]:
    loaded, errors = [], stray_files(specs_dir)
    for file in spec_files(specs_dir):
        try:
            loaded.append(load_one(file, specs_dir))
        except SpecErrors as e:
            errors.extend(e.errors)
        except Exception as e:  # noqa: BLE001 - one file must never hide the others
            errors.append(SpecError(str(file), 0, 0, "", f"cannot load ({type(e).__name__}: {e}); this is a bug "
                                                         "in lockstep, please report it"))
    return loaded, errors


def load_specs(specs_dir: Path) -> tuple[list[Spec], list[SpecError]]:
    """Every valid spec, and the errors of the others (and of stray files)."""
    return _load_all(specs_dir, load_spec_file)


def load_headers(specs_dir: Path) -> tuple[list[SpecHeader], list[SpecError]]:
    """Every spec's header (kind, description, tags), and the errors found reading them."""
    return _load_all(specs_dir, load_spec_header)


def select(specs: list, patterns=(), tags=()) -> list:
    """Specs whose id matches any glob pattern (all when none) and that carry every tag."""
    chosen = []
    for spec in specs:
        if patterns and not any(fnmatch.fnmatchcase(spec.id, p) for p in patterns):
            continue
        if tags and not set(tags) <= set(spec.tags):
            continue
        chosen.append(spec)
    return chosen
