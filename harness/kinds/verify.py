"""Spec kind `verify`: one verify step of DESIGN §6 on a hand-built tree, against a hand-worked outcome.

    kind: verify
    description: …                           # the arithmetic that gives the expected outcome
    inputs:
      mode: target-only                      # greedy | target-only | rejection
      tree:
        parents: [-1, 0, 0, 1]               # IntSeq: parents[0] = -1, 0 <= parents[i] < i;
                                             # siblings are tried in ascending node index
        tokens: [5, 2, 4, 0]                 # IntSeq, or one id for every node; tokens[0] is the root's
                                             # (already committed, never tested)
      probs: [[.1, .2, .3, .4], …]           # the target distribution at each node (rows sum to 1),
                                             # or one row for every node
      logits: [[0.0, 1.5, …], …]             # instead of probs: target logits at each node, turned into
      sampling: {temperature: 2.0, top_k: 2} # probabilities by engine.speculative.target_probs (greedy:
                                             # the argmax of the raw logits, no sampling)
      q: [[.1, .5, .2, .2], …]               # rejection: the draft distribution that drew node i, one
                                             # row per draft node 1 … N-1
      coins: {values: [.45, .6, .3, .9], final: .7}   # float32 coins, column i = node i's coin (its
                                             # children are tried with it), and the final coin
      coins: {seed: 42, committed_length: 123}        # or kernels.coins.verify_coins(seed, n, N)
      thresholds: {single: 1.0, acc: 1.0}    # target-only: threshold_single, threshold_acc
    expect:                                  # the hand-worked outcome; accepted and next_token required
      accepted: [0, 1, 3]                    # the accepted node path, root included (IntSeq)
      accepted_tokens: [2, 0]                # the draft tokens of the accepted nodes (root excluded)
      next_token: 3                          # the token drawn after them
      next_from: bonus                       # bonus (the last accepted node is a leaf) or correction
                                             # (its children were all rejected)

N is the number of tree nodes (the root included), so seeded coins are columns 0 … N-1 and the
final coin is column N (DESIGN §5). The runner calls engine.speculative.verify_greedy,
verify_target_only or verify_rejection (looked up at call time, so a test can swap in a broken
one): the batched acceptance the speculative round runs, on a batch of one tree and check compares the outcome with the spec's hand-worked one: the spec is the oracle, the
golden (shared by every platform: the outcome is integers, the coins are correctly rounded)
stores the outcome and the coins used.
"""

from __future__ import annotations

import math
from collections import Counter

import torch

from lockstep.engine.sampling import SamplingParams, seed_as_int64
from lockstep.engine import speculative
from lockstep.engine.speculative import Tree, number_tree
from lockstep.harness.intseq import INT64_MAX, INT64_MIN, IntSeq, length, materialize
from lockstep.harness.platform import SHARED
from lockstep.harness.result import SpecResult
from lockstep.harness.schema import Field, Float, Int, List, Map, OneOf, Problem, Str
from lockstep.harness.target import BITWISE, TargetInterface
from lockstep.kernels.coins import verify_coins

NAME = "verify"
MODES = ("greedy", "target-only", "rejection")
ROW_SUM_TOLERANCE = 1e-9
MAX_NODES = 4096                     # as many coin columns as a `coins` spec may ask for
ROWS = List(List(Float(), min_len=1), min_len=1)

