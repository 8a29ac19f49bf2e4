"""Spec kind `prefix-cache`: a prefix-cache hit gives the bits of a cold prefill (DESIGN §2, D3).

    kind: prefix-cache
    description: …
    inputs:
      checkpoint: {preset: tiny, seed: 0, format: bf16}
      prompt: {hashed: {count: 80, seed: 3, below: 500}}   # the base sequence every case cuts from
      query: 70                     # the query prompt: the base's first 70 tokens
      splits: [1, 15, 16, 17, 31, 32, 33]   # warm the cache with the base's first s tokens, then query
      diverge: [20, 40]             # warm with the whole query, then query base[:d] + other tokens
      chains: [[16, 40, 60]]        # warm s1, query s2 (a hit of s1), query s3 (a hit of s2), ...
      block: 16                     # the cache's block size (engine.prefix_cache)
      prefill_chunk: 16             # optional: chunked prefills in every run
      sampling: {greedy: true, max_new_tokens: 6}
      seed: 5                       # optional, for sampled requests
    expect:
      min_hits: 10                  # at least this many lookups must have reused KV (default: every case
                                    # that predicts a hit)

For every case, a query runs twice: cold (no cache) and warm (after the case's warm-up prompts
went through the same cache), one request each. The warm run must give the cold run's tokens and
logprob bits, and its lookup must have reused exactly the positions the case predicts (the
common prefix, at most the prompt minus its last token): a cache that never hits cannot pass.
Splits at and around multiples of the block (partial-block hits), the attention tile (KV_TILE =
32) and the prefill chunk are the cases where a cache that recomputes or misaligns a block would
show. The golden holds each case's cold tokens and logprobs.
"""

from __future__ import annotations

import torch

from lockstep.harness.checkpoints import CHECKPOINT, checkpoint_config, checkpoint_problems, target_dir
from lockstep.harness.intseq import IntSeq, length, materialize, max_value
from lockstep.harness.kinds.generate import SAMPLING, _params, project_root
from lockstep.harness.limits import MAX_REQUEST_TOKENS
from lockstep.harness.result import SpecResult
from lockstep.harness.schema import Field, Int, List, Map, Problem
from lockstep.harness.target import TOLERANCE, Request, TargetInterface

NAME = "prefix-cache"
MAX_CASES = 64

INPUTS = Map({
    "checkpoint": Field(CHECKPOINT, required=True),
    "prompt": Field(IntSeq(min_value=0, max_len=MAX_REQUEST_TOKENS), required=True),
    "query": Field(Int(min=2), required=True, doc="the query prompt: the base's first `query` tokens"),
    "splits": Field(List(Int(min=1), max_len=MAX_CASES), default=list),
    "diverge": Field(List(Int(min=0), max_len=MAX_CASES), default=list),
    "chains": Field(List(List(Int(min=1), min_len=2), max_len=MAX_CASES), default=list),
    "block": Field(Int(min=1), default=16),
    "prefill_chunk": Field(Int(min=1)),
    "sampling": Field(SAMPLING, default=dict),
    "seed": Field(Int(min=-(2**63), max=2**64 - 1)),
})
EXPECT = Map({"min_hits": Field(Int(min=1))})

OTHER = 1         # the token id the diverging cases continue with (then OTHER + 1, ...), never the base's


def validate(doc: dict, root=None) -> list[Problem]:
    inp, out = doc["inputs"], []
    n, q = length(inp["prompt"]), inp["query"]
    if q > n:
        out.append(Problem(("inputs", "query"), f"query {q} is longer than the prompt ({n} tokens)"))
    for key, cases in (("splits", inp["splits"]), ("diverge", inp["diverge"])):
        for j, s in enumerate(cases):
            if not 0 <= s < q:
                out.append(Problem(("inputs", key, j), f"{s} must be below the query length {q}"))
    for j, chain in enumerate(inp["chains"]):
        if chain != sorted(set(chain)) or chain[-1] > n:
            out.append(Problem(("inputs", "chains", j), f"a chain's lengths must increase and stay within the "
                                                        f"prompt ({n} tokens), got {chain}"))
    if not (inp["splits"] or inp["diverge"] or inp["chains"]):
        out.append(Problem(("inputs",), "no case: give splits, diverge or chains"))
    try:
        params = _params({**SAMPLING.check({}, (), []), **(inp["sampling"] or {})})
        if inp["seed"] is None and not params.is_greedy:
            out.append(Problem(("inputs", "seed"), "a sampled request needs a seed to be reproducible"))
    except ValueError as e:
        out.append(Problem(("inputs", "sampling"), str(e)))
    config, problems = checkpoint_config(inp["checkpoint"], root, ("inputs", "checkpoint"))
    out += problems + checkpoint_problems(inp["checkpoint"], ("inputs", "checkpoint"), check_preset=False)
    if config is not None and max_value(inp["prompt"]) >= config.vocab_size:
        out.append(Problem(("inputs", "prompt"), f"token ids must be below the vocabulary ({config.vocab_size})"))
    return out


def golden_platform(spec, ctx) -> str:
    return ctx.engine_platform


