"""The gpt-oss forward pass (DESIGN §7), in one file, under a dtype policy (fp32 or bf16).

    x = embed(tokens)                                           boundary 0
    for each block i:
        x = x + attention(rms_norm(x))                          GQA, sinks, YaRN RoPE, window
        x = x + moe(rms_norm(x))                                top-k experts, clamped SwiGLU
                                                                boundary i + 1
    logits = lm_head(rms_norm(x))                               untied

One `forward` serves prefill, chunked prefill and decode: it takes a flat list of tokens,
each with its position and the KV-cache slot of its request, writes their keys and values
into the cache, and then lets every token attend to its own slot. A batch may mix requests
and phases freely.

Determinism (DESIGN §2): every reduction has one order written in Lockstep's code. The torch
backend builds everything from single IEEE operations and fixed trees (kernels/portable.py):
linears, attention, RMSNorm, RoPE, the routing softmax and the SwiGLU's sigmoid are each kernel
module's `_portable` reference, so each row of a batch is computed exactly as it would be alone
(D2, D3) and on any CPU (D0). The row-parallel layers (o_proj, experts' down) are partial
products over 8 fixed K chunks (`linear_chunks_portable`) added in one fixed
tree (`tree_sum`), the order engine/parallel.py keeps at every TP degree (D4). MoE computes each
(token, slot) row with its expert's weights (engine/experts.py: gathered per row, or grouped by
expert on the device) and adds each token's k expert outputs in slot order. Everything runs on the model's
device ("cpu" or "cuda").

Dtype policies (`dtype=`): "fp32" computes everything in fp32 (the CPU reference). "bf16" keeps
the matmul weights, the embedding, the KV cache and the residual stream in bf16, as the
released checkpoints and the openai reference do; every matmul accumulates in fp32 (products of
bf16 values are exact in fp32) and rounds its output once, and norms, softmaxes, routing, RoPE,
the K-chunk partials, the MoE combine and the residual adds are computed in fp32 and rounded
once to bf16 where they are stored. Logits are fp32 under both. MXFP4 experts (`*_blocks` and
`*_scales` in `weights`) stay packed and are decoded inside the expert matmuls: every decoded
value is exact in fp32 and bf16, so packed and unpacked experts give the same bits.

Ops: the model is built with one ops table (engine/ops.py), chosen from the backend name once,
in the constructor: "torch" (the portable reference above), "triton" (kernels/, the same
contracts on the GPU and in the interpreter, each sublayer's end fused into one kernel) and
"fast" (cuBLAS matmuls through F.linear and torch's own ops, no invariance promise: bench/e2e.py
uses it to measure what determinism costs; the harness never records goldens with it). The
blocks below call the table's entries; nothing after the constructor reads the backend name.

Blocks: `x = block(x, step)`. A TransformerBlock is an AttentionBlock then an MoEBlock; each
owns its weights, its RMSNorm and its residual add, as in openai's gpt-oss reference and
gpt-fast. `engine.parallel.shard(model, ctx)` makes a model one rank of a TP × EP topology in
place: it keeps the rank's share of each weight and swaps in the collectives (`comm`: the one-device
`OneDevice` here) that complete the row-parallel sums, the vocab-parallel embedding and head, and
the traced shards; the class, the forward and the blocks stay these.

`model.trace` (None by default) may hold an engine.trace.OpTrace (engine.generate and
engine.speculative set it for the duration of a call from their `observer` argument; a direct
forward call may set it itself): every op's output is then handed to it at a named point (`self.record("L3.attention", o)`), which records and never
changes a value; `lockstep diff` uses it to find the first op where two runs part. A traced
forward runs the same code as an untraced one, fused ends included: a point that a fused kernel
forms inside (o_proj's sum, the MoE's down and combination) is recomputed for the trace from
that kernel's inputs, with the unfused path's operations (the same bits:
tests/engine/test_dtype_policy.py).

Shapes: T tokens in the step, H hidden, Hq / Hkv query / KV heads, D head_dim, E experts,
k experts per token, I intermediate size, V vocab.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import NamedTuple, Sequence, Union

import torch

from lockstep.engine.boundaries import gather_captured
from lockstep.engine.config import GptOssConfig
from lockstep.engine.experts import LocalExperts
from lockstep.engine.kv_cache import KVCache
from lockstep.engine.linear import k_chunk_bounds, tree_sum
from lockstep.engine.mxfp4 import Mxfp4Columns, Mxfp4Weight
from lockstep.engine.ops import BACKENDS, Ops, ops_for  # noqa: F401  (BACKENDS: read by bench/e2e.py)
from lockstep.engine.rope import rope_cos_sin, rope_frequencies
from lockstep.engine.trace import Recorder
from lockstep.kernels.rope import apply_rope_portable

ExpertWeight = Union[torch.Tensor, Mxfp4Weight, Mxfp4Columns]     # dense [E, N, K], or MXFP4 packed

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}    # dtype policy -> storage dtype


class Step(NamedTuple):
    """What every block of one forward call reads: the rows' positions and cache slots [T] int64,
    the KV cache, and the rows' RoPE angles [T, D/2]."""
    positions: torch.Tensor
    slots: torch.Tensor
    cache: KVCache
    cos: torch.Tensor
    sin: torch.Tensor


