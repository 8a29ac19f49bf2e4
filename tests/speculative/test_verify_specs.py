"""The `verify` specs (specs/verify/) turn red under the classic verify bugs, and the `verify` and
`distribution` kinds refuse bad specs naming the field.

Each bug is a small re-implementation swapped into engine.speculative (the verify runner looks the
functions up at call time). The bug-free re-implementation must pass every spec, so the only
change a parametrized case makes is its bug; which specs each bug must turn red is worked out in
the comments from the specs' own arithmetic."""

from pathlib import Path

import pytest
import torch

import lockstep.engine.speculative as speculative
from lockstep.engine import spec_accept
import lockstep.kernels.coins
from lockstep.engine.speculative import inverse_cdf
from lockstep.harness.kinds import verify
from lockstep.harness.platform import detect
from lockstep.harness.result import RunContext
from lockstep.harness.specfile import SpecErrors, load_spec_file, parse_spec

from tests.speculative.verify_bugs import rejection
from lockstep.harness.targets.lockstep import engine

SPECS = Path(__file__).resolve().parents[2] / "specs"
VERIFY_IDS = sorted(f"verify/{p.stem}" for p in (SPECS / "verify").glob("*.yaml"))


def failures(spec_id: str) -> list[str]:
    """The spec's failed expectations, or the crash, as messages."""
    spec, ctx = load_spec_file(SPECS / f"{spec_id}.yaml", SPECS), RunContext(detect("cpu"))
    try:
        return verify.check(spec, verify.run(spec, ctx, engine(ctx)))
    except Exception as e:                       # a crash of the code under test is a red spec too
        return [f"crash: {type(e).__name__}: {e}"]


def red(prefix: str = "verify/") -> dict[str, list[str]]:
    return {i: f for i in VERIFY_IDS if i.startswith(prefix) and (f := failures(i))}


def test_there_are_verify_specs_of_every_mode():
    assert {load_spec_file(SPECS / f"{i}.yaml", SPECS).inputs["mode"] for i in VERIFY_IDS} == \
        {"greedy", "target-only", "rejection"}


def test_the_engine_passes_every_verify_spec():
    assert red() == {}


# ---------------------------------------------------------------------- target-only bugs
def target_only(coin_of="node", cumulative=True, remove_mass=True, accept_on_equal=True):
    """DESIGN §6 target-only, with one of four bugs switched on by an argument."""
    def verify_target_only(tree, p, coins, final_coin, threshold_single=1.0, threshold_acc=1.0):
        cur, accepted = 0, [0]
        while True:
            kids = tree.children(cur)
            if not kids:
                return accepted, inverse_cdf(p[cur], final_coin)
            u = float(coins[cur if coin_of == "node" else tree.depth(cur)])
            mass, chosen = 0.0, None
            for c in kids:
                pc = float(p[cur, tree.tokens[c]])
                mass = mass + pc if cumulative else pc
                hit = u <= mass / threshold_acc if accept_on_equal else u < mass / threshold_acc
                if pc > 0 and (hit or pc >= threshold_single):
                    chosen = c
                    break
            if chosen is None:
                residual = p[cur].clone()
                if remove_mass:
                    residual[[tree.tokens[c] for c in kids]] = 0
                return accepted, inverse_cdf(residual, final_coin)
            cur = chosen
            accepted.append(cur)
    return verify_target_only


T = "verify/target-only-"
TARGET_ONLY_BUGS = {
    # node 2 (depth 1) tries its child with coin[1] = .60 instead of coin[2] (coin-per-node: .60 > .50
    # rejects node 6; threshold-acc: coin[1] = .99 > .625 rejects it)
    "coin per depth": (dict(coin_of="depth"), {T + "coin-per-node", T + "threshold-acc"}),
    # each child's own p instead of the running mass: root coin .45 > .40 (sibling-order,
    # coin-per-node), .65 > .10 (cumulative-mass), .72 > .40 / .80 (threshold-acc), .5 > .25
    # (equality), coin[2] = .638 > .05 (seeded-coin-known-answer) all reject where the spec accepts
    "own mass, not cumulative": (dict(cumulative=False), {
        T + "sibling-order", T + "coin-per-node", T + "cumulative-mass", T + "threshold-acc", T + "equality",
        T + "seeded-coin-known-answer"}),
    # the correction drawn from the full p: ids 4, 3 and 1, the rejected tokens, instead of 3, 4 and 0
    "no mass removal": (dict(remove_mass=False), {
        T + "full-rejection-root", T + "full-rejection-depth-2", T + "logits-temperature-top-k"}),
    # u < running mass: the coin .5 no longer accepts node 2 at running mass .5
    "strict comparison": (dict(accept_on_equal=False), {T + "equality"}),
}


def test_the_reimplementation_without_bugs_passes(monkeypatch):
    monkeypatch.setattr(speculative, "verify_target_only", target_only())
    assert red(T) == {}


