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
linears (`engine.linear`), attention (`engine.attention`), RMSNorm, the routing softmax and
the SwiGLU's sigmoid, so each row of a batch is computed exactly as it would be alone (D2, D3)
and on any CPU (D0). The row-parallel layers (o_proj, experts' down) are `linear_k_chunked`
spelled out: partial products over 8 fixed K chunks (`k_chunk_partials`) added in one fixed
tree (`tree_sum`), the order engine/parallel.py keeps at every TP degree (D4). MoE computes each
(token, slot) row with its expert's gathered weights (the Triton backend groups the tokens by
expert) and adds each token's k expert outputs in slot order. Everything runs on the model's
device ("cpu" or "cuda").

Dtype policies (`dtype=`): "fp32" computes everything in fp32 (the CPU reference). "bf16" keeps
the matmul weights, the embedding, the KV cache and the residual stream in bf16, as the
released checkpoints and the openai reference do; every matmul accumulates in fp32 (products of
bf16 values are exact in fp32) and rounds its output once, and norms, softmaxes, routing, RoPE,
the K-chunk partials, the MoE combine and the residual adds are computed in fp32 and rounded
once to bf16 where they are stored. Logits are fp32 under both. MXFP4 experts (`*_blocks` and
`*_scales` in `weights`) stay packed and are decoded inside the expert matmuls: every decoded
value is exact in fp32 and bf16, so packed and unpacked experts give the same bits.

Backends: "torch" (the portable reference above), "triton" (kernels/, the same contracts on the
GPU and in the interpreter) and "fast" (cuBLAS matmuls through F.linear and torch's own ops, no
invariance promise: bench/e2e.py uses it to measure what determinism costs; the harness never
records goldens with it).

`model.trace` (None by default) may hold an engine.trace.Trace: every op's output is then
handed to it at a named point (`self._record("L3.attention", o)`), which records and never
changes a value; `lockstep diff` uses it to find the first op where two runs part.

Shapes: T tokens in the step, H hidden, Hq / Hkv query / KV heads, D head_dim, E experts,
k experts per token, I intermediate size, V vocab.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple, Sequence, Union

import torch

from engine.attention import attention
from engine.boundaries import gather_captured
from engine.config import GptOssConfig
from engine.experts import expert_partials
from engine.kv_cache import KVCache
from engine.linear import K_CHUNKS, k_chunk_bounds, k_chunk_partials, linear, tree_sum
from engine.mxfp4 import Mxfp4Weight
from engine.rope import apply_rope, rope_cos_sin, rope_frequencies
from kernels import portable

ExpertWeight = Union[torch.Tensor, Mxfp4Weight]     # dense [E, N, K], or MXFP4 packed


DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}    # dtype policy -> storage dtype
BACKENDS = ("torch", "triton", "fast")


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float, backend: str = "torch",
             out_dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """x [T, H] -> x / sqrt(mean(x^2) + eps) * weight, in fp32 (the mean a fixed tree over H),
    rounded once to out_dtype."""
    x = x.to(torch.float32)
    if backend == "triton":
        from kernels.rmsnorm import rms_norm_triton          # one program per row, fixed chunks
        y = rms_norm_triton(x, weight, eps)
    elif backend == "fast":
        y = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * weight
    else:
        y = portable.rms_norm(x, weight, eps)
    return y.to(out_dtype)


def routing_weights(top_logits: torch.Tensor, backend: str = "torch") -> torch.Tensor:
    """top_logits [T, k] fp32 -> softmax over the k selected logits, [T, k] (portable exp, fixed tree)."""
    if backend == "fast":
        return torch.softmax(top_logits, dim=-1)
    return portable.softmax(top_logits, dim=-1)


def clamped_swiglu(gate_up: torch.Tensor, alpha: float, limit: float, backend: str = "torch") -> torch.Tensor:
    """gate_up [T, 2I], interleaved (gate = even columns, up = odd) -> [T, I] in gate_up's dtype:
    (gate * sigmoid(alpha * gate)) * (up + 1) in fp32, the sigmoid portable (float64, rounded
    once), the result rounded once to gate_up's dtype."""
    if backend == "triton":
        from kernels.moe import clamped_swiglu_triton
        return clamped_swiglu_triton(gate_up, alpha, limit)
    x = gate_up.to(torch.float32)
    gate = x[..., 0::2].clamp(max=limit)
    up = x[..., 1::2].clamp(min=-limit, max=limit)
    y = torch.mul(torch.mul(gate, portable.sigmoid(torch.mul(gate, alpha))), torch.add(up, 1.0))
    return y.to(gate_up.dtype)


