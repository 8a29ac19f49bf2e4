"""The replay spec kind validates what it takes at load time, located (file:line:col), as the other
kinds do: edits against the spec's own requests, steps and rounds; number bounds; prompt ids against
the checkpoint's vocabulary; the expectations' shapes. A run never reaches an IndexError."""

import shutil
import textwrap
from types import SimpleNamespace

import pytest

from lockstep.harness.cli import main
from lockstep.harness.kinds import replay as replay_kind
from lockstep.harness.specfile import SpecErrors, parse_spec
from tests.conftest import REPO

SPEC = """\
kind: replay
description: a replay spec
inputs:
  checkpoint: {path: models/tiny-target}
  requests:
    - prompt: [5, 9, 2]
      sampling: {greedy: true, max_new_tokens: 3, stop_token_ids: []}
  edits:
    - EDIT
expect:
  ok: false
  counts: COUNTS
"""


def spec(edit="{request: 0, step: 1, field: logprob, ulp: 3}", counts="{bitwise: 2, bits: 1}", **swap):
    text = SPEC.replace("EDIT", edit).replace("COUNTS", counts)
    for old, new in swap.items():
        text = text.replace(old.replace("_", " "), new)
    return text


def errors(text):
    with pytest.raises(SpecErrors) as e:
        parse_spec(textwrap.dedent(text), "r.yaml", "replay/r", root=REPO)
    return e.value.errors


def test_the_base_spec_is_valid():
    parse_spec(spec(), "r.yaml", "replay/r", root=REPO)


@pytest.mark.parametrize("edit,line,path,words", [
    ("{request: 5, step: 0, field: logprob, ulp: 3}", 9, "inputs.edits[0].request", "not in the spec's 1 request"),
    ("{request: 0, step: 99, field: logprob, ulp: 3}", 9, "inputs.edits[0].step", "beyond request 0's max_new_tokens 3"),
    ("{request: 0, round: 1, field: accept_length, add: 1}", 9, "inputs.edits[0]", "no speculative decoding"),
    ("{request: 0, step: 0, field: logprob, ulp: 1000000000000000000}", 9, "inputs.edits[0].ulp", "<= 16777216"),
    ("{request: 0, step: 0, field: token, add: 0.5}", 9, "inputs.edits[0].add", "a whole number"),
    ("{request: 0, step: 0, field: token, add: 1e300}", 9, "inputs.edits[0].add", "<= 1000000.0"),
    ("{request: 0, step: 0, field: token, ulp: 1}", 9, "inputs.edits[0].ulp", "takes add, not ulp"),
    ("{field: source, set: [1]}", 9, "inputs.edits[0].set", "sets a string"),
])
def test_an_edit_the_spec_cannot_record_is_refused_where_it_is(edit, line, path, words):
    errs = errors(spec(edit))
    assert len(errs) == 1, errs
    assert (errs[0].line, errs[0].path) == (line, path) and words in errs[0].message, errs[0]


@pytest.mark.parametrize("counts,path,words", [
    ("garbage", "expect.counts", "a mapping"),
    ("{bitwise: -1}", "expect.counts.bitwise", ">= 0"),
    ("{bitwize: 3}", "expect.counts.bitwize", "unknown key"),
])
def test_expect_counts_is_a_mapping_of_verdicts(counts, path, words):
    errs = errors(spec(counts=counts))
    assert len(errs) == 1 and errs[0].path == path and words in errs[0].message, errs
    assert errs[0].line == 12


def test_a_prompt_id_outside_the_vocabulary_is_refused():
    errs = errors(spec().replace("prompt: [5, 9, 2]", "prompt: [5, 9, 123456789]"))
    assert len(errs) == 1 and errs[0].path == "inputs.requests[0].prompt" and "outside the checkpoint's vocabulary" \
        in errs[0].message and errs[0].line == 6


def test_near_tie_and_threshold_are_not_negative():
    errs = errors(spec().replace("  edits:", "  near_tie: -1\n  edits:"))
    assert len(errs) == 1 and errs[0].path == "inputs.near_tie"


def test_validate_exits_2_with_one_located_line(tmp_path, monkeypatch, capsys):
    (tmp_path / "specs" / "replay").mkdir(parents=True)
    (tmp_path / "specs" / "replay" / "r.yaml").write_text(spec("{request: 0, step: 99, field: logprob, ulp: 3}"))
    shutil.copytree(REPO / "models" / "tiny-target", tmp_path / "models" / "tiny-target")
    monkeypatch.chdir(tmp_path)
    assert main(["validate"]) == 2
    out = capsys.readouterr().out.splitlines()
    assert out == ["specs/replay/r.yaml:9:26: inputs.edits[0].step: step 99 is beyond request 0's max_new_tokens 3 "
                   "(steps count from 0)", "0 spec(s) valid, 1 invalid"]


def test_an_edit_past_an_early_stop_is_named_not_an_index_error():
    trace = SimpleNamespace(steps=[[{"logprob_bits": "bf800000"}]], rounds=None)
    spec_ = SimpleNamespace(inputs={"edits": [{"field": "logprob", "request": 0, "step": 2, "ulp": 1, "add": None}]})
    with pytest.raises(ValueError, match=r"inputs.edits\[0\]: the recording has no logprob at request 0, step 2 "
                                         r"\(request 0 recorded 1 step"):
        replay_kind.judge(spec_, trace)