@pytest.mark.parametrize("bug", TARGET_ONLY_BUGS)
def test_target_only_bugs_turn_specs_red(monkeypatch, bug):
    switches, expected = TARGET_ONLY_BUGS[bug]
    monkeypatch.setattr(speculative, "verify_target_only", target_only(**switches))
    got = red(T)
    assert expected <= set(got), f"{bug}: {sorted(expected - set(got))} stayed green"
    for messages in got.values():
        assert any("the spec expects" in m for m in messages), messages


def test_inverse_cdf_at_or_above_the_coin_is_caught(monkeypatch):
    """The draw picks the first running sum that strictly exceeds coin x total: with >= the bonus
    of target-only-equality (running sums .25 .5 1.0, coin .5) would be id 1 instead of 2."""
    def at_or_above(weights, coins):          # the round's draw (inverse_cdf_rows), with >=
        w = weights.to(torch.float64).clamp(min=0)
        cs = torch.cumsum(w, 1)
        hit = (cs >= coins.to(torch.float64)[:, None] * cs[:, -1:]) & (w > 0)
        return torch.where(hit, torch.arange(w.shape[1]), w.shape[1]).amin(dim=1).tolist()

    monkeypatch.setattr(spec_accept, "inverse_cdf_rows", at_or_above)
    assert set(red(T + "equality")) == {T + "equality"}


# ---------------------------------------------------------------------- rejection and greedy bugs
R = "verify/rejection-"
REJECTION_BUGS = {
    # node 1: u = .70 >= p = .40 rejects what .70 x .50 = .35 < .40 accepts
    "u < p, ignoring q": (dict(ignore_q=True), {R + "accept-then-correct", R + "all-accepted-bonus"}),
    # .5 x .5 = .25 <= .25 accepts the node strict-inequality rejects
    "u q <= p": (dict(accept_on_equal=True), {R + "strict-inequality"}),
    # corrections from the full p: id 3 (accept-then-correct), id 2 (strict-inequality)
    "correction from p": (dict(residual_is_p=True), {R + "accept-then-correct", R + "strict-inequality"}),
}


def test_the_rejection_reimplementation_without_bugs_passes(monkeypatch):
    monkeypatch.setattr(speculative, "verify_rejection", rejection())
    assert red(R) == {}


@pytest.mark.parametrize("bug", REJECTION_BUGS)
def test_rejection_bugs_turn_specs_red(monkeypatch, bug):
    switches, expected = REJECTION_BUGS[bug]
    monkeypatch.setattr(speculative, "verify_rejection", rejection(**switches))
    got = red(R)
    assert expected <= set(got), f"{bug}: {sorted(expected - set(got))} stayed green"


def test_greedy_argmax_at_the_child_is_caught(monkeypatch):
    """Comparing a child with the argmax at the child instead of its parent: greedy-tree accepts
    nothing (argmax 0, 1, 2 at nodes 1, 2, 3 match none of their tokens 2, 4, 0) and greedy-mismatch
    accepts node 3 (its argmax is its own token 0)."""
    def verify_greedy(tree, argmax):
        cur, accepted = 0, [0]
        while True:
            nxt = next((c for c in tree.children(cur) if tree.tokens[c] == argmax[c]), None)
            if nxt is None:
                return accepted, int(argmax[cur])
            cur = nxt
            accepted.append(cur)

    monkeypatch.setattr(speculative, "verify_greedy", verify_greedy)
    assert set(red("verify/greedy-")) == {"verify/greedy-tree", "verify/greedy-mismatch"}


def test_an_unclamped_final_coin_is_caught(monkeypatch):
    """Without the clamp the top hash gives a final coin of exactly 1.0, which the inverse-CDF draw
    refuses: target-only-clamped-final-coin crashes."""
    monkeypatch.setattr(lockstep.kernels.coins, "COIN_MAX", 1.0)
    got = red(T + "clamped-final-coin")
    assert list(got) == [T + "clamped-final-coin"]
    assert "coins must be in [0, 1), got [1.0]" in got[T + "clamped-final-coin"][0]


# ---------------------------------------------------------------------- bad specs
GOOD = """kind: verify
description: d
inputs:
  mode: {mode}
  tree: {{parents: {parents}, tokens: {tokens}}}
  probs: {probs}
{extra}expect: {expect}
"""


def errors(mode="target-only", parents="[-1, 0, 1]", tokens="[0, 1, 2]", probs="[[.25, .25, .25, .25]]",
           extra="  coins: {values: [.5, .5, .5], final: .5}\n", expect="{accepted: [0], next_token: 0}") -> str:
    text = GOOD.format(mode=mode, parents=parents, tokens=tokens, probs=probs, extra=extra, expect=expect)
    try:
        parse_spec(text, "specs/verify/x.yaml", "verify/x")
    except SpecErrors as e:
        return str(e)
    return ""


def test_the_template_is_valid():
    assert errors() == ""