def top_k_lowest_index(logits: torch.Tensor, k: int, backend: str = "torch") -> tuple[torch.Tensor, torch.Tensor]:
    """Top-k along the last dim; equal values rank by lower index. -> (values, ids) [..., k]."""
    if backend == "fast":
        return torch.topk(logits, k, dim=-1)
    if backend == "triton" and logits.dim() == 2:
        from kernels.moe import router_top_k_triton
        ids = router_top_k_triton(logits, k)[1]              # [T, k], same ranking rule
        return logits.gather(-1, ids), ids
    values, ids = torch.sort(logits, dim=-1, descending=True, stable=True)
    return values[..., :k], ids[..., :k]


@dataclass
class BlockWeights:
    """One transformer block, in `linear` layout ([out, in]). Matmul weights in the policy's dtype
    (fp32 or bf16); norms, sinks and biases in fp32."""
    attn_norm: torch.Tensor     # [H]
    qkv_w: torch.Tensor         # [(Hq + 2 Hkv) * D, H]   q_proj, k_proj, v_proj rows stacked
    qkv_b: torch.Tensor         # [(Hq + 2 Hkv) * D]
    o_w: torch.Tensor           # [H, Hq * D]
    o_b: torch.Tensor           # [H]
    sinks: torch.Tensor         # [Hq]
    mlp_norm: torch.Tensor      # [H]
    router_w: torch.Tensor      # [E, H]
    router_b: torch.Tensor      # [E]
    gate_up_w: ExpertWeight     # [E, 2I, H]   rows interleaved gate, up, gate, up, ...
    gate_up_b: torch.Tensor     # [E, 2I]
    down_w: ExpertWeight        # [E, H, I]
    down_b: torch.Tensor        # [E, H]


class ForwardOutput(NamedTuple):
    logits: torch.Tensor                # [T, V] fp32 (rows of `logit_rows` only, if given)
    captured: torch.Tensor | None       # [T, len(capture) * H] boundary states, requested order


