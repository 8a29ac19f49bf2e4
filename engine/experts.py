"""The routed experts of a gpt-oss MoE layer, up to the down projection's K-chunk partials.

    experts(x [T, H], top_ids [T, k], held: LocalExperts) -> parts [C, T * k, H]

`LocalExperts` holds what a device has of a layer's experts: gate_up_w [E_l, 2I', H],
gate_up_b [E_l, 2I'], down_w [E_l, H, I'], down's K chunk `bounds`, the ids [lo, lo + n) and the
SwiGLU's alpha and limit. Row r = t * k + s is token t's slot s; its expert is top_ids[t, s]. For
a local expert (id in [lo, lo + n), local index e = id - lo):

    h = x[t] @ gate_up_w[e]^T + gate_up_b[e]                     [2I'], gate/up interleaved, in x's dtype
    a = clamped_swiglu(h)                                        [I'], elementwise (kernels.moe)
    parts[c, r] = a[lo_c:hi_c] @ down_w[e][:, lo_c:hi_c]^T       c = 0 .. C-1, no bias, fp32

Rows of non-local experts are 0 (skipped, never multiplied by zero: DESIGN §8). I' is the
intermediate range held here (all of I on one device; a TP rank's K chunks in engine/parallel.py,
`bounds` relative to it). The caller adds the C partials in the fixed tree (engine.linear.tree_sum
on one device, the gathered tree across a TP group), then the down bias: the same bits at any TP
and EP degree (DESIGN §2, D4).

Three implementations of that one contract, with the same bits (engine/ops.py picks one):

- experts_grouped (Triton ops, every rank; experts_one_device on one device, which skips the
  zero fills of outputs every row overwrites): group_by_expert sorts the rows by
  expert on the device, then one launch for gate_up, one for the SwiGLU (elementwise, all rows at
  once) and one for every (expert block, chunk) of the down projection: no tensor value is read
  on the host and every shape depends on T, k, n_local and the weights only, so a decode step can
  be captured in a CUDA graph. Each element is reduced exactly as linear_triton reduces it on the
  row's expert (gate_up) and on the chunk's fresh copy (down). A large MXFP4 prefill
  (kernels.moe.mxfp4_dense) first decodes the experts into the MXFP4 kernels' MMA order and then
  runs the dense tiles: the same bits.
- experts_per_row (torch ops, one device): every (token, slot) row with its own expert's weights
  gathered, so the step reads no tensor value on the host (static shapes).
- experts_per_expert (torch ops, a sharded model): a loop over the local experts with
  kernels.matmul's portable matmuls; it reads which experts were routed on the host, to skip the
  non-local ones.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from lockstep.engine.linear import k_chunk_bounds
from lockstep.engine.mxfp4 import Mxfp4Weight, dequantize
from lockstep.kernels import portable
from lockstep.kernels.case import KernelCase
from lockstep.kernels.matmul import linear_chunks_portable, linear_portable
from lockstep.kernels.moe import (clamped_swiglu_portable, clamped_swiglu_triton, expert_block_m, expert_down_partials_triton,
                                  expert_gate_up_triton, group_by_expert)
from lockstep.kernels.moe_mxfp4_order import gather_columns, mma_order_columns, mma_order_triton, mxfp4_dense
from lockstep.kernels.mxfp4 import quantize


@dataclass(frozen=True)
class LocalExperts:
    """The experts of one MoE layer that a device holds, and the constants they run with."""
    gate_up_w: object             # [n, 2I', H] dense, or packed MXFP4 (Mxfp4Weight, or (blocks, scales))
    gate_up_b: torch.Tensor       # [n, 2I']
    down_w: object                # [n, H, I'], dense or packed
    bounds: tuple                 # down's K chunks, relative to I' (engine/linear.py)
    lo: int                       # the ids held: [lo, lo + n)
    n: int
    alpha: float                  # the clamped SwiGLU's constants (kernels.moe)
    limit: float


def every_local(gate_up_w, gate_up_b: torch.Tensor, down_w, alpha: float, limit: float) -> LocalExperts:
    """Every expert of a layer on one device, down in the fixed K chunks of its intermediate size."""
    return LocalExperts(gate_up_w, gate_up_b, down_w, tuple(k_chunk_bounds(gate_up_b.shape[1] // 2)), 0,
                        gate_up_b.shape[0], alpha, limit)


def experts_grouped(x: torch.Tensor, top_ids: torch.Tensor, held: LocalExperts,
                    fused_swiglu: bool = False, every_expert_local: bool = False) -> torch.Tensor:
    """The Triton implementation (module docstring). fused_swiglu: the clamped SwiGLU inside the
    down kernel's loads (kernels/matmul.py `_load_a_tile`) instead of its own launch; the same bits
    in Triton's interpreter (tests/kernels/test_grouped_moe.py), off until a GPU run shows the
    CUDA goldens unchanged with it on. every_expert_local: the caller holds every expert (one
    device: experts_one_device), so no row is non-local and no output is zero-filled first."""
    if every_expert_local and held.lo != 0:
        raise ValueError(f"experts_grouped: every expert local needs expert_lo 0, got {held.lo}")
    gate_up_w, gate_up_b, down_w, n_local = held.gate_up_w, held.gate_up_b, held.down_w, held.n
    k = top_ids.shape[1]
    bounds = list(held.bounds)
    down_cols = None
    if isinstance(gate_up_w, tuple) and mxfp4_dense(top_ids.numel(), n_local, x.dtype):
        # a prefill's MXFP4 experts, decoded once into the packed kernels' MMA order: dense tiles,
        # the same bits (kernels.moe, "MXFP4 prefill as dense tiles")
        gate_bounds = ((0, x.shape[1]),)                                               # all of H
        gate_cols, _ = mma_order_columns(gate_bounds, x.shape[1], x.device)
        down_cols, padded = mma_order_columns(bounds, 32 * down_w[0].shape[2], x.device)
        gate_up_w = mma_order_triton(gate_up_w, gate_bounds, x.dtype)                 # [E, 2I, HP]
        down_w, bounds = mma_order_triton(down_w, bounds, x.dtype), padded              # [E, H, KP]
        x = gather_columns(x, gate_cols)                                                # [T, HP]
        fused_swiglu = False                                                           # a is gathered first
    block_m = expert_block_m(top_ids.numel(), n_local, x.dtype, mxfp4=isinstance(gate_up_w, tuple))   # shapes only
    groups = group_by_expert(top_ids.reshape(-1), held.lo, n_local, block_m)              # on the device
    every = every_expert_local                                                         # every row is stored
    h = expert_gate_up_triton(x, k, groups, gate_up_w, gate_up_b, every_row_local=every)   # [T * k, 2I']
    if fused_swiglu:
        return expert_down_partials_triton(h, groups, down_w, bounds, prologue_swiglu=(held.alpha, held.limit),
                                           every_row_local=every)
    a = clamped_swiglu_triton(h, held.alpha, held.limit)                               # [T * k, I']
    if down_cols is not None:
        a = gather_columns(a, down_cols)                                               # [T * k, KP]
    return expert_down_partials_triton(a, groups, down_w, bounds, every_row_local=every)   # [C, T * k, H]


def experts_one_device(x: torch.Tensor, top_ids: torch.Tensor, held: LocalExperts) -> torch.Tensor:
    """experts_grouped for a model holding every expert (the Triton ops' `experts`; a sharded model
    takes experts_grouped itself): the same bits, without zero-filling outputs every row overwrites."""
    return experts_grouped(x, top_ids, held, every_expert_local=True)


def experts_per_row(x: torch.Tensor, top_ids: torch.Tensor, held: LocalExperts) -> torch.Tensor:
    """The torch implementation for a model holding every expert (lo = 0): each row is
    gate_up, the clamped SwiGLU, then down over the chunks: the operations `linear_portable` and
    `linear_chunks_portable` do, element for element."""
    gate_up_w, gate_up_b, down_w = held.gate_up_w, held.gate_up_b, held.down_w
    if held.lo != 0 or held.n != gate_up_w.shape[0]:
        raise ValueError(f"experts_per_row: needs every expert local, got experts [{held.lo}, "
                         f"{held.lo + held.n}) of {gate_up_w.shape[0]}")
    T, H = x.shape
    k, I2 = top_ids.shape[1], gate_up_b.shape[1]
    bounds = list(held.bounds)
    ids = top_ids.reshape(-1)                                            # [T * k], token-major
    rows_x = x.repeat_interleave(k, dim=0)                               # [T * k, H]
    f32 = torch.float32
    parts = x.new_empty((len(bounds), T * k, H), dtype=f32)
    step = max(1, _EXPERT_ROW_ELEMENTS // (I2 * H))                      # memory bound only
    gate_up_rows, down_rows = _expert_rows(gate_up_w, T * k), _expert_rows(down_w, T * k)
    for r0 in range(0, T * k, step):
        e = ids[r0:r0 + step]                                            # [R] expert ids
        h = portable.matmul_nt(rows_x[r0:r0 + step, None, :].to(f32), gate_up_rows(e))[:, 0]
        h = torch.add(h, gate_up_b.index_select(0, e)).to(x.dtype)       # [R, 2I], stored in x's dtype
        a = clamped_swiglu_portable(h, held.alpha, held.limit).to(f32)            # [R, I], elementwise
        parts[:, r0:r0 + step] = _down_partials(a, down_rows(e), bounds)   # [C, R, H]
    return parts


def _down_partials(a: torch.Tensor, w: torch.Tensor, bounds) -> torch.Tensor:
    """a [R, I'] fp32, w [R, H, I'] fp32 -> [C, R, H]: chunk c's partial a[:, lo:hi] @ w[:, :, lo:hi]^T
    of each row. Equal adjacent chunks (every layer whose I' the chunk count divides) go in one
    portable matmul with the chunk as a leading dim: each element is the same tree_sum of the same
    products as chunk by chunk (kernels.matmul's _partials_at_once argues the same), in one call."""
    R, H = w.shape[0], w.shape[1]
    lo, hi, C = bounds[0][0], bounds[-1][1], len(bounds)
    width = bounds[0][1] - lo
    if width > 0 and all(b == (lo + c * width, lo + (c + 1) * width) for c, b in enumerate(bounds)):
        xs = a[:, lo:hi].reshape(R, C, 1, width)                                 # [R, C, 1, w]
        ws = w[:, :, lo:hi].reshape(R, H, C, width).transpose(1, 2)              # [R, C, H, w]
        return portable.matmul_nt(xs, ws)[:, :, 0].transpose(0, 1)               # [C, R, H]
    return torch.stack([portable.matmul_nt(a[:, None, l:h], w[:, :, l:h])[:, 0] for l, h in bounds])


_EXPERT_ROW_ELEMENTS = 1 << 22      # gathered expert weights built at once


def _expert_rows(weight, rows: int):
    """ids -> the fp32 [len(ids), N, K] weights of experts `ids` (MXFP4 decoded, or cast: exact
    either way), for a call of `rows` rows. With no more experts than rows (a prefill), and
    within the memory bound, every expert is decoded once here and each row gathers its decoded
    weights; otherwise (a decode step's few rows) each row decodes its own. Shapes alone decide."""
    E, N, K = weight.shape
    if E <= rows and E * N * K <= _EXPERT_ROW_ELEMENTS:
        dense = _dense(weight)
        return lambda ids: dense.index_select(0, ids)
    if isinstance(weight, Mxfp4Weight):
        return lambda ids: weight.rows(ids, torch.float32)
    return lambda ids: weight.index_select(0, ids).to(torch.float32)


def _dense(weight) -> torch.Tensor:
    """The fp32 [E, N, K] weights of every expert."""
    if isinstance(weight, Mxfp4Weight):
        return dequantize(weight.blocks, weight.scales, torch.float32)
    return weight.to(torch.float32)


def experts_per_expert(x: torch.Tensor, top_ids: torch.Tensor, held: LocalExperts) -> torch.Tensor:
    """The torch implementation for a sharded model (module docstring); packed weights (Mxfp4Weight,
    Mxfp4Columns) are decoded one routed expert at a time, exactly, into x's dtype."""
    T, H = x.shape
    k = top_ids.shape[1]
    bounds = list(held.bounds)
    act = lambda g: clamped_swiglu_portable(g, held.alpha, held.limit)  # noqa: E731
    parts = x.new_zeros((len(bounds), T * k, H), dtype=torch.float32)   # non-local rows stay zero
    flat_ids = top_ids.reshape(-1)                 # [T * k], token-major (token, slot) pairs
    for e in range(held.n):                        # local experts; the rest are skipped, not x 0
        rows = (flat_ids == e + held.lo).nonzero()[:, 0]
        if rows.numel() == 0:
            continue
        xe = x.index_select(0, torch.div(rows, k, rounding_mode="floor"))           # [n, H]
        h = linear_portable(xe, _one_expert(held.gate_up_w, e, x.dtype), held.gate_up_b[e])  # [n, 2I']
        down = _one_expert(held.down_w, e, x.dtype)
        for c, p in enumerate(linear_chunks_portable(h, down, bounds, prologue=act, x_per_k=2)):   # SwiGLU per chunk
            parts[c].index_copy_(0, rows, p)
    return parts


def _one_expert(weight, e: int, dtype: torch.dtype) -> torch.Tensor:
    """Local expert e's dense [N, K] weights: a dense tensor's row, or packed ones decoded (exact)."""
    if isinstance(weight, torch.Tensor):
        return weight[e]
    return weight.rows(torch.tensor([e], device=weight.blocks.device), dtype)[0]


# --------------------------------------------------------------------------- the kernel spec's case
def _experts_op(x, ids, gate_up_w, gate_up_b, down_w, alpha, limit):
    """The grouped Triton expert path on every expert (`experts` of the kernel kind)."""
    return experts_grouped(x, ids, every_local(gate_up_w, gate_up_b, down_w, alpha, limit))


def _experts_inputs(inp, s, d):
    """x [T, H], every token's k distinct experts, the weights (MXFP4-packed with `mxfp4`: the
    kernels decode in their tile loads)."""
    T, H, I, E, kk = s["T"], s["H"], s["I"], s["E"], s["k"]
    x = d.normal(T, H, scale=inp["scale"])
    gu_w, dn_w = d.normal(E, 2 * I, H, scale=H ** -0.5), d.normal(E, H, I, scale=I ** -0.5)
    gu_b = d.normal(E, 2 * I, dtype=torch.float32)
    if inp["mxfp4"]:
        gu_w, dn_w = (tuple(t.to(x.device) for t in quantize(w.cpu())) for w in (gu_w, dn_w))
    used = inp["experts_used"] or E
    ids = torch.stack([torch.randperm(used, generator=d.g)[:kk] for _ in range(T)]).to(x.device)   # [T, k] distinct
    return {"x": x, "ids": ids, "gate_up_w": gu_w, "gate_up_b": gu_b, "down_w": dn_w, "alpha": 1.702, "limit": 7.0}


def _partials_rows(parts, x):
    """[chunks, rows * k, H] -> [rows, k * chunks * H]: each (token, slot)'s down partials, chunk-major."""
    rows, kk, H = parts.shape[1] // x["ids"].shape[1], x["ids"].shape[1], x["x"].shape[1]
    return parts.view(parts.shape[0], rows, kk, H).permute(1, 2, 0, 3).reshape(rows, -1)


def _experts_reference(x):
    """experts_per_row (the torch ops' experts) on the spec's inputs."""
    gu, dn = (Mxfp4Weight(*w) if isinstance(w, tuple) else w for w in (x["gate_up_w"], x["down_w"]))
    return _partials_rows(experts_per_row(x["x"], x["ids"], every_local(gu, x["gate_up_b"], dn, x["alpha"], x["limit"])), x)


def _experts_problems(inp, s):
    out = [(("shape", "k"), f"k = {s['k']} exceeds E = {s['E']}")] if s["k"] > s["E"] else []
    if inp["experts_used"] is not None and not s["k"] <= inp["experts_used"] <= s["E"]:
        out.append((("experts_used",), f"must be in [k, E] = [{s['k']}, {s['E']}]"))
    if inp["mxfp4"] and (s["H"] % 32 or s["I"] % 32):
        out.append((("mxfp4",), "MXFP4 blocks need H and I to be multiples of 32"))
    return out


def _experts_elements(s):
    T, H, I, E, k = s["T"], s["H"], s["I"], s["E"], s["k"]
    return 2 * T * H + 4 * E * H * I + 3 * E * I + E * H + T * E + T * k * (3 * I + 3 * H) + 2 * 8 * T * k * H


CASES = (KernelCase(
    name="experts", dims=("T", "H", "I", "E", "k"), inputs=_experts_inputs, op=_experts_op,
    call=lambda op, x, r, offered: _partials_rows(op(x["x"][r], x["ids"][r], x["gate_up_w"], x["gate_up_b"],
                                                     x["down_w"], x["alpha"], x["limit"]), x),
    reference=_experts_reference, elements=_experts_elements, problems=_experts_problems,
    options=("experts_used", "mxfp4"),
    note="lockstep.engine.experts.experts_grouped (the grouped Triton expert path)"),)
