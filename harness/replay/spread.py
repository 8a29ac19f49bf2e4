"""A run's requests spread over data-parallel ranks, each a whole model (harness.replay.run).

    results = spread(dispatch, setup, requests, order, log, forced, speculative, dp=4)

The requests are dealt round-robin in run order: the request at run position j goes to rank
j mod dp, and each rank runs its share as one batch stream on one device (`dispatch`, harness.replay.run's
one-process run), in that order. D2 (a request's bits do not depend on its batchmates) makes every request's tokens,
logprobs and observed steps those of one process; the results and each rank's StepLog come back
into request order, so the verdicts, the report and the exit code do not depend on dp.

Where the ranks come from: torchrun's world when this process is one of its ranks (engine.world:
every rank runs its share, rank 0 gathers), else Lockstep's own launcher (engine.launch) starts
dp ranks on this host. A rank holds no collective but the launcher's closing barrier.
"""

from __future__ import annotations

import os

import torch

import lockstep.engine.launch as launcher
from lockstep.engine import world

# How long a finished rank of Lockstep's launcher may wait at its closing barrier for the slowest
# one (shares are balanced by count, not by length); a failed rank ends the run sooner (GRACE_S).
DEFAULT_WAIT_S = 3600.0
GRACE_S = 5.0


def degree(requested: int | None, tp: int, ep: int) -> int:
    """The data-parallel degree a replay runs at: `requested` (--dp; default 1), or torchrun's
    world size when this process is one of its ranks. ValueError for what cannot run: dp > 1 with
    a tp x ep topology, or a --dp other than torchrun's world."""
    size = world.joined()
    if tp * ep > 1:
        if requested not in (None, 1):
            raise ValueError(f"--dp {requested} with --tp {tp} --ep {ep}: data-parallel ranks each run a whole "
                             "model; replay at --tp 1 --ep 1 (D4: the same bits) or without --dp")
        return 1
    if size:
        if requested not in (None, size):
            raise ValueError(f"--dp {requested}: torchrun's world has {size} ranks, and a replay under torchrun "
                             f"spreads over all of them (omit --dp, or run torchrun with {requested} processes)")
        return size
    return requested or 1


def shares(order: list[int], dp: int) -> list[list[int]]:
    """The request indices each rank runs, in run order: run position j goes to rank j mod dp."""
    return [order[r::dp] for r in range(dp)]


def spread(dispatch, setup, requests, order: list[int], log, forced, speculative: bool, dp: int) -> list:
    """-> results in request order; `log` (a StepLog or None) takes every rank's records, mapped
    back to request indices. ValueError where a rank's run raised one (the lowest such rank's)."""
    parts = [p for p in shares(order, dp) if p]
    jobs = [([requests[i] for i in p],
             log.fresh([len(requests[i].prompt) for i in p], p) if log is not None else None,
             [forced[i] for i in p] if forced is not None else None) for p in parts]
    outcomes = _on_ranks(len(parts), (dispatch, setup, jobs, speculative), setup.device)
    errors = [o[1] for o in outcomes[:len(parts)] if o[0] == "value-error"]
    if errors:
        raise ValueError(errors[0])
    out = [None] * len(requests)
    for p, (_, results, rank_log) in zip(parts, outcomes):
        if log is not None:
            log.take(rank_log, dict(enumerate(p)))
        for j, i in enumerate(p):
            out[i] = results[j]
    return out


def _on_ranks(ranks: int, args: tuple, device: str) -> list:
    """share(*args) on each rank -> their outcomes in rank order (torchrun's world, or our launcher)."""
    if world.joined():
        return world.run(share, args, device)

    wait = float(os.environ.get(world.TIMEOUT_ENV, DEFAULT_WAIT_S))
    try:
        return launcher.launch(share, ranks, args=args, device=device, timeout_s=float("inf"), collective_timeout_s=wait,
                      grace_s=GRACE_S, threads=max(1, torch.get_num_threads() // ranks))
    except launcher.RankFailure as e:        # the ranks that failed, not the busy ones stopped after them
        failed = {r: d for r, d in e.ranks.items() if not d.startswith(("hung", "finished"))}
        raise RuntimeError(f"data-parallel run of {ranks} ranks failed: "
                           + "; ".join(f"rank {r} {d}" for r, d in sorted(failed.items())) + "\n" + str(e)) from None


def share(dispatch, setup, jobs: list, speculative: bool) -> tuple:
    """On one rank (found by RANK): its job (requests, StepLog or None, forced tokens or None) run
    by `dispatch` (a module-level function: it travels by name) on this rank's device -> ("ok",
    results, log), or ("value-error", message) for the bad input one process would report the same
    way; a rank past the jobs runs nothing."""
    rank = int(os.environ["RANK"])
    if rank >= len(jobs):
        return "ok", [], None
    reqs, log, forced = jobs[rank]
    device = os.environ.get("LOCKSTEP_DEVICE", "")
    if device.startswith("cuda:"):
        torch.cuda.set_device(torch.device(device))       # this rank's GPU; the model goes to the current one
    try:
        return "ok", dispatch(setup, reqs, log, forced, forced, speculative), log
    except ValueError as e:
        return "value-error", str(e)
