"""The first-divergence locator (harness/locate.py): the first request, step and token from the
results alone, and the golden-mismatch path, where nothing can be re-run."""

from __future__ import annotations

import json

import torch

from lockstep.harness.golden import GoldenStore
from lockstep.harness.locate import RequestBits, compare_traces, first_divergence
from lockstep.harness.platform import detect
from lockstep.harness.result import RunContext
from lockstep.harness.runner import MISMATCH, check_spec, regen_spec
from lockstep.harness.specfile import parse_spec
from lockstep.engine.trace import OpTrace

from tests.engine.planted import different_tile_when_alone, norm_nudged_in_whole_prefill


def bits(tokens, logprobs, prompt_len=5, captured=None, accept=None) -> RequestBits:
    return RequestBits(prompt_len, list(tokens), torch.tensor(logprobs, dtype=torch.float32), captured, accept)


def one_ulp_up(x: float) -> float:
    return float(torch.nextafter(torch.tensor(x, dtype=torch.float32), torch.tensor(1e9)))


def test_equal_runs_have_no_divergence():
    a = [bits([3, 4, 5], [-1.0, -2.0, -3.0])]
    assert first_divergence(a, [bits([3, 4, 5], [-1.0, -2.0, -3.0])]) is None


def test_the_first_differing_token_names_its_decode_step_and_position():
    ref = [bits([3, 4, 5, 6], [-1.0, -2.0, -3.0, -4.0], prompt_len=7)]
    other = [bits([3, 4, 9, 6], [-1.0, -2.0, -3.0, -4.0], prompt_len=7)]
    d = first_divergence(ref, other)
    assert (d.request, d.step, d.token, d.position, d.what) == (0, 2, 2, 9, ["tokens"])
    assert d.step_name() == "decode step 2"
    assert [td.name for td in d.diffs] == ["tokens_0"] and d.diffs[0].first_index == (2,)


def test_one_ulp_of_a_logprob_is_a_divergence():
    ref = [bits([3, 4], [-1.0, -2.0])]
    d = first_divergence(ref, [bits([3, 4], [-1.0, one_ulp_up(-2.0)])])
    assert (d.step, d.token, d.what) == (1, 1, ["logprob bits"]) and d.diffs[0].max_ulp == 1


def test_a_captured_row_maps_to_the_step_that_computed_it():
    """Captured row p is position p; the prompt's rows belong to the prefill (step 0), row
    prompt_len + s - 1 to decode step s."""
    cap = torch.zeros(7, 4)
    late, early = cap.clone(), cap.clone()
    late[5, 2] = 1.0                       # prompt_len 5: row 5 is decode step 1's input
    early[3, 0] = 1.0                      # a prompt row: the prefill
    ref = [bits([1, 2, 3], [-1.0, -1.0, -1.0], captured=cap)]
    assert first_divergence(ref, [bits([1, 2, 3], [-1.0, -1.0, -1.0], captured=late)]).step == 1
    d = first_divergence(ref, [bits([1, 2, 3], [-1.0, -1.0, -1.0], captured=early)])
    assert (d.step, d.token, d.what) == (0, 0, ["captured states"])


def test_the_earliest_step_wins_over_the_lower_request_index():
    ref = [bits([1, 2, 3], [-1.0] * 3), bits([1, 2, 3], [-1.0] * 3)]
    other = [bits([1, 2, 7], [-1.0] * 3), bits([1, 8, 3], [-1.0] * 3)]
    d = first_divergence(ref, other)
    assert (d.request, d.step) == (1, 1)
    other[0] = bits([1, 9, 3], [-1.0] * 3)                       # a tie on the step: request 0
    assert first_divergence(ref, other).request == 0


def test_speculative_tokens_map_to_verify_rounds():
    """Token 0 comes from the prefill; round r emits accept_lengths[r - 1] tokens."""
    acc = [3, 1, 2]                         # tokens 1-3 round 1, token 4 round 2, tokens 5-6 round 3
    r = bits([0] * 7, [-1.0] * 7, accept=acc)
    assert [r.step_of(j) for j in range(7)] == [0, 1, 1, 1, 2, 3, 3]
    ref = [r]
    d = first_divergence(ref, [bits([0, 0, 0, 0, 5, 0, 0], [-1.0] * 7, accept=acc)])
    assert (d.step, d.token, d.step_name()) == (2, 4, "verify round 2")
    d = first_divergence(ref, [bits([0] * 7, [-1.0] * 7, accept=[3, 2, 1])])
    assert (d.step, d.token, d.what) == (2, 4, ["accept lengths"])