INPUTS = Map({
    "mode": Field(Str(choices=MODES), required=True),
    "tree": Field(Map({
        "parents": Field(IntSeq(min_value=-1), required=True, doc="parents[0] = -1, parents[i] < i"),
        "tokens": Field(OneOf(Int(min=0), IntSeq(min_value=0, max_len=MAX_NODES)), required=True,
                        doc="one id per node, or one id for every node"),
    }), doc="the tree (or give `draft`)"),
    "draft": Field(Map({
        "parents": Field(List(Int(min=-1), min_len=1), required=True,
                         doc="each candidate's parent candidate (creation order), -1 = the root"),
        "tokens": Field(List(Int(min=0), min_len=1), required=True, doc="each candidate's token"),
        "scores": Field(List(Float(), min_len=1), required=True, doc="each candidate's float64 draft score"),
        "root": Field(Int(min=0), required=True, doc="the root's token"),
        "nodes": Field(Int(min=2), required=True, doc="N, the tree's node count, the root included"),
    }), doc="instead of tree: draft candidates, numbered into the tree by the round's number_tree"),
    "probs": Field(ROWS, doc="target distribution at each node (or one row for all)"),
    "logits": Field(ROWS, doc="target logits at each node (or one row for all), instead of probs"),
    "sampling": Field(Map({
        "temperature": Field(Float(), default=1.0),
        "top_k": Field(Int(min=0), default=0),
        "top_p": Field(Float(), default=1.0),
        "min_p": Field(Float(), default=0.0),
    }), doc="with logits: the target's temperature and filters"),
    "q": Field(ROWS, doc="rejection: the draft distribution of each draft node 1 … N-1"),
    "coins": Field(OneOf(
        Map({"values": Field(List(Float(), min_len=1), required=True, doc="one coin per node"),
             "final": Field(Float(), required=True, doc="the final coin")}),
        Map({"seed": Field(Int(min=INT64_MIN, max=2**64 - 1), required=True),
             "committed_length": Field(Int(min=0, max=INT64_MAX), required=True,
                                       doc="n: prompt plus accepted tokens, the root included")}),
    )),
    "thresholds": Field(Map({
        "single": Field(Float(), default=1.0),
        "acc": Field(Float(), default=1.0),
    }), doc="target-only: threshold_single and threshold_acc"),
})
EXPECT = Map({
    "accepted": Field(IntSeq(min_value=0, max_len=MAX_NODES), doc="the accepted node path, root included"),
    "accepted_tokens": Field(IntSeq(min_len=0, min_value=0, max_len=MAX_NODES),
                             doc="draft tokens of the accepted nodes"),
    "next_token": Field(Int(min=0), doc="the bonus or correction token"),
    "next_from": Field(Str(choices=["bonus", "correction"])),
    "tree": Field(Map({"parents": Field(List(Int(min=-1)), required=True),
                       "tokens": Field(List(Int(min=0)), required=True)}),
                  doc="with draft: the tree number_tree builds (node numbering and parents)"),
})


# --------------------------------------------------------------------------- validation
def _tokens(tokens, n_nodes: int) -> list[int]:
    return [tokens] * n_nodes if isinstance(tokens, int) else materialize(tokens).tolist()


def validate(doc: dict, root=None) -> list[Problem]:
    inp, exp = doc["inputs"], doc["expect"] or {}
    mode = inp["mode"]
    if (inp["tree"] is None) == (inp["draft"] is None):
        return [Problem(("inputs",), "give exactly one of 'tree' and 'draft'")]
    if inp["draft"] is not None:
        out = _validate_draft(inp["draft"])
        if out:
            return out
        inp = {**inp, "tree": drafted_tree(inp["draft"])}
    elif exp.get("tree") is not None:
        return [Problem(("expect", "tree"), "only with inputs.draft (the tree is given)", at_key=True)]
    out = _validate_tree(inp)
    if out:
        return out
    parents = materialize(inp["tree"]["parents"]).tolist()
    n_nodes = len(parents)
    tokens = _tokens(inp["tree"]["tokens"], n_nodes)

    given = [k for k in ("probs", "logits") if inp[k] is not None]
    if len(given) != 1:
        return [Problem(("inputs",), "give exactly one of 'probs' and 'logits' (the target at each node), "
                                     f"found {given or 'neither'}")]
    rows_key = given[0]
    rows = inp[rows_key]
    vocab = len(rows[0])
    out += _validate_rows(("inputs", rows_key), rows, vocab, (1, n_nodes), "node", is_dist=rows_key == "probs")
    bad = [t for t in tokens if t >= vocab]
    if bad:
        out.append(Problem(("inputs", "tree", "tokens"), f"token {bad[0]} is outside the vocabulary [0, {vocab}) "
                                                         f"of the {rows_key} rows"))
    out += _validate_mode(inp, mode, rows_key, n_nodes, parents, tokens, vocab)
    for key in ("accepted", "next_token"):
        if exp.get(key) is None:
            out.append(Problem(("expect",), f"missing required key {key!r}: the spec's hand-worked outcome is "
                                            "the oracle"))
    if exp.get("accepted") is not None:
        path = materialize(exp["accepted"]).tolist()
        if path[0] != 0 or any(not 0 <= node < n_nodes or parents[node] != prev
                               for prev, node in zip(path, path[1:])):
            out.append(Problem(("expect", "accepted"), f"expected a path down the tree starting at the root 0 "
                                                       f"(each node a child of the one before), found {path[:12]}"))
    if exp.get("next_token") is not None and exp["next_token"] >= vocab:
        out.append(Problem(("expect", "next_token"), f"{exp['next_token']} is outside the vocabulary [0, {vocab})"))
    return out


