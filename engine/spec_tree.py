"""The speculative round's trees and settings (DESIGN §6): SpecParams, the host `Tree`, the
device `TreeBatch` of a round, the numbering of drafted candidates into a tree, and the fixed
layout of a tree's root-to-leaf paths in the verify call."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch


VERIFY_MODES = ("greedy", "target-only", "rejection")


@dataclass(frozen=True)
class SpecParams:
    """num_steps: draft depth. topk: children per beam (1 = chain). draft_token_num: tree nodes N,
    root included (chain: at most num_steps + 1). verify: mode for sampled requests (greedy
    requests are always verified greedily; verify='greedy' requires every request to be greedy).
    threshold_single / threshold_acc: target-only acceptance knobs, in (0, 1]."""
    num_steps: int = 3
    topk: int = 1
    draft_token_num: int = 4
    verify: str = "target-only"
    threshold_single: float = 1.0
    threshold_acc: float = 1.0

    def __post_init__(self):
        def bad(name, why):
            raise ValueError(f"SpecParams.{name}: {why}, got {getattr(self, name)!r}")

        for name in ("num_steps", "topk", "draft_token_num"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                bad(name, "must be an int >= 1")
        if self.draft_token_num < 2:
            bad("draft_token_num", "must be >= 2 (the root and at least one draft token)")
        most = 1 + self.topk + (self.num_steps - 1) * self.topk * self.topk
        if self.draft_token_num > most:
            bad("draft_token_num", f"must be <= 1 + topk + (num_steps - 1) * topk^2 = {most} "
                                   f"(topk={self.topk}, num_steps={self.num_steps})")
        if self.verify not in VERIFY_MODES:
            bad("verify", f"must be one of {VERIFY_MODES}")
        for name in ("threshold_single", "threshold_acc"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 < v <= 1:
                bad(name, "must be in (0, 1]")
        if self.verify == "rejection":
            if self.topk != 1:
                bad("topk", "verify='rejection' needs a chain (topk=1)")
            if self.threshold_single != 1.0 or self.threshold_acc != 1.0:
                bad("threshold_acc" if self.threshold_acc != 1.0 else "threshold_single",
                    "verify='rejection' ignores thresholds; leave them at 1.0")


@dataclass
class Tree:
    """Node 0 is the root; parents[i] < i; siblings are tried in ascending node index."""
    tokens: list[int]                                   # target ids
    parents: list[int]                                  # parents[0] = -1
    q: list[torch.Tensor | None] = field(default_factory=list)   # rejection: q (target vocab) that drew node i

    def __post_init__(self):
        if len(self.tokens) != len(self.parents) or not self.parents or self.parents[0] != -1:
            raise ValueError("Tree: tokens and parents must have one entry per node, parents[0] = -1")
        for i, p in enumerate(self.parents[1:], 1):
            if not 0 <= p < i:
                raise ValueError(f"Tree: parent of node {i} must be in [0, {i}), got {p}")

    def children(self, i: int) -> list[int]:
        return [c for c in range(i + 1, len(self.parents)) if self.parents[c] == i]

    def depth(self, i: int) -> int:
        d = 0
        while i > 0:
            i, d = self.parents[i], d + 1
        return d

    def paths(self) -> list[list[int]]:
        """Root-to-leaf node lists, by ascending leaf index."""
        leaves = [i for i in range(len(self.parents)) if not self.children(i)]
        out = []
        for leaf in leaves:
            path, i = [], leaf
            while i >= 0:
                path.append(i)
                i = self.parents[i]
            out.append(path[::-1])
        return out


@dataclass
class TreeBatch:
    """The draft trees of one round, one row per request, on the device; node 0 is the root and
    parents[:, i] < i (the numbering of `Tree`). q: rejection mode, the q that drew node i."""
    tokens: torch.Tensor              # [R, N] target ids
    parents: torch.Tensor             # [R, N] int64, parents[:, 0] = -1
    q: torch.Tensor | None            # [R, N, V] float64 (row 0 unused)

    def tree(self, a: int) -> Tree:
        """Request a's tree as a host `Tree` (host reads: for the trace and tests only)."""
        qs = [None] + ([self.q[a, i] for i in range(1, self.tokens.shape[1])] if self.q is not None
                       else [None] * (self.tokens.shape[1] - 1))
        return Tree(self.tokens[a].tolist(), self.parents[a].tolist(), qs)


def _each(t: torch.Tensor, k: int) -> torch.Tensor:
    """Every element of the 1-D t, k times in a row (repeat_interleave by a constant, as a view
    expansion: no data-dependent size)."""
    return t[:, None].expand(t.shape[0], k).reshape(-1)


def _best(scores: torch.Tensor, k: int) -> torch.Tensor:
    """The k best candidates of each row of scores [R, C]: score descending, equal scores to the
    earlier candidate (a stable sort), returned in candidate (creation) order -> [R, k]."""
    return torch.sort(scores, dim=1, descending=True, stable=True).indices[:, :k].sort(dim=1).values


