"""A peer engine's run as a trace, teacher-forced through Lockstep's engine (the RL parity check).

    trace = import_peer("out.json", "sglang", {"path": "models/tiny-target"})
    report = teacher_force_peer(trace, threshold=1e-3)   # per-token |Δlogprob|: p50, p95, max, share > threshold

Accepted inputs (one JSON document, or JSONL with one such object a line):
  vllm      vLLM's RequestOutput as JSON: {"prompt_token_ids": [...], "outputs": [{"token_ids": [...],
            "logprobs": [{"<id>": {"logprob": x}} or {"<id>": x}, ...]}]}; or an OpenAI-style completion
            {"choices": [{"logprobs": {"tokens": ["token_id:7", ...], "token_logprobs": [...]}}]}
            (vLLM's --return-tokens-as-token-ids), the prompt ids in "prompt_token_ids" or --prompt-ids
  sglang    SGLang's /generate response with return_logprob: {"output_ids": [...], "meta_info":
            {"output_token_logprobs": [[logprob, id, text], ...], "input_token_logprobs": [...]}}
            (the prompt ids from input_token_logprobs, else "input_ids", else --prompt-ids)
  rollouts  RL rollouts: {"prompt_ids": [...], "response_ids": [...], "logprobs": [...]}
            ("prompt", "tokens", "rollout_log_probs" are read as synonyms)
  hf        the same fields as rollouts (what a transformers generate() run gives, written out)

A peer's logprobs are taken as float32 (the value it printed, rounded once). Its RNG model is its
own ("peer"): a peer trace is for teacher forcing only, judged with tolerances and per-token
statistics, never bitwise and never by a mean alone.
"""

from __future__ import annotations

import math
from pathlib import Path

from lockstep.engine.request import Request, SamplingParams
from lockstep.harness.intseq import materialize
from lockstep.harness.readers import ReadError, Unreadable, json_value, read_text
from lockstep.harness.replay.deltas import CLIP, Deltas
from lockstep.harness.replay.format import (FORMAT, MAX_TRACE_BYTES, TRACE_VERSION, Trace, TraceError, f32_bits,
                                            f32_from_bits)
from lockstep.harness.replay.identity import checkpoint_identity, platform_identity
from lockstep.harness.replay.processed import ProcessedLog, Processing, apply
from lockstep.harness.replay.run import Setup, checkpoint_folder, forced_requests, run
from lockstep.harness.replay.spread import degree

FORMATS = ("vllm", "sglang", "rollouts", "hf")


def _documents(path: Path) -> list:
    try:
        text = read_text(path, MAX_TRACE_BYTES, "peer file")
        try:
            doc = json_value(text, str(path))
            return doc if isinstance(doc, list) else [doc]
        except ReadError as e:
            if isinstance(e, Unreadable) and "\n" in text.strip():   # one line: named by its number below
                raise
        return [json_value(line, f"{path}:{n}") for n, line in enumerate(text.splitlines(), 1) if line.strip()]
    except ReadError as e:
        raise TraceError(str(e)) from None


def _id(token) -> int:
    if isinstance(token, int):
        return token
    if isinstance(token, str) and token.startswith("token_id:"):
        return int(token.split(":", 1)[1])
    raise ValueError(f"token {token!r} is not an id (ask vLLM for --return-tokens-as-token-ids)")


def _vllm(doc: dict) -> list[tuple]:
    if "choices" in doc:
        out = []
        for c in doc["choices"]:
            lp = c["logprobs"]
            out.append((c.get("prompt_token_ids") or doc.get("prompt_token_ids"),
                        [_id(t) for t in lp["tokens"]], [float(x) for x in lp["token_logprobs"]]))
        return out
    out = []
    for o in doc["outputs"]:
        ids, lps = list(o["token_ids"]), []
        for tok, entry in zip(ids, o["logprobs"]):
            v = entry.get(str(tok), entry.get(tok)) if isinstance(entry, dict) else entry
            lps.append(float(v["logprob"] if isinstance(v, dict) else v))
        out.append((doc.get("prompt_token_ids"), ids, lps))
    return out


