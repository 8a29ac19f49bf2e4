"""Speculative decoding: the pieces of one round against one target decode
step, on random gpt-oss weights and a random EAGLE3 draft built in memory on the device.

    python3 bench/speculative.py                       # gpt-oss-20b shape, bf16 then MXFP4 experts, batches 1 and 8
    python3 bench/speculative.py --dtype mxfp4         # one target: packed MXFP4 experts
    python3 bench/speculative.py --tiny                # CPU smoke check (tiny preset, a few rows)

Each --dtype is one target, measured in turn (the first freed before the next is built): bf16
(dense bf16 experts) and mxfp4 (the HF `_blocks` / `_scales` experts kept packed), as bench/e2e.py's
--dtype; the target's dtype policy (--compute) is the same for both. A later target's host memory
counts from the process as the earlier one left it (the device's peaks are reset for each).

For each batch B (B requests whose --context tokens are already in the target cache and the
draft's committed KV), chain drafting with --steps draft steps (topk 1, steps + 1 tree nodes),
greedy verification:
  decode step    one target forward of B rows, eager
  captured step  the baseline users get: the same step replayed from engine.graphs.DecodeGraph,
                 as generate runs it on a GPU (on the CPU it is the eager step again)
  draft step     one draft forward of B tree rows at depth 2 (over the committed keys and one
                 ancestor), through engine.graphs.RoundGraphs (on the cached path replayed from
                 a CUDA graph of its own; in the round the whole draft tree is one graph)
  verify         one target forward of B * (steps + 1) rows: the chain at its real positions,
                 as the round runs it (RoundGraphs: replayed from a CUDA graph on a GPU)
  round          engine.speculative's whole round (_round: draft trees, verify, batched
                 acceptance, the one host read, KV copy-back, draft extend), as
                 speculative_generate runs it between its bookkeeping: its forwards replayed
                 from the graphs captured at the warm-up rounds
  end to end     (B = 1, --new-tokens tokens) wall clock of plain `generate` (captured decode
                 steps) against `speculative_generate` whose draft (`proposing`) proposes the
                 plain run's own tokens after its real forward: full acceptance, measured
The derived lines (labelled "derived") turn the round time into throughput at a mean accept
length of --accept (default 2.68, SGLang's gpt-oss-120b + EAGLE3 figure: tokens committed
per request per round): tok/s = B * accept / round, speed-up = accept * captured step / round.
Random weights accept almost nothing, and a round's work has a fixed shape whatever is
accepted, so the times are the real ones and only the acceptance is assumed.

The draft's shape is an assumption (no EAGLE3 checkpoint is read): H_draft = the target's
hidden size, 64 query / 8 KV heads of 64, intermediate 4 * H, a 32 000-id draft vocabulary
(holding the end-to-end run's tokens), the target's embedding, the target's dtype policy and
backend (before 2026-12-03 the bench left the draft on the torch backend's portable ops: ~1,800
launches per draft step). Times are CUDA events after warm-up calls; wall clock on the CPU.
The "memory" lines give each build's peak device memory (CUDA) and host RSS against the models'
own bytes (bench/_memory.py; target <= 1.15x), and the same over the timed part.
Before timing, "check" runs greedy speculative_generate against greedy generate on one prompt
(tokens and logprob bits must agree; exit 3 if not), so a wrong round cannot hide behind a time.
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))        # this checkout's engine, not an installed copy
sys.path.insert(0, str(ROOT / "bench"))

import torch  # noqa: E402

import e2e  # noqa: E402  (random weights, the engine model, timing)
from _memory import Meter, model_bytes  # noqa: E402
from lockstep.engine.config import preset  # noqa: E402
from lockstep.engine.eagle3 import Eagle3Config, Eagle3Draft, expected_draft_tensors  # noqa: E402
from lockstep.engine.generate import Decoding, Request  # noqa: E402
from lockstep.engine.sampling import SamplingParams  # noqa: E402
import lockstep.engine.speculative as spec_mod  # noqa: E402
from lockstep.engine import spec_round  # noqa: E402
from lockstep.engine.graphs import DecodeGraph, RoundGraphs  # noqa: E402

SHAPES = {"20b": "gpt-oss-20b", "120b": "gpt-oss-120b"}


def random_draft(target, device, seed=1, dtype="fp32", must=()):
    """A random EAGLE3 head for `target` (module docstring's shape), weights made on the device,
    under dtype policy `dtype` and the target's backend (its ops table: on the triton backend the
    target's kernels); its draft vocabulary holds the target ids `must`."""
    tc = target.config
    H = tc.hidden_size
    heads = 64 if H >= 1024 else 2
    cfg = Eagle3Config(hidden_size=H, intermediate_size=4 * H, num_attention_heads=heads,
                       num_key_value_heads=max(1, heads // 8), head_dim=64 if H >= 1024 else max(2, H // heads // 2 * 2),
                       vocab_size=tc.vocab_size, draft_vocab_size=min(32000, tc.vocab_size // 2),
                       target_hidden_size=H, aux_layer_ids=None, rms_norm_eps=tc.rms_norm_eps)
    L = tc.num_hidden_layers
    ids = (2, L // 2, L - 3) if L >= 6 else (0, 1, L)
    cfg = Eagle3Config(**{**cfg.__dict__, "aux_layer_ids": ids})
    g = torch.Generator(device=device).manual_seed(seed)
    w = {}
    for name, (shape, kind) in expected_draft_tensors(cfg, 3, H, with_embed=False).items():
        if kind == "int":
            continue
        t = torch.randn(shape, generator=g, device=device)
        w[name] = (1 + 0.1 * t) if "norm" in name else t / math.sqrt(shape[-1])
    perm = torch.randperm(cfg.vocab_size, generator=g, device=device).tolist()
    hot = list(dict.fromkeys([*must, *perm]))[:cfg.draft_vocab_size]            # `must` first, no repeats
    hot = torch.tensor(sorted(hot), device=device)
    w["d2t"] = hot - torch.arange(cfg.draft_vocab_size, device=device)
    return Eagle3Draft(cfg, w, tc, "boundary", target_embed=target.embed, backend=target.backend, device=device,
                       dtype=dtype)


def proposing(draft, seqs: torch.Tensor):
    """`draft` made to propose the target's own tokens: seqs [slots, L] holds each request's
    sequence from a plain greedy run (prompt + output), and a draft row at position p of slot s
    gets its logit at seqs[s, p + 2] raised above every other (the step at position p predicts
    token p + 2), after the real forward: the cost is the real head's, the acceptance is full.
    Device gathers only (no host read). Tree scratch slots are not mapped: chains only."""
    real = draft.forward
    to_draft = torch.full((draft.config.vocab_size,), 0, dtype=torch.int64, device=draft.device)
    to_draft[draft.hot_ids] = torch.arange(draft.config.draft_vocab_size, device=draft.device)
    seqs = seqs.to(draft.device)

    def forward(tokens, positions, hidden, kv, slots, commit, **kw):
        step = real(tokens, positions, hidden, kv, slots, commit, **kw)
        s, p = slots.to(draft.device), (positions.to(draft.device) + 2).clamp(max=seqs.shape[1] - 1)
        ids = to_draft.index_select(0, seqs[s, p])[:, None]
        step.logits = step.logits.scatter(1, ids, step.logits.amax(1, keepdim=True) + 1.0)
        return step

    draft.forward = forward
    return draft


class State:
    """B requests with `context` committed tokens: target cache, draft KV and depth-1 inputs filled
    by one prefill forward and one draft extend (as speculative_generate's prefill)."""

    def __init__(self, target, draft, batch, context, spec, seed=0):
        dev = target.device
        self.spec, self.shape = spec, spec_round._RoundShape(spec)
        g = torch.Generator().manual_seed(seed)
        V = target.config.vocab_size
        self.seqs = [torch.randint(0, V, (context,), generator=g).tolist() for _ in range(batch)]
        self.requests = [Request(s, SamplingParams(greedy=True, max_new_tokens=1 << 20)) for s in self.seqs]
        cap = context + 4 * (spec.num_steps + 1) + 16
        # the round's caches and its captured forwards, kept across the timed rounds
        self.graphs = RoundGraphs(target, draft, batch * self.shape.P, batch, cap, 0)
        self.cache, self.dkv = self.graphs.cache, self.graphs.dkv
        self.root_logits = torch.zeros((batch, draft.config.draft_vocab_size), device=draft.device)
        self.root_h = torch.zeros((batch, draft.config.hidden_size), dtype=draft.act, device=draft.device)
        m = context - 1                                    # positions 0 .. n-2 are in the caches
        tok = torch.tensor([t for s in self.seqs for t in s[:m]], device=dev)
        pos = torch.arange(m, device=dev).repeat(batch)
        slot = torch.arange(batch, device=dev).repeat_interleave(m)
        out = target.forward(tok, pos, slot, self.cache, capture=draft.boundaries)
        nxt = torch.tensor([t for s in self.seqs for t in s[1:m + 1]], device=dev)
        spec_round._draft_extend(draft, self.dkv, self.root_logits, self.root_h, slot, pos, nxt, out.captured,
                               torch.arange(batch, device=dev) * m + m - 1, torch.arange(batch, device=dev), cap)
        self.context, self.batch, self.cap = context, batch, cap

    def round(self, target, draft):
        """One round over a fresh decoding state, so every call starts from the same committed sequences."""
        B = self.batch
        run = spec_round._SpecRun(target, draft, self.spec, self.shape, self.graphs, self.root_logits,
                                self.root_h, None, self.cap, Decoding(self.requests, target.config.eos_token_id),
                                [[] for _ in range(B)])
        spec_round._round(run, list(range(B)))


def measure(target, draft, batch, context, steps, repeat, device):
    spec = spec_mod.SpecParams(num_steps=steps, topk=1, draft_token_num=steps + 1, verify="greedy")
    st = State(target, draft, batch, context, spec)
    dev = target.device
    r = context - 1
    slots = torch.arange(batch, device=dev)
    tok = torch.tensor([s[-1] for s in st.seqs], device=dev)

    def decode(_):
        target.forward(tok, torch.full((batch,), r, device=dev), slots, st.cache)

    graph = DecodeGraph(target, st.cache, batch)
    d_pos = torch.full((batch,), r, device=dev)

    def captured(_):
        graph(tok, d_pos, slots)

    W = steps + 1
    v_tok = tok.repeat_interleave(W)
    v_pos = (r + torch.arange(W, device=dev)).repeat(batch)
    v_slot = slots.repeat_interleave(W)

    def verify(_):
        st.graphs.verify(v_tok, v_pos, v_slot)

    ddev = draft.device
    Hkv, D = st.dkv.k.shape[1], st.dkv.k.shape[3]
    anc = torch.zeros((batch, 1, Hkv, D), dtype=st.dkv.k.dtype, device=ddev)
    d_tok = tok.to(ddev)

    def draft_step(_):
        st.graphs.draft_forward(d_tok, torch.full((batch,), r + 1, device=ddev), st.root_h, st.dkv, slots.to(ddev),
                                commit=False, prefix_lens=torch.full((batch,), r, device=ddev), ancestors=(anc, anc),
                                kv_len=r)

    out = {}
    for name, fn in (("decode step", decode), ("captured step", captured), ("draft step", draft_step),
                     ("verify", verify),
                     ("round", lambda _: st.round(target, draft))):
        with torch.inference_mode():
            out[name] = e2e.time_per_call(fn, device, repeat)
    return out


def end_to_end(target, draft, prompt, want, steps, repeat, device):
    """Wall clock of one greedy request as a user calls it: plain `generate` (captured decode
    steps) against `speculative_generate` with `draft` proposing the plain run's own tokens
    (`proposing`), so every draft is accepted. -> (plain s, speculative s, mean accept length,
    outputs equal)."""
    from lockstep.engine.generate import generate
    import time
    params = SamplingParams(greedy=True, max_new_tokens=len(want.tokens))
    req = [Request(prompt, params)]
    chain = spec_mod.SpecParams(num_steps=steps, topk=1, draft_token_num=steps + 1, verify="greedy")

    def wall(fn):
        times = []
        for i in range(repeat + 1):                         # the first call warms up (compiles, captures)
            e2e.sync(device)
            t0 = time.perf_counter()
            out = fn()
            e2e.sync(device)
            times.append(time.perf_counter() - t0)
        return sorted(times[1:])[len(times[1:]) // 2], out  # median
    with torch.inference_mode():
        t_plain, plain = wall(lambda: generate(target, req)[0])
        t_spec, got = wall(lambda: spec_mod.speculative_generate(target, draft, req, chain)[0])
    same = got.tokens == plain.tokens == want.tokens and got.logprob_bytes == plain.logprobs.numpy().tobytes()
    if not same:
        print(f"end to end: plain {plain.tokens} speculative {got.tokens} accept {got.accept_lengths}")
    return t_plain, t_spec, got.mean_accept_length, same


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shape", default="20b", help="20b, 120b, tiny (or any engine.config preset)")
    ap.add_argument("--dtype", action="append", help="bf16, mxfp4 (repeatable, or comma-separated; default both: "
                                                     "the experts dense bf16 or packed MXFP4)")
    ap.add_argument("--batches", default="1,8")
    ap.add_argument("--context", type=int, default=128)
    ap.add_argument("--steps", type=int, default=3, help="draft steps of the chain (nodes = steps + 1)")
    ap.add_argument("--accept", type=float, default=2.68, help="assumed mean accept length (derived lines; 2.68: "
                                                               "SGLang's gpt-oss-120b + EAGLE3 figure)")
    ap.add_argument("--repeat", type=int, default=20)
    ap.add_argument("--new-tokens", type=int, default=48, help="tokens of the end-to-end figure (B = 1)")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--backend", help="engine backend (default triton on CUDA, torch on the CPU)")
    ap.add_argument("--compute", choices=("bf16", "fp32"), help="target dtype (default bf16 on CUDA, fp32 on the CPU)")
    ap.add_argument("--tiny", action="store_true", help="CPU smoke check: --shape tiny --device cpu --batches 1,2 "
                                                        "--context 12 --repeat 1")
    args = ap.parse_args(argv)
    if args.tiny:
        args.shape, args.device, args.batches, args.context, args.repeat = "tiny", "cpu", "1,2", 12, 1
        args.new_tokens = 8
    dtypes = [d for v in (args.dtype or ["bf16,mxfp4"]) for d in v.split(",") if d]
    for d in dtypes:
        if d not in ("bf16", "mxfp4"):
            ap.error(f"--dtype {d!r}: choose bf16 or mxfp4")
    device = torch.device(args.device)
    backend = args.backend or ("triton" if device.type == "cuda" else "torch")
    compute = args.compute or ("bf16" if device.type == "cuda" else "fp32")
    failed = []
    for d in dtypes:
        if not run(args, d, device, backend, compute):
            failed.append(d)
        if device.type == "cuda":
            torch.cuda.empty_cache()            # run's models are freed: the next target is built on a free card
    if failed:
        print(f"FAILED: the {', '.join(failed)} target's check")
        sys.exit(3)


def run(args, experts: str, device, backend: str, compute: str) -> bool:
    """The whole bench for one target (experts dense bf16 or packed MXFP4): -> whether its checks held."""
    config = preset(SHAPES.get(args.shape, args.shape))
    meter = Meter(device)
    floats, packed = e2e.random_weights(config, device)
    weights = {**floats, **(e2e.dense_experts(packed, consume=True) if experts == "bf16" else packed)}
    del packed, floats                                  # `weights` holds each tensor once, handed over
    target = e2e.engine_model(config, weights, backend, device, compute, take=True)
    del weights
    print(meter.line("target build (random weights made and handed over)", model_bytes(target)))
    # the end-to-end request's plain greedy run first: the draft's vocabulary must hold its tokens
    from lockstep.engine.generate import generate
    e2e_prompt = torch.randint(0, config.vocab_size, (args.context,), generator=torch.Generator().manual_seed(9)).tolist()
    with torch.inference_mode():
        plain_run = generate(target, [Request(e2e_prompt, SamplingParams(greedy=True, max_new_tokens=args.new_tokens))])[0]
    meter.start()
    draft = random_draft(target, device, dtype=compute, must=plain_run.tokens)
    print(meter.line("draft build (the target held)", model_bytes(target, draft)))
    meter.start()
    print(f"speculative round, {args.shape} shape, random weights, {compute} target with {experts} experts ({backend}), "
          f"{compute} draft, context {args.context}, chain of {args.steps} draft steps, greedy verify, device "
          f"{torch.cuda.get_device_name(device) if device.type == 'cuda' else 'cpu'}")
    # the round must be right before it is timed: greedy speculative decoding = greedy generate
    probe = [Request(torch.randint(0, config.vocab_size, (16,), generator=torch.Generator().manual_seed(5)).tolist(),
                     SamplingParams(greedy=True, max_new_tokens=6))]
    chain = spec_mod.SpecParams(num_steps=args.steps, topk=1, draft_token_num=args.steps + 1, verify="greedy")
    with torch.inference_mode():
        want, got = generate(target, probe)[0], spec_mod.speculative_generate(target, draft, probe, chain)[0]
    same = want.tokens == got.tokens and want.logprobs.numpy().tobytes() == got.logprob_bytes
    print(f"check: greedy speculative_generate = greedy generate (6 tokens, bits of tokens and logprobs): "
          f"{'ok' if same else 'FAILED'}")
    if not same:
        return False
    print(f"{'B':>3} {'decode step':>12} {'captured':>10} {'draft step':>11} {'verify':>10} {'round':>10} "
          f"{'round/captured':>15} | derived at accept {args.accept}: {'tok/s':>8} {'baseline tok/s':>15} "
          f"{'speed-up':>9}")
    for b in [int(x) for x in args.batches.split(",")]:
        t = measure(target, draft, b, args.context, args.steps, args.repeat, device)
        ms = {k: v * 1e3 for k, v in t.items()}
        ratio = t["round"] / t["captured step"]
        print(f"{b:>3} {ms['decode step']:>10.3f}ms {ms['captured step']:>8.3f}ms {ms['draft step']:>9.3f}ms "
              f"{ms['verify']:>8.3f}ms {ms['round']:>8.3f}ms {ratio:>14.2f}x | derived: "
              f"{b * args.accept / t['round']:>15.1f} {b / t['captured step']:>15.1f} {args.accept / ratio:>8.2f}x")
    print("round/captured: target <= 2.2x at B = 1; derived = measured round time x "
          "assumed acceptance, not a measured end-to-end rate")
    seq = torch.tensor([e2e_prompt + plain_run.tokens])
    oracle = proposing(draft, seq)                         # the timed head itself, now proposing
    t_plain, t_spec, accept, same = end_to_end(target, oracle, e2e_prompt, plain_run, args.steps, max(1, args.repeat // 4),
                                               device)
    n = len(plain_run.tokens)
    print(f"end to end, B = 1, {n} new tokens, greedy, {experts} experts, a draft proposing the target's own tokens "
          f"(full acceptance): generate {n / t_plain:.1f} tok/s, speculative {n / t_spec:.1f} tok/s, speed-up "
          f"{t_plain / t_spec:.2f}x, mean accept length {accept:.2f}, outputs equal: {'ok' if same else 'FAILED'} "
          f"(target >= 2x)")
    print(meter.line("the rounds and end to end (caches, graphs, activations on top)", model_bytes(target, draft)))
    return same


if __name__ == "__main__":
    main()
