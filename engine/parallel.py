"""Tensor- and expert-parallel gpt-oss, bitwise equal to one device (DESIGN §2, D4).

    model = shard(GptOssModel(config, weights), ParallelContext(Topology(tp=2, ep=2)))
    results = engine.generate.generate(model, requests)        # unchanged: same model, same forward

    # the same, run on tp × ep local processes (rank 0's results; every rank's must agree):
    results = generate_at(ckpt, tp, ep, requests)
    results = speculative_generate_at(ckpt, tp, ep, requests, draft=draft_dir, convention="sglang",
                                      spec=SpecParams(topk=2, num_steps=3, draft_token_num=6))

Parallelism is a transform, as gpt-fast's apply_tp: `shard(model, ctx)` takes an ordinary one-device
GptOssModel and, in place, keeps only this rank's share of each weight (moved to the context's
device), sets the ops to the sublayer ends op by op (`sharded_ops`: the fused ends add all 8 K
chunks in one kernel, a rank holds 8/tp of them) and swaps in `RankCollectives`, which completes
across the ranks what the one-device `engine.model.OneDevice` completes locally. The class, its
forward and its blocks are engine/model.py's, unchanged.

Layout and groups: engine/distributed.py (world = tp × ep). What each rank holds and does:

    embedding   vocab rows [tp_rank * V/tp, ...); a token's row comes from its owner rank by an
                all-gather and an index (never a float sum: -0.0 + 0.0 would change bits)
    q, k, v     column parallel: Hq/tp query heads and Hkv/tp KV heads, their rows stacked as on
                one device (each output column is its own reduction); the KV cache holds only
                this rank's KV heads
    o_proj      row parallel: the rank's heads are K chunks [tp_rank*8/tp, ...) of the fixed
                8 (engine.linear.K_CHUNKS); partials all-gathered, all 8 added in the fixed
                tree on every rank, then the bias: the one-device linear_k_chunked, bit for bit
    router      replicated (every rank routes every token the same way)
    experts     EP group ep_rank owns experts [ep_rank * E/ep, ...); non-local (token, slot)
                pairs are skipped, never multiplied by zero (DESIGN §8). Inside the EP group
                the intermediate dim is split into the K chunks' ranges: gate_up is column
                parallel (interleaved gate/up pairs stay together), down is row parallel with
                the same gather + tree as o_proj; then bias and routing weight on the owner.
                The (token, slot) outputs are all-gathered over the EP group, each taken from
                its expert's owner, and added in slot order, as on one device.
    lm_head     vocab rows [tp_rank * V/tp, ...); logits column blocks all-gathered

Every rank ends a forward with the full logits and captured states (the residual stream is
replicated), so generate(), sampling and the harness need nothing parallel-specific.
Unsupported splits raise UnsupportedTopology up front, naming each violated constraint.

The experts are engine/experts.py's contract given this rank's experts and K chunks: on the
torch ops the per-expert loop, which reads the routed expert ids on the host (to skip non-local
experts) and decodes packed experts one at a time; on the Triton ops the grouped kernels, which
read nothing. `from_checkpoint` (what the launched ranks call) builds a rank from the bytes it
holds alone (engine.rank_weights: its slices, MXFP4 kept packed, replicated parts whole);
`shard` of a one-device model decodes MXFP4 experts (exactly). Both give the same bits.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

import torch

from lockstep.engine import world
from lockstep.engine.checkpoint import read_tensor
from lockstep.engine.rank_weights import RankShare, held_bytes, load_rank
from lockstep.engine.distributed import ParallelContext, Topology, UnsupportedTopology, invariant_sum
from lockstep.engine.linear import K_CHUNKS, k_chunk_bounds
from lockstep.engine.model import ONE_DEVICE, GptOssModel
from lockstep.engine.mxfp4 import Mxfp4Weight
from lockstep.engine.ops import Ops


def local_chunks(K: int, tp: int, tp_rank: int) -> tuple[int, int, list[tuple[int, int]]]:
    """This rank's share of a length-K row-parallel reduction: its column range [lo, hi) and
    its K chunks' bounds relative to lo."""
    per = K_CHUNKS // tp
    bounds = k_chunk_bounds(K)[tp_rank * per:(tp_rank + 1) * per]
    lo, hi = bounds[0][0], bounds[-1][1]
    return lo, hi, [(a - lo, b - lo) for a, b in bounds]


