"""The outside-target judge's every rule on a stand-in kind (no model, no spec run): refusals by
their facts, properties by the target's claims, the tolerance report, the golden comparison each
way, n/a, an adapter's refusal and a crash, each outcome's message and JSON."""

from __future__ import annotations

import math
import re
from types import SimpleNamespace

import pytest
import torch

from lockstep.harness.golden import CorruptGolden
from lockstep.harness.result import SpecResult
from lockstep.harness.targets import judge
from lockstep.harness.targets.judge import (BITWISE, CALIBRATED, FAIL, NA, PASS, TOLERANCE, NotApplicable,
                                            TargetOutcome, UpstreamChanged, applicability, check_on_target,
                                            compared, error_facts, properties, run_on_target)
from tests.stand_in_kind import KIND
from tests.stand_in_kind import stand_in_kind as _kind


def _spec(expect=None, sid="stand/one"):
    return SimpleNamespace(id=sid, kind=KIND, expect=expect if expect is not None else {}, inputs={})


class _Store:
    def __init__(self, golden=None, corrupt=None):
        self.golden, self.corrupt, self.asked = golden, corrupt, []

    def load(self, platform, sid):
        self.asked.append((platform, sid))
        if self.corrupt:
            raise CorruptGolden(self.corrupt)
        return self.golden


def _target(claims=()):
    return SimpleNamespace(label="peer 1.0", claims=frozenset(claims))


# --------------------------------------------------------------------------- refusals judged by their facts
def test_the_facts_of_an_error_are_its_whole_numbers_and_tensor_names():
    assert error_facts(["model.layers.2.mlp.down_proj", "ids [24, 30, -3] past 36", "x2 1.5 a-3 7b 2_0 (9)"]) == \
        ["model.layers.2.mlp.down_proj", 24, 30, -3, 36, 9]
    assert error_facts(["layers.x", "plain", "a.b.c 5"]) == ["layers.x", 5], "a dotted name alone is a fact"
    assert error_facts([]) == []


def test_check_on_target_judges_an_expected_refusal_by_its_facts(monkeypatch):
    seen = []
    _kind(monkeypatch, refusal=lambda result: result.data.get("refused"),
          check=lambda spec, result: seen.append(result) or ["the kind's own check"])
    spec = _spec({"error": ["boundary 24 of 36", "model.w.x"]})
    assert check_on_target(spec, SpecResult(data={"refused": "no 24/36 at model.w.x"})) == []
    assert check_on_target(spec, SpecResult(data={"refused": "bad id 240 and 36 in model.w.y"})) == [
        "the refusal does not name ['model.w.x', 24]: bad id 240 and 36 in model.w.y"]
    assert seen == []
    assert check_on_target(spec, SpecResult(data={})) == ["the kind's own check"], "no refusal: the kind judges"
    assert check_on_target(_spec({"tokens": 1}), SpecResult(data={"refused": "x"})) == ["the kind's own check"]
    assert check_on_target(_spec(["not", "a", "mapping"]), SpecResult(data={"refused": "x"})) == ["the kind's own check"]
    _kind(monkeypatch, check=lambda s, result: [f"own check of {s.id}"])
    assert check_on_target(spec, SpecResult(data={"refused": "x"})) == ["own check of stand/one"], \
        "a kind without refusal() checks"
    assert check_on_target(spec, SpecResult(facts={"variant_property": {}})) == ["own check of stand/one"], \
        "variants named without any differing"


def test_the_kinds_check_never_sees_a_differing_variant(monkeypatch):
    seen = []
    _kind(monkeypatch, check=lambda spec, result: seen.append(result.facts) or [])
    facts = {"variant_property": {"batch": "batch"}, "variants_differing": {"batch": [1, 2], "order": [3]},
             "other": 5}
    result = SpecResult(facts=facts)
    assert check_on_target(_spec(), result) == []
    assert seen == [{"variant_property": {"batch": "batch"}, "variants_differing": {"batch": [], "order": []},
                     "other": 5}]
    assert result.facts["variants_differing"] == {"batch": [1, 2], "order": [3]}, "the result is not changed"
    plain = SpecResult(facts={"variants_differing": {"batch": [1]}})
    assert judge._without_variants(plain) is plain, "no variant_property: as it is"
    assert judge._without_variants(SpecResult(facts=None)).facts is None


