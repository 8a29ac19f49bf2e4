"""Replay's verdict vocabulary and its float32 distance (harness.replay.rerun): the values the
reports print, ULP across signs, and a missing measurement named as such."""

from __future__ import annotations

import json
import struct

from hypothesis import given, settings, strategies as st

from lockstep.harness.kinds.replay import _moved
from lockstep.harness.replay.format import f32_bits
from lockstep.harness.replay.rerun import ReplayReport, StepVerdict, Verdict, ulp_distance


def test_verdict_values_are_the_report_strings():
    assert [v.value for v in Verdict] == ["bitwise", "bits", "token", "near-tie", "control", "not recorded"]
    assert f"{Verdict.NEAR_TIE}" == "near-tie" and str(Verdict.BITS) == "bits" and Verdict.TOKEN == "token"
    r = ReplayReport("free-run", {}, [StepVerdict(0, 0, Verdict.BITWISE), StepVerdict(0, 1, Verdict.NEAR_TIE, "x")])
    r.first = r.verdicts[1]
    doc = json.loads(json.dumps(r.to_json()))
    assert doc["counts"] == {"bitwise": 1, "near-tie": 1} and doc["first"]["status"] == "near-tie"
    assert "1 bitwise, 1 near-tie" in r.text() and "step 1: near-tie: x" in r.text()


def test_ulp_across_signs():
    pos0, neg0 = f32_bits(0.0), f32_bits(-0.0)
    tiny = struct.pack(">I", 1).hex()                 # the smallest positive subnormal
    ntiny = struct.pack(">I", 0x80000001).hex()       # and its negative
    assert ulp_distance(pos0, neg0) == 0
    assert ulp_distance(pos0, ntiny) == ulp_distance(neg0, ntiny) == 1
    assert ulp_distance(tiny, ntiny) == 2
    assert ulp_distance(f32_bits(1.0), f32_bits(-1.0)) == 2 * 0x3F800000
    assert ulp_distance(f32_bits(1.0), f32_bits(1.0000001192092896)) == 1


finite = st.floats(allow_nan=False, allow_infinity=False, width=32)


@given(finite, finite, finite)
def test_ulp_is_a_distance_monotone_in_the_value(a, b, c):
    a, b, c = sorted((a, b, c))
    ab, bc, ac = (ulp_distance(f32_bits(x), f32_bits(y)) for x, y in ((a, b), (b, c), (a, c)))
    assert ac == ab + bc                              # points on one line: distances add up
    assert (ab == 0) == (a == b)                      # zero exactly for equal values (±0 included)


@settings(deadline=None)                              # a shared machine's first call can be slow
@given(finite, st.integers(-1000, 1000))
def test_an_ulp_edit_of_the_replay_kind_moves_exactly_that_many_values(x, n):
    bits = f32_bits(x)
    moved = _moved(bits, {"ulp": n, "add": None})
    value = struct.unpack(">f", bytes.fromhex(moved))[0]
    if value != value or abs(value) == float("inf"):
        return                                        # walked off the finite floats
    assert ulp_distance(bits, moved) == abs(n)
    assert value > x if n > 0 else value < x if n < 0 else value == x


def test_the_report_text_and_json_in_full():
    """Every line of the text and every field of the JSON, for the three endings of a report."""
    vs = [StepVerdict(0, 0, Verdict.BITWISE), StepVerdict(0, 1, Verdict.BITS, "d", 0.5, 7),
          StepVerdict(1, 0, Verdict.NOT_RECORDED, "n")]
    r = ReplayReport("teacher-forced", {"tp": 1, "max_batch": 2}, vs, threshold=1.0,
                     stats={"p50": 0.25, "p95": 0.5, "p99": 0.5, "max": 0.5, "mean": 0.125,
                            "share_over_threshold": 0.0, "bitwise_equal": 2, "tokens": 3})
    assert r.text().splitlines() == [
        "replay (teacher-forced; max_batch 2, tp 1): 3 steps, 1 bits, 1 bitwise, 1 not recorded",
        "another engine's trace: |Δlogprob| p50 0.25, p95 0.5, p99 0.5, max 0.5 (mean 0.125); 0.0% over 1; "
        "2 of 3 bitwise equal",
        "no step diverges, but 1 of 3 steps were not fully checked: the trace did not record what "
        "teacher-forcing compares (not recorded)"]
    doc = r.to_json()
    assert doc == {"mode": "teacher-forced", "setup": {"tp": 1, "max_batch": 2}, "bitwise": False, "ok": True,
                   "threshold": 1.0, "stats": r.stats, "counts": {"bitwise": 1, "bits": 1, "not recorded": 1},
                   "first": None, "located": None,
                   "divergent": [{"request": 0, "step": 1, "status": "bits", "detail": "d", "dlogprob": 0.5, "ulp": 7},
                                 {"request": 1, "step": 0, "status": "not recorded", "detail": "n", "dlogprob": 0.0,
                                  "ulp": 0}]}
    assert all(type(v["status"]) is str for v in doc["divergent"])
    r.verdicts, r.stats = vs[:2], None
    assert r.text().splitlines()[-1] == "every step is within |Δlogprob| <= 1 of the trace (not bitwise: another " \
                                        "implementation)"
    r.verdicts = vs[:1]
    assert r.text().splitlines()[-1] == "every step is bitwise equal to the trace" and r.bitwise
    r.verdicts, r.first = vs, vs[1]
    assert r.text().splitlines()[-1] == "first divergence: request 0, step 1: bits: d" and not r.ok
    assert r.to_json()["first"] == {**vars(vs[1]), "status": "bits"}
    assert f"{Verdict.BITS:>6}" == "  bits"
