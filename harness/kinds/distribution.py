"""Spec kind `distribution`: speculative sampling must follow the target's sampling distribution.

    kind: distribution
    description: …
    inputs:
      checkpoint: {preset: tiny-vocab8, seed: 0}           # a small vocabulary (harness.checkpoints)
      draft: {seed: 0, convention: boundary, aux_layer_ids: [0, 1, 2]}   # a real EAGLE3 draft
      speculative: {num_steps: 2, topk: 1, draft_token_num: 3, verify: rejection}   # or target-only
      prompt: [1, 2, 3]                 # every request's prompt
      seeds: {arange: [0, 2000]}        # one request per seed, all in one speculative_generate call
      sampling: {temperature: 1.0, top_k: 0, top_p: 1.0, min_p: 0.0}
      tokens: 3                         # K: the joint law of the first K generated tokens is tested
      min_expected: 5                   # pooling rule of the chi-square test (below)
    expect:                             # both required
      alpha: 1.0e-3                     # significance level: fail when the p-value is <= alpha
      acceptance: {min: 0.2, max: 0.8}  # share of verify rounds that accepted a draft token

Every request generates exactly K tokens (no stop ids). The observed counts of the V^K token
sequences are compared with the exact target law: P(t_1 … t_K) = Π_k P(t_k | prompt, t_1 … t_{k-1}),
each factor the target's sampling distribution (softmax of the logits / temperature, with the
top-k / top-p / min-p masks of engine.sampling) computed from a plain target forward of every
prefix. The first token comes from the prefill, the others from verify rounds: corrections,
accepted drafts and bonus tokens.

The test is Pearson's chi-square goodness of fit. Pooling rule: sequences whose expected count
n·P is below min_expected are pooled into one bin; if that bin's own expected count is below
min_expected, it joins the kept bin with the smallest expected count. df = bins − 1 (nothing is
estimated); p = Q(df/2, X²/2), the regularised upper incomplete gamma (torch.special.gammaincc).
A sequence of target probability 0 that is generated at all fails the spec outright. Under the
null hypothesis the spec fails with probability alpha; the seeds are fixed, so its outcome is
reproducible, and the golden pins the counts bit for bit.

The acceptance bounds keep the test from being vacuous: a draft that is never (or always)
accepted would test only one branch of the verify rule.

The golden holds `counts` and `expected` (the exact law, float64), shaped [V] * K, and
`accept_lengths` (rounds by accepted drafts + 1), with the statistic, df, p-value and acceptance
rate as data. Platform: this machine's, like `generate` specs.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from contextlib import contextmanager
from dataclasses import dataclass

import torch

from lockstep.engine.sampling import SamplingParams, keep_mask
from lockstep.engine.speculative import SpecParams
from lockstep.harness.checkpoints import (CHECKPOINT, DRAFT, checkpoint_config, draft_dir, draft_problems,
                                          reference_model, target_dir)
from lockstep.harness.intseq import IntSeq, length, materialize, max_value
from lockstep.harness.kinds.generate import project_root
from lockstep.harness.limits import (MAX_DISTRIBUTION_SEEDS, MAX_DRAFT_STEPS, MAX_DRAFT_TOKENS, MAX_DRAFT_TOPK,
                                     MAX_REQUEST_TOKENS)
from lockstep.harness.result import SpecResult
from lockstep.harness.schema import Field, Float, Int, Map, Problem, Str
from lockstep.harness.target import CHI_SQUARE, Request, TargetInterface
from lockstep.kernels import portable

NAME = "distribution"
MAX_PREFIXES = 4096          # V^(K-1) target forwards for the exact law

INPUTS = Map({
    "checkpoint": Field(CHECKPOINT, required=True),
    "draft": Field(DRAFT, required=True),
    "speculative": Field(Map({
        "num_steps": Field(Int(min=1, max=MAX_DRAFT_STEPS), default=3),
        "topk": Field(Int(min=1, max=MAX_DRAFT_TOPK), default=1),
        "draft_token_num": Field(Int(min=1, max=MAX_DRAFT_TOKENS), default=4),
        "verify": Field(Str(choices=["rejection", "target-only"]), default="rejection"),
    }), required=True),
    "prompt": Field(IntSeq(min_value=0, max_len=MAX_REQUEST_TOKENS), required=True),
    "seeds": Field(IntSeq(max_len=MAX_DISTRIBUTION_SEEDS), required=True, doc="one request per seed"),
    "sampling": Field(Map({
        "temperature": Field(Float(), default=1.0),
        "top_k": Field(Int(min=0), default=0),
        "top_p": Field(Float(), default=1.0),
        "min_p": Field(Float(), default=0.0),
    }), default=dict),
    "tokens": Field(Int(min=1, max=6), default=3, doc="K: the first K generated tokens are tested jointly"),
    "min_expected": Field(Float(), default=5.0, doc="bins expected below this are pooled"),
})
EXPECT = Map({
    "alpha": Field(Float(), doc="significance level of the chi-square test"),
    "acceptance": Field(Map({
        "min": Field(Float(), required=True),
        "max": Field(Float(), required=True),
    }), doc="bounds on the share of verify rounds that accepted a draft token"),
})


def _sampling_params(inp: dict):
    return SamplingParams(**(inp["sampling"] or {}), max_new_tokens=inp["tokens"], stop_token_ids=())


def _spec_params(inp: dict):
    return SpecParams(**inp["speculative"])


def validate(doc: dict, root=None) -> list[Problem]:
    inp, exp, out = doc["inputs"], doc["expect"] or {}, []
    config, problems = checkpoint_config(inp["checkpoint"], root, ("inputs", "checkpoint"))
    out += problems + draft_problems(inp["draft"], inp["checkpoint"], config, root, ("inputs", "draft"))
    if config is not None:
        out += _validate_against_config(inp, config)
    if length(inp["prompt"]) + inp["tokens"] > MAX_REQUEST_TOKENS:
        out.append(Problem(("inputs", "prompt"), f"prompt + tokens is more than {MAX_REQUEST_TOKENS} tokens"))
    try:
        if _sampling_params(inp).is_greedy:
            out.append(Problem(("inputs", "sampling", "temperature"), "expected a temperature > 0: a greedy "
                                                                      "target has no distribution to test"))
    except ValueError as e:                        # the engine's own validation names the field
        out.append(Problem(("inputs", "sampling"), str(e)))
    try:
        _spec_params(inp)
    except ValueError as e:
        out.append(Problem(("inputs", "speculative"), str(e)))
    if len(set(materialize(inp["seeds"]).tolist())) != len(materialize(inp["seeds"])):
        out.append(Problem(("inputs", "seeds"), "seeds must be distinct (each request is one independent sample)"))
    if not inp["min_expected"] > 0:
        out.append(Problem(("inputs", "min_expected"), f"expected a number > 0, found {inp['min_expected']!r}"))
    if exp.get("alpha") is None:
        out.append(Problem(("expect",), "missing required key 'alpha' (the significance level of the test)"))
    elif not 0 < exp["alpha"] < 1:
        out.append(Problem(("expect", "alpha"), f"expected a significance level in (0, 1), found {exp['alpha']!r}"))
    acc = exp.get("acceptance")
    if acc is None:
        out.append(Problem(("expect",), "missing required key 'acceptance' ({min, max}: without it a draft that "
                                        "is never accepted would pass vacuously)"))
    elif not 0 <= acc["min"] < acc["max"] <= 1:
        out.append(Problem(("expect", "acceptance"), f"expected 0 <= min < max <= 1, found {acc}"))
    return out


def _validate_against_config(inp, config) -> list[Problem]:
    V, K = config.vocab_size, inp["tokens"]
    out = []
    top = max_value(inp["prompt"])
    if top is not None and top >= V:
        out.append(Problem(("inputs", "prompt"), f"token id {top} is outside the checkpoint's vocabulary [0, {V})"))
    if V ** (K - 1) > MAX_PREFIXES:
        out.append(Problem(("inputs", "tokens"), f"K = {K} over a vocabulary of {V} needs {V ** (K - 1):,} target "
                                                 f"forwards for the exact law (at most {MAX_PREFIXES}); use a "
                                                 "smaller vocabulary or fewer tokens"))
    return out


def golden_platform(spec, ctx) -> str:
    return ctx.engine_platform


# --------------------------------------------------------------------------- the exact law
def exact_law(model, prompt: list[int], params, k: int) -> torch.Tensor:
    """P(t_1 … t_K) [V] * K (float64) of plain sampling: one target forward per prefix t_1 … t_{K-1},
    each in its own cache slot; row j of a prefix gives P(t_{j+1} | prompt, t_1 … t_j)."""

    V = model.config.vocab_size
    prefixes = list(itertools.product(range(V), repeat=k - 1))
    if len(prefixes) > MAX_PREFIXES:
        raise ValueError(f"tokens: K = {k} over a vocabulary of {V} needs {len(prefixes)} prefixes (at most "
                         f"{MAX_PREFIXES}); use a smaller vocabulary or fewer tokens")
    n = len(prompt) + k - 1
    toks, pos, slots = [], [], []
    for s, prefix in enumerate(prefixes):
        toks += prompt + list(prefix)
        pos += range(n)
        slots += [s] * n
    cache = model.new_cache(len(prefixes), n)
    logits = model.forward(*(torch.tensor(x, device=model.device) for x in (toks, pos, slots)), cache).logits
    z = logits.reshape(len(prefixes), n, V)[:, len(prompt) - 1:].to(torch.float64).cpu() / params.temperature
    keep = torch.stack([keep_mask(row, params.top_k, params.top_p, params.min_p) for row in z.reshape(-1, V)])
    cond = portable.softmax(torch.where(keep.reshape(z.shape), z, float("-inf")), dim=-1)   # [prefixes, K, V]
    law = torch.empty([V] * k, dtype=torch.float64)
    for seq in itertools.product(range(V), repeat=k):
        row = cond[_flat_index(seq[:-1], V)]
        prob = 1.0
        for j, tok in enumerate(seq):
            prob *= float(row[j, tok])
        law[seq] = prob
    return law


def _flat_index(seq, V: int) -> int:
    i = 0
    for t in seq:
        i = i * V + t
    return i


# --------------------------------------------------------------------------- the test
@dataclass
class ChiSquare:
    statistic: float
    df: int
    p_value: float
    bins: int                      # after pooling
    pooled_expected: float         # expected count of the pooled bin (0 if nothing was pooled)
    impossible: list               # [(sequence, count)] generated although their probability is 0
    largest: list                  # [(sequence or "pooled", observed, expected)], largest contributions first


def chi_square(counts: torch.Tensor, law: torch.Tensor, min_expected: float) -> ChiSquare:
    """Pearson's goodness of fit of `counts` against n · `law`, with the pooling rule of the docstring."""
    n = float(counts.sum())
    observed, expected = counts.flatten().to(torch.float64), law.flatten() * n
    names = list(itertools.product(range(law.shape[0]), repeat=law.dim()))
    impossible = [(names[i], int(observed[i])) for i in range(len(names)) if expected[i] == 0 and observed[i] > 0]
    kept = [i for i in range(len(names)) if expected[i] >= min_expected]
    low = [i for i in range(len(names)) if 0 < expected[i] < min_expected]
    bins = [([i], names[i]) for i in kept]
    pooled_expected = math.fsum(expected[low].tolist()) if low else 0.0
    if low:
        if pooled_expected >= min_expected or not bins:
            bins.append((low, "pooled"))
        else:                                        # too small alone: join the smallest kept bin
            smallest = min(range(len(bins)), key=lambda b: math.fsum(expected[bins[b][0]].tolist()))
            bins[smallest] = (bins[smallest][0] + low, f"{bins[smallest][1]} + pooled")
    if len(bins) < 2:
        raise ValueError(f"the chi-square test needs at least 2 bins, found {len(bins)} with {int(n)} requests: "
                         f"use more seeds")
    terms = []
    for members, name in bins:
        o, e = math.fsum(observed[members].tolist()), math.fsum(expected[members].tolist())
        terms.append(((o - e) ** 2 / e, name, o, e))
    statistic = math.fsum(t[0] for t in terms)
    df = len(bins) - 1
    p = float(torch.special.gammaincc(torch.tensor(df / 2, dtype=torch.float64),
                                      torch.tensor(statistic / 2, dtype=torch.float64)))
    p = float(f"{p:.9g}")   # libm's exp / lgamma inside gammaincc: keep only digits every CPU agrees on
    if impossible:
        p = 0.0
    largest = [(name, o, e) for _, name, o, e in sorted(terms, key=lambda t: -t[0])[:3]]
    return ChiSquare(statistic, df, p, len(bins), pooled_expected, impossible, largest)


