"""Choosing the next token from a row of logits (DESIGN §5).

Greedy: argmax of the raw fp32 logits, the lowest id on ties.

Seeded sampling (Gumbel-max, float64), for a request with seed s whose logits come from the
input token at position `pos`:

    z_v    = logits_v / temperature                 (float64)
    keep_v = top-k, top-p and min-p masks on p = softmax(z), see `keep_mask`
    logp_v = log_softmax(z masked with -inf where not kept)
    g_v    = gumbel_noise(s, pos, SAMPLE_COLUMNS + v)        (kernels.coins, one call per row)
    token  = argmax_v(logp_v + g_v), the lowest id on ties

Columns are always vocab ids, whatever the masks, so a request's draw never depends on its
batchmates. Requests without a seed draw uniform 32-bit integers from an explicit
torch.Generator instead of the hash, and go through the same Gumbel transform.

The logprob reported for a chosen token is log_softmax of the raw fp32 logits (no
temperature, no masks) at that token, in float32.

Every softmax, log_softmax and running sum here is kernels.portable's (fixed trees and a
fixed scan, float64 exp / log of our own), so a draw is the same on every CPU (D0).

Each step has one batched form (`sample_with`, `chosen_logprobs`, `keep_mask_rows`), run for a
whole batch [R, V] in one launch sequence on the logits' device; the one-row names (`sample`,
`chosen_logprob`, `keep_mask`) are those on a batch of 1. Every step above is elementwise or a
reduction along the vocabulary, so row r's bits never depend on its batchmates
(tests/engine/test_sampling_rows.py). The temperature division is done per distinct temperature,
with the temperature a Python float: a tensor divisor would be a different operation on some
devices (CUDA multiplies by a scalar divisor's reciprocal).

Two implementations of the batched steps, chosen with the ops table (engine/ops.py), never by
device inside a step: `TORCH_SAMPLER`, the torch path above, and `FUSED_SAMPLER`, one launch of
kernels.sampling's fused kernel per step (the triton and fast tables on a GPU): the same IEEE
operations in the same order (portable_tl's polynomials, tree sums in portable.tree_sum's order,
no FMA contraction, and the CUDA torch path's reciprocal multiplies), so the bits are the torch
path's (tests/engine/test_sampling_fused.py in the interpreter, the kernels/sample-fused-* specs).
Two parts stay torch in the fused sampler: the top-k / top-p / min-p masks of rows that use them
(keep_mask_rows: a stable sort and a Hillis-Steele scan, whose order the kernel would have to
reproduce over the whole sorted row), and rows without a seed (their noise comes from the host
generator). NaN results are NaN where the torch path's are; which NaN (sign, payload) is the
hardware's.

`broken_rule` names the rule above that another sampler's token breaks (a tie lost to a higher id,
a filter, the draw): what a judge of another engine's sampler reports first.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

import torch

from lockstep.engine.request import COIN_CONTRACT, SamplingParams, seed_as_int64  # noqa: F401  (re-exported: the request type lives in engine.request)
from lockstep.kernels import portable
from lockstep.kernels.case import KernelCase, rows_problems
from lockstep.kernels.coins import SAMPLE_COLUMNS, gumbel_from_hash, gumbel_noise
from lockstep.kernels.sampling import FORCED, GREEDY, SEEDED, distributions_triton, fused_temperature, sample_fused_triton


def keep_mask(z: torch.Tensor, top_k: int, top_p: float, min_p: float) -> torch.Tensor:
    """Which ids survive the filters: z [V] float64 (temperature-scaled logits) -> bool [V].

    All three filters look at the same distribution p = softmax(z) and the result is their
    intersection. Ids are ranked by p descending, equal p by lower id (a stable sort):
      top_k (>0): keep the first top_k ranks; ties at the cut go to the lower ids.
      top_p (<1): keep rank r iff the mass of the ranks before it (float64 prefix sum in rank
                  order, portable.prefix_sum) is < top_p: the shortest prefix whose mass reaches top_p; ties at
                  the cut go to the lower ids. top_p = 1 keeps everything.
      min_p (>0): keep v iff p_v >= min_p * max(p).
    The most likely id (lowest id among equals) always survives. One row of keep_mask_rows.
    """
    dev = z.device

    def on(value: float):                 # keep_mask_rows' [2, 1] form of a filter that is on
        return torch.tensor([[value], [0.0]], dtype=torch.float64, device=dev)
    return keep_mask_rows(z[None], torch.tensor([top_k], device=dev) if top_k > 0 else None,
                          on(top_p) if top_p < 1.0 else None, on(min_p) if min_p > 0.0 else None)[0]


def host_to(device: torch.device, values: list, dtype: torch.dtype = torch.int64) -> torch.Tensor:
    """A small host list as a tensor on `device`, without a host sync on a GPU (pinned memory,
    non-blocking copy): generate()'s step inputs and sample_rows' per-row settings."""
    t = torch.tensor(values, dtype=dtype)
    if torch.device(device).type != "cuda":
        return t.to(device)
    return t.pin_memory().to(device, non_blocking=True)


def keep_mask_rows(z: torch.Tensor, top_k: torch.Tensor | None, top_p: torch.Tensor | None,
                   min_p: torch.Tensor | None) -> torch.Tensor:
    """`keep_mask` for every row of z [R, V] at once -> bool [R, V]. Each filter is on z's device,
    or None where no row uses it: top_k [R] (a row with it off holds 2^62, more than any rank);
    top_p and min_p [2, R] float64, row 0 the values, row 1 1.0 where the row has the filter off,
    which keeps all of that row as keep_mask does by skipping it (even a NaN)."""
    R, V = z.shape
    dev = z.device
    probs = portable.softmax(z, dim=-1)
    sorted_p, order = torch.sort(probs, dim=-1, descending=True, stable=True)
    keep_sorted = torch.ones((R, V), dtype=torch.bool, device=dev)
    if top_k is not None:
        keep_sorted &= torch.arange(V, device=dev)[None, :] < top_k[:, None]
    if top_p is not None:
        exclusive = torch.cat([sorted_p.new_zeros(R, 1), portable.prefix_sum(sorted_p, dim=-1)[:, :-1]], dim=-1)
        keep_sorted &= (exclusive < top_p[0, :, None]) | (top_p[1, :, None] == 1.0)
    keep = torch.empty((R, V), dtype=torch.bool, device=dev)
    keep[torch.arange(R, device=dev)[:, None], order] = keep_sorted
    if min_p is not None:
        keep &= (probs >= min_p[0, :, None] * sorted_p[:, :1]) | (min_p[1, :, None] == 1.0)
    return keep


def chosen_logprob(logits: torch.Tensor, token: int) -> torch.Tensor:
    """log_softmax of the raw fp32 logits [V] at `token`, float32 0-dim: chosen_logprobs on a batch of 1."""
    return chosen_logprobs(logits[None], torch.tensor([token], device=logits.device))[0]


def sample(logits: torch.Tensor, params: SamplingParams, seed: int | None, pos: int,
           generator: torch.Generator | None = None) -> int:
    """Pick one token from logits [V] (fp32) per the module docstring: sample_with on a batch of 1."""
    dev = logits.device
    settings = row_settings([params], [seed], dev)
    return int(sample_with(logits[None], settings, torch.tensor([pos], device=dev), generator)[0])


@dataclass
class RowSettings:
    """How each row of a batch is sampled, as device tensors built once (`row_settings`), so the
    sampling itself (`sample_with`) is a fixed launch sequence: a CUDA graph can replay it."""
    rows: torch.Tensor | None           # [S] the rows that are not greedy (None: all greedy)
    temperatures: list                  # [(t, [k] indices into rows)] one division per distinct t
    top_k: torch.Tensor | None          # [S] ) keep_mask_rows' filters,
    top_p: torch.Tensor | None          # [2, S] ) None if no row uses one
    min_p: torch.Tensor | None          # [2, S] )
    seeded: torch.Tensor | None         # [s] indices into rows of the seeded ones
    seeded_rows: torch.Tensor | None    # [s] the same rows as indices into the batch
    seeds: torch.Tensor | None          # [s] int64
    unseeded: list[int]                 # indices into rows that draw from the generator
    fused: tuple | None = None          # the fused kernel's per-row (modes, temps, seeds, keep_idx) [R]

    @property
    def capturable(self) -> bool:
        return not self.unseeded

    @property
    def filtered(self) -> bool:
        return self.top_k is not None or self.top_p is not None or self.min_p is not None


def row_settings(params: list[SamplingParams], seeds: list[int | None], device) -> RowSettings:
    """The RowSettings of a batch whose row r has params[r] and seeds[r] (no host sync)."""
    rows = [r for r in range(len(params)) if not params[r].is_greedy]
    fused = _fused_settings(params, seeds, rows, device)
    if not rows:
        return RowSettings(None, [], None, None, None, None, None, None, [], fused)
    ps = [params[r] for r in rows]
    temps = [p.temperature for p in ps]
    temperatures = [(t, host_to(device, [i for i, u in enumerate(temps) if u == t])) for t in dict.fromkeys(temps)]
    top_k = host_to(device, [p.top_k or (1 << 62) for p in ps]) if any(p.top_k > 0 for p in ps) else None
    top_p = host_to(device, [[p.top_p for p in ps], [float(p.top_p == 1.0) for p in ps]], torch.float64) \
        if any(p.top_p < 1.0 for p in ps) else None
    min_p = host_to(device, [[p.min_p for p in ps], [float(p.min_p == 0.0) for p in ps]], torch.float64) \
        if any(p.min_p > 0.0 for p in ps) else None
    seeded = [i for i, r in enumerate(rows) if seeds[r] is not None]
    return RowSettings(
        rows=host_to(device, rows), temperatures=temperatures, top_k=top_k, top_p=top_p, min_p=min_p,
        seeded=host_to(device, seeded) if seeded else None,
        seeded_rows=host_to(device, [rows[i] for i in seeded]) if seeded else None,
        seeds=host_to(device, [seed_as_int64(seeds[rows[i]]) for i in seeded]) if seeded else None,
        unseeded=[i for i, r in enumerate(rows) if seeds[r] is None], fused=fused)


def _fused_settings(params, seeds, rows, device):
    """lockstep.kernels.sampling.sample_fused_triton's per-row operands, or None where a sampled row has
    no seed (its noise comes from the host generator: the torch path draws it)."""
    if any(seeds[r] is None for r in rows):
        return None
    where = {r: i for i, r in enumerate(rows)}
    return (host_to(device, [SEEDED if r in where else GREEDY for r in range(len(params))], torch.int32),
            host_to(device, [fused_temperature(p.temperature, device) if r in where else 1.0
                             for r, p in enumerate(params)], torch.float64),
            host_to(device, [seed_as_int64(seeds[r]) if r in where else 0 for r in range(len(params))]),
            host_to(device, [where.get(r, -1) for r in range(len(params))]))


def _scaled_rows(logits: torch.Tensor, settings: RowSettings) -> torch.Tensor:
    """z of the sampled rows [S, V] float64: the temperature division with a Python float."""
    z = logits.index_select(0, settings.rows).to(torch.float64)
    for t, same in settings.temperatures:
        z[same] = z.index_select(0, same) / t
    return z


def _keep_rows(z: torch.Tensor, settings: RowSettings) -> torch.Tensor | None:
    """The sampled rows' filter masks [S, V] bool (None when no row filters)."""
    if not settings.filtered:
        return None
    return keep_mask_rows(z, settings.top_k, settings.top_p, settings.min_p)