class OneDevice:
    """Where the model's shards are: all here. The blocks and the model hand it what a sharded
    model completes across ranks (engine/parallel.py's RankCollectives, swapped in by `shard`);
    on one device every head, K chunk, expert and vocab row is at hand."""

    def reduce(self, parts: torch.Tensor) -> torch.Tensor:
        """A row-parallel layer's partials [8, T, H] -> their fixed-tree sum [T, H]."""
        return tree_sum(parts)

    def heads(self, t: torch.Tensor) -> torch.Tensor:
        """[T, heads held, D] -> [T, every head, D] (for the trace)."""
        return t

    def chunks(self, t: torch.Tensor) -> torch.Tensor:
        """[..., K chunks held, H] partials -> [..., all 8, H] (for the trace)."""
        return t

    def from_owners(self, y: torch.Tensor, top_ids: torch.Tensor, n_local: int) -> torch.Tensor:
        """[T, k, ...] valid where the slot's expert is held here -> every slot's (its owner's)."""
        return y

    def embed(self, table: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
        """The embedding rows [T, H] of `tokens` [T] from `table` (the vocab rows held here)."""
        return table.index_select(0, tokens)

    def logits(self, local: torch.Tensor) -> torch.Tensor:
        """[T, vocab held] fp32 -> [T, V]."""
        return local


ONE_DEVICE = OneDevice()


def residual(x: torch.Tensor, y: torch.Tensor, act: torch.dtype) -> torch.Tensor:
    """x + y for the residual stream: y is a sublayer's fp32 output; the sum is formed in fp32 and
    rounded once to the policy's dtype `act` (under fp32 it is the plain sum)."""
    return torch.add(x.to(torch.float32), y).to(act)


class AttentionBlock:
    """x + o_proj(attention(rope(qkv(rms_norm(x))))): GQA with sinks, YaRN RoPE, an optional
    sliding window. Matmul weights in the policy's dtype `act`; norm, biases and sinks fp32."""

    def __init__(self, layer: int, config: GptOssConfig, ops: Ops, act: torch.dtype, record: Recorder, *,
                 norm, qkv_w, qkv_b, o_w, o_b, sinks, q_heads: int, kv_heads: int, o_bounds):
        self.layer, self.name = layer, f"L{layer}."
        self.ops, self.act, self.record = ops, act, record
        self.eps, self.head_dim = config.rms_norm_eps, config.head_dim
        self.window, self.scale = config.window(layer), 1.0 / math.sqrt(config.head_dim)
        self.q_heads, self.kv_heads = q_heads, kv_heads        # this model's (a rank's: its share)
        self.norm = norm            # [H]
        self.qkv_w = qkv_w          # [(Hq + 2 Hkv) * D, H]   q_proj, k_proj, v_proj rows stacked
        self.qkv_b = qkv_b          # [(Hq + 2 Hkv) * D]
        self.o_w, self.o_b = o_w, o_b   # [H, Hq * D], [H]
        self.sinks = sinks          # [Hq]
        self.o_bounds = o_bounds    # o_proj's fixed K chunks (engine/linear.py)
        self.comm = ONE_DEVICE      # completes the row-parallel sum and the traced shards

    def __call__(self, x: torch.Tensor, step: Step) -> torch.Tensor:
        """x [T, H] (the residual stream) -> [T, H]."""
        h = self.record(self.name + "attn_norm", self.ops.rms_norm(x, self.norm, self.eps, self.act))
        if self.ops.fused is not None:
            return self.fused(x, h, step)
        return residual(x, self.attend(h, step), self.act)

    def attend(self, h: torch.Tensor, step: Step) -> torch.Tensor:
        """h [T, H] normed -> the sublayer's output [T, H] fp32 (before the residual)."""
        T, D = h.shape[0], self.head_dim
        q, k, v = self.project_qkv(h)                                   # [T, Hq | Hkv, D] each
        q, k = self.rope(q, step), self.rope(k, step)                   # fp32, stored in act
        step.cache.write(self.layer, step.slots, step.positions, k, v)  # all T keys first,
        self.record(self.name + "qkv", (q, k, v), gather=self.qkv_whole)        # [T, Hq + 2 Hkv, D]
        o = self.ops.attention(q, step.cache.k[self.layer], step.cache.v[self.layer], step.slots,
                               step.positions, self.sinks, self.window, self.scale)   # then each query
        self.record(self.name + "attention", o, gather=self.comm.heads)         # [T, Hq, D]
        o = o.reshape(T, self.q_heads * D)
        if self.ops.chunk_partials is None:                             # fast: one GEMM, no promise
            return self.ops.linear(o, self.o_w, self.o_b, torch.float32)
        # row-parallel layer: fixed K chunks + fixed tree, the same bits at any TP (D4)
        parts = self.ops.chunk_partials(o, self.o_w, self.o_bounds)     # [8, T, H] fp32
        return self.reduce_traced(parts)                                # [T, H] fp32

    def reduce_traced(self, parts: torch.Tensor) -> torch.Tensor:
        """o_proj's partials [8, T, H] -> tree + bias [T, H] fp32, both handed to the trace."""
        self.record(self.name + "o_proj.partials", parts.transpose(0, 1), gather=self.comm.chunks)
        return self.record(self.name + "o_proj", self.comm.reduce(parts) + self.o_b)

    def fused(self, x: torch.Tensor, h: torch.Tensor, step: Step) -> torch.Tensor:
        """x + attend(h), the residual included, in 5 launches: RoPE writes the cache itself
        (kernels/rope.py) and one kernel adds the o_proj tree, the bias and the residual
        (kernels/residual.py): the same operations and bits as attend's. Traced, it records the
        same points as attend: k and v read back from the cache, and the o_proj sum the end kernel
        forms inside, recomputed from its inputs by reduce_traced."""
        T, cache, end = h.shape[0], step.cache, self.ops.fused
        qkv = self.ops.linear(h, self.qkv_w, self.qkv_b)                        # [T, (Hq + 2 Hkv) * D]
        q = end.rope_qkv_cache(qkv, step.cos, step.sin, cache.k[self.layer], cache.v[self.layer], step.slots,
                               step.positions, self.q_heads)                    # [T, Hq, D]; k, v cached
        if self.record.recording:
            kv = [c[self.layer][step.slots, :, step.positions] for c in (cache.k, cache.v)]   # [T, Hkv, D] each
            self.record(self.name + "qkv", (q, *kv), gather=self.qkv_whole)
        o = self.ops.attention(q, cache.k[self.layer], cache.v[self.layer], step.slots, step.positions,
                               self.sinks, self.window, self.scale)             # [T, Hq, D]
        self.record(self.name + "attention", o, gather=self.comm.heads)
        o = o.reshape(T, self.q_heads * self.head_dim)
        if self.ops.chunk_partials is None:                                     # fast: cuBLAS o_proj
            return residual(x, self.ops.linear(o, self.o_w, self.o_b, torch.float32), self.act)
        parts = self.ops.chunk_partials(o, self.o_w, self.o_bounds)            # [8, T, H]
        if self.record.recording:
            self.reduce_traced(parts)
        return end.row_parallel_residual(x, parts, self.o_b)                    # [T, H] in act

    def project_qkv(self, h: torch.Tensor):
        """One matmul for q, k and v: each output column is its own reduction, so stacking the
        rows changes no bit. -> q [T, Hq, D], k, v [T, Hkv, D]."""
        T, D, Hq, Hkv = h.shape[0], self.head_dim, self.q_heads, self.kv_heads
        qkv = self.ops.linear(h, self.qkv_w, self.qkv_b)                # [T, (Hq + 2 Hkv) * D]
        q, k, v = qkv.split([Hq * D, Hkv * D, Hkv * D], dim=1)
        return q.view(T, Hq, D), k.view(T, Hkv, D), v.view(T, Hkv, D)

    def rope(self, x: torch.Tensor, step: Step) -> torch.Tensor:
        return apply_rope_portable(x.to(torch.float32), step.cos, step.sin).to(self.act)

    def qkv_whole(self, qkv) -> torch.Tensor:
        """(q, k, v) of the heads held here -> [T, Hq + 2 Hkv, D] of every head (for the trace)."""
        return torch.cat([self.comm.heads(t) for t in qkv], dim=1)


class MoEBlock:
    """x + sum over the top k experts of routing * expert(rms_norm(x)): clamped SwiGLU experts,
    the down projection row parallel, the k outputs added in slot order."""

    def __init__(self, layer: int, config: GptOssConfig, ops: Ops, act: torch.dtype, record: Recorder, *,
                 norm, router_w, router_b, gate_up_w, gate_up_b, down_w, down_b, down_bounds,
                 expert_lo: int = 0, n_local: int | None = None):
        self.name = f"L{layer}."
        self.ops, self.act, self.record = ops, act, record
        self.eps, self.k = config.rms_norm_eps, config.num_experts_per_tok
        self.norm = norm                            # [H]
        self.router_w, self.router_b = router_w, router_b   # [E, H], [E]
        # the experts held here: gate_up [E_l, 2I, H] (rows interleaved gate, up, gate, up, ...) and
        # its bias [E_l, 2I], down [E_l, H, I] in its fixed K chunks (engine/linear.py), ids [lo, lo + n)
        self.held = LocalExperts(gate_up_w, gate_up_b, down_w, tuple(down_bounds), expert_lo,
                                 config.num_local_experts if n_local is None else n_local, config.swiglu_alpha,
                                 config.swiglu_limit)
        self.down_b = down_b                        # [E, H]: every expert's
        self.comm = ONE_DEVICE                      # completes the down sum, each slot from its owner

    def __call__(self, x: torch.Tensor, step: Step) -> torch.Tensor:
        """x [T, H] (the residual stream) -> [T, H]."""
        h = self.record(self.name + "mlp_norm", self.ops.rms_norm(x, self.norm, self.eps, self.act))
        if self.ops.fused is not None:
            return self.fused(x, h)
        return residual(x, self.moe(h), self.act)

    def moe(self, h: torch.Tensor) -> torch.Tensor:
        """h [T, H] normed -> the sublayer's output [T, H] fp32 (before the residual)."""
        return self.combine(*self.route_experts(h))

    def route_experts(self, h: torch.Tensor):
        """h [T, H] -> (down partials [8 (or a rank's), T * k, H] fp32, routing [T, k] fp32, top_ids [T, k])."""
        router_logits = self.ops.linear(h, self.router_w, self.router_b, torch.float32)   # [T, E]
        self.record(self.name + "router", router_logits)
        routing, top_ids = self.ops.route(router_logits, self.k)            # [T, k], over the k only
        self.record(self.name + "router.top_ids", top_ids)
        self.record(self.name + "routing", routing)
        return self.experts(h, top_ids), routing, top_ids

    def combine(self, parts: torch.Tensor, routing: torch.Tensor, top_ids: torch.Tensor) -> torch.Tensor:
        """Each (token, slot): the down tree + bias; then each token's k outputs weighted and added
        in slot order. -> [T, H] fp32."""
        (T, k), H, C = top_ids.shape, parts.shape[2], parts.shape[0]
        owners = lambda t: self.comm.from_owners(t, top_ids, self.held.n)     # noqa: E731
        self.record(self.name + "experts", parts.view(C, T, k, H).permute(1, 2, 0, 3),
                    gather=lambda p: owners(self.comm.chunks(p)))
        y = torch.add(self.comm.reduce(parts), self.down_b.index_select(0, top_ids.reshape(-1))).view(T, k, H)
        self.record(self.name + "down", y, gather=owners)                  # [T, k, H]
        weighted = owners(torch.mul(y, routing[..., None]))                 # [T, k, H]
        total = weighted[:, 0]
        for slot in range(1, k):                                            # slot order
            total = torch.add(total, weighted[:, slot])
        return self.record(self.name + "moe", total)

    def fused(self, x: torch.Tensor, h: torch.Tensor) -> torch.Tensor:
        """x + moe(h), the residual included, in 7 launches plus the grouping: one kernel adds the
        down tree, the bias, the routing weights in slot order and the residual (kernels/residual.py).
        Traced, it records the same points as moe: the sums the end kernel forms inside are
        recomputed from its inputs by combine."""
        parts, routing, top_ids = self.route_experts(h)                                 # [8, T * k, H]
        if self.record.recording:
            self.combine(parts, routing, top_ids)
        return self.ops.fused.moe_residual(x, parts, self.down_b, routing, top_ids)     # [T, H] in act

    def experts(self, h: torch.Tensor, top_ids: torch.Tensor) -> torch.Tensor:
        return self.ops.experts(h, top_ids, self.held)


class TransformerBlock:
    """One block: attention, then MoE, each with its own norm and residual. x = block(x, step)."""

    def __init__(self, attn: AttentionBlock, mlp: MoEBlock):
        self.attn, self.mlp = attn, mlp

    def __call__(self, x: torch.Tensor, step: Step) -> torch.Tensor:
        return self.mlp(self.attn(x, step), step)


class ForwardOutput(NamedTuple):
    logits: torch.Tensor                # [T, V] fp32 (rows of `logit_rows` only, if given)
    captured: torch.Tensor | None       # [T, len(capture) * H] boundary states, requested order


class GptOssModel:
    def __init__(self, config: GptOssConfig, weights: dict[str, torch.Tensor], backend: str = "torch",
                 device: str | torch.device = "cpu", dtype: str = "fp32", take: bool = False):
        """`weights`: HF tensor names and layout (see engine.checkpoint), any float dtype; experts
        dense or MXFP4 (`*_blocks`, `*_scales`: kept packed). Every weight, the KV cache and every
        activation live on `device` ("cpu" or "cuda"); `dtype` is the policy (module docstring);
        `backend` names the ops table (engine/ops.py), read here only. `take`: the model takes
        ownership of `weights`, removing each tensor from the dict as it is converted, so a caller
        that kept no other reference never holds a weight twice (the 20b shape in bf16 on 80 GB)."""
        if dtype not in DTYPES:
            raise ValueError(f"dtype policy must be one of {tuple(DTYPES)}, got {dtype!r}")
        self.config = config
        self.local_config = config          # the heads held here (a rank's share once sharded)
        self.device = torch.device(device)
        self.ops = ops_for(backend, self.device)                           # the one backend choice
        self.backend = backend                                             # its name, for callers to read
        self.dtype_policy = dtype
        self.act = DTYPES[dtype]                                           # storage dtype
        self.record = Recorder()
        self.comm = ONE_DEVICE              # vocab-parallel embedding and head once sharded
        inv_freq, self.mscale = rope_frequencies(config.head_dim, config.rope)
        self.inv_freq = inv_freq.to(self.device)
        self._take = take
        act = lambda name: self._weight(weights, name).to(self.device, self.act).contiguous()        # noqa: E731
        f32 = lambda name: self._weight(weights, name).to(self.device, torch.float32).contiguous()   # noqa: E731
        self.embed = act("model.embed_tokens.weight")                      # [V, H]
        self.norm = f32("model.norm.weight")                               # [H]
        self.lm_head = act("lm_head.weight")                               # [V, H]
        cfg, ops, rec = config, self.ops, self.record
        self.blocks = []
        for i in range(config.num_hidden_layers):
            p = f"model.layers.{i}."
            a = p + "self_attn."
            attn = AttentionBlock(
                i, cfg, ops, self.act, rec, norm=f32(p + "input_layernorm.weight"),
                qkv_w=torch.cat([act(a + f"{n}_proj.weight") for n in "qkv"]),
                qkv_b=torch.cat([f32(a + f"{n}_proj.bias") for n in "qkv"]),
                o_w=act(a + "o_proj.weight"), o_b=f32(a + "o_proj.bias"), sinks=f32(a + "sinks"),
                q_heads=cfg.num_attention_heads, kv_heads=cfg.num_key_value_heads,
                o_bounds=k_chunk_bounds(cfg.q_dim))
            mlp = MoEBlock(
                i, cfg, ops, self.act, rec, norm=f32(p + "post_attention_layernorm.weight"),
                router_w=act(p + "mlp.router.weight"), router_b=f32(p + "mlp.router.bias"),
                gate_up_w=self._expert_weight(weights, p + "mlp.experts.gate_up_proj"),
                gate_up_b=f32(p + "mlp.experts.gate_up_proj_bias"),
                down_w=self._expert_weight(weights, p + "mlp.experts.down_proj"),
                down_b=f32(p + "mlp.experts.down_proj_bias"), down_bounds=k_chunk_bounds(cfg.intermediate_size))
            self.blocks.append(TransformerBlock(attn, mlp))

    def use_ops(self, ops: Ops) -> None:
        """Run this model's blocks with another ops table (a test's variant of one op; the sharding
        of engine/parallel.py: the sublayer ends op by op)."""
        self.ops = ops
        for block in self.blocks:
            block.attn.ops = block.mlp.ops = ops

    def _weight(self, weights: dict, name: str):
        return weights.pop(name) if self._take else weights[name]

    def _expert_weight(self, weights: dict[str, torch.Tensor], name: str) -> "ExpertWeight":
        """Experts as [E, out, in]: MXFP4 stays packed (HF already stores blocks as [E, out, in/32,
        16]), and so does a rank's window of it (Mxfp4Columns, engine.rank_weights); a dense HF
        tensor ([E, in, out], x @ W) is transposed, in the policy's dtype."""
        if name + "_blocks" in weights:
            return Mxfp4Weight(self._weight(weights, name + "_blocks").to(self.device).contiguous(),
                               self._weight(weights, name + "_scales").to(self.device).contiguous())
        if isinstance(weights[name], Mxfp4Columns):
            return self._weight(weights, name).to(self.device)
        return self._weight(weights, name).to(self.device, self.act).transpose(1, 2).contiguous()

    @classmethod
    def from_checkpoint(cls, path: str | Path, backend: str = "torch",
                        device: str | torch.device = "cpu", dtype: str = "fp32") -> "GptOssModel":
        from lockstep.engine.checkpoint import load_checkpoint
        config, weights = load_checkpoint(path, dtype=None, packed_mxfp4=True)     # as stored: one conversion
        return cls(config, weights, backend=backend, device=device, dtype=dtype, take=True)

    def new_cache(self, num_slots: int, max_seq_len: int) -> KVCache:
        """A cache of the KV heads held here."""
        return KVCache(self.local_config, num_slots, max_seq_len, dtype=self.act, device=self.device)

    @property
    def trace(self):
        """An engine.trace.OpTrace to record every op's output into; None (the default): nothing."""
        return self.record.trace

    @trace.setter
    def trace(self, trace) -> None:
        self.record.trace = trace

    @property
    def tracing(self) -> bool:
        """Whether this forward call's ops are being recorded (engine.trace)."""
        return self.record.recording

    # ------------------------------------------------------------------ forward
    @torch.inference_mode()
    def forward(self, tokens: torch.Tensor, positions: torch.Tensor, slots: torch.Tensor,
                cache: KVCache, capture: Sequence[int] = (),
                logit_rows: torch.Tensor | None = None) -> ForwardOutput:
        """tokens, positions, slots [T] int64. `capture`: boundaries in [0, L] to return,
        in the order given. `logit_rows`: compute logits only for these rows."""
        L = self.config.num_hidden_layers
        for b in capture:
            if not 0 <= b <= L:
                raise ValueError(f"capture boundary {b} is outside [0, {L}]")
        wanted = set(capture)
        states: dict[int, torch.Tensor] = {}
        dev = self.device
        tokens, positions, slots = tokens.to(dev), positions.to(dev), slots.to(dev)

        if self.trace is not None:
            self.trace.begin(positions)
        x = self.record("boundary.0", self.embed_tokens(tokens))       # [T, H]
        step = Step(positions, slots, cache, *rope_cos_sin(positions, self.inv_freq, self.mscale))   # cos, sin [T, D/2]
        if 0 in wanted:
            states[0] = x
        for i, block in enumerate(self.blocks):
            x = self.record(f"boundary.{i + 1}", block(x, step))
            if i + 1 in wanted:
                states[i + 1] = x                                       # boundary i + 1
        h = self.record("final_norm", self.ops.rms_norm(x, self.norm, self.config.rms_norm_eps, self.act))
        if logit_rows is not None:
            logit_rows = logit_rows.to(dev)
            h = h.index_select(0, logit_rows)
        logits = self.record("lm_head", self.logits(h), rows=logit_rows)    # [T, V]
        return ForwardOutput(logits, gather_captured(states, capture, L))   # CaptureError if one is missing

    def embed_tokens(self, tokens: torch.Tensor) -> torch.Tensor:
        """tokens [T] -> their embedding rows [T, H] (boundary 0)."""
        return self.comm.embed(self.embed, tokens)

    def logits(self, h: torch.Tensor) -> torch.Tensor:
        """h [T, H] final-normed -> logits [T, V] fp32 (the head is untied)."""
        return self.comm.logits(self.ops.linear(h, self.lm_head, None, torch.float32))
