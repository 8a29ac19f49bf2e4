"""lockstep.engine.request: the one request type, and the dict form traces and specs share with it."""

from __future__ import annotations

import pytest

from lockstep.engine.request import Request, SamplingParams

# A request record's fields as traces written before engine.request existed hold them
# (harness/replay/record.py: every SamplingParams field, stop_token_ids a list or null).
RECORDED = {"prompt": [5, 9, 2], "seed": 11,
            "sampling": {"temperature": 0.9, "top_k": 40, "top_p": 0.8, "min_p": 0.05, "max_new_tokens": 6,
                         "greedy": False, "stop_token_ids": [7, 8]}}


def test_a_recorded_request_loads_and_writes_back_the_same_dict():
    r = Request.from_dict(RECORDED)
    assert r.prompt == [5, 9, 2] and r.seed == 11
    assert r.params == SamplingParams(temperature=0.9, top_k=40, top_p=0.8, min_p=0.05, max_new_tokens=6,
                                      stop_token_ids=(7, 8))
    assert r.to_dict() == RECORDED
    assert list(r.to_dict()) == ["prompt", "sampling", "seed"]
    assert list(r.to_dict()["sampling"]) == list(RECORDED["sampling"])    # field order: the trace's


def test_a_missing_or_null_field_takes_its_default():
    r = Request.from_dict({"prompt": [1], "sampling": {"temperature": None, "stop_token_ids": None}})
    assert r.params == SamplingParams() and r.seed is None
    assert Request.from_dict({"prompt": [1]}).params == SamplingParams()
    assert Request.from_dict({"prompt": [1], "sampling": {"stop_token_ids": []}}).params.stop_token_ids == ()


@pytest.mark.parametrize("d, field", [
    ({"prompt": [1], "sampling": {"temprature": 1.0}}, r"SamplingParams: unknown field 'temprature'"),
    ({"prompt": [1], "sampling": {"top_p": 0.0}}, r"SamplingParams\.top_p"),
    ({"prompt": [], "sampling": {}}, r"Request\.prompt"),
    ({"prompt": [1], "seed": 2 ** 64}, r"Request\.seed"),
])
def test_a_bad_dict_is_refused_naming_the_field(d, field):
    with pytest.raises(ValueError, match=field):
        Request.from_dict(d)