def _validate_draft(d) -> list[Problem]:
    where = ("inputs", "draft")
    C = len(d["parents"])
    if len(d["tokens"]) != C or len(d["scores"]) != C:
        return [Problem(where, f"expected as many tokens and scores as parents ({C}), found {len(d['tokens'])} "
                               f"and {len(d['scores'])}")]
    for c, p in enumerate(d["parents"]):
        if not -1 <= p < c:
            return [Problem(where + ("parents", c), f"a candidate's parent precedes it: expected -1 … {c - 1}, found {p}")]
        if p >= 0 and not d["scores"][c] <= d["scores"][p]:
            return [Problem(where + ("scores", c), f"a child's score (a sum of log-probs) is at most its parent's: "
                                                   f"{d['scores'][c]!r} > {d['scores'][p]!r}")]
    if not d["nodes"] - 1 <= C:
        return [Problem(where + ("nodes",), f"expected at most {C + 1} nodes (the candidates and the root), "
                                            f"found {d['nodes']}")]
    return []


def drafted_tree(d) -> dict:
    """The tree (parents, tokens lists) the round's number_tree makes of the draft candidates."""

    tokens, parents, _ = number_tree(torch.tensor([d["root"]]), torch.tensor([d["tokens"]]),
                                     torch.tensor([d["parents"]]), torch.tensor([d["scores"]], dtype=torch.float64),
                                     d["nodes"])
    return {"parents": parents[0].tolist(), "tokens": tokens[0].tolist()}


def _validate_tree(inp) -> list[Problem]:
    parents = materialize(inp["tree"]["parents"]).tolist()
    where = ("inputs", "tree", "parents")
    if len(parents) > MAX_NODES:
        return [Problem(where, f"expected at most {MAX_NODES} nodes, found {len(parents)}")]
    if parents[0] != -1:
        return [Problem(where, f"parents[0] must be -1 (node 0 is the root), found {parents[0]}")]
    for i, p in enumerate(parents[1:], 1):
        if not 0 <= p < i:
            return [Problem(where, f"the parent of node {i} must be in [0, {i}) (a parent precedes its "
                                   f"children), found {p}")]
    tokens = inp["tree"]["tokens"]
    if not isinstance(tokens, int) and length(tokens) != len(parents):
        return [Problem(("inputs", "tree", "tokens"), f"expected {len(parents)} ids (one per node, the root's "
                                                      f"first) or a single id, found {length(tokens)}")]
    return []


def _validate_rows(where, rows, vocab, counts, what, is_dist) -> list[Problem]:
    out = []
    if len(rows) not in counts:
        want = " or ".join(str(c) for c in sorted(set(counts)))
        out.append(Problem(where, f"expected {want} rows (one per {what}), found {len(rows)}"))
    for r, row in enumerate(rows):
        if len(row) != vocab:
            out.append(Problem(where + (r,), f"expected {vocab} values (the vocabulary of row 0), found {len(row)}"))
        elif is_dist and (any(not math.isfinite(x) or x < 0 for x in row)
                          or abs(math.fsum(row) - 1) > ROW_SUM_TOLERANCE):
            out.append(Problem(where + (r,), f"expected a probability distribution (finite values >= 0 summing to "
                                             f"1 within {ROW_SUM_TOLERANCE:g}), found sum {math.fsum(row)!r}"))
    return out


