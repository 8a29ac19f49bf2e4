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

Requests and results are the engine's own types (engine.request): a `Request` is a prompt, its
`SamplingParams` (`params`) and a seed; a `Result` is tokens, logprobs [n] f32, finish_reason,
and, where the operation gives them, `captured` and `accept_lengths`.

`Target.rng` names the RNG model of the target's seeded sampling (`generate` with seeded requests),
as `lockstep record --target` writes it into a trace: "lockstep-coins-1" (DESIGN §5's coin
contract: only Lockstep's own target), "stateless" (a draw depends only on the request's seed and
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

Spec kinds run against this interface (`run(spec, ctx, target)` in harness/kinds/<kind>.py, typed
with `TargetInterface`); Lockstep's engine is the default target (harness/targets/lockstep.py).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Protocol, runtime_checkable

from engine.request import Request, Result  # noqa: F401  (the request and result of every generation operation)

CPU, INTERPRETER, CUDA = "cpu", "cpu-interpreter", "cuda"
# How a spec's result on a target is compared (a kind's `compared`; the HOW column of `check --target`).
BITWISE, TOLERANCE, CHI_SQUARE = "bitwise", "tolerance", "chi-square"
RNG_COINS = "lockstep-coins-1"
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
    operations (`op`) and reads its declarations. `Target` below is the one implementation every
    adapter builds; `harness.targets.get` accepts any object with these members."""
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
    engine: bool

    def op(self, name: str, device: str = CPU, needs: tuple[str, ...] = ()) -> Callable: ...

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
    # Lockstep's engine itself (harness/targets/lockstep.py: engine()): the kinds run their whole
    # engine path on it (the run's backend, dtype policy and topologies), judged against the goldens
    # bit for bit by harness/runner.py. Every adapter, Lockstep's own `load()` too, leaves it False.
    engine: bool = False

    def op(self, name: str, device: str = CPU, needs: tuple[str, ...] = ()) -> Callable:
        """The operation's callable, or NotApplicable with the target's reason (also when the
        operation lacks one of the features `needs` names)."""
        if name not in self.ops:
            raise NotApplicable(self.missing.get(name, f"{self.name} has no {name!r} operation"))
        op = self.ops[name]
        here = CUDA if device.startswith("cuda") else (CPU, INTERPRETER)
        if not (set(op.where) & set(here if isinstance(here, tuple) else (here,))):
            raise NotApplicable(f"{self.name}'s {name} runs on {', '.join(op.where)} only, not on {device}")
        for need in needs:
            if need not in op.features:
                raise NotApplicable(self.missing.get(f"{name}:{need}",
                                                     f"{self.name}'s {name} does not offer {need!r}"))
        return op.fn

    @property
    def label(self) -> str:
        return f"{self.name}-{self.version}"
