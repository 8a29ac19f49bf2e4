"""The default target: Lockstep's own kernels and engine, through the target operations.

One builder, `lockstep(ctx)`: every operation under a run's settings (device, kernel backend,
dtype policy, topologies; harness/targets/lockstep_run.py defines them, with one model cache and
one draft cache). `engine(ctx)` is what plain `lockstep check` (and `regen`, and the pytest plugin)
runs every spec against, judged against the goldens bit for bit by harness/runner.py. `load()`
(`get("lockstep")`: `record --target lockstep`, tests/targets) is the same builder under default
settings (CPU, fp32, torch ops), judged like a peer against its expectations.
"""

from __future__ import annotations

import dataclasses

from lockstep.engine.checkpoint import CheckpointError
from lockstep.harness.platform import Platform
from lockstep.harness.result import RunContext
from lockstep.harness.target import PROPERTIES, RNG_COINS, Target
from lockstep.harness.targets.lockstep_run import run_ops
from lockstep.harness.version import version

DEFAULT = RunContext(Platform("cpu", "fp32"))     # load()'s settings: the CPU, fp32, torch ops


def lockstep(ctx: RunContext) -> Target:
    """Lockstep's engine under the run context `ctx`. Built afresh for every spec (a few dicts of
    closures): its operations call the functions the modules hold now, so a planted fault is
    always what runs; the costly things (models, drafts) are cached where they are loaded."""

    return Target(name="lockstep", version=version(),
                  description="Lockstep's own kernels (Triton) and reference engine: the default target",
                  conventions=("boundary", "sglang", "output-index"), rng=RNG_COINS, ops=run_ops(ctx),
                  refusals=(CheckpointError,), dtype=ctx.platform.dtype,
                  claims=frozenset(PROPERTIES))     # D1-D4 hold for Lockstep's engine: the goldens prove them


def engine(ctx: RunContext) -> Target:
    """The default target of `check` under `ctx`, judged against the goldens (`has_goldens`)."""
    return dataclasses.replace(lockstep(ctx), has_goldens=True)


def load() -> Target:
    """The same target under default settings (DEFAULT), loaded by name as a peer is."""
    return lockstep(DEFAULT)