def sample_with(logits: torch.Tensor, settings: RowSettings, positions: torch.Tensor,
                generator: torch.Generator | None = None) -> torch.Tensor:
    """logits [R, V] fp32, positions [R] int64 (both on one device) -> token ids [R] int64 there,
    row r as `sample(logits[r], params[r], seeds[r], positions[r])` (module docstring)."""
    tokens = torch.argmax(logits, dim=-1)                       # greedy rows: the first maximum
    if settings.rows is None:
        return tokens
    V, dev = logits.shape[1], logits.device
    z = _scaled_rows(logits, settings)                          # [S, V]
    keep = _keep_rows(z, settings)
    if keep is not None:
        z = torch.where(keep, z, float("-inf"))
    logp = portable.log_softmax(z, dim=-1)
    noise = torch.empty_like(logp)
    if settings.seeded is not None:
        cols = SAMPLE_COLUMNS + torch.arange(V, dtype=torch.int64, device=dev)
        noise[settings.seeded] = gumbel_noise(settings.seeds, positions.index_select(0, settings.seeded_rows), cols)
    for i in settings.unseeded:
        if generator is None:
            raise ValueError("sample: a request without a seed needs an explicit torch.Generator")
        h = torch.randint(0, 1 << 32, (V,), dtype=torch.int64, generator=generator)
        noise[i] = gumbel_from_hash(h.to(dev))
    tokens[settings.rows] = torch.argmax(logp + noise, dim=-1)  # -inf where masked; first maximum
    return tokens


