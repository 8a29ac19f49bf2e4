"""The EAGLE3 draft head (DESIGN §4): the forward pass and its KV. The config, checkpoint
reading and synthetic drafts are engine.eagle3_checkpoint.

Per draft step, for rows t (one token each, computed alone: D1/D2 as in engine/model.py):

    aux   = cat(boundary states of the target, in config order)        [A = n_aux * H_target]
    aux   = input_norm(aux)                     if norm_before_fc      (one RMSNorm over all of A)
    aux   = cat(fc_norm[i](chunk_i(aux)))       if fc_norm             (one RMSNorm per aux chunk)
    h     = fc(aux)                                                    (no bias; first step only)
    x     = cat(input_layernorm(embed(token)), hidden_norm(h))         [2 * H_draft], embeds first
    r     = h + o_proj(attention(x))                                    residual = un-normed h
    out   = r + mlp(post_attention_layernorm(r))                        SiLU-gated Llama MLP
    logits = lm_head(norm(out))                                         draft vocab
    next h = out                                                        the pre-norm output

Draft id d means target id d + d2t[d]. Pairing: the step at position t sees the target
feature h_t and the embedding of token t + 1. RoPE is plain Llama RoPE (half split, theta
from the config, default 10000), at position t.

Attention (`attend`) is defined per query over an explicit, logically ordered key list:
the committed keys of the request's slot (positions 0 .. c-1) followed by the keys of the
query's tree ancestors and its own key. A committed row at position p and a tree row at
position p with the same inputs see the same key tensor and give the same bits. The forward
computes all rows at once (`attend_rows`: the lists gathered into one padded key axis, padding
last, which leaves every fixed-order sum's bits as `attend`'s).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Sequence

import torch

from lockstep.engine.boundaries import resolve_boundaries
from lockstep.engine.checkpoint import CheckpointError
from lockstep.engine.config import GptOssConfig, RopeParams
# The checkpoint half's public names, importable from here too.
from lockstep.engine.eagle3_checkpoint import (DRAFT_FILE, Eagle3Config, _canonical_name,  # noqa: F401
                                               _check_d2t, _check_tensors, _shared_embed, expected_draft_tensors,
                                               make_draft_checkpoint, read_draft, synthetic_draft_weights,
                                               write_draft)
from lockstep.engine.model import DTYPES, residual
from lockstep.engine.ops import ops_for
from lockstep.engine.rope import rope_cos_sin, rope_frequencies
from lockstep.kernels import portable
from lockstep.kernels.attention import KV_TILE
from lockstep.kernels.rmsnorm import rms_norm_portable as rms_norm
from lockstep.kernels.rope import apply_rope_portable as apply_rope


class DraftKV:
    """Draft keys/values [num_slots + scratch, Hkv, capacity, D] in `dtype` (the draft's storage
    dtype: Eagle3Draft.new_kv). Slot i < num_slots holds request i's committed positions. The
    portable path (fp32 policy) never writes tree rows here; the cached path (bf16 policy) writes
    a tree row's ancestors and own key at the positions after its committed prefix (in the
    request's slot for a chain, in a scratch slot per beam for a tree), which no committed row
    reads before the next commit overwrites them. The capacity is rounded up to whole KV tiles
    (the attention ops' layout; the portable path's bits do not depend on it)."""

    def __init__(self, cfg: Eagle3Config, num_slots: int, capacity: int, device: str | torch.device = "cpu",
                 dtype: torch.dtype = torch.float32, scratch: int = 0):
        self.num_slots = num_slots
        capacity = -(-capacity // KV_TILE) * KV_TILE
        shape = (num_slots + scratch, cfg.num_key_value_heads, capacity, cfg.head_dim)
        self.k = torch.zeros(shape, dtype=dtype, device=device)
        self.v = torch.zeros(shape, dtype=dtype, device=device)

    def copy_prefix(self, dst: torch.Tensor, src: torch.Tensor, length: int) -> None:
        """Positions 0 .. length-1 of slots src[m] -> slots dst[m] (dst distinct; no host sync)."""
        for buf in (self.k, self.v):
            buf[dst, :, :length] = buf[src, :, :length]


class DraftStep:
    """Output of one draft forward: logits over the draft vocab, next h, and this step's k/v."""

    def __init__(self, logits, hidden, k, v):
        self.logits = logits      # [T, V_draft] fp32
        self.hidden = hidden      # [T, H_draft] pre-norm output (the next step's h)
        self.k = k                # [T, Hkv, D] (after RoPE)
        self.v = v                # [T, Hkv, D]