def test_properties_fail_only_when_claimed_and_observe_the_rest():
    facts = {"variant_property": {"batch": "batch-invariance", "order": "order-invariance"},
             "variants_first": {"batch": "request 1 step 2: token 5 vs 6"},
             "variants_differing": {"batch": [1, 3], "order": [0], "none": [], "plain": [2]},
             "variants_na": {"seeds": "no seeded sampling", "order": "one request"}}
    judged, observed = properties(SpecResult(facts=facts), frozenset({"batch-invariance"}))
    assert judged == ["property (claimed) batch-invariance: batch: request 1 step 2: token 5 vs 6; "
                      "requests [1, 3] differ"]
    assert observed == ["property (not claimed, observed) order-invariance: order: requests [0] differ; "
                        "requests [0] differ",
                        "property (not claimed, observed) plain: plain: requests [2] differ; requests [2] differ",
                        "property seeds: seeds: n/a (no seeded sampling)",
                        "property order-invariance: order: n/a (one request)"]
    assert properties(SpecResult(facts=None), frozenset()) == ([], [])
    judged, _ = properties(SpecResult(facts={"variants_differing": {"plain": [2]}}), frozenset({"plain"}))
    assert judged == ["property (claimed) plain: plain: requests [2] differ; requests [2] differ"]


def test_compared_is_the_kinds_or_bitwise_against_its_golden(monkeypatch):
    result = SpecResult()
    _kind(monkeypatch, compared=lambda spec, ctx, r: (TOLERANCE, f"{spec.id} {ctx} {r is result}"))
    assert compared(_spec(), "ctx", result) == (TOLERANCE, "stand/one ctx True")
    _kind(monkeypatch, golden_platform=lambda spec, ctx: f"golden of {spec.id} at {ctx}")
    assert compared(_spec(), "ctx", SpecResult()) == (BITWISE, "golden of stand/one at ctx")


def test_applicability_is_the_kinds_answer_or_na_with_its_reason(monkeypatch):
    asked = []
    _kind(monkeypatch, applicability=lambda spec, t, device: asked.append(device) or f"{spec.id} {t.label}")
    assert applicability(_spec(), _target()) == ("stand/one peer 1.0", "") and asked == ["cpu"]
    assert applicability(_spec(), _target(), "cuda") == ("stand/one peer 1.0", "") and asked[-1] == "cuda"

    def lacks(spec, t, device):
        raise NotApplicable("no op 'hash'")
    _kind(monkeypatch, applicability=lacks)
    assert applicability(_spec(), _target()) == (NA, "no op 'hash'")
    _kind(monkeypatch)
    assert applicability(_spec(), _target()) == (NA, f"kind {KIND}")


# --------------------------------------------------------------------------- the tolerance report
def test_the_tolerance_report_names_each_tensor_in_order():
    g = {"a": torch.tensor([1.0, 2.0]), "b": torch.zeros(2, 2), "c": torch.tensor([1, 2, 3]), "gone": torch.ones(1)}
    x = {"a": torch.tensor([1.0, 2.0]), "b": torch.zeros(3), "c": torch.tensor([1, 5, 7], dtype=torch.int32),
         "new": torch.ones(1)}
    assert judge._tolerance_diff(g, x) == [
        "tensor 'b': shape [3], the golden has [2, 2]",
        "tensor 'c' differs at [1]: 5 instead of 2",
        "tensor 'gone' is missing",
        "tensor 'new' is not in the golden"]