def test_compare_traces_names_the_first_boundary_and_the_first_op():
    a, b = OpTrace(0, 0), OpTrace(0, 0)
    for t, (name, value) in enumerate([("boundary.0", 1.0), ("L0.attention", 2.0), ("L0.o_proj", 3.0),
                                       ("boundary.1", 4.0), ("lm_head", 5.0)]):
        a.ops[name] = torch.full((2, 3), value)
        b.ops[name] = torch.full((2, 3), value + (name in ("L0.o_proj", "boundary.1", "lm_head")))
        a.row_positions[name] = b.row_positions[name] = [7, 8]
    o = compare_traces(a, b, ("one", "two"))
    assert (o.boundary.name, o.op.name, o.equal_before) == ("boundary.1", "L0.o_proj", 2)
    assert o.op.sides == ("one", "two") and "one 3.0" in o.op.describe()


SPEC = """\
kind: generate
description: one request, decoded alone (every decode step a one-row forward)
inputs:
  checkpoint: {preset: tiny-parallel, seed: 0}
  capture: [1, 2]
  requests:
    - {prompt: {hashed: {count: 20, seed: 1, below: 500}}, sampling: {greedy: true, max_new_tokens: 3, stop_token_ids: []}}
"""


def test_a_golden_mismatch_is_located_to_request_step_and_token(tmp_path, monkeypatch):
    """The golden keeps tokens, logprobs and captured states, not ops: the locator names request 0,
    decode step 1 (the first one-row forward, where the planted tile order acts) from them, and
    says why it did not re-run. (The captured state of that row differs; whether step 1's logprob
    keeps its bits is chance, so the test does not depend on it.)"""
    spec = parse_spec(SPEC, str(tmp_path / "specs" / "generate" / "one.yaml"), "generate/one")
    ctx, store = RunContext(detect("cpu")), GoldenStore(tmp_path / "golden")
    assert regen_spec(spec, ctx, store).written
    different_tile_when_alone(monkeypatch)
    out = check_spec(spec, ctx, store)
    assert out.status == MISMATCH and len(out.located) == 1
    where = out.located[0].to_json()
    assert (where["request"], where["step"], where["token"], where["position"]) == (0, 1, 1, 21)
    assert "captured states" in where["differs"]
    assert where["reference"] == "golden" and where["rerun"] is None and "a golden keeps no op-level states" in where["note"]
    assert "this run vs golden, first divergence: request 0, decode step 1, token 1" in out.report()


BATCH_SPEC = """\
kind: generate
description: two requests decoded together; alone, each decode step is a one-row forward
inputs:
  checkpoint: {preset: tiny-parallel, seed: 0}
  capture: [1, 2]
  requests:
    - {prompt: {hashed: {count: 20, seed: 1, below: 500}}, sampling: {greedy: true, max_new_tokens: 3, stop_token_ids: []}}
    - {prompt: {hashed: {count: 9, seed: 2, below: 500}}, seed: 7, sampling: {top_k: 20, max_new_tokens: 3, stop_token_ids: []}}
expect:
  batch_invariant: true
"""


