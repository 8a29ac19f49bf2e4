"""Fit a small EAGLE3 draft to the `tiny` target on the target's own greedy generations.

    python scripts/fit_draft.py [--out models] [--steps 400]

Writes <out>/tiny-target (make_checkpoint("tiny", 0, "bf16")) and <out>/tiny-eagle3 (the fitted
draft, SpecForge layout, bf16), then prints the mean acceptance length of greedy speculative
decoding on a fixed held-out prompt set (chain and tree). Deterministic: fixed seeds, CPU, one
thread for training; a few minutes on 2 cores.

Data: 128 random prompts of 8 tokens, 40 greedy tokens each, with the target's boundary states
[1, 2, 4] captured, computed by a batched plain-torch copy of the target's math
(the engine's per-row forward is too slow for this much data; greedy tokens agree with
engine.generate, checked on two prompts) (ids [1, 2, 4]: max(ids) == L = 4, so `sglang` and `boundary` both read them
as boundaries 1, 2, 4). Draft vocab: the 256 most frequent generated-or-prompt tokens (ties by
lower id); d2t maps them back. Training: cross-entropy against the target's greedy tokens
(full batch, Adam, cosine schedule), with 3 unrolled
"training-time test" steps (step j at base t: h from step j-1, token x_{t+j+1}, label x_{t+j+2};
keys = step-0 keys at positions <= t plus the same base's keys of steps 1..j), which is exactly
the key set a depth-(j+1) tree node sees at inference (engine/eagle3.py).
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from lockstep.engine.checkpoint import make_checkpoint            # noqa: E402
from lockstep.engine.eagle3 import Eagle3Config, load_draft, write_draft   # noqa: E402
from lockstep.engine.generate import Request, generate            # noqa: E402
from lockstep.engine.model import GptOssModel     # noqa: E402
from lockstep.kernels.moe import clamped_swiglu_portable as clamped_swiglu  # noqa: E402
from lockstep.engine.rope import rope_cos_sin  # noqa: E402
from lockstep.kernels.rope import apply_rope_portable as apply_rope  # noqa: E402
from lockstep.engine.sampling import SamplingParams               # noqa: E402
from lockstep.engine.speculative import SpecParams, speculative_generate   # noqa: E402

IDS = [1, 2, 4]
PROMPT_LEN, GEN_LEN, N_TRAIN = 8, 40, 128
DRAFT_VOCAB = 256
TTT_STEPS = 3


def prompts(n: int, seed: int, vocab: int) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, vocab - 8, (n, PROMPT_LEN), generator=g).tolist()


@torch.no_grad()
def batched_target(target: GptOssModel, tokens: torch.Tensor, capture: list[int], kv: list | None = None):
    """Plain batched torch forward of the target (the engine's math: sinks, window, YaRN, top-k MoE,
    without its per-row loops; the same function, not the same bits; only used to make training
    data fast). tokens [B, t] are the positions after those already in `kv` (a list, per layer,
    of (K, V) [B, s, Hq, D], extended in place). -> (logits [B, t, V], captured [B, t, len * H])."""
    cfg = target.config
    B, T = tokens.shape
    Hq, Hkv, D = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
    eps = cfg.rms_norm_eps
    start = kv[0][0].shape[1] if kv and kv[0] is not None else 0
    x = target.embed[tokens]
    pos = torch.arange(start, start + T)
    cos, sin = rope_cos_sin(pos, target.inv_freq, target.mscale)
    states = {0: x}
    for i, blk in enumerate(target.blocks):
        h = rms(x, blk.attn_norm, eps)
        q = apply_rope((h @ blk.q_w.T + blk.q_b).view(B, T, Hq, D), cos, sin)
        k = apply_rope((h @ blk.k_w.T + blk.k_b).view(B, T, Hkv, D), cos, sin).repeat_interleave(Hq // Hkv, 2)
        v = (h @ blk.v_w.T + blk.v_b).view(B, T, Hkv, D).repeat_interleave(Hq // Hkv, 2)
        if kv is not None:
            if kv[i] is not None:
                k, v = torch.cat([kv[i][0], k], 1), torch.cat([kv[i][1], v], 1)
            kv[i] = (k, v)
        kpos = torch.arange(k.shape[1])
        s = torch.einsum("bthd,bshd->bhts", q, k) * target.scale
        vis = kpos[None, :] <= pos[:, None]
        w = cfg.window(i)
        if w:
            vis = vis & (kpos[None, :] > pos[:, None] - w)
        s = s.masked_fill(~vis, float("-inf"))
        sink = blk.sinks.view(1, Hq, 1, 1).expand(B, Hq, T, 1)
        p = torch.softmax(torch.cat([s, sink], -1), -1)[..., :-1]
        o = torch.einsum("bhts,bshd->bthd", p, v).reshape(B, T, Hq * D)
        x = x + o @ blk.o_w.T + blk.o_b
        h = rms(x, blk.mlp_norm, eps)
        logits = h @ blk.router_w.T + blk.router_b
        top_v, top_i = torch.sort(logits, dim=-1, descending=True, stable=True)
        kk = cfg.num_experts_per_tok
        route = torch.softmax(top_v[..., :kk], -1)
        moe = torch.zeros_like(x)
        for e in range(cfg.num_local_experts):
            wgt = (route * (top_i[..., :kk] == e)).sum(-1, keepdim=True)
            gu = h @ blk.gate_up_w[e].T + blk.gate_up_b[e]
            y = clamped_swiglu(gu, cfg.swiglu_alpha, cfg.swiglu_limit) @ blk.down_w[e].T + blk.down_b[e]
            moe = moe + wgt * y
        x = x + moe
        states[i + 1] = x
    logits = rms(x, target.norm, eps) @ target.lm_head.T
    return logits, torch.cat([states[b] for b in capture], -1)


@torch.no_grad()
def greedy_batched(target: GptOssModel, prompt: torch.Tensor, n_new: int, capture: list[int]):
    """-> (tokens [B, P + n_new], captured states and logits of positions 0 .. P + n_new - 2)."""
    kv = [None] * target.config.num_hidden_layers
    logits, cap = batched_target(target, prompt, capture, kv)
    seq, caps, lgs = [prompt], [cap], [logits]
    for step in range(n_new):
        nxt = logits[:, -1].argmax(-1, keepdim=True)
        seq.append(nxt)
        if step < n_new - 1:
            logits, cap = batched_target(target, nxt, capture, kv)
            caps.append(cap)
            lgs.append(logits)
    return torch.cat(seq, 1), torch.cat(caps, 1), torch.cat(lgs, 1)


def rms(x, w, eps=1e-5):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


def rope(x, pos, inv_freq):
    """x [..., T, heads, D], pos [T] -> rotated (half split), like engine.rope with mscale 1."""
    ang = pos.to(torch.float32)[:, None] * inv_freq[None, :]
    cos, sin = ang.cos()[:, None, :], ang.sin()[:, None, :]
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)


class Trainable(torch.nn.Module):
    def __init__(self, cfg: Eagle3Config, A: int, embed: torch.Tensor, seed: int):
        super().__init__()
        g = torch.Generator().manual_seed(seed)
        H, I, D, Hq, Hkv = cfg.hidden_size, cfg.intermediate_size, cfg.head_dim, cfg.num_attention_heads, \
            cfg.num_key_value_heads
        P = lambda *s: torch.nn.Parameter(torch.randn(*s, generator=g) / math.sqrt(s[-1]))   # noqa: E731
        ones = lambda n: torch.nn.Parameter(torch.ones(n))                                  # noqa: E731
        self.cfg = cfg
        self.embed = torch.nn.Parameter(embed.clone())
        self.input_norm, self.fc = ones(A), P(H, A)
        self.in_ln, self.hid_ln, self.post_ln, self.norm = ones(H), ones(H), ones(H), ones(H)
        self.q, self.k, self.v, self.o = P(Hq * D, 2 * H), P(Hkv * D, 2 * H), P(Hkv * D, 2 * H), P(H, Hq * D)
        self.gate, self.up, self.down = P(I, H), P(I, H), P(H, I)
        self.lm_head = P(cfg.draft_vocab_size, H)
        self.inv_freq = 1.0 / (cfg.rope_theta ** (torch.arange(0, D, 2).float() / D))

    def tensors(self, hot: torch.Tensor) -> dict[str, torch.Tensor]:
        bf = lambda p: p.detach().to(torch.bfloat16).contiguous()   # noqa: E731
        m = "midlayer."
        V = self.embed.shape[0]
        t2d = torch.zeros(V, dtype=torch.bool)
        t2d[hot] = True
        return {"embed_tokens.weight": bf(self.embed), "input_norm.weight": bf(self.input_norm),
                "fc.weight": bf(self.fc), m + "input_layernorm.weight": bf(self.in_ln),
                m + "hidden_norm.weight": bf(self.hid_ln), m + "self_attn.q_proj.weight": bf(self.q),
                m + "self_attn.k_proj.weight": bf(self.k), m + "self_attn.v_proj.weight": bf(self.v),
                m + "self_attn.o_proj.weight": bf(self.o), m + "post_attention_layernorm.weight": bf(self.post_ln),
                m + "mlp.gate_proj.weight": bf(self.gate), m + "mlp.up_proj.weight": bf(self.up),
                m + "mlp.down_proj.weight": bf(self.down), "norm.weight": bf(self.norm),
                "lm_head.weight": bf(self.lm_head),
                "d2t": hot - torch.arange(len(hot)), "t2d": t2d}

    def forward(self, feats, tokens, labels):
        """feats [B, T-1, A] (position t), tokens [B, T], labels [B, T] (draft ids, -100 outside the
        draft vocab) -> cross-entropy summed over the TTT steps, accuracy per step."""
        cfg = self.cfg
        B, Tm1, _ = feats.shape
        Hq, Hkv, D = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
        G = Hq // Hkv
        h = rms(feats, self.input_norm) @ self.fc.T                  # [B, T-1, H]
        base = torch.arange(Tm1)
        K0 = V0 = None
        diag_k, diag_v = [], []
        loss, accs = 0.0, []
        for j in range(TTT_STEPS):
            tok_idx = (base + j + 1).clamp(max=tokens.shape[1] - 1)
            lab_idx = base + j + 2
            valid = lab_idx < tokens.shape[1]
            emb = self.embed[tokens[:, tok_idx]]                       # [B, T-1, H]
            x = torch.cat([rms(emb, self.in_ln), rms(h, self.hid_ln)], -1)
            pos = base + j
            q = rope((x @ self.q.T).view(B, Tm1, Hq, D), pos, self.inv_freq)
            k = rope((x @ self.k.T).view(B, Tm1, Hkv, D), pos, self.inv_freq)
            v = (x @ self.v.T).view(B, Tm1, Hkv, D)
            qh = q.view(B, Tm1, Hkv, G, D).permute(0, 2, 3, 1, 4)       # [B, Hkv, G, T, D]
            if j == 0:
                K0, V0 = k.permute(0, 2, 1, 3), v.permute(0, 2, 1, 3)   # [B, Hkv, T, D]
                diag_k, diag_v = [], []
            else:
                diag_k.append(k.permute(0, 2, 1, 3))
                diag_v.append(v.permute(0, 2, 1, 3))
            s0 = torch.einsum("bhgtd,bhsd->bhgts", qh, K0) / math.sqrt(D)
            causal = base[None, :] <= base[:, None]                    # key s <= base t
            s0 = s0.masked_fill(~causal, float("-inf"))
            sd = [torch.einsum("bhgtd,bhtd->bhgt", qh, dk)[..., None] / math.sqrt(D) for dk in diag_k]
            p = torch.softmax(torch.cat([s0] + sd, -1), -1)
            o = torch.einsum("bhgts,bhsd->bhgtd", p[..., :Tm1], V0)
            for i, dv in enumerate(diag_v):
                o = o + p[..., Tm1 + i, None] * dv[:, :, None]
            o = o.permute(0, 3, 1, 2, 4).reshape(B, Tm1, Hq * D)
            r = h + o @ self.o.T
            y = rms(r, self.post_ln)
            out = r + (F.silu(y @ self.gate.T) * (y @ self.up.T)) @ self.down.T
            logits = rms(out, self.norm) @ self.lm_head.T
            lab = labels[:, lab_idx.clamp(max=tokens.shape[1] - 1)]
            lab = torch.where(valid[None, :], lab, -100)
            loss = loss + F.cross_entropy(logits.reshape(-1, logits.shape[-1]), lab.reshape(-1), ignore_index=-100) \
                * (0.8 ** j)
            ok = lab >= 0
            accs.append(float(((logits.argmax(-1) == lab) & ok).sum() / ok.sum()))
            h = out
        return loss, accs


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="models")
    ap.add_argument("--steps", type=int, default=400)
    args = ap.parse_args(argv)
    torch.manual_seed(0)
    out = Path(args.out)
    t0 = time.time()
    target_dir = make_checkpoint("tiny", 0, "bf16", out / "tiny-target", overwrite=True, num_shards=1)
    target = GptOssModel.from_checkpoint(target_dir)
    tc = target.config
    V, Ht = tc.vocab_size, tc.hidden_size
    seqs, feats, _ = greedy_batched(target, torch.tensor(prompts(N_TRAIN, 1, V)), GEN_LEN, IDS)
    check = generate(target, [Request(prompts(2, 1, V)[i], SamplingParams(greedy=True, max_new_tokens=GEN_LEN,
                                                                           stop_token_ids=())) for i in range(2)])
    agree = sum(int(a == b) for i in range(2) for a, b in zip(check[i].tokens, seqs[i, PROMPT_LEN:].tolist()))
    print(f"generated {N_TRAIN} x {GEN_LEN} training tokens in {time.time() - t0:.0f}s (batched torch forward; "
          f"{agree}/{2 * GEN_LEN} tokens agree with engine.generate on 2 checks)", flush=True)

    counts = torch.bincount(seqs.reshape(-1), minlength=V)
    order = sorted(range(V), key=lambda i: (-int(counts[i]), i))[:DRAFT_VOCAB]
    hot = torch.tensor(sorted(order), dtype=torch.int64)
    t2d_index = torch.full((V,), -100, dtype=torch.int64)
    t2d_index[hot] = torch.arange(DRAFT_VOCAB)
    labels = t2d_index[seqs]

    cfg = Eagle3Config(hidden_size=Ht, intermediate_size=2 * Ht, num_attention_heads=4, num_key_value_heads=2,
                       head_dim=24, vocab_size=V, draft_vocab_size=DRAFT_VOCAB, target_hidden_size=Ht,
                       aux_layer_ids=tuple(IDS), norm_before_fc=True, rope_theta=10000.0,
                       rms_norm_eps=tc.rms_norm_eps, max_position_embeddings=tc.max_position_embeddings)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)                                   # one fixed reduction order
    model = Trainable(cfg, len(IDS) * Ht, target.embed, seed=2)
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    for step in range(args.steps):
        lr = 3e-3 * 0.5 * (1 + math.cos(math.pi * step / args.steps))
        for group in opt.param_groups:
            group["lr"] = lr
        loss, accs = model(feats, seqs, labels)
        opt.zero_grad()
        loss.backward()
        opt.step()
        if step % 50 == 0 or step == args.steps - 1:
            print(f"step {step:4d} loss {float(loss.detach()):.3f} train acc per depth "
                  + " ".join(f"{a:.2f}" for a in accs), flush=True)
    torch.set_num_threads(threads)
    draft_dir = write_draft(out / "tiny-eagle3", cfg, model.tensors(hot), overwrite=True)
    print(f"wrote {target_dir} and {draft_dir} ({time.time() - t0:.0f}s)", flush=True)

    draft = load_draft(draft_dir, target, convention="sglang")
    gen_params = SamplingParams(greedy=True, max_new_tokens=32, stop_token_ids=())
    sets = {"fixed prompt set (training prompts 0-7, in-sample)": prompts(N_TRAIN, 1, V)[:8],
            "held-out prompts (8, seed 12345)": prompts(8, 12345, V)}
    for label, ps in sets.items():
        for spec in (SpecParams(num_steps=3, topk=1, draft_token_num=4),
                     SpecParams(num_steps=3, topk=2, draft_token_num=6)):
            res = speculative_generate(target, draft, [Request(p, gen_params) for p in ps], spec)
            lens = [x for r in res for x in r.accept_lengths]
            print(f"{label}, greedy, num_steps {spec.num_steps} topk {spec.topk} draft_token_num "
                  f"{spec.draft_token_num}: mean acceptance length {sum(lens) / len(lens):.3f} over {len(lens)} "
                  f"rounds", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