def test_the_tolerance_is_inclusive_and_a_nan_is_outside_it():
    g = torch.tensor([0.0, 4.0, 2.0, -8.0], dtype=torch.float64)
    edge = torch.tensor([0.001, 4.004, 2.0, -8.0], dtype=torch.float64)     # |d| = ATOL exactly at 0: inside
    assert judge._tolerance_diff({"t": g}, {"t": edge}) == []
    over = edge.clone()
    over[0] = torch.nextafter(edge[0], torch.tensor(math.inf, dtype=torch.float64))
    over[3] = -8.5
    (line,) = judge._tolerance_diff({"t": g}, {"t": over})
    assert line == ("tensor 't': 2 of 4 values outside |d| <= 0.001 + 0.001|golden|, first at [0]: "
                    "0.001 instead of 0 (max |d| 0.5)")
    nan = g.clone()
    nan[2] = math.nan
    assert judge._tolerance_diff({"t": g}, {"t": nan}) == [
        "tensor 't': 1 of 4 values outside |d| <= 0.001 + 0.001|golden|, first at [2]: nan instead of 2 (max |d| inf)"]
    low = {"t": torch.tensor([[1.0, 2.0]], dtype=torch.bfloat16)}
    assert judge._tolerance_diff(low, {"t": torch.tensor([[1.0, 2.0078125]], dtype=torch.float32)}) == [
        "tensor 't': 1 of 2 values outside |d| <= 0.001 + 0.001|golden|, first at [0, 1]: 2.0078125 instead of 2 "
        "(max |d| 0.00781)"], "each side read in float64, whatever its dtype"
    assert judge.CROSS_ATOL == judge.CROSS_RTOL == 1e-3
    assert judge._tolerance_diff({"c": torch.tensor([1, 2])}, {"c": torch.tensor([1, 2], dtype=torch.int32)}) == []
    just_over = torch.nextafter(torch.tensor([0.001], dtype=torch.float64), torch.tensor(1.0, dtype=torch.float64))
    assert len(judge._tolerance_diff({"t": torch.zeros(1)}, {"t": just_over})) == 1, \
        "a float32 golden's bound is computed in float64 (in float32 0.001 rounds up past this)"


# --------------------------------------------------------------------------- run_on_target
def _run(monkeypatch, result=None, store=None, claims=(), raises=None, target=None, **parts):
    spec, given = _spec(), target or _target(claims)

    def run(s, ctx, t):
        assert torch.is_inference_mode_enabled(), "the target runs under inference_mode"
        assert (s, ctx, t) == (spec, "ctx", given), "the kind runs the spec, with the context, on the target"
        if raises is not None:
            raise raises
        return result
    _kind(monkeypatch, run=run, **parts)
    return run_on_target(spec, "ctx", given, store or _Store())


def test_a_clean_run_passes_with_its_notes_and_compare(monkeypatch):
    store = _Store(SimpleNamespace(tensors={"t": torch.ones(2)}, data={"k": [1, 2]}))
    facts = {"variant_property": {"batch": "batch"}, "variants_differing": {"batch": [1]}}
    out = _run(monkeypatch, SpecResult(tensors={"t": torch.ones(2)}, data={"k": (1, 2)}, facts=facts, notes=["kind note"]),
               store)
    assert (out.status, out.compare, out.message, out.messages) == (PASS, BITWISE, "", [])
    assert out.notes == ["property (not claimed, observed) batch: batch: requests [1] differ; requests [1] differ",
                         "kind note"]
    assert store.asked == [("cpu-fp32", "stand/one")]
    empty = _Store(SimpleNamespace(tensors={}, data={}))
    out = _run(monkeypatch, SpecResult(facts=facts), empty, target=SimpleNamespace(label="bare"))
    assert out.status == PASS and out.notes[0].startswith("property (not claimed, observed) batch"), \
        "a target without claims claims nothing"
    out = _run(monkeypatch, SpecResult(), empty,
               compared=lambda s, ctx, result: (BITWISE, f"{s.id} {ctx} {type(result).__name__}"))
    assert empty.asked[-1] == ("stand/one ctx SpecResult", "stand/one"), "compared() gets the spec, context, result"
    assert out.target == "peer 1.0" and out.spec.id == "stand/one" and 0 <= out.seconds < 60


def test_bitwise_failures_come_after_the_claimed_properties_and_the_kinds_checks(monkeypatch):
    golden = SimpleNamespace(tensors={"t": torch.tensor([1.0, 2.0])}, data={"k": [1, 2]})
    facts = {"variant_property": {"batch": "batch"}, "variants_differing": {"batch": [1]}}
    out = _run(monkeypatch, SpecResult(tensors={"t": torch.tensor([1.0, 3.0])}, data={"k": [1, 3]}, facts=facts),
               _Store(golden), claims={"batch"}, check=lambda spec, result: ["own check"])
    assert out.status == FAIL and out.messages[:2] == [
        "property (claimed) batch: batch: requests [1] differ; requests [1] differ", "own check"]
    assert out.messages[2].startswith("tensor 't': 1 of 2 elements differ")
    assert out.messages[3].startswith("data differs from the golden: Value of root['k'][1] changed from 2 to 3")
    assert len(out.messages) == 4
    assert out.message == out.messages[0], "the first line of the first failure"


