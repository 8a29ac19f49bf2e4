"""Hostile input, round three (issue 39): the replay-side commands (record, replay, import-peer,
promote, doctor, suite) and the selection messages get check's error boundary. Each input gives
one line naming the problem (its file, and line where there is one), exit 2, and writes nothing;
none is a vacuous pass and none an internal error."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import time

import pytest

from lockstep.engine.generate import Request
from lockstep.engine.sampling import SamplingParams
from lockstep.harness.cli import build_parser, main
from lockstep.harness.replay.format import Trace, read_trace, write_trace
from lockstep.harness.replay.record import record
from lockstep.harness.replay.run import Setup
from tests.conftest import REPO

TARGET = "models/tiny-target"
VOCAB = json.loads((REPO / TARGET / "config.json").read_text())["vocab_size"]


@pytest.fixture(scope="module")
def trace(tmp_path_factory):
    reqs = [Request([3, 1, 4, 1, 5], SamplingParams(greedy=True, max_new_tokens=2, stop_token_ids=()))]
    return record(Setup({"path": TARGET}), reqs)


@pytest.fixture(autouse=True)
def at_root(monkeypatch):
    monkeypatch.chdir(REPO)          # the checkpoints are named relative to the project root


def refused(capsys, argv, *words) -> str:
    """Exit 2, one line on stderr naming each of `words`, no traceback, nothing on stdout."""
    code = main([str(a) for a in argv])
    out = capsys.readouterr()
    assert code == 2, out.err + out.out
    assert out.err.count("\n") == 1 and "Traceback" not in out.err and "internal error" not in out.err, out.err
    for w in words:
        assert str(w) in out.err, out.err
    return out.err


def written(tmp_path, t: Trace, name: str, edit=None):
    t = Trace(json.loads(json.dumps(t.manifest)), json.loads(json.dumps(t.requests)),
              json.loads(json.dumps(t.steps)), [[] for _ in t.requests])
    if edit:
        edit(t)
    return write_trace(t, tmp_path / name)


def peer_file(tmp_path, tokens, logprobs, name="peer.jsonl"):
    path = tmp_path / name
    path.write_text(json.dumps({"prompt_ids": [3, 1, 4], "response_ids": tokens, "logprobs": logprobs}) + "\n")
    return path


# ---------------------------------------------------------------- vacuous passes
def test_replay_of_a_trace_without_requests_is_an_error_not_a_pass(tmp_path, trace, capsys):
    def empty(t):
        t.manifest["requests"] = 0
        t.requests, t.steps, t.rounds = [], [], []
    path = written(tmp_path, trace, "empty.jsonl", empty)
    assert read_trace(path).requests == []                    # a consistent file: the chain holds
    refused(capsys, ["replay", path], path, "nothing to replay")
    refused(capsys, ["promote", path, "replay/x", "--specs", tmp_path], "nothing to replay")
    assert not (tmp_path / "replay").exists()


@pytest.mark.parametrize("value, words", [(math.nan, ":1: logprobs[1] is nan, not a finite number"),
                                          (3.0, "not a log-probability"),
                                          (-1e300, "beyond float32")])
def test_import_peer_refuses_numbers_that_are_not_logprobs(tmp_path, capsys, value, words):
    path = peer_file(tmp_path, [5, 6], [-0.5, value])
    out = tmp_path / "peer-trace.jsonl"
    err = refused(capsys, ["import-peer", path, "--format", "rollouts", "--checkpoint", TARGET, "--out", out],
                  path, words)
    assert not out.exists() and list(tmp_path.iterdir()) == [path]
    if math.isnan(value) or value < 0:        # NaN: named by the reader, by line and field
        return
    assert "request 0, token 1" in err


# ---------------------------------------------------------------- internal errors for a user's file
def test_a_manifest_without_settings_is_located(tmp_path, trace, capsys):
    path = written(tmp_path, trace, "nosettings.jsonl", lambda t: t.manifest.pop("settings"))
    refused(capsys, ["replay", path], f"{path}:1", "'settings'")
    refused(capsys, ["promote", path, "replay/x", "--specs", tmp_path], f"{path}:1", "'settings'")


def test_a_token_beyond_the_vocabulary_is_located(tmp_path, trace, capsys):
    def far(t):
        t.steps[0][1]["token"] = 99999
    path = written(tmp_path, trace, "far.jsonl", far)
    refused(capsys, ["replay", path, "--mode", "teacher-forced"], f"{path}:4", "99999", f"[0, {VOCAB})")
    peer = peer_file(tmp_path, [5, 99999], [-0.5, -1.0])
    refused(capsys, ["import-peer", peer, "--format", "rollouts", "--checkpoint", TARGET], peer, "request 0, token 1",
            "99999", "vocabulary")


def test_doctor_inputs_has_a_ceiling(capsys):
    start = time.perf_counter()
    code = main(["doctor", "--inputs", "1000000000000"])
    assert code == 2 and "must be at most" in capsys.readouterr().err and time.perf_counter() - start < 5


def test_record_of_a_million_requests_is_refused_up_front_by_its_bounds(tmp_path, capsys):
    reqs = tmp_path / "many.jsonl"
    reqs.write_text('{"prompt": [1, 2, 3], "sampling": {"greedy": true, "max_new_tokens": 4}}\n' * 10**6)
    out = tmp_path / "t.jsonl"
    start = time.perf_counter()
    refused(capsys, ["record", out, "--checkpoint", TARGET, "--requests", reqs], f"{reqs}:4097",
            "more than 4096 requests")
    assert time.perf_counter() - start < 60 and not out.exists()
    reqs.write_text('{"prompt": [1, 2, 3], "sampling": {"greedy": true, "max_new_tokens": 60000}}\n' * 40)
    refused(capsys, ["record", out, "--checkpoint", TARGET, "--requests", reqs, "--max-seconds", "inf"],
            "KV cache", "above --max-gb", "40 request(s)")
    assert not out.exists()


# ---------------------------------------------------------------- record's cost bound, as generate's
def test_record_has_generates_time_bound(tmp_path, capsys):
    out = tmp_path / "t.jsonl"
    start = time.perf_counter()
    refused(capsys, ["record", out, "--checkpoint", TARGET, "--prompt-ids", "1,2,3", "--max-new-tokens", "100000"],
            "would take about", "above --max-seconds 300", "pass --max-seconds")
    assert time.perf_counter() - start < 30 and not out.exists()
    refused(capsys, ["record", out, "--checkpoint", TARGET, "--prompt-ids", "1,2,3", "--max-new-tokens", "100000",
                     "--max-seconds", "inf", "--max-gb", "0.1"], "0.41 GB KV cache", "above --max-gb 0.1")
    assert not out.exists()


# ---------------------------------------------------------------- messages naming the file
def test_a_request_file_that_is_not_utf8_is_named(tmp_path, capsys):
    reqs = tmp_path / "reqs.jsonl"
    reqs.write_bytes(b'{"prompt": [1, 2]}\n\xff\xfe\n')
    refused(capsys, ["record", tmp_path / "t.jsonl", "--checkpoint", TARGET, "--requests", reqs], reqs, "not UTF-8")


def test_a_peer_file_that_is_not_utf8_is_named(tmp_path, capsys):
    peer = tmp_path / "peer.json"
    peer.write_bytes(b"\xff\xfe{}")
    refused(capsys, ["import-peer", peer, "--format", "sglang", "--checkpoint", TARGET], peer, "not UTF-8")


@pytest.mark.parametrize("line, words", [("[1, 2, 3]", "line 1: expected an object"),
                                         ('{"prompt": "abc"}', '"prompt" must be'),
                                         ('{"prompt": [1, 2], "sampling": [1]}', '"sampling" must be an object'),
                                         ('{"prompt": [1, 2], "seed": 1e3}', '"seed" must be')])
def test_a_request_line_of_the_wrong_shape_is_located(tmp_path, capsys, line, words):
    reqs = tmp_path / "reqs.jsonl"
    reqs.write_text(line + "\n")
    err = refused(capsys, ["record", tmp_path / "t.jsonl", "--checkpoint", TARGET, "--requests", reqs], f"{reqs}:1")
    assert words.replace("line 1", f"{reqs}:1") in err or words in err


def test_record_out_is_checked_before_any_work(tmp_path, capsys, monkeypatch):
    def no_run(*a, **k):
        raise AssertionError("the recording ran before OUT was checked")
    monkeypatch.setattr("lockstep.harness.replay.record.record", no_run)
    refused(capsys, ["record", tmp_path, "--checkpoint", TARGET, "--prompt-ids", "1,2"], tmp_path, "is a directory")
    missing = tmp_path / "nowhere" / "t.jsonl"
    refused(capsys, ["record", missing, "--checkpoint", TARGET, "--prompt-ids", "1,2"], tmp_path / "nowhere",
            "does not exist")
    assert list(tmp_path.iterdir()) == []


def test_lockstep_suite_without_specs_names_the_value(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("LOCKSTEP_SUITE", str(tmp_path))
    refused(capsys, ["suite"], f"LOCKSTEP_SUITE={tmp_path}", "no specs/")


def test_a_pattern_naming_only_a_file_that_is_not_a_spec_says_so(tmp_path, capsys, monkeypatch):
    (tmp_path / "specs" / "coins").mkdir(parents=True)
    (tmp_path / "specs" / "coins" / "other.yml").write_text("kind: coins\n")
    monkeypatch.chdir(tmp_path)
    for command in ("check", "validate", "list"):
        refused(capsys, [command, "coins/other"], "no spec matches 'coins/other'", "specs/coins/other.yml",
                "end in .yaml")


# ---------------------------------------------------------------- papercuts
def test_record_seed_takes_one_seed_per_prompt_as_generate_does(tmp_path, capsys):
    out = tmp_path / "t.jsonl"
    assert main(["record", str(out), "--checkpoint", TARGET, "--prompt-ids", "1,2,3", "--prompt-ids", "4,5",
                 "--seed", "3,4", "--max-new-tokens", "2"]) == 0
    assert [r["seed"] for r in read_trace(out).requests] == [3, 4]
    capsys.readouterr()
    refused(capsys, ["record", out, "--checkpoint", TARGET, "--prompt-ids", "1,2", "--seed", "3,4,5"],
            "3 seeds for 1 prompts")


def test_every_record_option_has_help_text():
    sub = next(a for a in build_parser()._actions if a.dest == "command")
    for name in ("record", "replay", "import-peer", "promote"):
        bare = [a.option_strings or a.dest for a in sub.choices[name]._actions if not a.help]
        assert not bare, f"{name}: options without help text: {bare}"


def test_a_missing_dependency_names_the_package_and_its_install(tmp_path):
    probe = ("import sys; sys.modules['deepdiff'] = None; from lockstep.harness.cli import main; "
             "sys.exit(main(sys.argv[1:]))")
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.run([sys.executable, "-c", probe, "check", "coins/known-answers", "--dtype", "fp32",
                           "--backend", "torch"], cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2, proc.stderr
    assert "'deepdiff'" in proc.stderr and "pip install deepdiff" in proc.stderr
    assert "internal error" not in proc.stderr and proc.stderr.count("\n") == 1, proc.stderr
