"""The gpt-oss forward pass (DESIGN §7), in one file, computed in fp32.

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
from typing import NamedTuple, Sequence

import torch

from engine.attention import attention
from engine.boundaries import gather_captured
from engine.config import GptOssConfig
from engine.experts import expert_partials
from engine.kv_cache import KVCache
from engine.linear import K_CHUNKS, k_chunk_bounds, k_chunk_partials, linear, tree_sum
from engine.rope import apply_rope, rope_cos_sin, rope_frequencies
from kernels import portable


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float, backend: str = "torch") -> torch.Tensor:
    """x [T, H] -> x / sqrt(mean(x^2) + eps) * weight, in fp32, the mean a fixed tree over H."""
    x = x.to(torch.float32)
    if backend == "triton":
        from kernels.rmsnorm import rms_norm_triton          # one program per row, fixed chunks
        return rms_norm_triton(x, weight, eps)
    return portable.rms_norm(x, weight, eps)


def routing_weights(top_logits: torch.Tensor) -> torch.Tensor:
    """top_logits [T, k] -> softmax over the k selected logits, [T, k] (portable exp, fixed tree)."""
    return portable.softmax(top_logits, dim=-1)


def clamped_swiglu(gate_up: torch.Tensor, alpha: float, limit: float, backend: str = "torch") -> torch.Tensor:
    """gate_up [T, 2I], interleaved (gate = even columns, up = odd) -> [T, I]:
    (gate * sigmoid(alpha * gate)) * (up + 1), the sigmoid portable (float64, rounded once)."""
    if backend == "triton":
        from kernels.moe import clamped_swiglu_triton
        return clamped_swiglu_triton(gate_up, alpha, limit)
    gate = gate_up[..., 0::2].clamp(max=limit)
    up = gate_up[..., 1::2].clamp(min=-limit, max=limit)
    return torch.mul(torch.mul(gate, portable.sigmoid(torch.mul(gate, alpha))), torch.add(up, 1.0))


def top_k_lowest_index(logits: torch.Tensor, k: int, backend: str = "torch") -> tuple[torch.Tensor, torch.Tensor]:
    """Top-k along the last dim; equal values rank by lower index. -> (values, ids) [..., k]."""
    if backend == "triton" and logits.dim() == 2:
        from kernels.moe import router_top_k_triton
        ids = router_top_k_triton(logits, k)[1]              # [T, k], same ranking rule
        return logits.gather(-1, ids), ids
    values, ids = torch.sort(logits, dim=-1, descending=True, stable=True)
    return values[..., :k], ids[..., :k]


@dataclass
class BlockWeights:
    """One transformer block, in `linear` layout ([out, in]), fp32."""
    attn_norm: torch.Tensor     # [H]
    q_w: torch.Tensor           # [Hq * D, H]
    q_b: torch.Tensor           # [Hq * D]
    k_w: torch.Tensor           # [Hkv * D, H]
    k_b: torch.Tensor           # [Hkv * D]
    v_w: torch.Tensor           # [Hkv * D, H]
    v_b: torch.Tensor           # [Hkv * D]
    o_w: torch.Tensor           # [H, Hq * D]
    o_b: torch.Tensor           # [H]
    sinks: torch.Tensor         # [Hq]
    mlp_norm: torch.Tensor      # [H]
    router_w: torch.Tensor      # [E, H]
    router_b: torch.Tensor      # [E]
    gate_up_w: torch.Tensor     # [E, 2I, H]   rows interleaved gate, up, gate, up, ...
    gate_up_b: torch.Tensor     # [E, 2I]
    down_w: torch.Tensor        # [E, H, I]
    down_b: torch.Tensor        # [E, H]


class ForwardOutput(NamedTuple):
    logits: torch.Tensor                # [T, V] fp32 (rows of `logit_rows` only, if given)
    captured: torch.Tensor | None       # [T, len(capture) * H] boundary states, requested order


class GptOssModel:
    trace = None    # an engine.trace.Trace to record every op's output into; None: record nothing

    def __init__(self, config: GptOssConfig, weights: dict[str, torch.Tensor], backend: str = "torch",
                 device: str | torch.device = "cpu"):
        """`weights`: HF tensor names and layout (see engine.checkpoint), any float dtype.
        Every weight, the KV cache and every activation live on `device` ("cpu" or "cuda")."""
        self.config = config
        self.backend = backend
        self.device = torch.device(device)
        f32 = lambda name: weights[name].to(self.device, torch.float32).contiguous()   # noqa: E731
        self.embed = f32("model.embed_tokens.weight")                      # [V, H]
        self.norm = f32("model.norm.weight")                               # [H]
        self.lm_head = f32("lm_head.weight")                               # [V, H]
        self.blocks = []
        for i in range(config.num_hidden_layers):
            p = f"model.layers.{i}."
            self.blocks.append(BlockWeights(
                attn_norm=f32(p + "input_layernorm.weight"),
                q_w=f32(p + "self_attn.q_proj.weight"), q_b=f32(p + "self_attn.q_proj.bias"),
                k_w=f32(p + "self_attn.k_proj.weight"), k_b=f32(p + "self_attn.k_proj.bias"),
                v_w=f32(p + "self_attn.v_proj.weight"), v_b=f32(p + "self_attn.v_proj.bias"),
                o_w=f32(p + "self_attn.o_proj.weight"), o_b=f32(p + "self_attn.o_proj.bias"),
                sinks=f32(p + "self_attn.sinks"),
                mlp_norm=f32(p + "post_attention_layernorm.weight"),
                router_w=f32(p + "mlp.router.weight"), router_b=f32(p + "mlp.router.bias"),
                # HF stores experts as x @ W ([E, in, out]); transpose to [E, out, in].
                gate_up_w=f32(p + "mlp.experts.gate_up_proj").transpose(1, 2).contiguous(),
                gate_up_b=f32(p + "mlp.experts.gate_up_proj_bias"),
                down_w=f32(p + "mlp.experts.down_proj").transpose(1, 2).contiguous(),
                down_b=f32(p + "mlp.experts.down_proj_bias"),
            ))
        self.inv_freq, self.mscale = rope_frequencies(config.head_dim, config.rope)
        self.inv_freq = self.inv_freq.to(self.device)
        self.scale = 1.0 / math.sqrt(config.head_dim)

    @classmethod
    def from_checkpoint(cls, path: str | Path, backend: str = "torch",
                        device: str | torch.device = "cpu") -> "GptOssModel":
        from engine.checkpoint import load_checkpoint
        config, weights = load_checkpoint(path)
        return cls(config, weights, backend=backend, device=device)

    def new_cache(self, num_slots: int, max_seq_len: int) -> KVCache:
        return KVCache(self.config, num_slots, max_seq_len, device=self.device)

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
            h = self._record(f"L{i}.attn_norm", rms_norm(x, blk.attn_norm, cfg.rms_norm_eps, self.backend))
            x = x + self._attention(i, blk, h, cos, sin, positions, slots, cache)
            h = self._record(f"L{i}.mlp_norm", rms_norm(x, blk.mlp_norm, cfg.rms_norm_eps, self.backend))
            x = self._record(f"boundary.{i + 1}", x + self._moe(i, blk, h))
            if i + 1 in wanted:
                states[i + 1] = x                                       # boundary i + 1
        h = self._record("final_norm", rms_norm(x, self.norm, cfg.rms_norm_eps, self.backend))   # [T, H]
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

    def _embed(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.embed.index_select(0, tokens)                       # [T, H]

    def _logits(self, h: torch.Tensor) -> torch.Tensor:
        return linear(h, self.lm_head, None, self.backend)              # [T, V] untied head

    def _attention(self, layer: int, blk: BlockWeights, x: torch.Tensor, cos: torch.Tensor,
                   sin: torch.Tensor, positions: torch.Tensor, slots: torch.Tensor,
                   cache: KVCache) -> torch.Tensor:
        cfg = self.config
        T, D = x.shape[0], cfg.head_dim
        q = linear(x, blk.q_w, blk.q_b, self.backend).view(T, cfg.num_attention_heads, D)
        k = linear(x, blk.k_w, blk.k_b, self.backend).view(T, cfg.num_key_value_heads, D)
        v = linear(x, blk.v_w, blk.v_b, self.backend).view(T, cfg.num_key_value_heads, D)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        cache.write(layer, slots, positions, k, v)                     # all T keys first,
        if self.tracing:
            self._record(f"L{layer}.qkv", torch.cat([q, k, v], dim=1))  # [T, Hq + 2 Hkv, D]
        o = attention(q, cache.k[layer], cache.v[layer], slots, positions,   # then each query
                      blk.sinks, cfg.window(layer), self.scale, self.backend)  # [T, Hq, D]
        self._record(f"L{layer}.attention", o)
        # row-parallel layer: fixed K chunks + fixed tree, the same bits at any TP (D4)
        parts = k_chunk_partials(o.reshape(T, cfg.q_dim), blk.o_w, k_chunk_bounds(cfg.q_dim), self.backend)
        self._record(f"L{layer}.o_proj.partials", parts)                       # 8 x [T, H]
        return self._record(f"L{layer}.o_proj", tree_sum(parts) + blk.o_b)     # [T, H]

    def _moe(self, layer: int, blk: BlockWeights, x: torch.Tensor) -> torch.Tensor:
        cfg = self.config
        k = cfg.num_experts_per_tok
        router_logits = linear(x, blk.router_w, blk.router_b, self.backend)   # [T, E]
        self._record(f"L{layer}.router", router_logits)
        top_logits, top_ids = top_k_lowest_index(router_logits, k, self.backend)   # [T, k]
        routing = routing_weights(top_logits)                                # [T, k], over the k only
        self._record(f"L{layer}.router.top_ids", top_ids)
        self._record(f"L{layer}.routing", routing)
        T, H = x.shape
        experts = self._experts_per_row if self.backend == "torch" else self._experts_by_group
        slot_out, slot_parts = experts(blk, x, top_ids)                     # [T, k, H], traced parts
        if slot_parts is not None:
            self._record(f"L{layer}.experts", slot_parts.reshape(T, k, K_CHUNKS, H))
        self._record(f"L{layer}.down", slot_out)                            # [T, k, H]
        weighted = torch.mul(slot_out, routing[..., None])                  # [T, k, H]
        total = weighted[:, 0]
        for slot in range(1, k):                                             # slot order
            total = torch.add(total, weighted[:, slot])
        return self._record(f"L{layer}.moe", total)

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
        out = x.new_empty((T * k, H))
        slot_parts = x.new_empty((T * k, K_CHUNKS, H)) if self.tracing else None
        step = max(1, _EXPERT_ROW_ELEMENTS // (2 * I * H))                   # memory bound only
        for r0 in range(0, T * k, step):
            e = ids[r0:r0 + step]                                            # [R] expert ids
            h = portable.matmul_nt(rows_x[r0:r0 + step, None, :], blk.gate_up_w.index_select(0, e))[:, 0]
            h = torch.add(h, blk.gate_up_b.index_select(0, e))                # [R, 2I]
            a = clamped_swiglu(h, cfg.swiglu_alpha, cfg.swiglu_limit)        # [R, I], elementwise
            down_w = blk.down_w.index_select(0, e)                           # [R, H, I]
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