def _sglang(doc: dict) -> list[tuple]:
    meta = doc["meta_info"]
    entries = meta["output_token_logprobs"]
    prompt = None
    if meta.get("input_token_logprobs"):
        prompt = [int(e[1]) for e in meta["input_token_logprobs"]]
    prompt = prompt or doc.get("input_ids")
    return [(prompt, [int(e[1]) for e in entries], [float(e[0]) for e in entries])]


def _rollout(doc: dict) -> list[tuple]:
    def first(*names):
        for n in names:
            if doc.get(n) is not None:
                return doc[n]
        raise KeyError(names[0])
    return [(first("prompt_ids", "prompt"), [int(t) for t in first("response_ids", "tokens")],
             [float(x) for x in first("logprobs", "rollout_log_probs")])]


def import_peer(path: str | Path, fmt: str, checkpoint: dict, prompts: list[list[int]] | None = None,
                setup: Setup | None = None, processing: Processing | None = None) -> Trace:
    """A peer's output file as a trace (source = the peer, steps = its tokens and logprobs, and the
    processing its logprobs went through, harness/replay/processed.py)."""
    path = Path(path)
    if fmt not in FORMATS:
        raise TraceError(f"peer format must be one of {FORMATS}, got {fmt!r}")
    parse = {"vllm": _vllm, "sglang": _sglang, "rollouts": _rollout, "hf": _rollout}[fmt]
    items = []
    for n, doc in enumerate(_documents(path)):
        try:
            items += parse(doc)
        except (KeyError, TypeError, ValueError, IndexError) as e:
            raise TraceError(f"{path}: record {n} is not {fmt} output with token ids and logprobs "
                             f"({type(e).__name__}: {e})") from None
    if not items:
        raise TraceError(f"{path}: no {fmt} records")
    for i, (prompt, ids, lps) in enumerate(items):
        if prompt is None:
            if not prompts or i >= len(prompts):
                raise TraceError(f"{path}: request {i} carries no prompt ids; pass them with --prompt-ids")
            items[i] = (prompts[i], ids, lps)
        if len(ids) != len(lps) or not ids:
            raise TraceError(f"{path}: request {i} has {len(ids)} token ids and {len(lps)} logprobs")
    return peer_trace(items, fmt, checkpoint, setup or Setup(checkpoint), processing, path.name)


def peer_trace(items: list[tuple], source: str, checkpoint: dict, setup: Setup, processing: Processing | None = None,
               file: str | None = None) -> Trace:
    """A trace of another engine's run: `items` are (prompt ids, token ids, logprobs), one a request;
    its RNG is the peer's own, so the trace can only be teacher-forced."""
    requests, steps = [], []
    for i, (prompt, ids, lps) in enumerate(items):
        requests.append({"index": i, "prompt": [int(t) for t in prompt],
                         "sampling": {"max_new_tokens": len(ids), "greedy": True, "temperature": 1.0, "top_k": 0,
                                      "top_p": 1.0, "min_p": 0.0, "stop_token_ids": []},
                         "seed": None, "rng": f"peer:{source} (its own; teacher forcing only)", "eagle3": None,
                         "finish_reason": "length", "tokens": len(ids)})
        steps.append([{"request": i, "step": k, "token": t, "logprob": lp if math.isfinite(lp) else None,
                       "logprob_bits": f32_bits(lp), "margin": None, "margin_bits": None, "logits_sha256": None,
                       "experts": []} for k, (t, lp) in enumerate(zip(ids, lps))])
    manifest = {"format": FORMAT, "version": TRACE_VERSION, "source": source,
                "engine": {"name": source, "file": file},
                "settings": {**setup.settings(), "mode": "generate"},
                "platform": platform_identity(setup.dtype, setup.backend, setup.device),
                "checkpoint": {"ref": checkpoint, **checkpoint_identity(checkpoint_folder(setup))},
                "draft": None, "speculative": None, "requests": len(requests),
                "peer_logprobs": (processing or Processing()).to_json()}
    return Trace(manifest, requests, steps, [[] for _ in requests])


