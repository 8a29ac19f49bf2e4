"""The trace file: a recorded run, one JSON record a line, hash-chained (DESIGN §10).

    {"kind": "manifest", "format": "lockstep-trace", "version": "1.0", ...}   what the bits depend on
    {"kind": "request", "index": 0, "prompt": [...], "sampling": {...}, "seed": 7, "rng": ..., ...}
    {"kind": "step", "request": 0, "step": 0, "token": 42, "logprob_bits": "c0a1b2c3", ...}
    {"kind": "round", "request": 0, "round": 1, "draft_tokens": [...], "accept_length": 2, ...}
    {"kind": "end", "records": N}

Every record carries `prev` (the previous record's `hash`; "" for the manifest) and `hash`:
sha256 over `prev` and the record's canonical JSON without `hash`. Editing one bit of any line,
dropping or reordering lines, or cutting the file short breaks the chain or loses the end record,
and `read_trace` refuses it naming the file and line. A trace of an unknown major version is
refused before anything else is read. The layout of each record kind is in README.md (section
"Replay traces"); `TRACE_VERSION`'s minor number grows when fields are added, the major number
when a reader of the old version would misread the file.

Floats: every float a verdict depends on is stored as its IEEE bits in hex (float32 for
logprobs and margins), beside a decimal copy for people; the bits are authoritative.
"""

from __future__ import annotations

import hashlib
import json
import os
import struct
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from lockstep.harness.readers import ReadError, Unreadable, json_value, read_bytes

FORMAT = "lockstep-trace"
TRACE_VERSION = "1.0"
MAJOR = 1
KINDS = ("manifest", "request", "step", "round", "end")
MAX_TRACE_BYTES = 1 << 30          # a bigger file is refused before it is read


class TraceError(ValueError):
    """A trace that cannot be used, with a one-line located message (the CLI exits 2)."""


# ---------------------------------------------------------------- float bits
def f32_bits(x: float) -> str:
    return struct.pack(">f", x).hex()


def f32_bits_all(xs) -> list[str]:
    """[f32_bits(x) for x in xs], from one struct.pack (a 64 x 1024 replay's verdicts read 65,536)."""
    h = struct.pack(f">{len(xs)}f", *xs).hex()
    return [h[j:j + 8] for j in range(0, len(h), 8)]


def f32_from_bits(h: str) -> float:
    return struct.unpack(">f", bytes.fromhex(h))[0]


def canonical(obj) -> bytes:
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), allow_nan=False).encode()


def record_hash(prev: str, record: dict) -> str:
    body = {k: v for k, v in record.items() if k != "hash"}
    return hashlib.sha256(prev.encode() + b"\n" + canonical(body)).hexdigest()


@dataclass
class Trace:
    """A trace in memory: the manifest, one dict per request, and per request its steps and rounds."""
    manifest: dict
    requests: list[dict]
    steps: list[list[dict]] = field(default_factory=list)     # [request][step]
    rounds: list[list[dict]] = field(default_factory=list)    # [request][round - 1], speculative only

    def records(self) -> list[dict]:
        out = [{"kind": "manifest", **self.manifest}]
        out += [{"kind": "request", **r} for r in self.requests]
        for i in range(len(self.requests)):
            out += [{"kind": "step", **s} for s in self.steps[i]]
            out += [{"kind": "round", **r} for r in (self.rounds[i] if self.rounds else [])]
        return out


def write_trace(trace: Trace, path: str | Path) -> Path:
    """Write `trace` to `path` atomically (a temporary file in the same folder, fsynced, renamed)."""
    path = Path(path)
    lines, prev = [], ""
    records = trace.records()
    records.append({"kind": "end", "records": len(records)})
    from lockstep.harness.jsonout import non_finite, where_in_trace
    for n, rec in enumerate(records, 1):
        for at, number in non_finite(rec):      # canonical JSON has no NaN: name it, not json's words
            raise TraceError(f"{path}: record {n} ({rec.get('kind')}){where_in_trace(rec)}: {at} is {number}; a "
                             f"trace holds finite numbers only (non-finite weights or logits?); nothing written")
        rec = {**rec, "prev": prev}
        rec["hash"] = prev = record_hash(prev, rec)
        lines.append(canonical(rec))
    payload = b"\n".join(lines) + b"\n"
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name + ".", suffix=".tmp-lockstep")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(payload)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    return path


