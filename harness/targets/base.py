"""What a target is: an implementation under test, seen through the operations the spec kinds need.

A target is an object with a `name`, a `version` and an `ops` mapping from operation name to an
`Op`: the callable plus where it can run. The operations (their signatures are in
`harness/targets/lockstep.py`, the default target, which implements every one of them):

    hash(seed [n], pos [n], col [m]) -> [n, m] int64     coins kind: the seeded hash
    verify_coins(seeds [n], seq_lens [n], N) -> (coins [n, N] f32, final [n] f32)
    gumbel(seed [n], pos [n], col [m]) -> [n, m] f64     Gumbel noise of each key
    eagle3_layers(draft_config, convention, L, fc_in, hidden, name, direct_ids) -> the boundaries
              captured, in capture order (raises on refusal); direct_ids: the spec gave bare ids
              (top level of draft_config), which the adapter puts where its stack reads them
    capture(checkpoint_dir, prompt, boundaries) -> [T, count * H] f32    whole-model capture
    greedy_generate(checkpoint_dir, prompt, max_new_tokens, stop_ids) -> (tokens, logprobs)
    verify_greedy(tree, argmax per node) -> (accepted path, next token)
    verify_target_only(tree, p [N, V], coins [N], final, single, acc) -> (accepted, next)
    verify_rejection(tree with q, p, coins, final) -> (accepted, next)
    attention(q [T, Hq, D], k [S, Hkv, D], v [S, Hkv, D], positions [T], sinks [Hq], window,
              scale) -> [T, Hq, D]       query t sees keys max(0, pos - window + 1) … pos
    rmsnorm(x [M, N], weight [N], eps) -> [M, N]
    sampling(logp [R, V] f64, seeds [R], positions [R]) -> [R] int64   seeded Gumbel-max

An operation a target lacks is not run: every spec that needs it is reported `n/a` with the
target's reason (`Target.missing`). `Op.where` says where the operation runs: `cpu` (plain
torch), `cpu-interpreter` (Triton kernels through TRITON_INTERPRET=1) or `cuda`; an operation
whose `where` excludes the current device is `n/a` too, never silently skipped.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

CPU, INTERPRETER, CUDA = "cpu", "cpu-interpreter", "cuda"


class NotApplicable(Exception):
    """A spec this target cannot run, with the reason (reported as n/a)."""


class UpstreamChanged(RuntimeError):
    """A pinned upstream symbol moved or changed signature: the adapter refuses, naming it."""


@dataclass
class Op:
    fn: Callable
    where: tuple[str, ...] = (CPU, CUDA)
    note: str = ""          # how the operation reaches the implementation (shown by `lockstep list --target`)


@dataclass
class Target:
    name: str
    version: str
    description: str = ""
    ops: dict[str, Op] = field(default_factory=dict)
    missing: dict[str, str] = field(default_factory=dict)   # operation -> why the target does not have it
    conventions: tuple[str, ...] = ()                        # EAGLE3 layer-id conventions it implements
    notes: dict[str, str] = field(default_factory=dict)      # spec id or kind -> remark shown in reports
    expectations: str | None = None                          # a plugin's own expectations file

    def op(self, name: str, device: str = CPU) -> Callable:
        """The operation's callable, or NotApplicable with the target's reason."""
        if name not in self.ops:
            raise NotApplicable(self.missing.get(name, f"{self.name} has no {name!r} operation"))
        op = self.ops[name]
        here = CUDA if device.startswith("cuda") else (CPU, INTERPRETER)
        if not (set(op.where) & set(here if isinstance(here, tuple) else (here,))):
            raise NotApplicable(f"{self.name}'s {name} runs on {', '.join(op.where)} only, not on {device}")
        return op.fn

    @property
    def label(self) -> str:
        return f"{self.name}-{self.version}"
