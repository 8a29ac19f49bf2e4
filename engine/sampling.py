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

`sample_rows` does the same for a whole batch [R, V] in one launch sequence on the logits'
device: every step above is elementwise or a reduction along the vocabulary, so row r gets
exactly the bits `sample(logits[r], ...)` gives (tests/engine/test_sampling_rows.py). Only the
temperature division is done per distinct temperature, with the temperature a Python float as
in `sample`: a tensor divisor would be a different operation on some devices (CUDA multiplies
by a scalar divisor's reciprocal).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from engine.request import SamplingParams, seed_as_int64  # noqa: F401  (re-exported: the request type lives in engine.request)
from kernels import portable
from kernels.coins import SAMPLE_COLUMNS, gumbel_from_hash, gumbel_noise


def keep_mask(z: torch.Tensor, top_k: int, top_p: float, min_p: float) -> torch.Tensor:
    """Which ids survive the filters: z [V] float64 (temperature-scaled logits) -> bool [V].

    All three filters look at the same distribution p = softmax(z) and the result is their
    intersection. Ids are ranked by p descending, equal p by lower id (a stable sort):
      top_k (>0): keep the first top_k ranks; ties at the cut go to the lower ids.
      top_p (<1): keep rank r iff the mass of the ranks before it (float64 prefix sum in rank
                  order, portable.prefix_sum) is < top_p: the shortest prefix whose mass reaches top_p; ties at
                  the cut go to the lower ids. top_p = 1 keeps everything.
      min_p (>0): keep v iff p_v >= min_p * max(p).
    The most likely id (lowest id among equals) always survives.
    """
    V = z.shape[-1]
    keep_sorted = torch.ones(V, dtype=torch.bool, device=z.device)
    probs = portable.softmax(z, dim=-1)
    sorted_p, order = torch.sort(probs, descending=True, stable=True)
    ranks = torch.arange(V, device=z.device)
    if top_k > 0:
        keep_sorted &= ranks < top_k
    if top_p < 1.0:
        exclusive = torch.cat([sorted_p.new_zeros(1), portable.prefix_sum(sorted_p, dim=-1)[:-1]])
        keep_sorted &= exclusive < top_p
    keep = torch.empty(V, dtype=torch.bool, device=z.device)
    keep[order] = keep_sorted
    if min_p > 0.0:
        keep &= probs >= min_p * sorted_p[0]
    return keep


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
    """log_softmax of the raw fp32 logits [V] at `token`, float32 0-dim."""
    return portable.log_softmax(logits.to(torch.float32), dim=-1)[token]


def sample(logits: torch.Tensor, params: SamplingParams, seed: int | None, pos: int,
           generator: torch.Generator | None = None) -> int:
    """Pick one token from logits [V] (fp32) per the module docstring."""
    if params.is_greedy:
        return int(torch.argmax(logits))                      # first maximum
    z = logits.to(torch.float64) / params.temperature
    keep = keep_mask(z, params.top_k, params.top_p, params.min_p)
    logp = portable.log_softmax(torch.where(keep, z, float("-inf")), dim=-1)
    V = logits.shape[-1]
    if seed is not None:
        dev = logits.device
        s = torch.tensor([seed_as_int64(seed)], dtype=torch.int64, device=dev)
        p = torch.tensor([pos], dtype=torch.int64, device=dev)
        cols = SAMPLE_COLUMNS + torch.arange(V, dtype=torch.int64, device=dev)
        g = gumbel_noise(s, p, cols)[0]                        # [V] float64
    else:
        if generator is None:
            raise ValueError("sample: a request without a seed needs an explicit torch.Generator")
        h = torch.randint(0, 1 << 32, (V,), dtype=torch.int64, generator=generator)
        g = gumbel_from_hash(h.to(logits.device))
    return int(torch.argmax(logp + g))                       # -inf where masked; first maximum


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

    @property
    def capturable(self) -> bool:
        return not self.unseeded


def row_settings(params: list[SamplingParams], seeds: list[int | None], device) -> RowSettings:
    """The RowSettings of a batch whose row r has params[r] and seeds[r] (no host sync)."""
    rows = [r for r in range(len(params)) if not params[r].is_greedy]
    if not rows:
        return RowSettings(None, [], None, None, None, None, None, None, [])
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
        unseeded=[i for i, r in enumerate(rows) if seeds[r] is None])


def sample_with(logits: torch.Tensor, settings: RowSettings, positions: torch.Tensor,
                generator: torch.Generator | None = None) -> torch.Tensor:
    """logits [R, V] fp32, positions [R] int64 (both on one device) -> token ids [R] int64 there,
    row r as `sample(logits[r], params[r], seeds[r], positions[r])` (module docstring)."""
    tokens = torch.argmax(logits, dim=-1)                       # greedy rows: the first maximum
    if settings.rows is None:
        return tokens
    V, dev = logits.shape[1], logits.device
    z = logits.index_select(0, settings.rows).to(torch.float64)            # [S, V]
    for t, same in settings.temperatures:                       # the temperature as a Python float
        z[same] = z.index_select(0, same) / t
    if settings.top_k is not None or settings.top_p is not None or settings.min_p is not None:
        keep = keep_mask_rows(z, settings.top_k, settings.top_p, settings.min_p)
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


def sample_rows(logits: torch.Tensor, params: list[SamplingParams], seeds: list[int | None],
                positions: list[int], generator: torch.Generator | None = None) -> torch.Tensor:
    """Row r of logits [R, V] (fp32) sampled as `sample(logits[r], params[r], seeds[r],
    positions[r], generator)`, for all rows in one launch sequence on the logits' device:
    -> token ids [R] int64 there. Reads nothing back to the host. Rows without a seed draw
    from `generator` in row order, V integers each, exactly as `sample` would one after another."""
    dev = logits.device
    return sample_with(logits, row_settings(params, seeds, dev), host_to(dev, positions), generator)


def chosen_logprobs(logits: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
    """`chosen_logprob` of every row: logits [R, V], tokens [R] int64 -> [R] float32."""
    lp = portable.log_softmax(logits.to(torch.float32), dim=-1)
    return lp.gather(-1, tokens[:, None])[:, 0]