def cases(spec) -> list[tuple[str, list[list[int]], list[int], int]]:
    """(name, warm-up prompts, query prompt, positions the query's hit must reuse) per case; a
    chain gives one case per link, each warmed by the links before it in one shared cache."""
    inp = spec.inputs
    base = materialize(inp["prompt"]).tolist()
    query = base[:inp["query"]]
    out = []
    for s in inp["splits"]:
        out.append((f"split {s}", [base[:s]], query, s))
    for d in inp["diverge"]:
        other = base[:d] + [OTHER + (j % 7) if base[d + j] != OTHER + (j % 7) else OTHER + 8
                            for j in range(len(query) - d)]
        out.append((f"diverge at {d}", [query], other, d))
    for chain in inp["chains"]:
        for k in range(1, len(chain)):
            out.append((f"chain {chain} link {k}", [base[:c] for c in chain[:k]], base[:chain[k]],
                        min(chain[k - 1], chain[k] - 1)))
    return out


def run_cases(spec, cold, new_cache, warm, counters) -> SpecResult:
    """The kind's cases on one implementation: `cold(prompt)` runs a prompt without a cache,
    `new_cache()` makes an empty cache, `warm(cache, prompt)` runs a prompt through it, and
    `counters(cache)` -> (lookups that reused KV, positions reused). Each returns what
    generate() does (.tokens, .logprobs float32): a target's prefix-cache capability (`run` below)."""
    inp = spec.inputs
    tensors, names, differing, hits, reused = {}, [], [], 0, []
    caches: dict[str, object] = {}
    colds: dict[tuple, object] = {}                     # the splits share one query: one cold run
    for i, (name, warm_up, query, expected) in enumerate(cases(spec)):
        cold_res = colds.get(tuple(query))
        if cold_res is None:
            cold_res = colds[tuple(query)] = cold(query)
        key = name.split(" link ")[0] if " link " in name else f"case {i}"
        cache = caches.get(key)
        if cache is None:                              # a chain's links share one cache, warmed once
            cache = caches[key] = new_cache()
            for w in warm_up:
                warm(cache, w)
        before = counters(cache)
        warm_res = warm(cache, query)
        after = counters(cache)
        got = after[1] - before[1]
        hits += after[0] - before[0]
        reused.append(got)
        cold_lp = torch.as_tensor(cold_res.logprobs, dtype=torch.float32)
        warm_lp = torch.as_tensor(warm_res.logprobs, dtype=torch.float32)
        same = list(cold_res.tokens) == list(warm_res.tokens) and cold_lp.shape == warm_lp.shape and \
            torch.equal(cold_lp.view(torch.int32), warm_lp.view(torch.int32))
        if not same or got != expected:
            differing.append(f"{name}: " + (f"the hit reused {got} positions, the case predicts {expected}"
                                            if got != expected else "the warm run's tokens or logprob bits differ "
                                                                    "from the cold prefill's"))
        tensors[f"tokens_{i}"] = torch.tensor(list(cold_res.tokens), dtype=torch.int64)
        tensors[f"logprobs_{i}"] = cold_lp.cpu()
        names.append(name)
    data = {"cases": names, "reused_positions": reused, "hits": hits}
    return SpecResult(tensors=tensors, data=data, facts={"differing": differing, "hits": hits})


def _target_call(spec, t: TargetInterface, device: str):
    inp = spec.inputs
    params = _params({**SAMPLING.check({}, (), []), **(inp["sampling"] or {})})
    needs = (("sampling",) if not params.is_greedy else ()) + (("prefill_chunk",) if inp["prefill_chunk"] else ())
    return t.op("prefix_cache", device, needs), params


def run(spec, ctx, t: TargetInterface) -> SpecResult:
    """The kind's cases through the target's own prefix cache (Lockstep's engine: its PrefixCache
    under the run's backend and dtype policy): every cold run is a fresh, empty cache's run (which
    must reuse nothing), every warm run goes through the case's cache; a hit must give the cold
    bits of the same target, and its counters the predicted reuse."""
    inp = spec.inputs
    new_cache, p = _target_call(spec, t, str(ctx.device))
    ckpt = target_dir(inp["checkpoint"], project_root(spec))
    kw = {"prefill_chunk": inp["prefill_chunk"]} if inp["prefill_chunk"] else {}
    cold_reuse = []

    def run(cache, prompt):
        req = Request(list(prompt), p, seed=inp["seed"])
        out = list(cache.generate([req], **kw))
        if len(out) != 1:
            raise ValueError(f"{t.name}'s prefix cache returned {len(out)} results for 1 request")
        return out[0]

    def cold(prompt):
        cache = new_cache(ckpt, inp["block"])
        out = run(cache, prompt)
        if cache.hit_tokens:
            cold_reuse.append(f"a fresh cache reused {cache.hit_tokens} positions of the cold run of "
                              f"{len(prompt)} tokens")
        return out
    result = run_cases(spec, cold=cold, new_cache=lambda: new_cache(ckpt, inp["block"]), warm=run,
                         counters=lambda c: (int(c.hits), int(c.hit_tokens)))
    result.facts["differing"] = cold_reuse + result.facts["differing"]
    return result


def applicability(spec, target: TargetInterface, device: str) -> str:
    _target_call(spec, target, device)
    return TOLERANCE


def compared(spec, ctx, result: SpecResult) -> tuple[str, str]:
    """Warm against cold bitwise within the target (the kind's check); cold runs within the cross bound."""
    return TOLERANCE, golden_platform(spec, ctx)


def check(spec, result: SpecResult) -> list[str]:
    fails = list(result.facts["differing"])
    want = (spec.expect or {}).get("min_hits") or sum(1 for c in cases(spec) if c[3] > 0)
    if result.facts["hits"] < want:
        fails.append(f"{result.facts['hits']} prefix-cache hits, the spec needs at least {want}")
    return fails
