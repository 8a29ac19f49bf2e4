"""`lockstep promote TRACE SPEC_ID`: a trace (or some of its requests) becomes a `generate` spec.

The spec holds the trace's requests (prompt ids written out, full sampling parameters, seeds),
checkpoint, schedule, draft and speculative settings, and expects the recorded finish reasons
and last tokens, reproducibility and batch invariance; when the trace was recorded at a tp × ep
topology, that topology must reproduce the one-device bits. Promote first replays the trace
here (free-run) and refuses one that does not replay bitwise, so the golden that
`lockstep regen SPEC_ID` then records (two identical runs) pins the trace's own bits. Promote
writes a spec, never a golden; the spec is written atomically and never over an existing file.
"""

from __future__ import annotations

import os
import re
import tempfile
from pathlib import Path

import yaml

from lockstep.harness.replay.format import Trace, TraceError
from lockstep.harness.replay.run import ROOT

SPEC_ID = re.compile(r"^[a-z0-9][a-z0-9_-]*(/[a-z0-9][a-z0-9_-]*)*$")


def spec_document(trace: Trace, requests: list[int], description: str | None) -> dict:
    m = trace.manifest
    ref = m["checkpoint"]["ref"]
    if "path" in ref and Path(ref["path"]).is_absolute():
        raise TraceError(f"the trace's checkpoint {ref['path']} is outside the project; a spec can only name "
                         f"a checkpoint inside it (or a preset)")
    s = m["settings"]
    reqs = []
    for i in requests:
        r = trace.requests[i]
        sampling = {k: v for k, v in r["sampling"].items() if v is not None}
        item = {"prompt": list(r["prompt"]), "sampling": sampling}
        if r["seed"] is not None:
            item["seed"] = r["seed"]
        reqs.append(item)
    inputs = {"checkpoint": ref, "requests": reqs, "schedule": {"max_batch": s["max_batch"]}}
    if s.get("prefill_chunk"):
        inputs["schedule"]["prefill_chunk"] = s["prefill_chunk"]
    if (s["tp"], s["ep"]) != (1, 1):
        inputs["topologies"] = [[s["tp"], s["ep"]]]
    if m.get("draft"):
        inputs["draft"] = m["draft"]["ref"]
        inputs["speculative"] = dict(m["speculative"])
    expect = {"finish_reasons": [trace.requests[i]["finish_reason"] for i in requests],
              "last_tokens": [trace.steps[i][-1]["token"] for i in requests],
              "reproducible": True, "batch_invariant": len(requests) > 1}
    text = description or (f"Promoted from a replay trace recorded by {m['engine'].get('name')} "
                           f"{m['engine'].get('revision')} on {m['platform']['name']} "
                           f"(checkpoint sha256 {m['checkpoint']['sha256'][:16]}...).")
    return {"kind": "generate", "description": text, "tags": ["replay", "promoted"], "inputs": inputs,
            "expect": expect}


def promote(trace: Trace, spec_id: str, requests: list[int] | None = None, description: str | None = None,
            specs_dir: Path | None = None, check: bool = True) -> Path:
    from lockstep.harness.replay.replay import replay

    if not SPEC_ID.match(spec_id):
        raise TraceError(f"spec id {spec_id!r}: use lowercase words, digits, '-' and '_' joined by '/'")
    n = len(trace.requests)
    requests = list(range(n)) if requests is None else list(requests)
    if not requests or any(not 0 <= i < n for i in requests) or len(set(requests)) != len(requests):
        raise TraceError(f"--requests must name distinct request indices in [0, {n})")
    doc = spec_document(trace, requests, description)
    specs_dir = specs_dir or ROOT / "specs"
    path = specs_dir / (spec_id + ".yaml")
    if path.exists():
        raise TraceError(f"{path} exists; choose another spec id")
    if check:
        report = replay(trace, "free-run", locate_first=False)
        if not report.bitwise:
            f = report.first
            raise TraceError(f"the trace does not replay bitwise here (request {f.request}, step {f.step}: "
                             f"{f.status}); a spec would pin other bits than the trace's")
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name + ".", suffix=".tmp-lockstep")
    try:
        with os.fdopen(fd, "w") as f:
            yaml.safe_dump(doc, f, sort_keys=False, default_flow_style=None, width=100)
        os.chmod(tmp, 0o644)
        os.link(tmp, path)                      # never over an existing file, even one made meanwhile
    except FileExistsError:
        raise TraceError(f"{path} exists; choose another spec id") from None
    finally:
        os.unlink(tmp)
    return path