# --------------------------------------------------------------------------- run and check
@contextmanager
def _one_cpu_thread():
    """The run is thousands of tiny per-row operations: on the CPU, intra-op threads only spin (7x
    the CPU time on a busy 2-core machine) and change no bit. Restored afterwards."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def run(spec, ctx, target: TargetInterface) -> SpecResult:
    """The target's `speculative_generate` (features: sampling, batch, the verify mode, tree), one
    seeded request per seed, counted against the exact law of a reference forward of the same
    checkpoint (harness.checkpoints.reference_model: Lockstep's engine under the run's backend and
    dtype policy, or for a target without its own `model`, Lockstep's fp32 model)."""
    with _one_cpu_thread():
        return _run(spec, ctx, target)


def _target_call(spec, t: TargetInterface, device: str):
    sp = spec.inputs["speculative"]
    needs = ("sampling", "batch", sp["verify"]) + (("tree",) if sp["topk"] > 1 else ())
    return t.op("speculative_generate", device, needs)


def _run(spec, ctx, t: TargetInterface) -> SpecResult:
    inp = spec.inputs
    op = _target_call(spec, t, str(ctx.device))
    root = project_root(spec)
    params, sp, K = _sampling_params(inp), _spec_params(inp), inp["tokens"]
    prompt = materialize(inp["prompt"]).tolist()
    requests = [Request(prompt, params, seed=s) for s in materialize(inp["seeds"]).tolist()]
    ckpt = target_dir(inp["checkpoint"], root)
    results = op(ckpt, draft_dir(inp["draft"], inp["checkpoint"], root), inp["draft"]["convention"], requests,
                 dataclasses.asdict(sp))
    model = reference_model(t, inp["checkpoint"], root, str(ctx.device))
    V = model.config.vocab_size
    counts = torch.zeros([V] * K, dtype=torch.int64)
    for r in results:
        counts[tuple(list(r.tokens)[:K])] += 1
    law = exact_law(model, prompt, params, K)
    test = chi_square(counts, law, inp["min_expected"])
    rounds = [a for r in results for a in (r.accept_lengths or [])]
    accept_hist = torch.bincount(torch.tensor(rounds, dtype=torch.int64), minlength=sp.num_steps + 2)
    data = {
        "requests": len(requests), "rounds": len(rounds),
        "acceptance_rate": sum(a > 1 for a in rounds) / max(len(rounds), 1),
        "mean_accepted_drafts": sum(a - 1 for a in rounds) / max(len(rounds), 1),
        "statistic": test.statistic, "df": test.df, "p_value": test.p_value, "bins": test.bins,
        "pooled_expected": test.pooled_expected,
        "impossible": [[list(seq), c] for seq, c in test.impossible],
        "largest_terms": [[list(name) if isinstance(name, tuple) else name, o, e] for name, o, e in test.largest],
    }
    return SpecResult(tensors={"counts": counts, "expected": law, "accept_lengths": accept_hist}, data=data,
                  notes=[f"chi-square X² = {test.statistic:.2f}, df = {test.df}, p = {test.p_value:.3g}; "
                         f"acceptance rate {data['acceptance_rate']:.3f} over {len(rounds)} verify rounds"])


def applicability(spec, target: TargetInterface, device: str) -> str:
    _target_call(spec, target, device)
    return CHI_SQUARE


def compared(spec, ctx, result: SpecResult) -> tuple[str, None]:
    """The chi-square test is the comparison (the kind's check): no golden on a target."""
    return CHI_SQUARE, None



def check(spec, result: SpecResult) -> list[str]:
    exp, d, fails = spec.expect, result.data, []
    K, n = spec.inputs["tokens"], d["requests"]
    for seq, count in d["impossible"]:
        fails.append(f"the token sequence {tuple(seq)} has target probability 0 but was generated {count} times")
    if d["p_value"] <= exp["alpha"]:
        worst = "; ".join(f"{tuple(s) if isinstance(s, list) else s}: seen {o:.0f}, expected {e:.1f}"
                          for s, o, e in d["largest_terms"])
        fails.append(f"chi-square goodness of fit: X² = {d['statistic']:.2f} with {d['df']} degrees of freedom, "
                     f"p-value {d['p_value']:.3g} <= alpha {exp['alpha']:g}: the first {K} tokens of {n} seeded "
                     f"requests do not follow the target's sampling distribution (largest terms: {worst})")
    lo, hi = exp["acceptance"]["min"], exp["acceptance"]["max"]
    if not lo <= d["acceptance_rate"] <= hi:
        fails.append(f"acceptance rate {d['acceptance_rate']:.3f} (verify rounds that accepted a draft token, of "
                     f"{d['rounds']}) is outside the spec's [{lo}, {hi}]: the test would not exercise both the "
                     f"accepting and the rejecting branch of the verify rule")
    return fails
