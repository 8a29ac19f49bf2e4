"""Plausible but wrong row-parallel reductions, swapped into engine.parallel.reduce_row_parallel
by the negative-control tests to show that the D4 tests catch them."""

from __future__ import annotations

import torch
import torch.distributed as dist

from engine.distributed import all_gather_stack
from engine.linear import tree_sum


def rank_order(local_parts, ctx):
    """Each rank adds its own chunks (a tree), then the rank sums are added in rank order:
    the usual "gather and sum in fixed rank order". Fixed at one world size, not across them."""
    mine = tree_sum(local_parts)
    every = all_gather_stack(mine, ctx.tp, ctx.tp_group)
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
    every = all_gather_stack(torch.stack(local_parts), ctx.tp, ctx.tp_group).flatten(0, 1)
    total = every[0]
    for p in every[1:]:
        total = total + p
    return total