def number_tree(root_tok: torch.Tensor, cand_tok: torch.Tensor, cand_parent: torch.Tensor, scores: torch.Tensor,
                N: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The draft tree of each request from its candidates (creation order; cand_parent = the
    parent's candidate index, -1 = the root; a child's score <= its parent's): the best N - 1
    (_best) become nodes 1 .. N-1 in creation order, node 0 is the root root_tok [R].
    -> (tokens [R, N], parents [R, N], the chosen candidates [R, N - 1])."""
    R = scores.shape[0]
    order = _best(scores, N - 1)
    node_of = torch.full_like(scores, -1, dtype=torch.int64)
    node_of.scatter_(1, order, torch.arange(1, N, device=scores.device).expand(R, N - 1))
    par = cand_parent.gather(1, order)
    parents = torch.where(par < 0, 0, node_of.gather(1, par.clamp(min=0)))
    parents = torch.cat([torch.full_like(parents[:, :1], -1), parents], dim=1)
    tokens = torch.cat([root_tok[:, None], cand_tok.gather(1, order)], dim=1)
    return tokens, parents, order


@dataclass
class _Layout:
    """Where each tree node runs in the verify call. Rows are (request, path, depth): P paths of
    W rows per request, path p = the p-th leaf's root-to-leaf chain (ascending leaf index) at
    positions r .. r + depth, rows past a path's leaf (and paths past the last leaf) padding.
    node_row [R, N]: the node's row in its first path; valid [R, P, W]: real rows."""
    path_nodes: torch.Tensor          # [R, P, W] node index (padding: 0)
    valid: torch.Tensor               # [R, P, W] bool
    node_row: torch.Tensor            # [R, N] int64 into the flattened rows
    node_path: torch.Tensor           # [R, N] the path whose slot holds the node's row
    children: torch.Tensor            # [R, N, K] child nodes in ascending order, -1 = none


def _layout(parents: torch.Tensor, P: int, W: int, K: int) -> _Layout:
    R, N = parents.shape
    dev = parents.device
    par = parents.clamp(min=0)                                  # the root is its own parent here
    up = [torch.arange(N, device=dev).expand(R, N)]             # up[k][v]: v's ancestor k levels up
    for _ in range(W - 1):
        up.append(par.gather(1, up[-1]))
    up = torch.stack(up, dim=2)                                 # [R, N, W]
    depth = (up != 0).sum(dim=2)                                # [R, N]
    nodes = torch.arange(N, device=dev)
    has_child = torch.zeros((R, N), dtype=torch.bool, device=dev)
    has_child.scatter_(1, par[:, 1:], True)
    leaf = ~has_child
    leaf_order = torch.sort(torch.where(leaf, nodes, N + nodes), dim=1).indices[:, :P]   # ascending leaves
    path_exists = leaf.gather(1, leaf_order)                    # [R, P]
    leaf_depth = depth.gather(1, leaf_order)                    # [R, P]
    k = torch.arange(W, device=dev)
    valid = path_exists[:, :, None] & (k <= leaf_depth[:, :, None])             # [R, P, W]
    up_leaf = up.gather(1, leaf_order[:, :, None].expand(R, P, W))             # [R, P, W]
    path_nodes = up_leaf.gather(2, (leaf_depth[:, :, None] - k).clamp(min=0))
    path_nodes = torch.where(valid, path_nodes, 0)
    # a node's first path: the lowest path whose real rows hold it
    holds = (path_nodes[:, :, :, None] == nodes) & valid[:, :, :, None]         # [R, P, W, N]
    in_path = holds.any(dim=2)                                                  # [R, P, N]
    p_idx = torch.arange(P, device=dev)[None, :, None]
    node_path = torch.where(in_path, p_idx, P).amin(dim=1)                      # [R, N]
    node_row = (torch.arange(R, device=dev)[:, None] * P + node_path) * W + depth
    return _Layout(path_nodes, valid, node_row, node_path, _children(parents, K))


def _children(parents: torch.Tensor, K: int) -> torch.Tensor:
    """parents [R, N] -> children [R, N, K]: each node's children in ascending node index (the
    order siblings are tried in), -1 = none. A child's rank = its earlier siblings."""
    R, N = parents.shape
    par = parents.clamp(min=0)
    nodes = torch.arange(N, device=parents.device)
    same = (par[:, 1:, None] == par[:, None, 1:]) & (nodes[1:, None] > nodes[None, 1:])
    rank = same.sum(dim=2)                                                      # [R, N-1]
    children = torch.full((R, N * K), -1, dtype=torch.int64, device=parents.device)
    children.scatter_(1, par[:, 1:] * K + rank, nodes[1:].expand(R, N - 1).contiguous())
    return children.view(R, N, K)