def _validate_mode(inp, mode, rows_key, n_nodes, parents, tokens, vocab) -> list[Problem]:
    out = []
    if mode == "greedy":
        for key in ("coins", "q", "thresholds", "sampling"):
            if inp[key] is not None:
                out.append(Problem(("inputs", key), "not used by greedy verification (it compares each child with "
                                                    "the target argmax)", at_key=True))
        return out
    if inp["coins"] is None:
        out.append(Problem(("inputs",), f"missing required key 'coins' (mode {mode} draws coins)"))
    elif "values" in inp["coins"]:
        values, final = inp["coins"]["values"], inp["coins"]["final"]
        if len(values) != n_nodes:
            out.append(Problem(("inputs", "coins", "values"), f"expected {n_nodes} coins (columns 0 … N-1, one per "
                                                              f"node), found {len(values)}"))
        for i, c in enumerate(values):
            if not 0 <= c < 1:
                out.append(Problem(("inputs", "coins", "values", i), f"expected a coin in [0, 1), found {c!r}"))
        if not 0 <= final < 1:
            out.append(Problem(("inputs", "coins", "final"), f"expected a coin in [0, 1), found {final!r}"))
    if inp["sampling"] is not None and rows_key != "logits":
        out.append(Problem(("inputs", "sampling"), "only with 'logits' (probs are already the target distribution)",
                           at_key=True))
    elif inp["sampling"] is not None:
        out += _validate_sampling(inp["sampling"])
    if inp["thresholds"] is not None:
        if mode != "target-only":
            out.append(Problem(("inputs", "thresholds"), "only target-only verification has thresholds", at_key=True))
        for name, v in inp["thresholds"].items():
            if not 0 < v <= 1:
                out.append(Problem(("inputs", "thresholds", name), f"expected a value in (0, 1], found {v!r}"))
    if mode == "rejection":
        out += _validate_rejection(inp, n_nodes, parents, tokens, vocab)
    elif inp["q"] is not None:
        out.append(Problem(("inputs", "q"), "only rejection verification reads the draft distribution", at_key=True))
    return out


def _validate_sampling(sampling: dict) -> list[Problem]:
    try:
        params = SamplingParams(**sampling)
    except ValueError as e:                        # the engine's own validation names the field
        return [Problem(("inputs", "sampling"), str(e))]
    if params.is_greedy:
        return [Problem(("inputs", "sampling", "temperature"), "expected a temperature > 0 (a sampled target; "
                                                               "use mode: greedy for the argmax)")]
    return []


def _validate_rejection(inp, n_nodes, parents, tokens, vocab) -> list[Problem]:
    twice = sorted(p for p, n in Counter(parents[1:]).items() if n > 1)
    if twice:
        return [Problem(("inputs", "tree", "parents"), f"rejection verification needs a chain (one child per "
                                                       f"node); node {twice[0]} has several")]
    if inp["q"] is None:
        return [Problem(("inputs",), "missing required key 'q' (rejection needs the draft distribution of each "
                                     "draft node)")]
    out = _validate_rows(("inputs", "q"), inp["q"], vocab, (n_nodes - 1,), "draft node 1 … N-1", is_dist=True)
    if not out:
        for node, row in enumerate(inp["q"], 1):
            if row[tokens[node]] <= 0:
                out.append(Problem(("inputs", "q", node - 1), f"q of node {node} gives its own token "
                                                              f"{tokens[node]} probability 0: no draft could "
                                                              f"have drawn it"))
    return out


def golden_platform(spec, ctx) -> str:
    return SHARED


# --------------------------------------------------------------------------- the verify step
def _tree(spec):
    t = spec.inputs["tree"] if spec.inputs["draft"] is None else drafted_tree(spec.inputs["draft"])
    parents = materialize(t["parents"]).tolist()
    return Tree(tokens=_tokens(t["tokens"], len(parents)), parents=parents)


def _per_node(rows, n_nodes: int) -> torch.Tensor:
    """[N, V] float64: the spec's rows, or its single row repeated for every node."""
    t = torch.tensor(rows, dtype=torch.float64)
    return t.expand(n_nodes, -1) if t.shape[0] == 1 else t


def _target(spec, n_nodes: int) -> torch.Tensor:
    """The target distribution at each node [N, V] (float64)."""
    inp = spec.inputs
    if inp["probs"] is not None:
        return _per_node(inp["probs"], n_nodes)

    params = SamplingParams(**(inp["sampling"] or {}))
    return torch.stack([speculative.target_probs(row, params) for row in _per_node(inp["logits"], n_nodes)])


def _coins(spec, n_nodes: int) -> tuple[torch.Tensor, float]:
    """(coins [N] float32, final coin): the spec's values cast to float32, or verify_coins."""
    c = spec.inputs["coins"]
    if "values" in c:
        return torch.tensor(c["values"], dtype=torch.float32), float(torch.tensor(c["final"], dtype=torch.float32))

    coins, final = verify_coins(torch.tensor([seed_as_int64(c["seed"])], dtype=torch.int64),
                                torch.tensor([c["committed_length"]], dtype=torch.int64), n_nodes)
    return coins[0], float(final[0])


OPS = {"greedy": "verify_greedy", "target-only": "verify_target_only", "rejection": "verify_rejection"}