def sharded_ops(ops: Ops) -> Ops:
    """The ops of one rank: the sublayer ends op by op (the reductions go through the collectives
    below), and on the torch ops the experts that skip the other EP groups' experts."""
    if ops.chunk_partials is None:
        raise ValueError(f"the {ops.name} ops have no row-parallel partials; a sharded model needs the "
                         f"torch or triton ops")
    return replace(ops, fused=None, experts=ops.sharded_experts or ops.experts)


class RankCollectives:
    """lockstep.engine.model.OneDevice's questions answered for one rank of a TP × EP topology: the
    row-parallel partials added in the fixed tree across the TP group, the shards of the trace
    gathered to their one-device layout, each slot's output from its expert's owner, the
    vocab-parallel embedding and head. Every collective moves bytes; no float is summed in one."""

    def __init__(self, ctx: ParallelContext, vocab_per_rank: int):
        self.ctx = ctx
        self.vocab_per_rank = vocab_per_rank
        self.vocab_lo = ctx.tp_rank * vocab_per_rank

    def reduce(self, parts: torch.Tensor) -> torch.Tensor:
        return reduce_row_parallel(list(parts.unbind(0)), self.ctx)    # looked up per call (tests swap it)

    def heads(self, t: torch.Tensor) -> torch.Tensor:
        return all_heads(t, self.ctx)

    def chunks(self, t: torch.Tensor) -> torch.Tensor:
        return all_chunks(t, self.ctx)

    def from_owners(self, y: torch.Tensor, top_ids: torch.Tensor, n_local: int) -> torch.Tensor:
        """[T, k, ...] valid where this EP group owns the slot's expert -> every slot from its owner
        (all-gathered over the EP group; bytes only)."""
        if self.ctx.ep == 1:
            return y
        every = self.ctx.gather_ep(y)                                         # [ep, T, k, ...]
        T, k = top_ids.shape
        owner = top_ids // n_local                                            # [T, k]
        ti = torch.arange(T, device=y.device).unsqueeze(1).expand(T, k)
        si = torch.arange(k, device=y.device).unsqueeze(0).expand(T, k)
        return every[owner, ti, si]

    def embed(self, table: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
        """Vocab-parallel lookup: each rank looks up the tokens it owns (others get a dummy
        row), the rows are gathered, and each token takes its owner's row. Pure data movement."""
        n = self.vocab_per_rank
        mine = table.index_select(0, (tokens - self.vocab_lo).clamp(0, n - 1))   # [T, H], valid where owned
        if self.ctx.tp == 1:
            return mine
        every = self.ctx.gather_tp(mine)                                # [tp, T, H]
        return every[tokens // n, torch.arange(tokens.shape[0], device=tokens.device)]

    def logits(self, local: torch.Tensor) -> torch.Tensor:
        """[T, V/tp] -> [T, V], the ranks' column blocks in rank order."""
        return self.ctx.gather_tp(local).permute(1, 0, 2).reshape(local.shape[0], self.ctx.tp * local.shape[1])


def all_heads(t: torch.Tensor, ctx: ParallelContext) -> torch.Tensor:
    """[T, heads/tp, D] -> [T, heads, D], heads in rank order (as one device numbers them)."""
    every = ctx.gather_tp(t)                                                  # [tp, T, h, D]
    return every.transpose(0, 1).reshape(t.shape[0], -1, t.shape[-1])


def all_chunks(t: torch.Tensor, ctx: ParallelContext) -> torch.Tensor:
    """[..., K_CHUNKS/tp, H] partials of this rank's K chunks -> [..., K_CHUNKS, H]."""
    every = ctx.gather_tp(t)                                                  # [tp, ..., n, H]
    return every.movedim(0, -3).flatten(-3, -2)


def shard(model: GptOssModel, ctx: ParallelContext) -> GptOssModel:
    """Make the one-device `model` rank ctx's share of a TP × EP topology, in place (module
    docstring) -> model. Its tensors go to ctx.device (build the model on the CPU: only the shard
    reaches the rank's GPU). Refuses, before any change, a topology the config cannot take, the
    fast ops and a model already sharded."""
    config = model.config
    ctx.topology.check(config)
    ops = sharded_ops(model.ops)
    if model.comm is not ONE_DEVICE:
        raise ValueError("shard: the model is already sharded")
    share, dev = RankShare.of(config, ctx.topology, ctx.rank), ctx.device

    def part(t: torch.Tensor, rows=None, cols=None) -> torch.Tensor:
        t = t if rows is None else t[rows[0]:rows[1]]
        t = t if cols is None else t[:, cols[0]:cols[1]]
        return t.contiguous().to(dev)

    model.embed, model.lm_head, model.norm = part(model.embed, share.vocab), part(model.lm_head, share.vocab), \
        part(model.norm)
    q_dim, kv_dim, kvr = config.q_dim, config.kv_dim, share.kv_rows
    (i_lo, i_hi), er = share.inter, share.experts
    for block in model.blocks:
        a, m = block.attn, block.mlp
        # q, k, v rows stacked as on one device: this rank's query heads, then its KV heads of k, of v
        rows = [(q_dim + kv_dim * j + kvr[0], q_dim + kv_dim * j + kvr[1]) for j in (0, 1)]
        a.qkv_w = torch.cat([part(a.qkv_w, r) for r in (share.q_rows, *rows)])    # [(Hq + 2 Hkv)/tp * D, H]
        a.qkv_b = torch.cat([part(a.qkv_b, r) for r in (share.q_rows, *rows)])
        a.o_w, a.o_b, a.norm = part(a.o_w, cols=share.q_rows), part(a.o_b), part(a.norm)   # [H, Hq/tp * D]
        a.sinks = part(a.sinks, share.heads)
        # experts [E, out, in]: this EP group's experts, this rank's intermediate range
        held = m.held
        m.held = replace(held, gate_up_w=part(_dense(held.gate_up_w, model.act)[er[0]:er[1], 2 * i_lo:2 * i_hi]),
                         gate_up_b=part(held.gate_up_b[er[0]:er[1], 2 * i_lo:2 * i_hi]),       # [E/ep, 2I/tp, H]
                         down_w=part(_dense(held.down_w, model.act)[er[0]:er[1], :, i_lo:i_hi]))   # [E/ep, H, I/tp]
        m.down_b, m.norm = part(m.down_b), part(m.norm)                                    # [E, H]: all experts
        m.router_w, m.router_b = part(m.router_w), part(m.router_b)
    return as_rank(model, ctx, ops)


def as_rank(model: GptOssModel, ctx: ParallelContext, ops: Ops | None = None) -> GptOssModel:
    """A model that holds rank ctx's share of every weight (sliced by `shard`, or read as such by
    engine.rank_weights) made that rank, in place: its heads, K chunks and experts named, the
    collectives and the sharded ops swapped in."""
    config = model.config
    share = RankShare.of(config, ctx.topology, ctx.rank)
    hq, hkv = config.num_attention_heads // ctx.tp, config.num_key_value_heads // ctx.tp
    o_bounds = local_chunks(config.q_dim, ctx.tp, ctx.tp_rank)[2]
    comm = RankCollectives(ctx, config.vocab_size // ctx.tp)
    for block in model.blocks:
        a, m = block.attn, block.mlp
        a.q_heads, a.kv_heads, a.o_bounds = hq, hkv, o_bounds
        m.held = replace(m.held, bounds=tuple(share.down_bounds), lo=share.experts[0], n=share.experts[1] - share.experts[0])
        a.comm = m.comm = comm
    model.comm = comm
    model.use_ops(ops or sharded_ops(model.ops))
    model.local_config = config.replace(num_attention_heads=hq, num_key_value_heads=hkv)
    model.device = torch.device(ctx.device)
    model.inv_freq = model.inv_freq.to(ctx.device)
    return model


def _dense(weight, dtype: torch.dtype) -> torch.Tensor:
    """Experts [E, N, K] as a dense tensor: MXFP4 decoded (exact in fp32 and bf16)."""
    if isinstance(weight, Mxfp4Weight):
        return weight.rows(torch.arange(weight.shape[0], device=weight.blocks.device), dtype)
    return weight


def from_checkpoint(path: str | Path, ctx: ParallelContext, backend: str = "torch",
                    dtype: str = "fp32") -> GptOssModel:
    """Rank ctx's model of the checkpoint at `path`, built from the bytes it holds alone
    (engine.rank_weights: its slices, MXFP4 kept packed, replicated parts whole) straight on
    ctx.device: the bits of shard(one-device model, ctx)."""
    config, weights = load_rank(path, ctx.topology, ctx.rank, windows=backend == "torch")
    model = GptOssModel(config, weights, backend=backend, device=ctx.device, dtype=dtype)
    del weights
    return as_rank(model, ctx)


def reduce_row_parallel(local_parts: list[torch.Tensor], ctx: ParallelContext) -> torch.Tensor:
    """This rank's K-chunk partials -> the full sum, in the fixed tree (engine.distributed).
    A module-level function so the tests can swap in a wrong order and watch D4 fail."""
    return invariant_sum(local_parts, ctx.tp, ctx.tp_group, host_copies=ctx.host_copies)


# ---------------------------------------------------------------- one call for a runner
@dataclass(frozen=True)
class TopologyRun:
    """Where and how the ranks of one call run: the checkpoint, the split, the model's backend and
    dtype policy, the device, and the launcher's bounds (engine.launch.launch)."""
    ckpt: str
    topology: Topology
    backend: str = "torch"
    dtype: str = "fp32"
    device: str = "cpu"
    timeout_s: float = 600.0
    collective_timeout_s: float = 120.0


def run_at(fn, run: TopologyRun, args: tuple, what: str, trace=None) -> list:
    """fn(ParallelContext, run, *args, trace) on every rank of run.topology -> rank 0's result, once
    every rank returned the same bits. Under torchrun (engine.world) the ranks are its world's;
    else Lockstep's launcher starts them here. device "cpu": gloo, one process per rank; "cuda":
    rank r on GPU r mod G, NCCL when every rank has its own GPU, else gloo over host copies
    (engine.launch.plan; `transport`). A CUDA topology whose ranks would not fit their GPU's free
    memory is refused up front, with the estimate (the run's dtype policy and backend set what a
    rank holds; memory_problem). World size 1 runs in this process, no process group.
    `trace` (engine.trace.OpTrace or None): each rank's model records into a copy of it, and rank 0's
    records come back into it (fn returns (results, trace) then)."""
    from lockstep.engine.config import GptOssConfig
    from lockstep.engine.launch import launch
    topology = run.topology
    topology.check(GptOssConfig.from_json_file(Path(run.ckpt) / "config.json"))   # before any process starts
    device = torch.device(run.device)
    problem = (missing_gpus(topology, device) or world.world_problem(topology.world_size)
               or memory_problem(topology, run.ckpt, device, run.dtype, run.backend))
    if problem:
        raise UnsupportedTopology(f"topology {topology} {problem}")
    args = (run,) + args + (trace,)
    if topology.world_size == 1:
        per_rank = [fn(ParallelContext(topology, device=device), *args)]
    elif world.joined():                 # ranks torchrun started: the same entry point, on its world
        per_rank = world.run(_on_rank, (fn, topology, args), device.type)
    else:
        per_rank = launch(_on_rank, topology.world_size, args=(fn, topology, args), device=device.type,
                          timeout_s=run.timeout_s, collective_timeout_s=run.collective_timeout_s)
    if trace is not None:
        trace.merge(per_rank[0][1])
        per_rank = [results for results, _ in per_rank]
    return _rank_0_if_all_agree(per_rank, what)


def _gpus() -> int:
    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def missing_gpus(topology: Topology, device: str | torch.device) -> str | None:
    """Why `topology` cannot run on `device` here (CUDA needs at least one GPU; ranks may share
    it), or None."""
    if torch.device(device).type == "cuda" and _gpus() == 0:
        return "on cuda needs a CUDA GPU, this machine has none"
    return None


def transport(topology: Topology, device: str | torch.device) -> str:
    """How `topology`'s ranks would run on `device` here, in words: "gloo", "nccl: 2 ranks on 2
    GPUs", "gloo-host (host copies): 4 ranks on 1 GPU"."""
    from lockstep.engine.launch import plan
    dev = torch.device(device).type
    if topology.world_size == 1:
        return "one device"
    name, devices = plan(dev, topology.world_size, _gpus() if dev == "cuda" else 0)
    if dev == "cpu":
        return name
    where = f"{topology.world_size} ranks on {len(set(devices))} GPU{'s' if len(set(devices)) > 1 else ''}"
    return f"{name}{' (host copies)' if name == 'gloo-host' else ''}: {where}"


def plan_splits(config, wanted, world_sizes, device: str | torch.device) -> tuple[list, list[str], list[str]]:
    """(the (tp, ep) splits to run, the ones left out with why, a note per split on CUDA naming its
    transport): `wanted` pairs, plus (w, 1) and (1, w) for each world size w the model can be split
    over; a split is left out where the model cannot take it, the device lacks a GPU, or torchrun's
    world has another size."""
    run = [tuple(t) for t in wanted or []]
    skipped = []
    for w in world_sizes:
        for tp, ep in ((w, 1), (1, w)):
            if w == 1 or (tp, ep) in run:
                continue
            problems = Topology(tp, ep).problems(config)
            if problems:
                skipped.append(f"tp={tp} ep={ep}: " + "; ".join(problems) + " (unsupported split)")
            else:
                run.append((tp, ep))
    why = {t: missing_gpus(Topology(*t), device) or world.world_problem(t[0] * t[1]) for t in run}
    skipped += [f"tp={tp} ep={ep}: {w}" for (tp, ep), w in why.items() if w]
    run = [t for t in run if not why[t]]
    notes = [f"tp={tp} ep={ep} over {transport(Topology(tp, ep), device)}" for tp, ep in run] \
        if torch.device(device).type == "cuda" else []
    return run, skipped, notes


# A rank's CUDA context, allocator slack, cuBLAS workspace and compiled kernels, beyond its weights.
RANK_OVERHEAD_BYTES = 1 << 30


def rank_weight_bytes(ckpt: str | Path, topology: Topology, dtype: str = "fp32", backend: str = "torch") -> int:
    """The weight bytes the largest rank of `topology` holds on its device: its slices of the
    checkpoint, MXFP4 experts packed, replicated parts whole, matmul weights in the dtype policy's
    storage dtype (engine.rank_weights.held_bytes, from the files' headers alone)."""
    return max(held_bytes(ckpt, topology, r, dtype, windows=backend == "torch") for r in range(topology.world_size))


def fit_problem(ranks_on_gpu: dict[int, int], per_rank_bytes: int, free_bytes: dict[int, int]) -> str | None:
    """Why ranks_on_gpu[g] ranks of per_rank_bytes (+ RANK_OVERHEAD_BYTES) each do not fit GPU g's
    free_bytes[g], for the first GPU that is short; None when all fit."""
    gib = 1 << 30
    for g, n in sorted(ranks_on_gpu.items()):
        need = n * (per_rank_bytes + RANK_OVERHEAD_BYTES)
        if need > free_bytes[g]:
            return (f"on cuda does not fit: {n} rank(s) on GPU {g} need about {need / gib:.1f} GiB "
                    f"({n} x ({per_rank_bytes / gib:.2f} GiB of weights + {RANK_OVERHEAD_BYTES / gib:.0f} GiB "
                    f"per process)), GPU {g} has {free_bytes[g] / gib:.1f} GiB free")
    return None


def memory_problem(topology: Topology, ckpt: str | Path, device: str | torch.device, dtype: str = "fp32",
                   backend: str = "torch") -> str | None:
    """fit_problem for `topology`'s ranks on this machine's GPUs (None on the CPU and at world size 1)."""
    if torch.device(device).type != "cuda" or topology.world_size == 1:
        return None
    from lockstep.engine.launch import plan
    _, devices = plan("cuda", topology.world_size, _gpus())
    on_gpu: dict[int, int] = {}
    for d in devices:
        g = torch.device(d).index
        on_gpu[g] = on_gpu.get(g, 0) + 1
    free = {g: torch.cuda.mem_get_info(g)[0] for g in on_gpu}
    return fit_problem(on_gpu, rank_weight_bytes(ckpt, topology, dtype, backend), free)


def _on_rank(fn, topology: Topology, args: tuple):
    return fn(ParallelContext(topology), *args)      # the device and transport are the launcher's


def _generate_rank(ctx: ParallelContext, run: TopologyRun, requests, generate_kwargs: dict, trace=None):
    from lockstep.engine.generate import generate
    model = from_checkpoint(run.ckpt, ctx, backend=run.backend, dtype=run.dtype)
    results = generate(model, requests, observer=trace, **generate_kwargs)
    return results if trace is None else (results, trace)


def generate_at(ckpt: str | Path, tp: int, ep: int, requests, *, backend: str = "torch",
                device: str | torch.device = "cpu", timeout_s: float = 600.0,
                collective_timeout_s: float = 120.0, trace=None, dtype: str = "fp32", **generate_kwargs):
    """lockstep.engine.generate.generate(model, requests, **generate_kwargs) on a tp × ep topology of
    local processes on `device` (see run_at), kernels from `backend`, dtype policy `dtype`.
    -> rank 0's list[Result]. Every rank must return the same bits; a disagreement raises.
    `trace`: an engine.trace.OpTrace to fill with rank 0's records (every op gathered whole).

    Requests must be greedy or carry a seed (or pass a `generator`, which each rank gets a
    copy of): an unseeded stream would differ from rank to rank."""
    run = TopologyRun(str(ckpt), Topology(tp, ep), backend, dtype, str(device), timeout_s, collective_timeout_s)
    return run_at(_generate_rank, run, (list(requests), generate_kwargs), f"generate_at({run.topology})", trace)


def _result_bits(r) -> tuple:
    """Everything of one request's result (engine.generate or engine.speculative) every rank must
    agree on, as comparable values."""
    captured = getattr(r, "captured", None)
    return (r.tokens, r.finish_reason, r.logprobs.numpy().tobytes(),
            None if captured is None else captured.contiguous().view(torch.uint8).numpy().tobytes(),   # bits
            getattr(r, "accept_lengths", None))


def _rank_0_if_all_agree(per_rank: list, what: str) -> list:
    first = [_result_bits(r) for r in per_rank[0]]
    for rank, res in enumerate(per_rank[1:], 1):
        if [_result_bits(r) for r in res] != first:
            raise RuntimeError(f"{what}: rank {rank}'s results differ from rank 0's")
    return per_rank[0]


# ---------------------------------------------------------------- speculative decoding
def _speculative_rank(ctx: ParallelContext, run: TopologyRun, requests, draft: str, convention: str, spec,
                      trace=None):
    """lockstep.engine.speculative.speculative_generate, unchanged, on this rank: the target is this rank's
    sharded GptOssModel (its forward gathers full logits and captured states on every rank), the
    draft is a full replica (it is small), so every rank drafts, verifies and samples the same
    trees. A draft without its own embed_tokens reads the target's embedding, of which this rank
    holds only a vocab shard: it gets the checkpoint's full table (the one-device model's values)."""
    from lockstep.engine.eagle3 import load_draft
    from lockstep.engine.speculative import speculative_generate
    target = from_checkpoint(run.ckpt, ctx, backend=run.backend, dtype=run.dtype)
    embed = None if _draft_has_embed(draft) else read_tensor(run.ckpt, "model.embed_tokens.weight").to(torch.float32)
    drafter = load_draft(draft, target, convention=convention, backend=run.backend, target_embed=embed)
    del embed                                   # from here on only this rank's shard and the draft
    results = speculative_generate(target, drafter, requests, spec, observer=trace)
    return results if trace is None else (results, trace)


def _draft_has_embed(draft: str | Path) -> bool:
    """Whether the draft checkpoint holds its own embed_tokens (else it reads the target's)."""
    from safetensors import safe_open
    for file in sorted(Path(draft).glob("*.safetensors")):
        with safe_open(file, framework="pt") as f:
            if "embed_tokens.weight" in f.keys():
                return True
    return False


def speculative_generate_at(ckpt: str | Path, tp: int, ep: int, requests, *, draft: str | Path, convention: str,
                            spec, backend: str = "torch", device: str | torch.device = "cpu",
                            timeout_s: float = 600.0, collective_timeout_s: float = 120.0, trace=None,
                            dtype: str = "fp32"):
    """lockstep.engine.speculative.speculative_generate(target, draft, requests, spec) with the target at
    a tp × ep topology of local processes on `device` (as generate_at) and the draft checkpoint
    `draft` (read under layer-id `convention`) replicated on every rank. -> rank 0's
    list[Result]; every rank must return the same tokens, logprob bytes and accept lengths, or
    it raises. Requests must be greedy or seeded (an unseeded stream would differ from rank to rank).
    `trace`: as generate_at's."""
    unseeded = [i for i, r in enumerate(requests) if r.seed is None and not r.params.is_greedy]
    if unseeded:
        raise ValueError(f"speculative_generate_at: requests {unseeded} are sampled without a seed; "
                         f"each rank would draw its own coins")
    run = TopologyRun(str(ckpt), Topology(tp, ep), backend, dtype, str(device), timeout_s, collective_timeout_s)
    return run_at(_speculative_rank, run, (list(requests), str(draft), convention, spec),
                  f"speculative_generate_at({run.topology})", trace)
