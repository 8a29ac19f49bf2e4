"""What moved between an old golden and a new recording, in the one sentence a reviewer needs:
whether tokens changed, the largest float move in ULPs, and which requests are affected.

Requests are read from tensor names `<name>_<i>` and from a `tokens` list in the data (one item a
request); a tensor without a request index is named instead."""

from __future__ import annotations

import re
from dataclasses import dataclass, field

_SUFFIX = re.compile(r"^(.*)_(\d+)$")


@dataclass
class Moved:
    tokens_changed: bool = False
    max_ulp: int = 0                                       # over float tensors whose bits moved
    floats: list[str] = field(default_factory=list)        # float tensors whose bits moved
    other: list[str] = field(default_factory=list)         # other tensors that moved (ints, shape, dtype, gone)
    requests: set[int] = field(default_factory=set)
    data_changed: bool = False

    def sentence(self) -> str:
        parts = ["tokens changed" if self.tokens_changed else "tokens unchanged"]
        if self.floats:
            parts.append(f"floats within {self.max_ulp} ULP ({_names(self.floats)})")
        else:
            parts.append("floats unchanged")
        if self.other:
            parts.append(f"also moved: {_names(self.other)}")
        if self.data_changed:
            parts.append("data changed")
        if self.requests:
            parts.append(f"{len(self.requests)} request(s) affected: {', '.join(map(str, sorted(self.requests)))}")
        return "; ".join(parts)

    def to_json(self) -> dict:
        return {"tokens_changed": self.tokens_changed, "max_ulp": self.max_ulp, "floats": self.floats,
                "other": self.other, "requests": sorted(self.requests), "data_changed": self.data_changed}


def _names(names: list[str], most: int = 4) -> str:
    return ", ".join(names[:most]) + (f" … ({len(names)} tensors)" if len(names) > most else "")


def moved(old_tensors: dict, new_tensors: dict, changes: list, old_data: dict, new_data: dict) -> Moved:
    """`changes`: harness.compare.diff_tensors(old, new); the data are the manifests' data."""
    out = Moved()
    for d in changes:
        m = _SUFFIX.match(d.name)
        base = m.group(1) if m else d.name
        if m:
            out.requests.add(int(m.group(2)))
        t = new_tensors.get(d.name, old_tensors.get(d.name))
        if base == "tokens" or base.startswith("tokens"):
            out.tokens_changed = True
        elif d.problem == "bits" and t is not None and t.dtype.is_floating_point:
            out.floats.append(d.name)
            out.max_ulp = max(out.max_ulp, int(d.max_ulp))
        else:
            out.other.append(d.name)
    if old_data != new_data:
        out.data_changed = True
        old_tokens, new_tokens = old_data.get("tokens"), new_data.get("tokens")
        if _per_request(old_tokens) and _per_request(new_tokens) and old_tokens != new_tokens:
            out.tokens_changed = True
            n = max(len(old_tokens), len(new_tokens))
            out.requests |= {i for i in range(n) if (old_tokens[i:i + 1] != new_tokens[i:i + 1])}
    return out


def _per_request(tokens) -> bool:
    return isinstance(tokens, list) and all(isinstance(t, list) for t in tokens)