def run(spec, ctx, target: TargetInterface) -> SpecResult:
    """The mode's verify operation on the spec's tree, rows and coins: one path for every target,
    Lockstep's engine included (its operations are engine.speculative's)."""
    inp = spec.inputs
    verify = target.op(OPS[inp["mode"]], str(ctx.device))
    tree = _tree(spec)
    n_nodes = len(tree.parents)
    tensors = {}
    if inp["mode"] == "greedy":
        rows = _per_node(inp["probs"] if inp["probs"] is not None else inp["logits"], n_nodes)
        accepted, nxt = verify(tree, [int(torch.argmax(row)) for row in rows])
    else:
        p = _target(spec, n_nodes)
        coins, final = _coins(spec, n_nodes)
        tensors["coins"] = torch.cat([coins, torch.tensor([final], dtype=torch.float32)])
        if inp["mode"] == "target-only":
            th = inp["thresholds"] or {"single": 1.0, "acc": 1.0}
            accepted, nxt = verify(tree, p, coins, final, th["single"], th["acc"])
        else:
            tree.q = [None] + list(_per_node(inp["q"], n_nodes - 1))
            accepted, nxt = verify(tree, p, coins, final)
    result = verify_result(tree, accepted, nxt, tensors)
    if inp["draft"] is not None:                       # the numbering is part of the outcome
        result.data["tree"] = {"parents": tree.parents, "tokens": tree.tokens}
    return result


def applicability(spec, target: TargetInterface, device: str) -> str:
    target.op(OPS[spec.inputs["mode"]], device)
    return BITWISE


def verify_result(tree, accepted, nxt, tensors: dict) -> SpecResult:
    """The golden of one verify call: the accepted path, the emitted tokens and where the next
    token came from (a correction after a rejection, or the bonus after a full accept)."""
    accepted = [int(a) for a in accepted]
    accepted_tokens = [tree.tokens[a] for a in accepted[1:]]
    next_from = "correction" if tree.children(accepted[-1]) else "bonus"
    tensors["accepted"] = torch.tensor(accepted, dtype=torch.int64)
    tensors["emitted"] = torch.tensor(accepted_tokens + [int(nxt)], dtype=torch.int64)
    data = {"accepted": accepted, "next_token": int(nxt), "next_from": next_from}
    return SpecResult(tensors=tensors, data=data, facts={"accepted_tokens": accepted_tokens})


# --------------------------------------------------------------------------- expectations
def _short(xs: list[int]) -> str:
    return str(xs) if len(xs) <= 16 else f"[{', '.join(map(str, xs[:8]))}, … ({len(xs)} in all), {xs[-1]}]"


def _first_difference(got: list[int], want: list[int]) -> str:
    i = next((i for i, (g, w) in enumerate(zip(got, want)) if g != w), min(len(got), len(want)))
    g = got[i] if i < len(got) else "nothing"
    w = want[i] if i < len(want) else "nothing"
    return f"first difference at index {i}: {g} instead of {w}"


def check(spec, result: SpecResult) -> list[str]:
    exp, data, fails = spec.expect, result.data, []
    mode = spec.inputs["mode"]
    if exp.get("accepted") is not None:
        want = materialize(exp["accepted"]).tolist()
        if data["accepted"] != want:
            fails.append(f"{mode} accepted the node path {_short(data['accepted'])}, the spec expects {_short(want)} "
                         f"({_first_difference(data['accepted'], want)})")
    if exp.get("accepted_tokens") is not None:
        want = materialize(exp["accepted_tokens"]).tolist()
        got = result.facts["accepted_tokens"]
        if got != want:
            fails.append(f"{mode} accepted the draft tokens {_short(got)}, the spec expects {_short(want)}")
    if exp.get("next_token") is not None and data["next_token"] != exp["next_token"]:
        fails.append(f"{mode} drew {data['next_token']} as the {data['next_from']} token after the accepted path, "
                     f"the spec expects {exp['next_token']}")
    if exp.get("next_from") is not None and data["next_from"] != exp["next_from"]:
        fails.append(f"the token after the accepted path is a {data['next_from']} (the last accepted node "
                     f"{data['accepted'][-1]} {'has' if data['next_from'] == 'correction' else 'has no'} children), "
                     f"the spec expects a {exp['next_from']}")
    if exp.get("tree") is not None and data.get("tree") != exp["tree"]:
        fails.append(f"the draft candidates were numbered into the tree {data.get('tree')}, the spec expects "
                     f"{exp['tree']}")
    return fails