def test_diff_locates_a_decode_step_with_another_attention_tile(tmp_path, monkeypatch, capsys):
    """Planted: one-row forwards (only a request decoding alone has them here) walk the keys in
    other tiles. `lockstep diff` must name request 0 (both requests part at decode step 1, the
    first one-row forward; the lower index wins), decode step 1, boundary 1 (layer 0) and the
    attention op, with the ops before it equal."""
    from lockstep.harness.cli import main
    (tmp_path / "specs" / "generate").mkdir(parents=True)
    (tmp_path / "specs" / "generate" / "tile.yaml").write_text(BATCH_SPEC)
    (tmp_path / "golden").mkdir(exist_ok=True)        # no golden in it: the spec's own checks judge
    monkeypatch.chdir(tmp_path)
    different_tile_when_alone(monkeypatch)
    assert main(["diff", "generate/tile"]) == 1
    text = capsys.readouterr().out
    assert "each request alone vs the spec's run, first divergence: request 0, decode step 1, token 1 " \
           "(sequence position 21, sampled from the logits at position 20): " in text
    assert "captured states differ" in text           # (the logprob bits may or may not part too)
    assert "first boundary that differs: boundary 1: the output of layer 0" in text
    assert "first op that differs: L0.attention (layer 0, attention over the KV cache" in text
    assert "the 3 ops before it are bitwise equal" in text and "(row 0 is position 20)" in text
    assert "expectation failed: reversed order" not in text            # D2 holds for the order

    assert main(["check", "--json", "generate/tile"]) == 1
    report = json.loads(capsys.readouterr().out)["specs"][0]
    (where,) = report["located"]
    assert (where["other"], where["request"], where["step"], where["token"]) == ("each request alone", 0, 1, 1)
    rerun = where["rerun"]
    assert rerun["positions"] == [20] and rerun["boundary"]["name"] == "boundary.1"
    assert (rerun["op"]["name"], rerun["op"]["op"], rerun["equal_before"]) == ("L0.attention", "attention", 3)
    diff = rerun["op"]["diff"]
    assert diff["problem"] == "bits" and diff["n_diff"] > 0 and diff["max_ulp"] >= 1
    assert diff["sides"] == ["the spec's run", "each request alone"]


CACHE_SPEC = """\
kind: generate
description: one request, its prompt prefilled whole and in chunks of 4
inputs:
  checkpoint: {preset: tiny, seed: 0, format: bf16}
  requests:
    - {prompt: [30, 31, 32, 33, 34, 35, 36, 37, 38, 39, 40, 41], sampling: {greedy: true, max_new_tokens: 3, stop_token_ids: []}}
expect:
  prefill_chunks: [4]
"""


def test_regen_refusal_names_the_earlier_step_the_kv_cache_carries(tmp_path, monkeypatch):
    """Planted: the whole-prompt prefill nudges layer 0's attention norm at prompt row 5 (its keys
    and values go into the cache) by one float32 step; the prefill's own token and logprob keep
    their bits, decode step 1's do not. Re-run op by op, decode step 1 first differs at
    L1.attention (its own inputs equal; row 5's keys and values in layer 1's cache carry the nudge),
    which alone would blame the wrong step. The refusal must say so and name the prefill's
    L0.attn_norm, the earliest step whose op trace differs."""
    spec = parse_spec(CACHE_SPEC, str(tmp_path / "specs" / "generate" / "cache.yaml"), "generate/cache")
    ctx, store = RunContext(detect("cpu")), GoldenStore(tmp_path / "golden")
    norm_nudged_in_whole_prefill(monkeypatch, prompt_len=12, layer=0, row=5, element=7)
    out = regen_spec(spec, ctx, store)
    assert not out.written
    text = "\n".join(out.explanation)
    assert "expectation failed: prefill chunks of 4" in text
    assert "first divergence: request 0, decode step 1" in text
    assert "first op that differs: L1.attention" in text
    assert ("the KV cache carries an earlier step's difference: L1.attention reads the keys and values earlier "
            "steps wrote, and the earliest step whose op trace differs is step 0 (the prefill), first at "
            "L0.attn_norm (layer 0, attention RMSNorm)") in text


def test_an_attention_that_differs_by_itself_is_not_blamed_on_the_cache(tmp_path, monkeypatch):
    """The tile order planted in one-row forwards acts in decode step 1's own attention: the prefill
    (step 0) re-run op by op is equal, and the report says the cache carried nothing."""
    from lockstep.harness.kinds.generate import run
    from lockstep.harness.targets.lockstep import engine

    spec = parse_spec(BATCH_SPEC, str(tmp_path / "specs" / "generate" / "tile.yaml"), "generate/tile")
    different_tile_when_alone(monkeypatch)
    ctx = RunContext(detect("cpu"))
    located = run(spec, ctx, engine(ctx)).located
    assert located and located[0].ops.op.name == "L0.attention"
    carry = located[0].cache
    assert (carry.reader, carry.before, carry.compared, carry.step) == ("L0.attention", 1, 1, None)
    assert "the earlier steps' op traces (steps 0..0) are bitwise equal: L0.attention differs at this step, " \
           "not through the KV cache" in located[0].text()
    assert located[0].to_json()["cache"]["earliest_step"] is None