def test_the_data_is_compared_as_a_manifest_reads_it_back(monkeypatch):
    golden = SimpleNamespace(tensors={}, data={"k": [1, 2], "m": {"a": 1, "b": 2}})
    out = _run(monkeypatch, SpecResult(data={"m": {"b": 2, "a": 1}, "k": (1, 2)}), _Store(golden))
    assert out.status == PASS, out.messages


def test_without_a_golden_or_with_a_corrupt_one_the_run_fails_saying_so(monkeypatch):
    out = _run(monkeypatch, SpecResult(), _Store(None))
    assert out.messages == ["no golden on cpu-fp32 to compare with (record it with lockstep regen stand/one)"]
    out = _run(monkeypatch, SpecResult(), _Store(corrupt="sha256 differs"))
    assert out.messages == ["corrupt golden: sha256 differs",
                            "no golden on cpu-fp32 to compare with (record it with lockstep regen stand/one)"]
    out = _run(monkeypatch, SpecResult(), _Store(None), compared=lambda spec, ctx, result: (TOLERANCE, None))
    assert (out.status, out.compare, out.messages) == (PASS, TOLERANCE, []), "no golden platform: nothing to load"


def test_a_tolerance_kind_reports_the_tolerance_diff(monkeypatch):
    golden = SimpleNamespace(tensors={"t": torch.tensor([1.0, 2.0])}, data={"ignored": 1})
    out = _run(monkeypatch, SpecResult(tensors={"t": torch.tensor([1.0, 2.0005])}, data={"other": 2}), _Store(golden),
               compared=lambda spec, ctx, result: (TOLERANCE, "cpu-bf16"))
    assert (out.status, out.compare) == (PASS, TOLERANCE), "inside the tolerance; data not compared"
    out = _run(monkeypatch, SpecResult(tensors={"t": torch.tensor([1.0, 2.5])}), _Store(golden),
               compared=lambda spec, ctx, result: (TOLERANCE, "cpu-bf16"), check=lambda spec, result: ["own"])
    assert out.messages == ["own", judge._tolerance_diff(golden.tensors, {"t": torch.tensor([1.0, 2.5])})[0]]


def test_a_calibrated_kind_leads_with_the_agreement_and_compares_the_rest(monkeypatch):
    seen = []

    def agreement(spec, ctx, result, target):
        seen.append((spec.id, ctx, torch.is_inference_mode_enabled()))
        assert result is got and target.label == "peer 1.0"
        return ["agreement: sampler at request 0 step 1"], ["agreement note"]
    monkeypatch.setattr(judge, "_agreement", agreement)
    golden = SimpleNamespace(tensors={"tokens_0": torch.tensor([1]), "logprobs_0": torch.tensor([0.5]),
                                      "extra": torch.tensor([1.0])}, data={})
    got = SpecResult(tensors={"tokens_0": torch.tensor([9]), "logprobs_0": torch.tensor([9.0]), "extra": torch.tensor([3.0]),
                          "unasked": torch.tensor([0.0])}, notes=["kind note"])
    out = _run(monkeypatch, got, _Store(golden), compared=lambda spec, ctx, result: (CALIBRATED, "cpu-bf16"),
               check=lambda spec, result: ["own check"])
    assert seen == [("stand/one", "ctx", True)]
    assert out.messages == ["agreement: sampler at request 0 step 1", "own check",
                            "tensor 'extra': 1 of 1 values outside |d| <= 0.001 + 0.001|golden|, first at [0]: 3 "
                            "instead of 1 (max |d| 2)"]
    assert out.notes == ["kind note", "agreement note"]


def test_not_applicable_an_adapters_refusal_and_a_crash(monkeypatch):
    out = _run(monkeypatch, raises=NotApplicable("no op 'hash'"))
    assert (out.status, out.message, out.messages) == (NA, "no op 'hash'", [])
    out = _run(monkeypatch, raises=UpstreamChanged("vllm moved its sampler"))
    assert (out.status, out.messages, out.message) == (
        FAIL, ["adapter refused: vllm moved its sampler"], "adapter refused: vllm moved its sampler")
    out = _run(monkeypatch, raises=ValueError("bad shape\nsecond line"))
    assert out.status == FAIL and out.message == "crash: ValueError: bad shape"
    (line,) = out.messages
    assert re.fullmatch(r"crash: ValueError: bad shape \(at (\S*/)?tests/targets/test_judge_rules\.py:\d+ in run\)",
                        line), line
    assert out.traceback.startswith("Traceback (most recent call last):") and \
        out.traceback.endswith("ValueError: bad shape\nsecond line")
    out = _run(monkeypatch, raises=ValueError("x" * 400))
    assert out.message == "crash: ValueError: " + "x" * (300 - len("crash: ValueError: "))
    assert len(out.messages[0]) > 400


