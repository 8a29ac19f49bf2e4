"""Plausible but wrong row-parallel reductions, swapped into engine.parallel.reduce_row_parallel
by the negative-control tests to show that the D4 tests catch them."""

from __future__ import annotations

import torch
import torch.distributed as dist

from lockstep.engine.distributed import all_gather_stack
from lockstep.engine.linear import tree_sum


def rank_order(local_parts, ctx):
    """Each rank adds its own chunks (a tree), then the rank sums are added in rank order:
    the usual "gather and sum in fixed rank order". Fixed at one world size, not across them."""
    mine = tree_sum(local_parts)
    every = all_gather_stack(mine, ctx.tp, ctx.tp_group, ctx.host_copies)
    total = every[0]
    for r in range(1, ctx.tp):
        total = total + every[r]
    return total


def all_reduce(local_parts, ctx):
    """Each rank adds its own chunks, then a float all_reduce(SUM)."""
    total = tree_sum(local_parts).contiguous()
    if ctx.tp > 1:
        dist.all_reduce(total, group=ctx.tp_group)
    return total


def sequential(local_parts, ctx):
    """All chunks gathered (as the invariant path does), but added left to right."""
    every = all_gather_stack(torch.stack(local_parts), ctx.tp, ctx.tp_group, ctx.host_copies).flatten(0, 1)
    total = every[0]
    for p in every[1:]:
        total = total + p
    return total


def one_rank_sequential(local_parts, ctx):
    """The invariant gather, except that TP rank 1 adds its own chunks left to right instead of
    as their subtree of the fixed tree. Every rank then adds the same (wrong) subtree sums, so the
    ranks agree with each other and differ from one device."""
    if ctx.tp_rank == 1:
        mine = local_parts[0]
        for p in local_parts[1:]:
            mine = mine + p
    else:
        mine = tree_sum(local_parts)
    return tree_sum(list(all_gather_stack(mine, ctx.tp, ctx.tp_group, ctx.host_copies).unbind(0)))


def _planted(rank_fn, variant: str):
    def run(ctx, *args):
        from lockstep.engine import parallel
        invariant = parallel.reduce_row_parallel
        parallel.reduce_row_parallel = globals()[variant]
        try:
            return rank_fn(ctx, *args)
        finally:
            parallel.reduce_row_parallel = invariant
    return run


def generate_rank_one_rank_sequential(ctx, *args):
    """lockstep.engine.parallel._generate_rank with one_rank_sequential as the row-parallel reduction: put
    in place of engine.parallel._generate_rank (in the launching process, over more than one
    rank), it plants the wrong order in every launched rank, which imports it by name."""
    from lockstep.engine import parallel
    return _planted(parallel._generate_rank, "one_rank_sequential")(ctx, *args)


def speculative_rank_one_rank_sequential(ctx, *args):
    """As generate_rank_one_rank_sequential, for engine.parallel._speculative_rank."""
    from lockstep.engine import parallel
    return _planted(parallel._speculative_rank, "one_rank_sequential")(ctx, *args)
