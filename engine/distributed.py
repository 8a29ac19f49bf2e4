"""Topologies, process groups and the invariant collectives (DESIGN §2, D4).

Layout: world = tp × ep, rank = ep_rank * tp + tp_rank.

    attention, embedding, lm_head   split over the tp ranks of a TP group; every EP group
                                    holds the same copy (attention is replicated across EP)
    MoE experts                     expert e lives on EP group e // (E / ep); inside that group
                                    its intermediate dim is split over the tp ranks

    TP group of rank r: the tp ranks with r's ep_rank     [e*tp, e*tp + tp)
    EP group of rank r: the ep ranks with r's tp_rank     {t, tp + t, 2*tp + t, ...}

Sums never go through a float all_reduce (its order depends on the world size and the
algorithm). Every collective here is an all_gather, which moves bytes; the adding happens
afterwards on every rank in one fixed order (engine.linear.tree_sum, slot order). A rank's
K chunks are an aligned block of the 8-chunk tree, so it adds them as that subtree before
the gather: the tree is shared within and across ranks (TBIK's idea, reference/determinism §4).

The same code runs over every transport engine.launch chooses: gloo (CPU), NCCL (a GPU per
rank) and gloo-host (ranks sharing a GPU: each collective copies its CUDA tensor to a fresh host
buffer, gloo moves the bytes, and the result is copied back to the rank's GPU). A collective
moves bytes either way, so the transport never changes a bit.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch
import torch.distributed as dist

from lockstep.engine.config import GptOssConfig
from lockstep.engine.linear import K_CHUNKS, tree_sum

# On CPU (MKL), a [1, K] x [K, N] product computes its last N % 4 columns by another code
# path, so a column slice gives the full product's bits only if its width is a multiple of
# this (checked in tests/parallel/test_reductions.py). The Triton backend has no such tail.
COLUMN_ALIGN = 4


class UnsupportedTopology(ValueError):
    """A split the model's shapes do not allow; the message names every violated constraint."""


