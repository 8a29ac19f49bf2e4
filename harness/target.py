"""What a target is: an implementation under test, seen through the operations the spec kinds need.

A target is an object with a `name`, a `version` and an `ops` mapping from operation name to an
`Op`: the callable, where it can run, and which optional features of the operation it offers.
Every operation is optional: a spec that needs one the target lacks (or a feature its `Op` does
not list) is `n/a` with the target's reason (`Target.missing`), never skipped or passed. The
operations, with the default target `harness/targets/lockstep.py` implementing every one:

    hash(seed [n], pos [n], col [m]) -> [n, m] int64     coins kind: the seeded hash
    verify_coins(seeds [n], seq_lens [n], N) -> (coins [n, N] f32, final [n] f32)
    gumbel(seed [n], pos [n], col [m]) -> [n, m] f64     Gumbel noise of each key
    eagle3_layers(draft_config, convention, L, fc_in, hidden, name, direct_ids) -> the boundaries
              captured, in capture order (raises on refusal, see "Refusals"); direct_ids: the spec
              gave bare ids (top level of draft_config), which the adapter puts where its stack reads them
    capture(checkpoint_dir, prompt, boundaries) -> [T, count * H] f32    whole-model capture
    greedy_generate(checkpoint_dir, prompt, max_new_tokens, stop_ids)
              -> (tokens, logprobs [n] f32, finish_reason "stop" | "length")
              the minimal decode loop; a target with `generate` needs no `greedy_generate`
    generate(checkpoint_dir, requests: list[Request], *, capture=(), prefill_chunk=None, max_batch=8)
              -> list[Result]: the whole decode loop, a batch at once. Op.features says what
              it offers beyond greedy batch-of-one generation:
                "sampling"       seeded sampling under the coin contract (DESIGN §5: the request's
                                 seed, Gumbel-max over vocab ids at the input token's position)
                "batch"          several requests in one call (else each request is its own call,
                                 and specs that demand batch invariance are n/a)
                "capture"        captured boundary states per position (Result.captured)
                "prefill_chunk"  chunked prefill of the given chunk size (D3 specs)
    speculative_generate(checkpoint_dir, draft_dir, convention, requests, speculative: dict)
              -> list[Result] with accept_lengths (accepted drafts + 1 per verify round).
              `speculative`: num_steps, topk, draft_token_num, verify, threshold_single,
              threshold_acc (as a generate spec's `speculative`). Op.features: the verify modes
              it implements ("greedy", "target-only", "rejection") and "tree" when topk > 1 works;
              also "sampling" and "batch" as for generate. The distribution kind drives it too
              (one seeded request per seed; its tokens judged by a chi-square test).
    draft_stages(checkpoint_dir, draft_dir, convention, aux [R, A] f32, tokens [R] int64, top_k)
              -> dict of the draft head's
              internals (DESIGN §4) for R rows as one committed draft step: fc_input [R, A],
              fc_output [R, Hd], hidden [R, Hd], logits [R, Vd], top_logprobs [R, k] f64,
              top_draft_ids [R, k], top_target_ids [R, k]. Its draft proposals: the top-k.
    prefix_cache(checkpoint_dir, block) -> a fresh, empty prefix cache of the target's engine on that
              checkpoint (the optional prefix-cache capability), an object with
                generate(requests: list[Request], prefill_chunk=None) -> list[Result]
                                 generation through this cache (a lookup before each prefill
                                 reuses cached prompt KV, the prompt's KV is stored after it)
                hits, hit_tokens lookups that reused at least one position, positions reused
              The prefix-cache kind drives it: a hit must give the cold run's bits, and the
              counters must show the predicted reuse. Op.features: "sampling" (seeded requests
              under the coin contract), "prefill_chunk".
    mxfp4_decode(blocks [rows, G, 16] u8, scales [rows, G] u8, dtype) -> [rows, G * 32] of dtype
              MXFP4 (DESIGN §7): E2M1 nibbles (low nibble = even element) times 2^(scale - 127);
              scale 255 gives NaN for its block
    load_checkpoint(checkpoint_dir) -> anything; raises (a refusal) on a checkpoint it must refuse
              (an MXFP4 block of scale 255), naming the tensor, the block index and the scale
    verify_greedy(tree, argmax per node) -> (accepted path, next token)        verify decisions
    verify_target_only(tree, p [N, V], coins [N], final, single, acc) -> (accepted, next)
    verify_rejection(tree with q, p, coins, final) -> (accepted, next)
              Lockstep's are the batched acceptance its speculative round runs, on a batch of one
              tree (engine.speculative: one implementation of each rule).
    attention(q [T, Hq, D], k [S, Hkv, D], v [S, Hkv, D], positions [T], sinks [Hq], window,
              scale) -> [T, Hq, D]       query t sees keys max(0, pos - window + 1) … pos
    rmsnorm(x [M, N], weight [N], eps) -> [M, N]
    sampling(logp [R, V] f64, seeds [R], positions [R]) -> [R] int64   seeded Gumbel-max
              Op.features: "col_base" (col_base=: the hash column of vocab id 0), and
                "params"         the request's settings: sampling(logits [R, V] f32, seeds [R] int64,
                                 positions [R] int64, params=[SamplingParams] * R) -> [R] int64, row r
                                 drawn as a request with params[r] (temperature, top_k, top_p, min_p;
                                 greedy) and seed seeds[r] whose logits [r] are the raw logits of the
                                 input token at positions[r] (DESIGN §5: temperature divides, the filters
                                 keep equal probabilities lowest id first and mask the rest to -inf,
                                 Gumbel-max over vocab-id columns, the lowest id on ties). The kernel
                                 kind judges sample_fused specs' tokens through it, bitwise, on a target
                                 that declares the coin contract (`rng`); without the feature or the
                                 declaration they are n/a with the reason

Operations only Lockstep's engine has (`harness/targets/lockstep.py: engine(ctx)`, the run's
settings applied, harness/targets/lockstep_run.py); the kinds that need them are n/a elsewhere:

    matmul(x [M, K], w [N, K], b [N]) -> [M, N]; rope(x [T, H, D], cos, sin [T, D / 2]) -> x's shape;
    router_top_k(logits [T, E], k) -> (weights [T, k], ids [T, k]); swiglu(x [M, 2I]) -> [M, I];
    experts(x [T, H], ids [T, k], gate_up_w, gate_up_b [E, 2I], down_w, alpha, limit)
              -> [chunks, T * k, H] each (token, slot)'s down partials (the grouped expert path);
    sample_fused(logits [R, V] f32, params: list[SamplingParams], seeds: list[int], positions [R])
              -> (tokens [R], chosen logprobs [R], target distributions [R, V])
              Lockstep's own kernel interface: the kernel kind compares each with its torch reference
              (each operation, these and attention / rmsnorm / sampling, a kernel case's `op`: kernels/case.py)
    walk_boundaries(checkpoint_dir, prompt) -> [L + 1] states [T, H]: the blocks called one at a
              time, with no capture code (the layer_ids kind checks `capture` against it)
    model(checkpoint_dir) -> the implementation's own model object (engine.model.GptOssModel):
              the reference forward a kind computes on (draft aux rows, an exact sampling law);
              without it a kind uses Lockstep's fp32 model (harness.checkpoints.reference_model)
    plan_topologies(config, wanted [(tp, ep)], world_sizes) -> (splits to run, splits left out
              with why, notes): what a generate spec's "topology" variants run here
    primitive(function, implementation "torch" | "triton", x) -> y   Lockstep's own primitives
    record_trace(checkpoint, requests, draft, speculative) -> a trace of the engine (harness.replay)
and features only its operations offer: "backends" on hash, verify_coins and gumbel (backends=:
each output computed on every backend named, "torch" and "triton", refused unless they agree
bitwise); "observer" on generate and speculative_generate (observer=: an engine.trace.OpTrace the
run records into, so harness.locate can re-run a step op by op); "topology" on the same (tp=,
ep=: the run split over local processes, engine.parallel). `capture` may also raise
engine.boundaries.CaptureError where the engine sees its capture contract broken.

Requests and results are the engine's own types (engine.request): a `Request` is a prompt, its
`SamplingParams` (`params`) and a seed; a `Result` is tokens, logprobs [n] f32, finish_reason,
and, where the operation gives them, `captured` and `accept_lengths`.

`Target.rng` names the RNG model of the target's seeded sampling (`generate` with seeded requests,
`sampling` with params), as `lockstep record --target` writes it into a trace: "lockstep-coins-1"
(DESIGN §5's coin contract: Lockstep's own target, and an engine that draws exactly as it does,
whose `sampling` with params is then judged bitwise; `record --target` refuses to record seeded
requests of any other target that declares it), "stateless" (a draw depends only on the request's seed and
the token's position, whatever else is batched or drawn), "stateful" (a generator seeded once per
request whose state advances with every draw, so a draw depends on every draw before it). None:
the target declares none, and only greedy requests can be recorded from it.

`Op.where` says where the operation runs: `cpu` (plain torch), `cpu-interpreter` (Triton kernels
through TRITON_INTERPRET=1) or `cuda`; an operation whose `where` excludes the current device is
`n/a` too.

Refusals (the exception contract). Where a spec expects the implementation to refuse (the
layer_ids and mxfp4 `error` specs), the refusal counts as a clean error when the operation raises
`Refused`, `ValueError`, `engine.boundaries.LayerIdError`, `AssertionError` (peers validate with
asserts), or any type the target lists in `Target.refusals` (its engine's own exception types).
Any other exception is a crash: the spec fails with the exception's type and message. A clean
refusal is judged by its facts, not by Lockstep's wording: every whole number the spec's expected
message fragments contain (ids, bounds, counts, widths, indices) must appear as a number in the
message, and every tensor name (a dotted name) as it is.
Where a spec expects no refusal, any exception is a crash.

Spec kinds run against this interface only (`run(spec, ctx, target)` in harness/kinds/<kind>.py,
typed with `TargetInterface`): they ask for operations and features, never which implementation
they run on. Lockstep's engine is the default target (harness/targets/lockstep.py: engine(ctx));
`has_goldens` says what a check of a target is judged against: the goldens, bit for bit (Lockstep's
engine), or the target's expectations file (every adapter).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Protocol, runtime_checkable

from lockstep.engine.request import COIN_CONTRACT, Request, Result  # noqa: F401  (the request and result of every generation operation)
from lockstep.harness.target_returns import checked

CPU, INTERPRETER, CUDA = "cpu", "cpu-interpreter", "cuda"
# How a spec's result on a target is compared (a kind's `compared`; the HOW column of `check --target`).
BITWISE, TOLERANCE, CHI_SQUARE, CALIBRATED = "bitwise", "tolerance", "chi-square", "calibrated"
# Properties of an engine judged against its own bits (DESIGN §11): a claimed one that breaks fails,
# an unclaimed one is reported as observed. An engine's deterministic or batch-invariant mode
# claims run-to-run, batch and prefill; a plain engine perhaps run-to-run alone.
PROPERTIES = {"run-to-run": "D1: the same run twice gives the same bits",
              "batch": "D2: a request alone, inside batches of other sizes, or in another order gives the same bits",
              "prefill": "D3: chunked and whole prefill, prefill and decode give the same bits",
              "prefix-cache": "D3: a prefix-cache hit gives the cold run's bits",
              "speculative-greedy": "greedy speculative decoding gives plain greedy decoding's tokens and bits",
              "topology": "D4: a topology's run gives one device's bits"}
RNG_COINS = COIN_CONTRACT
RNG_MODELS = {RNG_COINS: "DESIGN §5's coin contract (murmur3(seed, position, column) Gumbel-max)",
              "stateless": "stateless: a draw depends only on the request's seed and the token position",
              "stateful": "stateful: a generator seeded once per request, advancing with every draw"}


class NotApplicable(Exception):
    """A spec this target cannot run, with the reason (reported as n/a)."""


class UpstreamChanged(RuntimeError):
    """A pinned upstream symbol moved or changed signature: the adapter refuses, naming it."""


class Refused(Exception):
    """An implementation's clean refusal of bad input (see "Refusals" above)."""