def test_a_crash_without_a_traceback_and_a_long_failure_line(monkeypatch):
    error = KeyError("k")
    monkeypatch.setattr(judge, "where", lambda e: "")
    out = _run(monkeypatch, raises=error)
    assert out.messages == ["crash: KeyError: 'k'"]
    out = _run(monkeypatch, SpecResult(), _Store(None), check=lambda spec, result: ["y" * 350 + "\nsecond"])
    assert out.message == "y" * 300


def test_the_outcome_as_json():
    out = TargetOutcome(_spec(), "peer 1.0", FAIL, compare=BITWISE, message="m", messages=["m", "n"],
                        seconds=1.23456, notes=["note"], traceback="tb")
    assert out.to_json() == {"id": "stand/one", "kind": KIND, "target": "peer 1.0", "status": FAIL,
                             "compare": BITWISE, "message": "m", "messages": ["m", "n"], "notes": ["note"],
                             "seconds": 1.235}
    assert out.to_json()["messages"] is not out.messages and out.to_json()["notes"] is not out.notes
    fresh = TargetOutcome(_spec(), "t", PASS)
    assert (fresh.compare, fresh.message, fresh.messages, fresh.seconds, fresh.traceback, fresh.notes) == \
        ("", "", [], 0.0, "", [])


def test_the_agreement_runs_the_reference_at_the_runs_dtype(monkeypatch):
    """_agreement's inputs: the spec's requests, Lockstep's model at the run's device and dtype, the
    target's generations read from tokens_i / logprobs_i, the bound of that dtype."""
    from lockstep.harness.targets import agreement

    asked = {}
    monkeypatch.setattr(judge, "_requests", lambda s: ["r0", "r1"] if s is spec else None)
    monkeypatch.setattr(judge, "project_root", lambda s: "/root" if s is spec else None)
    monkeypatch.setattr(judge, "model_for", lambda *a: asked.setdefault("model", a) and "model")
    monkeypatch.setattr(judge, "bound", lambda dtype: f"bound {dtype}")

    def judge_(requests, results, reference, bound, locator, sampler):
        asked["judge"] = (requests, [(r.tokens, r.logprobs.tolist()) for r in results], reference, bound,
                          locator, sampler)
        return ["fail"], ["note"], "ignored"
    monkeypatch.setattr(agreement, "judge", judge_)
    spec = SimpleNamespace(inputs={"checkpoint": "tiny"})
    ctx = SimpleNamespace(device=torch.device("cpu"), platform=SimpleNamespace(dtype="bf16"))
    result = SpecResult(tensors={"tokens_0": torch.tensor([1, 2]), "logprobs_0": torch.tensor([-0.5, -1.0]),
                             "tokens_1": torch.tensor([3]), "logprobs_1": torch.tensor([-2.0])})
    assert judge._agreement(spec, ctx, result) == (["fail"], ["note"])
    assert asked["model"] == ("tiny", "torch", "/root", "cpu", "bf16")
    assert asked["judge"] == (["r0", "r1"], [([1, 2], [-0.5, -1.0]), ([3], [-2.0])], "model", "bound bf16",
                              None, None), "no target: no layer locator, no sampler judge"
    target = SimpleNamespace(label="t")
    monkeypatch.setattr(judge, "_layer_locator", lambda s, c, t, r: ("locator", s is spec, c is ctx, t is target, r))
    monkeypatch.setattr(judge, "_sampler", lambda t, device: ("sampler", t is target, device))
    judge._agreement(spec, ctx, result, target)
    assert asked["judge"][4:] == (("locator", True, True, True, "model"), ("sampler", True, "cpu"))


class _Ops:
    """A stand-in target with the operations named, each with its features."""

    def __init__(self, ops, rng=None, refuse=()):
        self.ops, self.rng, self.refuse, self.asked = ops, rng, refuse, []

    def op(self, name, device="cpu", needs=()):
        self.asked.append((name, device, needs))
        if name in self.refuse:
            raise NotApplicable(f"no {name} here")
        return f"{name} op"

    def offers(self, name, feature):
        return feature in self.ops.get(name, ())