@dataclass(frozen=True)
class Topology:
    tp: int = 1
    ep: int = 1

    @property
    def world_size(self) -> int:
        return self.tp * self.ep

    def __str__(self) -> str:
        return f"tp={self.tp} ep={self.ep}"

    def problems(self, config: GptOssConfig) -> list[str]:
        """Every constraint this topology breaks for `config` (empty: supported)."""
        tp, ep, c = self.tp, self.ep, config
        out = []
        for name, v in (("tp", tp), ("ep", ep)):
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                return [f"{name} must be a positive int, got {v!r}"]
        if K_CHUNKS % tp:
            out.append(f"tp={tp} must divide the K chunk count {K_CHUNKS} (tp in 1, 2, 4, 8)")
        if c.num_attention_heads % tp:
            out.append(f"tp={tp} must divide num_attention_heads={c.num_attention_heads}")
        if c.num_key_value_heads % tp:
            out.append(f"tp={tp} must divide num_key_value_heads={c.num_key_value_heads}")
        if c.vocab_size % tp:
            out.append(f"tp={tp} must divide vocab_size={c.vocab_size} (vocab-parallel embedding, lm_head)")
        if c.num_local_experts % ep:
            out.append(f"ep={ep} must divide num_local_experts={c.num_local_experts}")
        if tp > 1 and not out:
            for what, K in (("q_dim (o_proj input)", c.q_dim), ("intermediate_size (down input)", c.intermediate_size)):
                if K % K_CHUNKS:
                    out.append(f"{what}={K} must be a multiple of the K chunk count {K_CHUNKS} for tp > 1")
            widths = {"query heads": c.q_dim // tp, "KV heads": c.kv_dim // tp,
                      "gate_up": 2 * c.intermediate_size // tp, "vocab": c.vocab_size // tp}
            for what, w in widths.items():
                if w % COLUMN_ALIGN:
                    out.append(f"tp={tp}: the per-rank {what} slice ({w} columns) must be a multiple of "
                               f"{COLUMN_ALIGN} (column-parallel bits)")
        return out

    def check(self, config: GptOssConfig) -> None:
        bad = self.problems(config)
        if bad:
            raise UnsupportedTopology(f"unsupported topology {self}: " + "; ".join(bad))


class ParallelContext:
    """This process's place in a topology, its process groups and collectives.

    Build it after torch.distributed is initialised (engine.launch does that), on every rank,
    in the same order: `ParallelContext(Topology(tp, ep))`. The device follows the process
    group's kind: NCCL -> this rank's GPU, gloo -> cpu. With world size 1 no process group is
    needed, and `device` (default cpu) says where the model runs."""

    def __init__(self, topology: Topology, rank: int | None = None, device: str | torch.device | None = None):
        self.topology = topology
        tp, ep = topology.tp, topology.ep
        if topology.world_size == 1 and (not dist.is_initialized() or dist.get_world_size() != 1):
            # one device needs no process group, also inside a larger world (torchrun's: engine.world)
            self.rank, self.world_size, group = 0, 1, "none"
        else:
            if not dist.is_initialized():
                raise RuntimeError(f"ParallelContext({topology}): torch.distributed is not initialised")
            self.rank, self.world_size, group = dist.get_rank(), dist.get_world_size(), dist.get_backend()
            if self.world_size != topology.world_size:
                raise UnsupportedTopology(f"topology {topology} needs world size {topology.world_size}, "
                                          f"the process group has {self.world_size}")
        self.tp_rank, self.ep_rank = self.rank % tp, self.rank // tp
        self.device, self.transport = _rank_device(group, self.rank, device)
        if self.device.type == "cuda" and self.device.index is not None:    # a rank's own GPU
            torch.cuda.set_device(self.device)
        if device is not None and torch.device(device).type != self.device.type:
            raise ValueError(f"ParallelContext: device {device} was asked for, but the {self.transport} process "
                             f"group runs on {self.device.type}")
        self.host_copies = self.transport == "gloo-host"
        # Every rank creates every group, in the same order (a torch.distributed rule).
        self.tp_group = self.ep_group = None
        if tp > 1 and ep > 1:
            for e in range(ep):
                g = dist.new_group([e * tp + t for t in range(tp)])
                if e == self.ep_rank:
                    self.tp_group = g
            for t in range(tp):
                g = dist.new_group([e * tp + t for e in range(ep)])
                if t == self.tp_rank:
                    self.ep_group = g
        elif tp > 1:
            self.tp_group = dist.group.WORLD
        elif ep > 1:
            self.ep_group = dist.group.WORLD

    @property
    def tp(self) -> int:
        return self.topology.tp

    @property
    def ep(self) -> int:
        return self.topology.ep

    # ------------------------------------------------------------------ collectives
    def gather_tp(self, t: torch.Tensor) -> torch.Tensor:
        """[*] -> [tp, *]: every TP-group member's tensor, in tp_rank order (bytes, no sums)."""
        return all_gather_stack(t, self.tp, self.tp_group, self.host_copies)

    def gather_ep(self, t: torch.Tensor) -> torch.Tensor:
        """[*] -> [ep, *]: every EP-group member's tensor, in ep_rank order."""
        return all_gather_stack(t, self.ep, self.ep_group, self.host_copies)


def _rank_device(group: str, rank: int, asked) -> tuple[torch.device, str]:
    """(this rank's device, its transport) in a process group of kind `group` ("gloo", "nccl", or
    "none" without one): what engine.launch put in the environment, else the group's default
    (NCCL: GPU LOCAL_RANK; gloo: the CPU; no group: `asked`, default cpu)."""
    if group == "none":
        return torch.device(asked if asked is not None else "cpu"), "none"
    transport = os.environ.get("LOCKSTEP_TRANSPORT", group)
    if "LOCKSTEP_DEVICE" in os.environ:
        return torch.device(os.environ["LOCKSTEP_DEVICE"]), transport
    if group == "nccl":
        return torch.device("cuda", int(os.environ.get("LOCAL_RANK", rank % torch.cuda.device_count()))), transport
    return torch.device("cpu"), transport


def _via_host(collective, out: torch.Tensor, inp: torch.Tensor) -> torch.Tensor:
    """collective(out, inp) over gloo-host: `inp` copied to a fresh host buffer, gloo moves the
    bytes between host buffers, and `out` (on the rank's device) gets them back. Fresh buffers
    even on the CPU, so the path is the same one a GPU rank takes."""
    host_out = torch.empty(out.shape, dtype=out.dtype, device="cpu")
    collective(host_out, inp.to("cpu", copy=True))
    return out.copy_(host_out)


def _all_gather_flat(flat: torch.Tensor, size: int, group, host_copies: bool = False) -> torch.Tensor:
    out = flat.new_empty(size * flat.numel())
    gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
    if host_copies:
        return _via_host(lambda o, i: gather(o, i, group=group), out, flat)
    gather(out, flat, group=group)                        # one buffer, no stacking copy
    return out


def all_gather_stack(t: torch.Tensor, size: int, group, host_copies: bool = False) -> torch.Tensor:
    """All-gather equal-shaped tensors of a group of `size` ranks -> [size, *t.shape].
    `host_copies`: through host buffers (the gloo-host transport)."""
    if size == 1:
        return t.unsqueeze(0)
    return _all_gather_flat(t.contiguous().reshape(-1), size, group, host_copies).view((size,) + tuple(t.shape))


# At or above this many elements, invariant_sum scatters before it gathers (bandwidth of a
# ring all_reduce); below it, one all_gather (fewer messages). The bits are the same either way.
SCATTER_MIN_ELEMENTS = 1 << 16


def invariant_sum(local_parts: list[torch.Tensor], size: int, group, algorithm: str = "auto",
                  host_copies: bool = False) -> torch.Tensor:
    """The row-parallel reduction. Each of `size` ranks holds K_CHUNKS / size consecutive
    partials, an aligned block of the fixed tree, so it adds them as that subtree locally;
    the `size` subtree sums are then added as the tree's top levels, on every rank. Same
    additions in the same order as the one-device `tree_sum` of all K_CHUNKS partials, so
    bitwise equal at every world size. Two ways to move the subtree sums, same bits:

      "gather"   all_gather them all; every rank adds every element's top levels
      "scatter"  all_to_all: rank j receives everyone's slice j of the flattened sum and adds
                 those top levels; then all_gather the summed slices. Moves what a ring
                 all_reduce moves.

    `host_copies`: every collective through host buffers (the gloo-host transport).
    """
    if len(local_parts) * size != K_CHUNKS:
        raise ValueError(f"invariant_sum: {len(local_parts)} partials on each of {size} ranks, "
                         f"need {K_CHUNKS} in all")
    subtree = tree_sum(local_parts)
    if size == 1:
        return subtree
    if algorithm == "auto":
        algorithm = "scatter" if subtree.numel() >= SCATTER_MIN_ELEMENTS else "gather"
    if algorithm == "gather":
        return tree_sum(list(all_gather_stack(subtree, size, group, host_copies).unbind(0)))
    if algorithm != "scatter":
        raise ValueError(f"invariant_sum: algorithm must be 'auto', 'gather' or 'scatter', got {algorithm!r}")
    flat = subtree.contiguous().reshape(-1)
    n = flat.numel()
    block = -(-n // size)
    padded = torch.cat([flat, flat.new_zeros(block * size - n)])     # the padding is dropped
    received = torch.empty_like(padded)                              # [j] = rank j's slice `rank`
    to_all = lambda o, i: dist.all_to_all_single(o, i, group=group)    # noqa: E731
    _via_host(to_all, received, padded) if host_copies else to_all(received, padded)
    mine = tree_sum(list(received.view(size, block).unbind(0)))
    return _all_gather_flat(mine, size, group, host_copies)[:n].view(subtree.shape)