@pytest.mark.parametrize("changes, message", [
    (dict(parents="[0, 0, 1]"), "inputs.tree.parents: parents[0] must be -1"),
    (dict(parents="{arange: [-1, 5000]}", tokens="0"), "inputs.tree.parents: expected at most 4096 nodes, found 5001"),
    (dict(parents="[-1, 0, 2]"), "inputs.tree.parents: the parent of node 2 must be in [0, 2)"),
    (dict(tokens="[0, 1]"), "inputs.tree.tokens: expected 3 ids (one per node"),
    (dict(tokens="[0, 1, 7]"), "inputs.tree.tokens: token 7 is outside the vocabulary [0, 4)"),
    (dict(probs="[[.5, .5], [.5, .5]]"), "inputs.probs: expected 1 or 3 rows (one per node), found 2"),
    (dict(probs="[[.5, .3, .1, 0]]"), "inputs.probs[0]: expected a probability distribution"),
    (dict(probs="[[.5, .5, 0, 0], [.5, .5]]", parents="[-1, 0]", tokens="[0, 1]",
          extra="  coins: {values: [.5, .5], final: .5}\n"), "inputs.probs[1]: expected 4 values"),
    (dict(extra="  coins: {values: [.5, .5], final: .5}\n"), "inputs.coins.values: expected 3 coins"),
    (dict(extra="  coins: {values: [.5, 1.0, .5], final: .5}\n"), "inputs.coins.values[1]: expected a coin in [0, 1)"),
    (dict(extra=""), "missing required key 'coins' (mode target-only draws coins)"),
    (dict(mode="greedy"), "inputs.coins: not used by greedy verification"),
    (dict(expect="{next_token: 0}"), "missing required key 'accepted'"),
    (dict(expect="{accepted: [0, 2], next_token: 0}"), "expect.accepted: expected a path down the tree"),
    (dict(expect="{accepted: [0], next_token: 9}"), "expect.next_token: 9 is outside the vocabulary"),
    (dict(extra="  coins: {values: [.5, .5, .5], final: .5}\n  logits: [[0, 0, 0, 0]]\n"),
     "give exactly one of 'probs' and 'logits'"),
    (dict(extra="  coins: {values: [.5, .5, .5], final: .5}\n  sampling: {temperature: 0.5}\n"),
     "inputs.sampling: only with 'logits'"),
    (dict(extra="  coins: {values: [.5, .5, .5], final: .5}\n  thresholds: {acc: 0}\n"),
     "inputs.thresholds.acc: expected a value in (0, 1]"),
    (dict(mode="rejection", extra="  coins: {values: [.5, .5, .5], final: .5}\n  thresholds: {acc: .5}\n"
          "  q: [[.25, .25, .25, .25]]\n"), "only target-only verification has thresholds"),
    (dict(mode="rejection", parents="[-1, 0, 0]"), "rejection verification needs a chain (one child per node); "
                                                   "node 0 has several"),
    (dict(mode="rejection", extra="  coins: {values: [.5, .5, .5], final: .5}\n  q: [[.25, 0, .5, .25], "
                                  "[.25, .25, .25, .25]]\n"),
     "inputs.q[0]: q of node 1 gives its own token 1 probability 0"),
    (dict(mode="rejection"), "missing required key 'q'"),
    (dict(mode="rejection", extra="  coins: {values: [.5, .5, .5], final: .5}\n  q: [[.25, .25, .25, .25]]\n"),
     "inputs.q: expected 2 rows (one per draft node 1 … N-1), found 1"),
])
def test_bad_verify_specs_name_the_field(changes, message):
    text = errors(**changes)
    assert message in text, text
    assert text.startswith("specs/verify/x.yaml:")          # located: file:line:column


DIST = """kind: distribution
description: d
inputs:
  checkpoint: {{preset: tiny-vocab8}}
  draft: {{seed: 0, convention: boundary, aux_layer_ids: [0, 1, 2]}}
  speculative: {speculative}
  prompt: [1, 2]
  seeds: {seeds}
  sampling: {sampling}
expect: {expect}
"""


@pytest.mark.parametrize("changes, message", [
    (dict(expect="{acceptance: {min: .2, max: .8}}"), "missing required key 'alpha'"),
    (dict(expect="{alpha: .001}"), "missing required key 'acceptance'"),
    (dict(expect="{alpha: 1.5, acceptance: {min: .2, max: .8}}"), "expect.alpha: expected a significance level"),
    (dict(expect="{alpha: .001, acceptance: {min: .8, max: .2}}"), "expect.acceptance: expected 0 <= min < max"),
    (dict(sampling="{temperature: 0}"), "inputs.sampling.temperature: expected a temperature > 0"),
    (dict(speculative="{verify: greedy}"), "inputs.speculative.verify: expected one of ['rejection', 'target-only']"),
    (dict(speculative="{topk: 2, num_steps: 2, draft_token_num: 3}"),
     "inputs.speculative: SpecParams.topk: verify='rejection' needs a chain"),
    (dict(seeds="[1, 2, 1]"), "inputs.seeds: seeds must be distinct"),
])
def test_bad_distribution_specs_name_the_field(changes, message):
    fields = dict(speculative="{num_steps: 2, draft_token_num: 3}", seeds="{arange: [0, 10]}",
                  sampling="{temperature: 1.0}", expect="{alpha: .001, acceptance: {min: .2, max: .8}}") | changes
    with pytest.raises(SpecErrors) as e:
        parse_spec(DIST.format(**fields), "specs/x.yaml", "x")
    assert message in str(e.value), str(e.value)