def decision_scores(logits: torch.Tensor, settings: RowSettings, positions: torch.Tensor) -> torch.Tensor:
    """The scores whose first maximum is `sample_with`'s token, [R, V] float64: a greedy row's
    logits, a seeded row's masked log-probabilities plus its Gumbel noise (-inf where masked).
    Their top-1 minus top-2 is how near the choice was to another token (a near-tie)."""
    scores = logits.to(torch.float64).clone()
    if settings.rows is None:
        return scores
    if settings.unseeded:
        raise ValueError("decision_scores: a request without a seed has no reproducible scores")
    V, dev = logits.shape[1], logits.device
    z = _scaled_rows(logits, settings)
    keep = _keep_rows(z, settings)
    if keep is not None:
        z = torch.where(keep, z, float("-inf"))
    cols = SAMPLE_COLUMNS + torch.arange(V, dtype=torch.int64, device=dev)
    noise = gumbel_noise(settings.seeds, positions.index_select(0, settings.seeded_rows), cols)
    scores[settings.rows] = portable.log_softmax(z, dim=-1) + noise
    return scores


def sample_and_logprobs(logits: torch.Tensor, settings: RowSettings, positions: torch.Tensor,
                        generator: torch.Generator | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """sample_with and the chosen logprobs of its tokens: -> (tokens [R] int64, logprobs [R] fp32)."""
    tokens = sample_with(logits, settings, positions, generator)
    return tokens, chosen_logprobs(logits, tokens)


def sample_rows(logits: torch.Tensor, params: list[SamplingParams], seeds: list[int | None],
                positions: list[int], generator: torch.Generator | None = None,
                sampler: "Sampler | None" = None) -> torch.Tensor:
    """Row r of logits [R, V] (fp32) sampled as `sample(logits[r], params[r], seeds[r],
    positions[r], generator)`, for all rows in one launch sequence on the logits' device, by
    `sampler` (default TORCH_SAMPLER): -> token ids [R] int64 there. Reads nothing back to the host.
    Rows without a seed draw from `generator` in row order, V integers each, as `sample` would."""
    dev = logits.device
    return (sampler or TORCH_SAMPLER).sample(logits, row_settings(params, seeds, dev), host_to(dev, positions),
                                             generator)[0]


def chosen_logprobs(logits: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
    """`chosen_logprob` of every row: logits [R, V], tokens [R] int64 -> [R] float32."""
    lp = portable.log_softmax(logits.to(torch.float32), dim=-1)
    return lp.gather(-1, tokens[:, None])[:, 0]


def target_distributions(logits: torch.Tensor, params: list[SamplingParams]) -> torch.Tensor:
    """softmax(z masked by the filters) of every row of logits [R, V] fp32 (row r sampled with
    params[r], none greedy) -> [R, V] float64: engine.spec_accept.target_probs for each row."""
    settings = row_settings(params, [0] * len(params), logits.device)
    z = _scaled_rows(logits, settings)
    keep = _keep_rows(z, settings)
    return portable.softmax(z if keep is None else torch.where(keep, z, float("-inf")), dim=-1)


# --------------------------------------------------------------------------- the fused sampler
def sample_fused(logits: torch.Tensor, settings: RowSettings, positions: torch.Tensor):
    """sample_with and chosen_logprobs in one kernels.sampling launch (settings.fused set):
    -> (tokens [R] int64, logprobs [R] fp32); the filter masks, where a row has one, come from
    keep_mask_rows (a sort and a scan) first."""
    modes, temps, seeds, keep_idx = settings.fused
    keep = _keep_rows(_scaled_rows(logits, settings), settings) if settings.filtered else None   # z: masks only
    return sample_fused_triton(logits, modes, temps, seeds, positions, torch.zeros_like(positions),
                               keep, None if keep is None else keep_idx)


def sample_and_logprobs_fused(logits: torch.Tensor, settings: RowSettings, positions: torch.Tensor,
                              generator: torch.Generator | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """sample_and_logprobs' bits from one kernels.sampling launch; a batch with a row that draws
    from the host generator (settings.fused None) takes the torch path."""
    if settings.fused is None:
        return sample_and_logprobs(logits, settings, positions, generator)
    return sample_fused(logits, settings, positions)


def chosen_logprobs_fused(logits: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
    """chosen_logprobs' bits from kernels.sampling's FORCED rows: no [R, V] log-softmax in memory."""
    R = logits.shape[0]
    z = torch.zeros(R, dtype=torch.int64, device=logits.device)
    # one program per row: a forced row makes only the two fp32 passes, which a split does not
    # pay back (H200: 0.25 ms one program, 0.35-0.39 ms split at 1-8 rows; docs/history/benchmarks.md)
    return sample_fused_triton(logits.to(torch.float32), torch.full_like(z, FORCED, dtype=torch.int32),
                               torch.ones(R, dtype=torch.float64, device=logits.device), z, z, tokens, chunks=1)[1]


def target_distributions_fused(logits: torch.Tensor, params: list[SamplingParams]) -> torch.Tensor:
    """target_distributions' bits from kernels.sampling.distributions_triton."""
    settings = row_settings(params, [0] * len(params), logits.device)
    keep = _keep_rows(_scaled_rows(logits, settings), settings) if settings.filtered else None
    _, temps, _, keep_idx = settings.fused
    return distributions_triton(logits, temps, keep, None if keep is None else keep_idx)


@dataclass(frozen=True)
class Sampler:
    """One implementation of the batched sampling steps (module docstring), an entry of the ops
    table: every call site of the engine samples through its model's `ops.sampler`."""
    name: str
    sample: Callable            # (logits [R, V] fp32, RowSettings, positions [R], generator) -> (tokens, logprobs)
    chosen_logprobs: Callable   # (logits [R, V], tokens [R]) -> [R] fp32
    distributions: Callable     # (logits [R, V] fp32, params, none greedy) -> [R, V] float64


TORCH_SAMPLER = Sampler("torch", sample_and_logprobs, chosen_logprobs, target_distributions)
FUSED_SAMPLER = Sampler("fused", sample_and_logprobs_fused, chosen_logprobs_fused, target_distributions_fused)


# --------------------------------------------------------------------------- the kernel spec's case
def _sample_fused_op(logits, params, seeds, positions):
    """The fused kernels: (tokens, chosen logprobs, target distributions; greedy rows at temperature 1)."""
    tok, lp = sample_fused(logits, row_settings(params, seeds, logits.device), positions)
    return tok, lp, target_distributions_fused(logits, [SamplingParams() if p.is_greedy else p for p in params])


def _sample_torch(x: dict):
    """The torch path's (tokens, chosen logprobs, target distributions; greedy rows at temperature 1)."""
    logits, params = x["logits"], x["params"]
    tok = sample_with(logits, row_settings(params, x["seeds"], logits.device), x["positions"])
    dist = target_distributions(logits, [SamplingParams() if p.is_greedy else p for p in params])
    return tok, chosen_logprobs(logits, tok), dist


def _sample_fused_inputs(inp, s, d):
    """Rows written in the spec (logits [R, V] float32, each row's SamplingParams, seed, position)."""
    rows, V = inp["rows"] or [{"seed": i, "position": i} for i in range(s["R"])], s["V"]
    x = d.normal(len(rows), V, scale=3.0 * inp["scale"], dtype=torch.float32)
    for i, row in enumerate(rows):
        if row.get("fill") is not None:
            x[i] = row["fill"]
        for v, val in (row.get("logits") or {}).items():
            x[i, int(v)] = float(val)
    return {"logits": x, "params": [SamplingParams(**(row.get("params") or {"greedy": True})) for row in rows],
            "seeds": [row["seed"] for row in rows],
            "positions": torch.tensor([row["position"] for row in rows], dtype=torch.int64, device=d.device)}


def _sampled_rows(tok, lp, dist):
    """[rows, 2 + V] int64: the token, the chosen logprob's bits, the bits of the row's target
    distribution. Every NaN is written as one NaN: which NaN an operation on NaNs returns (sign,
    payload) is the hardware's and the library's choice (x86 keeps an operand's, a GPU gives its
    own), so the contract is that a value is NaN where the torch path's is, not its NaN bits."""
    lp, dist = (torch.where(t.isnan(), math.nan, t) for t in (lp, dist))
    return torch.cat([tok[:, None], lp.view(torch.int32).to(torch.int64)[:, None], dist.view(torch.int64)], 1)


def _filters_alone(params: SamplingParams) -> list[tuple[str, tuple]]:
    """(name, keep_mask's (top_k, top_p, min_p) with only that filter on) for each filter params use."""
    return [(name, args) for name, on, args in (("top-k", params.top_k > 0, (params.top_k, 1.0, 0.0)),
                                                ("top-p", params.top_p < 1.0, (0, params.top_p, 0.0)),
                                                ("min-p", params.min_p > 0.0, (0, 1.0, params.min_p))) if on]


def broken_rule(logits: torch.Tensor, params: SamplingParams, seed: int, position: int, token: int) -> str:
    """Which rule of the module docstring a sampler that chose `token` from logits [V] fp32 broke,
    in a phrase (this engine's choice is `sample(logits, params, seed, position)`): the cause a
    sampler mismatch reports first. A tie lost to a higher id is named as the tie rule."""
    V, dev = logits.shape[-1], logits.device
    if not 0 <= token < V:
        return f"an id outside the vocabulary [0, {V})"
    settings = row_settings([params], [seed], dev)
    pos = torch.tensor([position], device=dev)
    scores = decision_scores(logits[None], settings, pos)[0]
    want = int(sample_with(logits[None], settings, pos)[0])
    if params.is_greedy:
        return "the tie rule (greedy: the lowest id among equal logits)" if scores[token] == scores[want] \
            else "greedy (not the argmax of the raw logits)"
    z = _scaled_rows(logits[None], settings)[0]
    p = portable.softmax(z, dim=-1)
    for name, args in _filters_alone(params):
        kept = keep_mask(z, *args)
        if not kept[token]:
            if bool(((p[kept] == p[token]) | (p[kept].isnan() & p[token].isnan())).any()):   # the sort's equals
                return f"the tie rule at the {name} cut (equal probabilities are kept lowest id first)"
            return f"the {name} filter (it excludes id {token})"
    if scores[token] == scores[want]:
        return "the tie rule (the lowest id among equal logp + Gumbel scores)"
    return "the draw (another id has the larger logp + Gumbel score: the coin's seed, position or column, " \
           "or the temperature)"


def settings_phrase(params: SamplingParams, seed: int | None) -> str:
    """A request's sampling settings in one phrase: what a reader needs to reproduce its draw."""
    if params.is_greedy:
        return "greedy"
    parts = [f"seed {seed}", f"temperature {params.temperature:g}"]
    return ", ".join(parts + [f"{k} {getattr(params, k):g}" for k, off in (("top_k", 0), ("top_p", 1.0), ("min_p", 0.0))
                              if getattr(params, k) != off])


def _sampling_params_call(op, x, r, offered):
    """The interface `sampling` operation with params= on rows r: the tokens [rows] int64."""
    seeds = torch.tensor([int(s) for s in x["seeds"][r]], dtype=torch.int64, device=x["logits"].device)
    return op(x["logits"][r], seeds, x["positions"][r], params=list(x["params"][r]))


def _explain_row(x, r: int, got: int) -> str:
    """sampler: the broken rule at row r (its key and settings) — the two tokens."""
    params, seed, pos = x["params"][r], int(x["seeds"][r]), int(x["positions"][r])
    want = int(_sample_torch(x)[0][r])
    return (f"sampler: {broken_rule(x['logits'][r], params, seed, pos, got)} at row {r} (position {pos}; "
            f"{settings_phrase(params, seed)}) — token {got} where DESIGN §5 gives {want}")


# An outside target's form of sample_fused: the tokens alone, through the interface's `sampling`
# with params, judged bitwise where the target declares the coin contract.
SAMPLED_TOKENS = KernelCase(
    name="sampling", dims=("R", "V"), inputs=_sample_fused_inputs,
    op=lambda logits, seeds, positions, params: sample_rows(logits, params, seeds.tolist(), positions.tolist()),
    call=_sampling_params_call, reference=lambda x: _sample_torch(x)[0], elements=lambda s: 8 * s["R"] * s["V"],
    options=("rows",), problems=rows_problems, interface=True, needs=("params",), rng=COIN_CONTRACT,
    explain=_explain_row, note="its tokens, through its `sampling` operation with params=")

CASES = (KernelCase(
    name="sample_fused", dims=("R", "V"), inputs=_sample_fused_inputs, op=_sample_fused_op,
    call=lambda op, x, r, offered: _sampled_rows(*op(x["logits"][r], x["params"][r], x["seeds"][r],
                                                     x["positions"][r])),
    reference=lambda x: _sampled_rows(*_sample_torch(x)), elements=lambda s: 8 * s["R"] * s["V"],
    options=("rows",), problems=rows_problems, form=SAMPLED_TOKENS,
    note="lockstep.engine.sampling.sample_fused and the fused target distributions"),)