class Eagle3Draft:
    """An EAGLE3 draft head bound to one target: its aux boundaries are resolved at load.

    Two paths, chosen by the dtype policy (the target's) when the head is built:
      fp32  the portable reference: fp32 weights and activations, the portable RMSNorm and
            `attend_rows` (every row's key list gathered, portable softmax, fixed trees over the
            whole list); only the linears go through the ops table. Its bits are the fp32 goldens'.
      bf16  the cached path (`_forward_cached`), the target's own recipe (engine/model.py's
            policy): matmul weights, embedding, draft KV and the hidden stream in bf16, every
            matmul accumulated in fp32 and rounded once, norms / RoPE / SiLU / residual adds in
            fp32 rounded once; RMSNorm, RoPE with the cache write, and attention are the ops
            table's entries (on the triton backend the target's kernels: one launch each), with
            the keys read from the draft KV (tree rows write theirs there first, at the positions
            after the committed prefix) and no sink. fp32 stays where a contract needs it: the
            logits (the draft's log-probs and the float64 tree scores are formed from them, as the
            target's logits are fp32 under both policies) and the norm weights.
    """

    def __init__(self, cfg: Eagle3Config, weights: dict[str, torch.Tensor], target_config: GptOssConfig,
                 convention: str, target_embed: torch.Tensor | None = None, backend: str = "torch",
                 device: str | torch.device | None = None, dtype: str = "fp32"):
        """`device`: where weights and activations live; default the target embedding's device, else cpu.
        `dtype`: the dtype policy (the target's; class docstring)."""
        self.config = cfg
        self.device = torch.device(device if device is not None else
                                   target_embed.device if target_embed is not None else "cpu")
        if dtype not in DTYPES:
            raise ValueError(f"{cfg.name}: dtype policy must be one of {tuple(DTYPES)}, got {dtype!r}")
        self.dtype_policy, self.act = dtype, DTYPES[dtype]
        self.cached = dtype != "fp32"                 # the cached path (class docstring)
        self.ops = ops_for(backend, self.device)
        self.target_config = target_config
        Ht, L = target_config.hidden_size, target_config.num_hidden_layers
        name = cfg.name
        if cfg.target_hidden_size is not None and cfg.target_hidden_size != Ht:
            raise ValueError(f"{name}: Eagle3Config.target_hidden_size={cfg.target_hidden_size} but the target's "
                             f"hidden_size is {Ht}")
        if cfg.vocab_size != target_config.vocab_size:
            raise ValueError(f"{name}: Eagle3Config.vocab_size={cfg.vocab_size} but the target's vocab_size is "
                             f"{target_config.vocab_size}")
        weights = {_canonical_name(k): v for k, v in weights.items()}
        if "fc.weight" not in weights:
            raise CheckpointError(f"{name}: tensor fc.weight is missing")
        A = weights["fc.weight"].shape[1]
        if A % Ht:
            raise ValueError(f"{name}: fc.weight input width {A} is not a multiple of the target hidden size "
                             f"{Ht}: cannot tell the number of aux states")
        n_aux = A // Ht
        # DESIGN §3: ids, convention, count -> boundaries, or a LayerIdError naming all of them.
        self.boundaries = resolve_boundaries(cfg.aux_layer_ids, convention, L, n_aux, name)
        self.convention = convention
        self.n_aux = n_aux
        with_embed = "embed_tokens.weight" in weights
        expected = expected_draft_tensors(cfg, n_aux, Ht, with_embed)
        if "d2t" not in weights and cfg.draft_vocab_size == cfg.vocab_size:
            del expected["d2t"]                                # no d2t: draft id d is target id d
        _check_tensors(name, cfg, weights, expected)
        self._load_weights(weights, with_embed, target_embed, Ht)
        self.d2t = (weights["d2t"].to(self.device, torch.int64) if "d2t" in weights else
                    torch.zeros(cfg.draft_vocab_size, dtype=torch.int64, device=self.device))
        self.hot_ids = self.d2t + torch.arange(cfg.draft_vocab_size, dtype=torch.int64,
                                               device=self.device)                 # draft id -> target id
        _check_d2t(name, cfg, self.hot_ids)
        self.inv_freq, _ = rope_frequencies(cfg.head_dim, RopeParams(rope_type="default", theta=cfg.rope_theta))
        self.inv_freq = self.inv_freq.to(self.device)
        self.scale = 1.0 / math.sqrt(cfg.head_dim)
        self._rope_table = None                       # cos, sin of every draft KV position (_cos_sin)
        self._old_rope_tables: list = []

    def _load_weights(self, weights: dict, with_embed: bool, target_embed: torch.Tensor | None, Ht: int) -> None:
        """The tensors on the device: norm weights fp32; matmul weights and the embedding fp32
        (portable path) or in the policy's dtype, q/k/v and gate/up stacked (cached path)."""
        cfg, name, act = self.config, self.config.name, self.act
        f32 = lambda n: weights[n].to(self.device, torch.float32).contiguous()   # noqa: E731
        mat = lambda n: weights[n].to(self.device, act).contiguous()             # noqa: E731
        self.embed = (mat("embed_tokens.weight") if with_embed else
                      _shared_embed(name, cfg, target_embed, Ht, self.device, act))
        self.input_norm = f32("input_norm.weight") if cfg.norm_before_fc else None
        self.fc_norm = [f32(f"fc_norm.{i}.weight") for i in range(self.n_aux)] if cfg.fc_norm else None
        self.fc = mat("fc.weight")
        p = "midlayer."
        self.input_layernorm = f32(p + "input_layernorm.weight")
        self.hidden_norm = f32(p + "hidden_norm.weight")
        self.q_w, self.k_w = mat(p + "self_attn.q_proj.weight"), mat(p + "self_attn.k_proj.weight")
        self.v_w, self.o_w = mat(p + "self_attn.v_proj.weight"), mat(p + "self_attn.o_proj.weight")
        self.post_norm = f32(p + "post_attention_layernorm.weight")
        self.gate_w, self.up_w = mat(p + "mlp.gate_proj.weight"), mat(p + "mlp.up_proj.weight")
        self.down_w = mat(p + "mlp.down_proj.weight")
        self.norm = f32("norm.weight")
        self.lm_head = mat("lm_head.weight")
        if self.cached:          # one matmul each: every output column is its own reduction
            self.qkv_w = torch.cat([self.q_w, self.k_w, self.v_w])
            self.gate_up_w = torch.cat([self.gate_w, self.up_w])
            self.no_sinks = torch.full((cfg.num_attention_heads,), float("-inf"), device=self.device)

    def _cos_sin(self, positions: torch.Tensor, capacity: int) -> tuple[torch.Tensor, torch.Tensor]:
        """rope_cos_sin at `positions` (< capacity), read from a table of every position below the
        KV capacity (rebuilt when a larger KV comes): the same bits, two launches instead of ~80.
        An outgrown table is kept alive: a captured draft step (engine.graphs.RoundGraphs) reads
        the table that existed when it was captured."""
        if self._rope_table is None or self._rope_table[0].shape[0] < capacity:
            if self._rope_table is not None:
                self._old_rope_tables.append(self._rope_table)
            self._rope_table = rope_cos_sin(torch.arange(capacity, device=self.device), self.inv_freq, 1.0)
        cos, sin = self._rope_table
        return cos.index_select(0, positions), sin.index_select(0, positions)

    def new_kv(self, num_slots: int, capacity: int, scratch: int = 0) -> DraftKV:
        """An empty draft KV for this head (its storage dtype), `scratch` extra slots."""
        return DraftKV(self.config, num_slots, capacity, self.device, self.act, scratch)

    # ------------------------------------------------------------------ pieces
    def to_target_ids(self, draft_ids: torch.Tensor) -> torch.Tensor:
        """draft id d -> target id d + d2t[d]."""
        return self.hot_ids.index_select(0, draft_ids.reshape(-1)).reshape(draft_ids.shape)

    def fc_input(self, aux: torch.Tensor) -> torch.Tensor:
        """aux [T, A] (captured boundary states, config order) -> what fc reads [T, A]: input_norm
        over all of A first (norm_before_fc), then fc_norm per aux chunk (DESIGN §4)."""
        if aux.shape[-1] != self.fc.shape[1]:
            raise ValueError(f"{self.config.name}: aux width {aux.shape[-1]} != fc input width {self.fc.shape[1]}")
        eps, act = self.config.rms_norm_eps, self.act
        norm = self.ops.rms_norm if self.cached else rms_norm      # fp32 in, rounded once to act
        x = aux.to(act)
        if self.input_norm is not None:                        # norm_before_fc: one norm over all of A
            x = norm(x, self.input_norm, eps, act)
        if self.fc_norm is not None:                           # fc_norm: one norm per aux chunk
            chunks = x.chunk(self.n_aux, dim=-1)
            x = torch.cat([norm(c.contiguous(), w, eps, act) for c, w in zip(chunks, self.fc_norm)], dim=-1)
        return x

    def combine_aux(self, aux: torch.Tensor) -> torch.Tensor:
        """aux [T, A] -> h = fc(fc_input(aux)) [T, H_draft], the first draft step's hidden input."""
        return self.ops.linear(self.fc_input(aux), self.fc)

    def attend(self, q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
        """One query q [Hq, D] over keys/values [Hkv, n, D] (all visible) -> [Hq, D]; fixed-order
        sums (kernels.portable) over D for the scores and over the n keys for the output."""
        Hkv, n, D = keys.shape
        G = q.shape[0] // Hkv
        s = torch.mul(portable.tree_sum(torch.mul(q.reshape(Hkv, G, 1, D), keys[:, None]), -1), self.scale)
        p = portable.softmax(s, dim=-1)                                              # [Hkv, G, n]
        return portable.tree_sum(torch.mul(p[..., None], values[:, None]), -2).reshape(Hkv * G, D)

    def attend_rows(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, kv: DraftKV, slots: torch.Tensor,
                    visible: torch.Tensor, anc_k: torch.Tensor, anc_v: torch.Tensor, n_anc: torch.Tensor,
                    with_self: bool, kv_len: int) -> torch.Tensor:
        """`attend` for T rows at once, on the device, with no host read. Row t's logical key list is
        its slot's positions 0 .. visible[t]-1, then its first n_anc[t] ancestors (anc_k/anc_v
        [T, A, Hkv, D], depth order), then its own k/v (with_self). The lists are gathered into
        one padded axis of length J = kv_len + A + with_self, real keys first: padding sits only at
        the end, scores -inf (weight exactly 0) and products -0.0, so every fixed-order sum
        (portable.tree_sum) sees the same operands in the same places as `attend` over the
        unpadded list (adding -0.0 or a +0 weight after the last real term changes no bit).
        kv_len: leading slot positions that can be visible (>= every visible[t])."""
        T, Hq, D = q.shape
        Hkv, A = kv.k.shape[1], anc_k.shape[1]
        G = Hq // Hkv
        J = kv_len + A + int(with_self)
        j = torch.arange(J, device=q.device)
        c, m = visible[:, None], n_anc[:, None]                                    # [T, 1]
        # pool index of logical key j: slot position j, ancestor j - c, or self (pool tail)
        idx = torch.where(j < c, j, kv_len + (j - c).clamp(max=max(A - 1, 0)))
        if with_self:
            idx = torch.where(j == c + m, kv_len + A, idx)
        idx = torch.where(j < c + m + int(with_self), idx, 0)                     # padding: any key
        valid = j < c + m + int(with_self)                                           # [T, J]
        out = q.new_empty((T, Hq, D))
        step = max(1, (1 << 25) // max(1, Hq * J * D))      # rows per chunk: bounds the [rows, Hq, J, D] product
        for lo in range(0, T, step):
            hi = min(T, lo + step)
            sl = slots[lo:hi]
            parts_k = [kv.k[:, :, :kv_len].index_select(0, sl), anc_k[lo:hi].transpose(1, 2)]
            parts_v = [kv.v[:, :, :kv_len].index_select(0, sl), anc_v[lo:hi].transpose(1, 2)]
            if with_self:
                parts_k.append(k[lo:hi, :, None])
                parts_v.append(v[lo:hi, :, None])
            gi = idx[lo:hi, None, :, None].expand(hi - lo, Hkv, J, D)
            keys = torch.gather(torch.cat(parts_k, dim=2), 2, gi)                   # [t, Hkv, J, D]
            values = torch.gather(torch.cat(parts_v, dim=2), 2, gi)
            ok = valid[lo:hi, None, None, :]                                         # [t, 1, 1, J]
            qq = q[lo:hi].reshape(hi - lo, Hkv, G, 1, D)
            s = torch.mul(portable.tree_sum(torch.mul(qq, keys[:, :, None]), -1), self.scale)   # [t, Hkv, G, J]
            p = portable.softmax(torch.where(ok, s, float("-inf")), dim=-1)
            prod = torch.mul(p[..., None], values[:, :, None])                     # [t, Hkv, G, J, D]
            prod = torch.where(ok[..., None], prod, torch.full_like(prod[:1, :1, :1, :1], -0.0))
            out[lo:hi] = portable.tree_sum(prod, -2).reshape(hi - lo, Hq, D)
        return out

    @torch.inference_mode()
    def forward(self, tokens: torch.Tensor, positions: torch.Tensor, hidden: torch.Tensor, kv: DraftKV,
                slots: torch.Tensor, commit: bool, prefix_lens: Sequence[int] | torch.Tensor | None = None,
                ancestors: Sequence[Sequence[tuple[torch.Tensor, torch.Tensor]]]
                | tuple[torch.Tensor, torch.Tensor] | None = None,
                kv_len: int | None = None) -> DraftStep:
        """One draft step for T rows. hidden [T, H_draft] is h (fc output, or the previous step's output).

        commit=True: rows are committed positions; their k/v go into `kv` at (slot, position) first,
        then row t attends to its slot's positions 0 .. positions[t].
        commit=False: tree rows. Row t attends to its slot's first prefix_lens[t] positions, then
        its ancestors' (k, v) in depth order, then itself. The portable path writes nothing; the
        cached path writes the ancestors and the row's own k/v after the prefix (_forward_cached).
        `ancestors`: per row a list of (k [Hkv, D], v [Hkv, D]), or a pair of tensors
        (k, v) [T, A, Hkv, D] when every row has A ancestors (the speculative loop's form).
        kv_len: a bound on the slot positions any row sees (default: the capacity); the
        attention's cost grows with it, its bits do not (see attend_rows).
        All rows run in one batch on the device (attend_rows, or the ops table's attention on the
        cached path): no per-row loop, no host read.
        """
        cfg = self.config
        T, D = tokens.shape[0], cfg.head_dim
        Hkv = cfg.num_key_value_heads
        eps = cfg.rms_norm_eps
        tokens, positions, slots = tokens.to(self.device), positions.to(self.device), slots.to(self.device)
        if commit:
            visible, anc_k, anc_v, n_anc = positions + 1, None, None, None
        else:
            if prefix_lens is None:
                raise ValueError("Eagle3Draft.forward: tree rows (commit=False) need prefix_lens")
            visible = torch.as_tensor(prefix_lens, dtype=torch.int64).to(self.device)
            anc_k, anc_v, n_anc = _ancestor_tensors(ancestors, T, Hkv, D, kv.k)
        if self.cached:
            return self._forward_cached(tokens, positions, hidden, kv, slots, visible, anc_k, anc_v, n_anc)
        emb = self.embed.index_select(0, tokens)
        x = torch.cat([rms_norm(emb, self.input_layernorm, eps), rms_norm(hidden, self.hidden_norm, eps)], dim=-1)
        q = self.ops.linear(x, self.q_w).view(T, cfg.num_attention_heads, D)
        k = self.ops.linear(x, self.k_w).view(T, Hkv, D)
        v = self.ops.linear(x, self.v_w).view(T, Hkv, D)
        cos, sin = rope_cos_sin(positions, self.inv_freq, 1.0)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        kv_len = kv.k.shape[2] if kv_len is None else kv_len
        if commit:
            kv.k[slots, :, positions] = k
            kv.v[slots, :, positions] = v
            none = k.new_zeros((T, 0, Hkv, D))
            o = self.attend_rows(q, k, v, kv, slots, positions + 1, none, none,
                                 torch.zeros_like(positions), False, kv_len)
        else:
            o = self.attend_rows(q, k, v, kv, slots, visible, anc_k.to(k.dtype), anc_v.to(k.dtype), n_anc, True,
                                 kv_len)
        r = hidden.to(torch.float32) + self.ops.linear(o.reshape(T, -1), self.o_w)
        y = rms_norm(r, self.post_norm, eps)
        gate = self.ops.linear(y, self.gate_w)
        silu = torch.mul(gate, portable.sigmoid(gate))                    # SiLU, portable sigmoid
        mlp = self.ops.linear(torch.mul(silu, self.ops.linear(y, self.up_w)), self.down_w)
        out = r + mlp
        logits = self.ops.linear(rms_norm(out, self.norm, eps), self.lm_head)
        return DraftStep(logits, out, k, v)

    def _forward_cached(self, tokens, positions, hidden, kv: DraftKV, slots, visible, anc_k, anc_v,
                        n_anc) -> DraftStep:
        """`forward` on the cached path (class docstring). A tree row (anc_k not None) first writes
        its ancestors' keys at positions visible .. visible + n_anc - 1 of its slot, then, like a
        committed row, its own at its attention position a = visible + n_anc (committed rows: their
        position), and attends to positions 0 .. a of its slot: its logical key list in `attend`'s
        order. Tree rows must have distinct slots (the round gives a tree's beams scratch slots)."""
        cfg, ops, act, eps = self.config, self.ops, self.act, self.config.rms_norm_eps
        T, D, Hq, Hkv = tokens.shape[0], cfg.head_dim, cfg.num_attention_heads, cfg.num_key_value_heads
        at = positions if anc_k is None else visible + n_anc
        if anc_k is not None and anc_k.shape[1]:       # padding entries land on `at`, rewritten below
            A = anc_k.shape[1]
            pos = visible[:, None] + torch.minimum(torch.arange(A, device=self.device)[None], n_anc[:, None])
            kv.k[slots[:, None], :, pos] = anc_k.to(act)
            kv.v[slots[:, None], :, pos] = anc_v.to(act)
        hidden = hidden.to(act)
        x = torch.cat([ops.rms_norm(self.embed.index_select(0, tokens), self.input_layernorm, eps, act),
                       ops.rms_norm(hidden, self.hidden_norm, eps, act)], dim=-1)
        qkv = ops.linear(x, self.qkv_w)                                            # [T, (Hq + 2 Hkv) D]
        cos, sin = self._cos_sin(positions, kv.k.shape[2])
        if ops.fused is not None:                      # RoPE writes the cache itself (kernels/rope.py)
            q = ops.fused.rope_qkv_cache(qkv, cos, sin, kv.k, kv.v, slots, at, Hq)
        else:
            q, k, v = qkv.split([Hq * D, Hkv * D, Hkv * D], dim=1)
            q = apply_rope(q.view(T, Hq, D).to(torch.float32), cos, sin).to(act)
            kv.k[slots, :, at] = apply_rope(k.view(T, Hkv, D).to(torch.float32), cos, sin).to(act)
            kv.v[slots, :, at] = v.view(T, Hkv, D)
        o = ops.attention(q, kv.k, kv.v, slots, at, self.no_sinks, 0, self.scale)   # [T, Hq, D]
        r = residual(hidden, ops.linear(o.reshape(T, Hq * D), self.o_w, None, torch.float32), act)
        gate, up = ops.linear(ops.rms_norm(r, self.post_norm, eps, act), self.gate_up_w).chunk(2, dim=-1)
        g = gate.to(torch.float32)
        silu = torch.mul(torch.mul(g, portable.sigmoid(g)), up.to(torch.float32)).to(act)   # SiLU(gate) * up
        out = residual(r, ops.linear(silu, self.down_w, None, torch.float32), act)
        logits = ops.linear(ops.rms_norm(out, self.norm, eps, act), self.lm_head, None, torch.float32)
        return DraftStep(logits, out, kv.k[slots, :, at], kv.v[slots, :, at])


def _ancestor_tensors(ancestors, T: int, Hkv: int, D: int, like: torch.Tensor
                      ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Eagle3Draft.forward's `ancestors` -> (k, v [T, A, Hkv, D], count [T]); per-row lists are
    padded at the end to the longest (the padding is never visible)."""
    dev = like.device
    if ancestors is None:
        return like.new_zeros((T, 0, Hkv, D)), like.new_zeros((T, 0, Hkv, D)), torch.zeros(T, dtype=torch.int64, device=dev)
    if isinstance(ancestors, tuple) and len(ancestors) == 2 and isinstance(ancestors[0], torch.Tensor):
        ak, av = ancestors
        if ak.dim() != 4 or ak.shape[0] != T or ak.shape[2:] != (Hkv, D) or av.shape != ak.shape:
            raise ValueError(f"Eagle3Draft.forward: ancestor tensors must be [T={T}, A, {Hkv}, {D}], got "
                             f"{tuple(ak.shape)} and {tuple(av.shape)}")
        return ak.to(like.dtype), av.to(like.dtype), torch.full((T,), ak.shape[1], dtype=torch.int64, device=dev)
    if len(ancestors) != T:
        raise ValueError(f"Eagle3Draft.forward: {len(ancestors)} ancestor lists for {T} rows")
    A = max((len(a) for a in ancestors), default=0)
    ak, av = like.new_zeros((T, A, Hkv, D)), like.new_zeros((T, A, Hkv, D))
    for t, chain in enumerate(ancestors):
        for i, (a_k, a_v) in enumerate(chain):
            ak[t, i], av[t, i] = a_k, a_v
    counts = torch.tensor([len(a) for a in ancestors], dtype=torch.int64, device=dev)
    return ak, av, counts


def load_draft(path: str | Path, target, *, convention: str, backend: str | None = None,
               device: str | torch.device | None = None, target_embed: torch.Tensor | None = None,
               dtype: str | None = None) -> Eagle3Draft:
    """Load an HF-style EAGLE3 draft for `target` (a GptOssModel, or a GptOssConfig when the draft
    carries its own embed_tokens). `convention` names how its layer ids are read (DESIGN §3).
    `device`: default the target model's device (cpu for a config). `target_embed`: the target's
    full [V, H] embedding, for a draft without its own when `target.embed` is not the full table
    (engine.parallel holds a vocab shard per rank); default `target.embed`. `dtype`: the dtype
    policy; default the target model's (fp32 for a config). `backend`: the ops table; default the
    target model's ("torch" for a config), so a pair runs one backend unless a caller asks otherwise."""
    cfg, weights = read_draft(path)
    target_config = target if isinstance(target, GptOssConfig) else target.config
    if target_embed is None and not isinstance(target, GptOssConfig):
        target_embed = target.embed
    if device is None and not isinstance(target, GptOssConfig):
        device = getattr(target, "device", None)
    if dtype is None:
        dtype = "fp32" if isinstance(target, GptOssConfig) else getattr(target, "dtype_policy", "fp32")
    if backend is None:
        backend = "torch" if isinstance(target, GptOssConfig) else getattr(target, "backend", "torch")
    return Eagle3Draft(cfg, weights, target_config, convention, target_embed, backend, device, dtype)
