"""`lockstep promote TRACE SPEC_ID`: a trace (or some of its requests) becomes a regression spec.

Lockstep's own trace becomes a `generate` spec: the trace's requests (prompt ids written out, full
sampling parameters, seeds), checkpoint, schedule, draft and speculative settings, expecting the
recorded finish reasons and last tokens, reproducibility and batch invariance; when the trace was
recorded at a tp × ep topology, that topology must reproduce the one-device bits. Promote first
replays the trace here (free-run) and refuses one that does not replay bitwise, so the golden that
`lockstep regen SPEC_ID` then records (two identical runs) pins the trace's own bits.

Another engine's trace (an import-peer rollout, a `record --target` run) becomes a teacher-forced
`replay` spec of the peer form (harness/kinds/replay.py): the peer's tokens and logprob bits, forced
through Lockstep's engine, whose golden is Lockstep's teacher-forced logprobs and verdict report;
its expectations are the verdict the spec's own replay gives here (ok, counts, first divergence).

Promote writes a spec, never a golden; the spec is written atomically and never over an existing file.
"""
from __future__ import annotations

import os
import re
import tempfile
from pathlib import Path

import yaml

from lockstep.harness.replay.format import Trace, TraceError
from lockstep.harness.replay.identity import check_checkpoint
from lockstep.harness.replay.peer import spec_trace
from lockstep.harness.replay.processed import Processing
from lockstep.harness.replay.rerun import foreign, replay
from lockstep.harness.replay.run import ROOT, Setup, checkpoint_folder

SPEC_ID = re.compile(r"^[a-z0-9][a-z0-9_-]*(/[a-z0-9][a-z0-9_-]*)*$")


def spec_document(trace: Trace, requests: list[int], description: str | None) -> dict:
    m = trace.manifest
    ref = m["checkpoint"]["ref"]
    _inside_project(ref)
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


def peer_spec_document(trace: Trace, requests: list[int], description: str | None, threshold: float) -> dict:
    """Another engine's trace as a teacher-forced `replay` spec of the peer form, without expectations."""

    m = trace.manifest
    _inside_project(m["checkpoint"]["ref"])
    if len(requests) > 8:
        raise TraceError(f"a replay spec holds at most 8 requests, the trace has {len(requests)}: choose some "
                         f"with --request-indices")
    reqs = [{"prompt": list(trace.requests[i]["prompt"]),
             "sampling": {"greedy": True, "max_new_tokens": len(trace.steps[i]), "stop_token_ids": []}}
            for i in requests]
    peer = {"source": m.get("source"), "logprobs": Processing.of(m).to_json(),
            "tokens": [[s["token"] for s in trace.steps[i]] for i in requests],
            "logprob_bits": [[s["logprob_bits"] for s in trace.steps[i]] for i in requests]}
    text = description or (f"Promoted from another engine's trace ({m.get('source')}, "
                           f"{(m.get('engine') or {}).get('file') or (m.get('engine') or {}).get('name')}): its "
                           f"tokens teacher-forced through Lockstep on checkpoint sha256 "
                           f"{m['checkpoint']['sha256'][:16]}...; the golden pins Lockstep's logprobs.")
    inputs = {"checkpoint": m["checkpoint"]["ref"], "requests": reqs, "mode": "teacher-forced",
              "threshold": threshold, "peer": peer}
    return {"kind": "replay", "description": text, "tags": ["replay", "promoted", "peer"], "inputs": inputs,
            "expect": {}}


def _inside_project(ref: dict) -> None:
    if "path" in ref and Path(ref["path"]).is_absolute():
        raise TraceError(f"the trace's checkpoint {ref['path']} is outside the project; a spec can only name "
                         f"a checkpoint inside it (or a preset)")


def _peer_expectations(trace: Trace, doc: dict) -> dict:
    """The verdict the spec's own replay gives here (fp32, torch, this CPU), after checking that the
    trace is of the checkpoint the spec names."""

    inp = doc["inputs"]
    check_checkpoint(trace.manifest["checkpoint"], checkpoint_folder(Setup(inp["checkpoint"])))
    report = replay(spec_trace(inp, "cpu"), "teacher-forced", threshold=inp["threshold"], locate_first=False)
    first = None if report.first is None else {"request": report.first.request, "step": report.first.step,
                                               "status": report.first.status.value}
    return {"ok": report.ok, "counts": report.counts(), "first": first}


def promote(trace: Trace, spec_id: str, requests: list[int] | None = None, description: str | None = None,
            specs_dir: Path | None = None, check: bool = True, threshold: float = 1e-3) -> Path:
    if not SPEC_ID.match(spec_id):
        raise TraceError(f"spec id {spec_id!r}: use lowercase words, digits, '-' and '_' joined by '/'")
    n = len(trace.requests)
    requests = list(range(n)) if requests is None else list(requests)
    if not requests or any(not 0 <= i < n for i in requests) or len(set(requests)) != len(requests):
        raise TraceError(f"--request-indices must name distinct request indices in [0, {n})")
    peer = foreign(trace)
    doc = peer_spec_document(trace, requests, description, threshold) if peer else \
        spec_document(trace, requests, description)
    specs_dir = specs_dir or ROOT / "specs"
    path = specs_dir / (spec_id + ".yaml")
    if path.exists():
        raise TraceError(f"{path} exists; choose another spec id")
    if check and peer:
        doc["expect"] = _peer_expectations(trace, doc)
    elif check:
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