def test_the_sampler_judge_needs_sampling_with_params_under_the_coin_contract():
    from lockstep.harness.target import RNG_COINS
    assert judge._sampler(None, "cpu") is None
    t = _Ops({"sampling": ("params",)}, rng=RNG_COINS)
    assert judge._sampler(t, "cuda:0") == "sampling op" and t.asked == [("sampling", "cuda:0", ("params",))]
    assert judge._sampler(_Ops({"sampling": ()}, rng=RNG_COINS), "cpu") is None, "no params feature"
    assert judge._sampler(_Ops({"sampling": ("params",)}, rng="own"), "cpu") is None, "another RNG"
    assert judge._sampler(_Ops({"sampling": ("params",)}, rng=RNG_COINS, refuse=("sampling",)), "cpu") is None
    bare = SimpleNamespace(offers=lambda name, feature: True)
    assert judge._sampler(bare, "cpu") is None, "a target that names no RNG contract"


def test_the_layer_locator_needs_the_targets_capture(monkeypatch):
    from lockstep.harness.targets import locator

    spec = SimpleNamespace(inputs={"checkpoint": {"preset": "tiny"}})
    ctx = SimpleNamespace(device=torch.device("cpu"), platform=SimpleNamespace(dtype="bf16"))
    captured = []

    class Reference:
        config = SimpleNamespace(num_hidden_layers=3)

        def new_cache(self, batch, n):
            return ("cache", batch, n)

        def forward(self, tokens, positions, slots, cache, capture):
            captured.append((tokens.tolist(), positions.tolist(), slots.tolist(), slots.dtype, cache, capture))
            return SimpleNamespace(captured=torch.ones(2))
    reference = Reference()
    assert judge._layer_locator(spec, ctx, None, reference) is None
    assert judge._layer_locator(spec, ctx, _Ops({}), reference) is None, "no capture operation"
    assert judge._layer_locator(spec, ctx, SimpleNamespace(), reference) is None, "a target without ops"
    assert judge._layer_locator(spec, ctx, _Ops({"capture": ()}, refuse=("capture",)), reference) is None
    monkeypatch.setattr(judge, "target_dir", lambda ckpt, root: f"dir of {ckpt['preset']} under {root}")
    monkeypatch.setattr(judge, "project_root", lambda s: "/root" if s is spec else None)
    seen = {}

    def locate(capture, reference_capture, folder, tokens, layers, dtype):
        seen["args"] = (capture, folder, tokens, layers, dtype)
        seen["ref"] = reference_capture("ckpt", tokens, [0, 1])
        return "block 2", "note"
    monkeypatch.setattr(locator, "locate", locate)
    t = _Ops({"capture": ()})
    find = judge._layer_locator(spec, ctx, t, reference)
    assert t.asked == [("capture", "cpu", ())]
    assert find([5, 6, 7]) == ("block 2", "note")
    assert seen["args"] == ("capture op", "dir of tiny under /root", [5, 6, 7], 3, "bf16")
    assert captured == [([5, 6, 7], [0, 1, 2], [0, 0, 0], torch.int64, ("cache", 1, 3), [0, 1])], \
        "the reference's own forward of the tokens from position 0 in slot 0, capturing the boundaries asked"
    assert torch.equal(seen["ref"], torch.ones(2))
    meta = SimpleNamespace(device=torch.device("meta"), platform=ctx.platform)
    t = _Ops({"capture": ()})
    judge._layer_locator(spec, meta, t, reference)
    assert t.asked == [("capture", "meta", ())], "the capture asked for on the run's device"


def test_the_missing_golden_hint_names_the_pair_a_bare_regen_may_not_record(monkeypatch):
    from lockstep.harness.platform import detect
    from lockstep.harness.result import RunContext
    from lockstep.harness.targets.judge import regen_flags

    assert regen_flags(RunContext(platform=detect("cpu", "fp32"))) == ""
    assert regen_flags(RunContext(platform=detect("cpu", "bf16"), backend="triton")) == \
        " --dtype bf16 --backend triton"


def test_the_missing_golden_hint_of_a_run_takes_its_pair(monkeypatch):
    from lockstep.harness.platform import detect
    from lockstep.harness.result import RunContext

    _kind(monkeypatch, run=lambda spec, ctx, target: SpecResult())
    out = run_on_target(_spec(), RunContext(platform=detect("cpu", "bf16")), _target(), _Store(None))
    assert out.messages == ["no golden on cpu-fp32 to compare with (record it with lockstep regen stand/one "
                            "--dtype bf16 --backend torch)"]
