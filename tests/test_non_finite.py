"""Non-finite numbers are named where they are (file, line, field; request, step) and never
printed as bare NaN in JSON: a trace or request line holding one, a recording that produced one,
and `generate --json --logprobs`."""

import json
import math

import pytest

from lockstep.harness.cli import main
from lockstep.harness.commands.generate import _finite_or_null
from lockstep.harness.replay.format import TraceError, read_trace, write_trace
from tests.conftest import REPO


def test_a_trace_line_with_nan_is_named_by_file_line_field_request_and_step(tmp_path, capsys):
    t = tmp_path / "t.jsonl"
    t.write_text('{"kind": "step", "request": 0, "step": 2, "logprob": NaN}\n')
    assert main(["replay", str(t)]) == 2
    err = capsys.readouterr().err.strip()
    assert err == (f"lockstep: error: {t}:1: logprob (request 0, step 2) is nan, not a finite number "
                   f"(JSON has no NaN or infinity): refused"), err


def test_a_request_line_with_infinity_is_named(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(REPO)
    r = tmp_path / "r.jsonl"
    r.write_text('{"prompt": [1, 2], "sampling": {"temperature": Infinity}}\n')
    assert main(["record", str(tmp_path / "o.jsonl"), "--checkpoint", "models/tiny-target", "--requests", str(r)]) == 2
    assert f"{r}:1: sampling.temperature is inf, not a finite number" in capsys.readouterr().err
    assert not (tmp_path / "o.jsonl").exists()


def test_a_recording_with_a_nan_logprob_names_request_and_step_and_writes_nothing(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(REPO)
    good = tmp_path / "good.jsonl"
    assert main(["record", str(good), "--checkpoint", "models/tiny-target", "--prompt-ids", "1,2,3",
                 "--max-new-tokens", "2"]) == 0
    trace = read_trace(good)
    trace.steps[0][1]["logprob"] = math.nan
    with pytest.raises(TraceError, match=r"bad.jsonl: record \d+ \(step\) \(request 0, step 1\): logprob is nan; "
                                         r"a trace holds finite numbers only"):
        write_trace(trace, tmp_path / "bad.jsonl")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["good.jsonl"]


def test_generate_json_prints_null_for_a_non_finite_logprob_and_names_it(capsys):
    assert _finite_or_null([-0.5, math.nan, -math.inf], 3, json_out=True) == [-0.5, None, None]
    err = capsys.readouterr().err
    assert "request 3, step 1: logprob is nan; null in --json" in err and "request 3, step 2: logprob is -inf" in err
    json.dumps([None], allow_nan=False)
    assert math.isnan(_finite_or_null([math.nan], 0, json_out=False)[0])      # the text output keeps the value


def test_the_generate_schema_takes_a_null_logprob_and_nothing_else_non_numeric():
    import jsonschema

    from lockstep.harness.jsonout import generate_document
    schema = json.loads((REPO / "docs" / "schemas" / "generate.schema.json").read_text())
    v = jsonschema.Draft202012Validator(schema)
    item = {"prompt": [1], "seed": None, "sampling": {"greedy": True, "temperature": 1.0, "top_k": 0,
            "top_p": 1.0, "min_p": 0.0, "max_new_tokens": 1, "stop_token_ids": None}, "tokens": [2],
            "finish_reason": "length", "logprobs": [None], "logprobs_bits": ["7fc00000"]}
    doc = json.loads(json.dumps(generate_document(checkpoint="c", checkpoint_digest="sha256:" + "0" * 64, platform="cpu-fp32",
                                                  backend="torch", results=[item]), allow_nan=False))
    assert not [e.message for e in v.iter_errors(doc)]
    doc["results"][0]["logprobs"] = ["NaN"]
    assert list(v.iter_errors(doc))