def spec_trace(inputs: dict, device: str) -> Trace:
    """A peer spec's inputs (the `replay` kind's `peer` form) as the trace they stand for, on
    Lockstep's fp32 torch engine on `device`: what the spec's check replays."""

    peer = inputs["peer"]
    items = [(materialize(r["prompt"]).tolist(), list(ids), [f32_from_bits(b) for b in bits])
             for r, ids, bits in zip(inputs["requests"], peer["tokens"], peer["logprob_bits"])]
    setup = Setup(inputs["checkpoint"], dtype="fp32", backend="torch", device=device)
    return peer_trace(items, peer["source"], inputs["checkpoint"], setup, Processing(**peer["logprobs"]))


class PeerReport(Deltas):
    """import-peer's report: the shared per-token comparison (harness/replay/deltas.py) and its verdict."""

    processing: str = "raw"                 # what the peer's logprobs are (harness/replay/processed.py)

    @property
    def ok(self) -> bool:
        """No token over the threshold: the same verdict replay gives the imported trace."""
        return not self.first_off

    def text(self) -> str:
        s = self.stats()
        lines = [f"{self.source} run teacher-forced through lockstep: {s['tokens']} tokens, "
                 f"|Δlogprob| p50 {s['p50']:.3g}, p95 {s['p95']:.3g}, p99 {s['p99']:.3g}, max {s['max']:.3g} "
                 f"(mean {s['mean']:.3g}); {100 * s['share_over_threshold']:.1f}% over {self.threshold:g}; "
                 f"{s['bitwise_equal']} bitwise equal"
                 + ("" if self.processing == "raw" else f" ({self.processing} logprobs compared)")]
        lines += self.rl_text()
        for i, k in sorted(self.first_off.items()):
            lines.append(f"  request {i}: first departs at step {k}")
        for w in self.worst[:5]:
            lines.append(f"  worst: request {w['request']} step {w['step']} token {w['token']}: peer {w['peer']:.6g}, "
                         f"lockstep {w['lockstep']:.6g} (|Δ| {w['delta']:.3g})")
        lines.append("ok: every token within the threshold" if self.ok else
                     f"DIVERGED: {len(self.first_off)} request(s) have a token over |Δlogprob| {self.threshold:g}")
        return "\n".join(lines)

    def to_json(self) -> dict:
        return {"source": self.source, "ok": self.ok, "logprobs": self.processing, "stats": self.stats(), "per_request": self.per_request(),
                "first_off": self.first_off, "worst": self.worst}


def teacher_force_peer(trace: Trace, threshold: float = 1e-3, setup: Setup | None = None,
                       clip: float = CLIP, dp: int | None = None) -> PeerReport:
    """Feed the peer's tokens through Lockstep's engine; per-token comparison against the peer's.
    `dp`: data-parallel ranks the requests spread over (harness.replay.spread; the same report)."""
    if not threshold > 0:
        raise TraceError(f"threshold must be > 0, got {threshold}")
    setup = setup or Setup(trace.manifest["checkpoint"]["ref"])
    dp = degree(dp, setup.tp, setup.ep)
    tokens = [[s["token"] for s in steps] for steps in trace.steps]
    reqs = [Request(prompt=r["prompt"], params=SamplingParams(greedy=True, max_new_tokens=r["tokens"])) for r in
            trace.requests]
    processing = Processing.of(trace.manifest)
    log = None if processing.kind == "raw" else ProcessedLog([len(r.prompt) for r in reqs], tokens, processing)
    try:
        results = run(setup, forced_requests(reqs, tokens), log, tokens, dp=dp)
        if log is not None:
            apply(log, results)             # compare what the peer declared it returned
    except ValueError as e:                 # an id outside the vocabulary, a sequence past the context
        raise TraceError(f"the peer's tokens cannot run on this checkpoint: {e}") from None
    rep = PeerReport(trace.manifest["source"], threshold, clip)
    rep.processing = processing.kind
    for steps, res in zip(trace.steps, results):
        rep.add_request(steps, res.logprobs.tolist() if hasattr(res.logprobs, "tolist") else list(res.logprobs))
    return rep