class GptOssModel:
    trace = None    # an engine.trace.Trace to record every op's output into; None: record nothing

    def __init__(self, config: GptOssConfig, weights: dict[str, torch.Tensor], backend: str = "torch",
                 device: str | torch.device = "cpu", dtype: str = "fp32"):
        """`weights`: HF tensor names and layout (see engine.checkpoint), any float dtype; experts
        dense or MXFP4 (`*_blocks`, `*_scales`: kept packed). Every weight, the KV cache and every
        activation live on `device` ("cpu" or "cuda"); `dtype` is the policy (module docstring)."""
        if backend not in BACKENDS:
            raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")
        if dtype not in DTYPES:
            raise ValueError(f"dtype policy must be one of {tuple(DTYPES)}, got {dtype!r}")
        self.config = config
        self.backend = backend
        self.device = torch.device(device)
        self.dtype_policy = dtype
        self.act = DTYPES[dtype]                                           # storage dtype
        act = lambda name: weights[name].to(self.device, self.act).contiguous()         # noqa: E731
        f32 = lambda name: weights[name].to(self.device, torch.float32).contiguous()    # noqa: E731
        self.embed = act("model.embed_tokens.weight")                      # [V, H]
        self.norm = f32("model.norm.weight")                               # [H]
        self.lm_head = act("lm_head.weight")                               # [V, H]
        self.blocks = []
        for i in range(config.num_hidden_layers):
            p = f"model.layers.{i}."
            a = p + "self_attn."
            self.blocks.append(BlockWeights(
                attn_norm=f32(p + "input_layernorm.weight"),
                # one matmul for q, k and v: each output column is its own reduction, so
                # stacking the rows changes no bit
                qkv_w=torch.cat([act(a + f"{n}_proj.weight") for n in "qkv"]),
                qkv_b=torch.cat([f32(a + f"{n}_proj.bias") for n in "qkv"]),
                o_w=act(a + "o_proj.weight"), o_b=f32(a + "o_proj.bias"),
                sinks=f32(a + "sinks"),
                mlp_norm=f32(p + "post_attention_layernorm.weight"),
                router_w=act(p + "mlp.router.weight"), router_b=f32(p + "mlp.router.bias"),
                gate_up_w=self._expert_weight(weights, p + "mlp.experts.gate_up_proj"),
                gate_up_b=f32(p + "mlp.experts.gate_up_proj_bias"),
                down_w=self._expert_weight(weights, p + "mlp.experts.down_proj"),
                down_b=f32(p + "mlp.experts.down_proj_bias"),
            ))
        self.inv_freq, self.mscale = rope_frequencies(config.head_dim, config.rope)
        self.inv_freq = self.inv_freq.to(self.device)
        self.scale = 1.0 / math.sqrt(config.head_dim)

    def _expert_weight(self, weights: dict[str, torch.Tensor], name: str) -> "ExpertWeight":
        """Experts as [E, out, in]: MXFP4 stays packed (HF already stores blocks as [E, out, in/32,
        16]); a dense HF tensor ([E, in, out], x @ W) is transposed, in the policy's dtype."""
        if name + "_blocks" in weights:
            return Mxfp4Weight(weights[name + "_blocks"].to(self.device).contiguous(),
                               weights[name + "_scales"].to(self.device).contiguous())
        return weights[name].to(self.device, self.act).transpose(1, 2).contiguous()

    @classmethod
    def from_checkpoint(cls, path: str | Path, backend: str = "torch",
                        device: str | torch.device = "cpu", dtype: str = "fp32") -> "GptOssModel":
        from engine.checkpoint import load_checkpoint
        config, weights = load_checkpoint(path, packed_mxfp4=True)
        return cls(config, weights, backend=backend, device=device, dtype=dtype)

    def new_cache(self, num_slots: int, max_seq_len: int) -> KVCache:
        return KVCache(self.config, num_slots, max_seq_len, dtype=self.act, device=self.device)

    # ------------------------------------------------------------------ forward
    @torch.inference_mode()
    def forward(self, tokens: torch.Tensor, positions: torch.Tensor, slots: torch.Tensor,
                cache: KVCache, capture: Sequence[int] = (),
                logit_rows: torch.Tensor | None = None) -> ForwardOutput:
        """tokens, positions, slots [T] int64. `capture`: boundaries in [0, L] to return,
        in the order given. `logit_rows`: compute logits only for these rows."""
        cfg = self.config
        L = cfg.num_hidden_layers
        for b in capture:
            if not 0 <= b <= L:
                raise ValueError(f"capture boundary {b} is outside [0, {L}]")
        wanted = set(capture)
        states: dict[int, torch.Tensor] = {}
        dev = self.embed.device
        tokens, positions, slots = tokens.to(dev), positions.to(dev), slots.to(dev)

        if self.trace is not None:
            self.trace.begin(positions)
        x = self._record("boundary.0", self._embed(tokens))            # [T, H]
        cos, sin = rope_cos_sin(positions, self.inv_freq, self.mscale)  # [T, D/2] each
        if 0 in wanted:
            states[0] = x
        for i, blk in enumerate(self.blocks):
            h = self._record(f"L{i}.attn_norm", self._norm(x, blk.attn_norm))
            if self._fused:
                x = self._attention_fused(i, blk, x, h, cos, sin, positions, slots, cache)
            else:
                x = self._residual(x, self._attention(i, blk, h, cos, sin, positions, slots, cache))
            h = self._record(f"L{i}.mlp_norm", self._norm(x, blk.mlp_norm))
            x = self._moe_fused(i, blk, x, h) if self._fused else self._residual(x, self._moe(i, blk, h))
            x = self._record(f"boundary.{i + 1}", x)
            if i + 1 in wanted:
                states[i + 1] = x                                       # boundary i + 1
        h = self._record("final_norm", self._norm(x, self.norm))      # [T, H]
        if logit_rows is not None:
            logit_rows = logit_rows.to(dev)
            h = h.index_select(0, logit_rows)
        logits = self._record("lm_head", self._logits(h), rows=logit_rows)   # [T, V]
        return ForwardOutput(logits, gather_captured(states, capture, L))   # CaptureError if one is missing

    @property
    def tracing(self) -> bool:
        """Whether this forward call's ops are being recorded (engine.trace)."""
        return self.trace is not None and self.trace.recording

    def _record(self, name: str, t, rows: torch.Tensor | None = None):
        """Hand op `name`'s output to the trace, if one is recording; returns t unchanged."""
        if self.tracing:
            self.trace.record(name, t, rows)
        return t

    @property
    def _fused(self) -> bool:
        """Triton backend with no trace recording: each sublayer's end is one kernel (the fixed
        tree of partials, bias, routing and residual: kernels/residual.py) and RoPE writes the
        cache itself (kernels/rope.py), the same operations and bits as the unfused path, in a
        tenth of the launches. A trace needs the intermediate ops, so it takes the unfused path."""
        on_gpu_kernels = self.backend == "triton" or (self.backend == "fast" and self.device.type == "cuda")
        return on_gpu_kernels and not self.tracing

    def _norm(self, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        """RMSNorm in fp32, stored in the policy's dtype."""
        if self.backend == "triton" or (self.backend == "fast" and x.is_cuda):
            from kernels.rmsnorm import rms_norm_triton           # reads x's dtype, rounds once
            return rms_norm_triton(x, weight, self.config.rms_norm_eps, out_dtype=self.act)
        return rms_norm(x, weight, self.config.rms_norm_eps, self.backend, out_dtype=self.act)

    def _route(self, router_logits: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
        """router_logits [T, E] fp32 -> (routing [T, k] fp32, top_ids [T, k]): the top k (ties to
        the lower id) and kernels.portable.softmax over them. On the Triton backend both come from
        one kernel that computes that softmax op for op (float64 exp, the fixed tree, IEEE
        division): the same bits as the ~20 torch launches it replaces."""
        if self.backend == "triton" and k <= 16:
            from kernels.moe import router_top_k_triton
            return router_top_k_triton(router_logits, k, portable_softmax=True)
        top_logits, top_ids = top_k_lowest_index(router_logits, k, self.backend)
        return routing_weights(top_logits, self.backend), top_ids

    def _residual(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """x + y for the residual stream: y is a block's fp32 output; the sum is formed in fp32
        and rounded once to the policy's dtype (under fp32 it is the plain sum)."""
        return torch.add(x.to(torch.float32), y).to(self.act)

    def _embed(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.embed.index_select(0, tokens)                       # [T, H]

    def _logits(self, h: torch.Tensor) -> torch.Tensor:
        return linear(h, self.lm_head, None, self.backend, out_dtype=torch.float32)   # [T, V] untied head

    def _attention(self, layer: int, blk: BlockWeights, x: torch.Tensor, cos: torch.Tensor,
                   sin: torch.Tensor, positions: torch.Tensor, slots: torch.Tensor,
                   cache: KVCache) -> torch.Tensor:
        cfg = self.config
        T, D = x.shape[0], cfg.head_dim
        Hq, Hkv = cfg.num_attention_heads, cfg.num_key_value_heads
        qkv = linear(x, blk.qkv_w, blk.qkv_b, self.backend)            # [T, (Hq + 2 Hkv) * D]
        q, k, v = qkv.split([Hq * D, Hkv * D, Hkv * D], dim=1)
        q, k, v = q.view(T, Hq, D), k.view(T, Hkv, D), v.view(T, Hkv, D)
        q, k = self._rope(q, cos, sin), self._rope(k, cos, sin)           # fp32, stored in act
        cache.write(layer, slots, positions, k, v)                     # all T keys first,
        if self.tracing:
            self._record(f"L{layer}.qkv", torch.cat([q, k, v], dim=1))  # [T, Hq + 2 Hkv, D]
        o = attention(q, cache.k[layer], cache.v[layer], slots, positions,   # then each query
                      blk.sinks, cfg.window(layer), self.scale, self.backend)  # [T, Hq, D]
        self._record(f"L{layer}.attention", o)
        if self.backend == "fast":                                      # one cuBLAS GEMM, no promise
            return linear(o.reshape(T, cfg.q_dim), blk.o_w, blk.o_b, "fast", out_dtype=torch.float32)
        # row-parallel layer: fixed K chunks + fixed tree, the same bits at any TP (D4)
        parts = k_chunk_partials(o.reshape(T, cfg.q_dim), blk.o_w, k_chunk_bounds(cfg.q_dim), self.backend)
        self._record(f"L{layer}.o_proj.partials", parts)                       # 8 x [T, H] fp32
        return self._record(f"L{layer}.o_proj", tree_sum(parts) + blk.o_b)     # [T, H] fp32

    def _rope(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        return apply_rope(x.to(torch.float32), cos, sin).to(self.act)

    def _moe(self, layer: int, blk: BlockWeights, x: torch.Tensor) -> torch.Tensor:
        cfg = self.config
        k = cfg.num_experts_per_tok
        router_logits = linear(x, blk.router_w, blk.router_b, self.backend, out_dtype=torch.float32)   # [T, E]
        self._record(f"L{layer}.router", router_logits)
        routing, top_ids = self._route(router_logits, k)                     # [T, k], over the k only
        self._record(f"L{layer}.router.top_ids", top_ids)
        self._record(f"L{layer}.routing", routing)
        T, H = x.shape
        per_row = self.backend == "torch" or (self.backend == "fast" and not x.is_cuda)
        experts = self._experts_per_row if per_row else self._experts_by_group
        slot_out, slot_parts = experts(blk, x, top_ids)                     # [T, k, H] fp32, traced parts
        if slot_parts is not None:
            self._record(f"L{layer}.experts", slot_parts.reshape(T, k, K_CHUNKS, H))
        self._record(f"L{layer}.down", slot_out)                            # [T, k, H]
        weighted = torch.mul(slot_out, routing[..., None])                  # [T, k, H]
        total = weighted[:, 0]
        for slot in range(1, k):                                             # slot order
            total = torch.add(total, weighted[:, slot])
        return self._record(f"L{layer}.moe", total)

    # ------------------------------------------------------------------ fused ends (Triton)
    def _attention_fused(self, layer: int, blk: BlockWeights, x: torch.Tensor, h: torch.Tensor,
                         cos: torch.Tensor, sin: torch.Tensor, positions: torch.Tensor,
                         slots: torch.Tensor, cache: KVCache) -> torch.Tensor:
        """x + attention(h) (the residual included) in 5 launches; see _fused. The fast backend
        takes cuBLAS for the qkv and o projections."""
        from kernels.matmul import linear_chunks_triton
        from kernels.residual import row_parallel_residual_triton
        from kernels.rope import rope_qkv_cache_triton
        cfg = self.config
        T = h.shape[0]
        qkv = linear(h, blk.qkv_w, blk.qkv_b, self.backend)                       # [T, (Hq + 2 Hkv) * D]
        q = rope_qkv_cache_triton(qkv, cos, sin, cache.k[layer], cache.v[layer], slots, positions,
                                  cfg.num_attention_heads)                          # [T, Hq, D]; k, v cached
        o = attention(q, cache.k[layer], cache.v[layer], slots, positions,
                      blk.sinks, cfg.window(layer), self.scale, "triton")           # [T, Hq, D]
        if self.backend == "fast":
            return self._residual(x, linear(o.reshape(T, cfg.q_dim), blk.o_w, blk.o_b, "fast", torch.float32))
        parts = linear_chunks_triton(o.reshape(T, cfg.q_dim), blk.o_w, k_chunk_bounds(cfg.q_dim))  # [8, T, H]
        return row_parallel_residual_triton(x, parts, blk.o_b)                    # [T, H] in act

    def _moe_fused(self, layer: int, blk: BlockWeights, x: torch.Tensor, h: torch.Tensor) -> torch.Tensor:
        """x + moe(h) (the residual included) in 7 launches plus the grouping; see _fused."""
        from kernels.residual import moe_residual_triton
        cfg = self.config
        router_logits = linear(h, blk.router_w, blk.router_b, self.backend, out_dtype=torch.float32)   # [T, E]
        routing, top_ids = self._route(router_logits, cfg.num_experts_per_tok)              # [T, k]
        parts = expert_partials(h, top_ids, blk.gate_up_w, blk.gate_up_b, blk.down_w,
                                k_chunk_bounds(cfg.intermediate_size), 0, cfg.num_local_experts,
                                cfg.swiglu_alpha, cfg.swiglu_limit, "triton")                 # [8, T * k, H]
        return moe_residual_triton(x, parts, blk.down_b, routing, top_ids)                  # [T, H] in act

    def _experts_per_row(self, blk: BlockWeights, x: torch.Tensor, top_ids: torch.Tensor):
        """Torch backend: every (token, slot) row with its own expert's weights gathered, so the
        step reads no tensor value on the host (static shapes). Each row's output is gate_up, the
        clamped SwiGLU, then down over the fixed K chunks added in the fixed tree: the operations
        `linear` and `linear_k_chunked` do, element for element (D4).
        x [T, H], top_ids [T, k] -> (outputs [T, k, H], down partials [T * k, K_CHUNKS, H] if tracing)."""
        cfg = self.config
        T, H = x.shape
        k, I = top_ids.shape[1], cfg.intermediate_size
        ids = top_ids.reshape(-1)                                            # [T * k], token-major
        rows_x = x.repeat_interleave(k, dim=0)                               # [T * k, H]
        f32 = torch.float32
        out = x.new_empty((T * k, H), dtype=f32)
        slot_parts = x.new_empty((T * k, K_CHUNKS, H), dtype=f32) if self.tracing else None
        step = max(1, _EXPERT_ROW_ELEMENTS // (2 * I * H))                   # memory bound only
        for r0 in range(0, T * k, step):
            e = ids[r0:r0 + step]                                            # [R] expert ids
            h = portable.matmul_nt(rows_x[r0:r0 + step, None, :].to(f32), _expert_rows(blk.gate_up_w, e))[:, 0]
            h = torch.add(h, blk.gate_up_b.index_select(0, e)).to(self.act)  # [R, 2I], stored in act
            a = clamped_swiglu(h, cfg.swiglu_alpha, cfg.swiglu_limit)        # [R, I], elementwise
            down_w = _expert_rows(blk.down_w, e)                             # [R, H, I] fp32
            a = a.to(f32)
            parts = [portable.matmul_nt(a[:, None, lo:hi], down_w[:, :, lo:hi])[:, 0]
                     for lo, hi in k_chunk_bounds(I)]                        # K_CHUNKS x [R, H]
            out[r0:r0 + step] = torch.add(tree_sum(parts), blk.down_b.index_select(0, e))
            if slot_parts is not None:
                slot_parts[r0:r0 + step] = torch.stack(parts, dim=1)
        return out.view(T, k, H), slot_parts

    def _experts_by_group(self, blk: BlockWeights, x: torch.Tensor, top_ids: torch.Tensor):
        """Triton backend: engine.experts.expert_partials, the rows grouped by expert on the device
        (one launch per op, no host read, static shapes: a decode step can be a CUDA graph), then
        the fixed tree and the bias. Same result layout as _experts_per_row."""
        cfg = self.config
        T, H = x.shape
        k = top_ids.shape[1]
        parts = expert_partials(x, top_ids, blk.gate_up_w, blk.gate_up_b, blk.down_w,
                                k_chunk_bounds(cfg.intermediate_size), 0, cfg.num_local_experts,
                                cfg.swiglu_alpha, cfg.swiglu_limit, self.backend)   # [K_CHUNKS, T * k, H]
        out = torch.add(tree_sum(parts.unbind(0)), blk.down_b.index_select(0, top_ids.reshape(-1)))
        slot_parts = parts.transpose(0, 1) if self.tracing else None               # [T * k, K_CHUNKS, H]
        return out.view(T, k, H), slot_parts


_EXPERT_ROW_ELEMENTS = 1 << 22      # gathered expert weights built at once


def _expert_rows(weight: ExpertWeight, ids: torch.Tensor) -> torch.Tensor:
    """The fp32 [R, N, K] weights of experts `ids` (MXFP4 decoded: exact)."""
    if isinstance(weight, Mxfp4Weight):
        return weight.rows(ids, torch.float32)
    return weight.index_select(0, ids).to(torch.float32)