@dataclass
class Op:
    fn: Callable
    where: tuple[str, ...] = (CPU, CUDA)
    note: str = ""          # how the operation reaches the implementation (shown by `lockstep list --target`)
    features: frozenset[str] = frozenset()   # optional features it offers (see the operations above)


@runtime_checkable
class TargetInterface(Protocol):
    """What a spec kind sees of an implementation under test: `run(spec, ctx, target)` asks it for
    operations (`op`, `offers`) and reads its declarations; it never asks which implementation it
    is. `Target` below is the one implementation every adapter builds (Lockstep's engine too);
    `harness.targets.get` accepts any object with these members."""
    name: str
    version: str
    description: str
    ops: dict[str, Op]
    missing: dict[str, str]
    conventions: tuple[str, ...]
    notes: dict[str, str]
    expectations: str | None
    refusals: tuple[type, ...]
    rng: str | None
    dtype: str
    claims: frozenset[str]
    has_goldens: bool

    def op(self, name: str, device: str = CPU, needs: tuple[str, ...] = (), why: str | None = None) -> Callable: ...

    def offers(self, name: str, feature: str) -> bool: ...

    @property
    def label(self) -> str: ...


@dataclass
class Target:
    name: str
    version: str
    description: str = ""
    ops: dict[str, Op] = field(default_factory=dict)
    missing: dict[str, str] = field(default_factory=dict)   # operation or feature -> why the target lacks it
    conventions: tuple[str, ...] = ()                        # EAGLE3 layer-id conventions it implements
    notes: dict[str, str] = field(default_factory=dict)      # spec id or kind -> remark shown in reports
    expectations: str | None = None                          # a plugin's own expectations file
    refusals: tuple[type, ...] = ()                          # its engine's own clean-refusal exception types
    rng: str | None = None                                   # its seeded sampling's RNG model (RNG_MODELS)
    dtype: str = "fp32"                                      # its dtype policy: the calibrated judge's bound
    dtypes: tuple[str, ...] = ()                             # other policies it can run, through at_dtype
    at_dtype: Callable[[str], "Target"] | None = None        # the same target at another of its dtypes
    claims: frozenset[str] = frozenset()                     # the engine properties it promises (PROPERTIES)
    # What a check of this target is judged against: True for Lockstep's engine under a run's
    # settings (harness/targets/lockstep.py: engine(ctx)), whose results are the goldens, compared
    # bit for bit by harness/runner.py; False (every adapter) for the target's expectations file.
    has_goldens: bool = False

    def op(self, name: str, device: str = CPU, needs: tuple[str, ...] = (), why: str | None = None) -> Callable:
        """The operation's callable, or NotApplicable with the target's reason (also when the
        operation lacks one of the features `needs` names). `why`: the kind's reason for an
        operation that only Lockstep implements, when the target does not give its own."""
        if name not in self.ops:
            raise NotApplicable(self.missing.get(name, why or f"{self.name} has no {name!r} operation"))
        op = self.ops[name]
        here = CUDA if device.startswith("cuda") else (CPU, INTERPRETER)
        if not (set(op.where) & set(here if isinstance(here, tuple) else (here,))):
            raise NotApplicable(f"{self.name}'s {name} runs on {', '.join(op.where)} only, not on {device}")
        for need in needs:
            if need not in op.features:
                raise NotApplicable(self.missing.get(f"{name}:{need}",
                                                     f"{self.name}'s {name} does not offer {need!r}"))
        return checked(self.name, name, op.fn)

    def offers(self, name: str, feature: str) -> bool:
        """Whether the target has the operation with that optional feature (a kind that can use
        the feature but does not need it asks this, rather than which target it runs on)."""
        return name in self.ops and feature in self.ops[name].features

    @property
    def label(self) -> str:
        return f"{self.name}-{self.version}"
