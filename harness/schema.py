"""A small schema language for spec files, with errors that point at the YAML.

Each schema checks a value parsed by `yaml.safe_load` and returns it normalised (defaults
filled in). Problems are collected, not raised, so one pass reports every error of a spec:
each `Problem` names the field path, what was expected and what was found; `specfile`
turns the path into a file:line:column.

    Map({"seeds": Field(IntList(), required=True), "outputs": Field(List(Str(choices=...)))})
"""

from __future__ import annotations

import difflib
import math
from dataclasses import dataclass, field
from typing import Any

Path = tuple  # a field path: ("inputs", "seeds", 3)


@dataclass(frozen=True)
class Problem:
    path: Path
    message: str
    at_key: bool = False  # point at the mapping key rather than its value


def describe(value: Any) -> str:
    """How a parsed YAML value reads in an error: its YAML type and a short repr."""
    kind = {bool: "bool", int: "int", float: "float", str: "str", list: "list", dict: "mapping",
            type(None): "null"}.get(type(value), type(value).__name__)
    text = repr(value)
    if len(text) > 60:
        text = text[:57] + "..."
    return f"{kind} {text}" if value is not None else "null"


def did_you_mean(word: str, options) -> str:
    close = difflib.get_close_matches(word, sorted(options), n=1, cutoff=0.6)
    return f" (did you mean {close[0]!r}?)" if close else ""


class Schema:
    expected = "a value"

    def check(self, value: Any, path: Path, problems: list[Problem]) -> Any:
        raise NotImplementedError

    def _wrong(self, value, path, problems):
        problems.append(Problem(path, f"expected {self.expected}, found {describe(value)}"))
        return value


class Any_(Schema):
    expected = "any value"

    def check(self, value, path, problems):
        return value


class Bool(Schema):
    expected = "true or false"

    def check(self, value, path, problems):
        return value if isinstance(value, bool) else self._wrong(value, path, problems)


class Int(Schema):
    def __init__(self, min: int | None = None, max: int | None = None):
        self.min, self.max = min, max
        if (min, max) == (-(2**63), 2**63 - 1):
            self.expected = "an integer (int64)"
        else:
            bounds = [f">= {min}" if min is not None else "", f"<= {max}" if max is not None else ""]
            self.expected = "an integer" + (" " + " and ".join(b for b in bounds if b) if any(bounds) else "")

    def check(self, value, path, problems):
        if isinstance(value, bool) or not isinstance(value, int):
            return self._wrong(value, path, problems)
        if (self.min is not None and value < self.min) or (self.max is not None and value > self.max):
            return self._wrong(value, path, problems)
        return value


class Float(Schema):
    """A number, finite unless `allow_inf` (NaN never: a NaN bound or tolerance makes every
    comparison false, so an expectation would hold vacuously), within [min, max] when given."""

    def __init__(self, min: float | None = None, max: float | None = None, allow_inf: bool = False):
        self.min, self.max, self.allow_inf = min, max, allow_inf
        bounds = [f">= {min}" if min is not None else "", f"<= {max}" if max is not None else ""]
        finite = "" if allow_inf else "finite "
        self.expected = f"a {finite}number" + (" " + " and ".join(b for b in bounds if b) if any(bounds) else "")

    def check(self, value, path, problems):
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            return self._wrong(value, path, problems)
        try:
            number = float(value)
        except OverflowError:  # an int beyond the float range
            return self._wrong(value, path, problems)
        if math.isnan(number) or (math.isinf(number) and not self.allow_inf):
            return self._wrong(value, path, problems)
        if (self.min is not None and number < self.min) or (self.max is not None and number > self.max):
            return self._wrong(value, path, problems)
        return number


class Str(Schema):
    def __init__(self, choices=None, nonempty: bool = True):
        self.choices = tuple(choices) if choices else None
        self.nonempty = nonempty
        self.expected = f"one of {list(self.choices)}" if self.choices else "a non-empty string"

    def check(self, value, path, problems):
        if not isinstance(value, str) or (self.nonempty and not value.strip()):
            return self._wrong(value, path, problems)
        if self.choices and value not in self.choices:
            problems.append(Problem(path, f"expected {self.expected}, found {describe(value)}"
                                          f"{did_you_mean(value, self.choices)}"))
        return value


class List(Schema):
    def __init__(self, item: Schema, min_len: int = 0, max_len: int | None = None):
        self.item, self.min_len, self.max_len = item, min_len, max_len
        self.expected = f"a list of {item.expected}" + (f" with at least {min_len} items" if min_len else "")

    def check(self, value, path, problems):
        if not isinstance(value, list):
            return self._wrong(value, path, problems)
        if len(value) < self.min_len or (self.max_len is not None and len(value) > self.max_len):
            want = f"{self.min_len}..{self.max_len}" if self.max_len is not None else f">= {self.min_len}"
            problems.append(Problem(path, f"expected a list with {want} items, found {len(value)} items"))
        return [self.item.check(v, path + (i,), problems) for i, v in enumerate(value)]


@dataclass
class Field:
    schema: Schema
    required: bool = False
    default: Any = None
    doc: str = ""


@dataclass
class Map(Schema):
    fields: dict[str, Field] = field(default_factory=dict)

    @property
    def expected(self):  # type: ignore[override]
        return "a mapping"

    def check(self, value, path, problems):
        if not isinstance(value, dict):
            return self._wrong(value, path, problems)
        out = {}
        for key in value:
            if key not in self.fields:
                known = ", ".join(sorted(self.fields)) or "none"
                problems.append(Problem(path + (key,), f"unknown key {key!r}{did_you_mean(str(key), self.fields)}; "
                                                       f"known keys: {known}", at_key=True))
        for name, f in self.fields.items():
            if name in value:
                out[name] = f.schema.check(value[name], path + (name,), problems)
            elif f.required:
                problems.append(Problem(path, f"missing required key {name!r}" + (f" ({f.doc})" if f.doc else "")))
            else:
                out[name] = f.default() if callable(f.default) else f.default
        return out


class OneOf(Schema):
    """The first alternative that accepts the value wins; otherwise every alternative is named."""

    def __init__(self, *options: Schema):
        self.options = options
        self.expected = " or ".join(dict.fromkeys(o.expected for o in options))  # each wording once

    def check(self, value, path, problems):
        attempts = []
        for option in self.options:
            attempt: list[Problem] = []
            result = option.check(value, path, attempt)
            if not attempt:
                return result
            attempts.append((option, attempt))
        # Report the alternative of the value's own shape, with its detail (the element at fault).
        maps = [(o, a) for o, a in attempts if isinstance(o, Map)]
        lists = [a for o, a in attempts if isinstance(o, List)]
        if isinstance(value, dict) and maps:
            _, best = max(maps, key=lambda oa: len(set(value) & set(oa[0].fields)))
            problems.extend(best)
        elif isinstance(value, list) and len(lists) == 1:
            problems.extend(lists[0])
        else:
            self._wrong(value, path, problems)
        return value