def read_trace(path: str | Path) -> Trace:
    """Read and verify a trace file; any problem is a TraceError naming the file and line."""
    path = Path(path)
    try:
        raw = read_bytes(path, MAX_TRACE_BYTES, "trace file")       # bytes read, not st_size (a device has 0)
    except ReadError as e:
        raise TraceError(str(e)) from None
    lines = raw.split(b"\n")
    if lines and lines[-1] == b"":
        lines.pop()
    if not lines:
        raise TraceError(f"{path}: empty file, not a trace")
    prev, recs = "", []
    for n, line in enumerate(lines, 1):
        where = f"{path}:{n}"
        try:
            rec = json_value(line, where)
        except ReadError as e:
            if isinstance(e, Unreadable):
                raise TraceError(str(e)) from None
            raise TraceError(f"{where}: not a JSON record (the file is cut short or edited)") from None
        if not isinstance(rec, dict) or rec.get("kind") not in KINDS:
            raise TraceError(f"{where}: not a trace record (kind must be one of {', '.join(KINDS)})")
        if n == 1:
            _check_header(rec, where)
        elif rec["kind"] == "manifest":
            raise TraceError(f"{where}: a second manifest")
        if rec.get("prev") != prev:
            raise TraceError(f"{where}: hash chain broken (prev does not name line {n - 1}'s hash): "
                             f"lines were dropped, reordered or edited")
        if record_hash(prev, rec) != rec.get("hash"):
            raise TraceError(f"{where}: record hash mismatch: this line was edited")
        prev = rec["hash"]
        recs.append(rec)
    last = recs[-1]
    if last["kind"] != "end":
        raise TraceError(f"{path}:{len(recs)}: the trace has no end record: it was cut short")
    if last.get("records") != len(recs) - 1:
        raise TraceError(f"{path}:{len(recs)}: the end record counts {last.get('records')} records, "
                         f"the file has {len(recs) - 1}")
    return _assemble(path, recs[:-1])


def _check_header(rec: dict, where: str) -> None:
    if rec.get("kind") != "manifest" or rec.get("format") != FORMAT:
        raise TraceError(f"{where}: not a {FORMAT} file (its first record must be the manifest)")
    version = str(rec.get("version", ""))
    major = version.split(".")[0]
    if not major.isdigit():
        raise TraceError(f"{where}: trace version {version!r} is not MAJOR.MINOR")
    if int(major) != MAJOR:
        raise TraceError(f"{where}: trace format version {version} has major version {major}; this lockstep "
                         f"reads major version {MAJOR} only")


def _strip(rec: dict) -> dict:
    return {k: v for k, v in rec.items() if k not in ("kind", "prev", "hash")}


def _assemble(path: Path, recs: list[dict]) -> Trace:
    manifest = _strip(recs[0])
    n = manifest.get("requests")
    requests = [_strip(r) for r in recs if r["kind"] == "request"]
    if not isinstance(n, int) or len(requests) != n:
        raise TraceError(f"{path}: the manifest lists {n} requests, the file holds {len(requests)}")
    steps = [[] for _ in range(n)]
    rounds = [[] for _ in range(n)]
    for line, rec in enumerate(recs, 1):
        if rec["kind"] in ("step", "round"):
            i = rec.get("request")
            if not isinstance(i, int) or not 0 <= i < n:
                raise TraceError(f"{path}:{line}: request index {i!r} is outside [0, {n})")
            (steps if rec["kind"] == "step" else rounds)[i].append(_strip(rec))
    for i, req in enumerate(requests):
        if req.get("index") != i:
            raise TraceError(f"{path}: request record {i} carries index {req.get('index')!r}")
        if [s.get("step") for s in steps[i]] != list(range(len(steps[i]))):
            raise TraceError(f"{path}: request {i}'s steps are not numbered 0, 1, ...")
        if [r.get("round") for r in rounds[i]] != list(range(1, len(rounds[i]) + 1)):
            raise TraceError(f"{path}: request {i}'s verify rounds are not numbered 1, 2, ...")
        if len(steps[i]) != req.get("tokens"):
            raise TraceError(f"{path}: request {i} lists {req.get('tokens')} tokens, the file holds "
                             f"{len(steps[i])} steps")
    return Trace(manifest, requests, steps, rounds)
