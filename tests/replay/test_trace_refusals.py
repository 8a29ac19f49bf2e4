"""Bad traces are refused with a located one-line error and exit 2, never a traceback: one bit
edited, cut short, lines dropped, an unknown major version, another checkpoint, another platform."""

from __future__ import annotations

import json

import pytest

from lockstep.engine.generate import Request
from lockstep.engine.sampling import SamplingParams
from lockstep.harness.cli import main
from lockstep.harness.replay.format import TraceError, canonical, read_trace, record_hash, write_trace
from lockstep.harness.replay.record import record
from lockstep.harness.replay.run import Setup


@pytest.fixture(scope="module")
def trace_file(tmp_path_factory):
    reqs = [Request(list(range(20, 30)), SamplingParams(temperature=1.0, max_new_tokens=3, stop_token_ids=()), seed=4),
            Request([3, 1, 4, 1, 5], SamplingParams(greedy=True, max_new_tokens=3, stop_token_ids=()))]
    return write_trace(record(Setup({"path": "models/tiny-target"}), reqs),
                       tmp_path_factory.mktemp("t") / "trace.jsonl")


def refused(capsys, argv, *words):
    code = main(argv)
    err = capsys.readouterr().err
    assert code == 2, err
    assert err.count("\n") == 1 and "Traceback" not in err, err
    for w in words:
        assert w in err, err
    return err


def copy_with(tmp_path, trace_file, edit) -> str:
    data = bytearray(trace_file.read_bytes())
    edit(data)
    out = tmp_path / "edited.jsonl"
    out.write_bytes(bytes(data))
    return str(out)


def test_the_clean_trace_reads(trace_file):
    t = read_trace(trace_file)
    assert len(t.requests) == 2 and [len(s) for s in t.steps] == [3, 3]


@pytest.mark.parametrize("offset", [40, 700, -200])
def test_one_bit_edited_anywhere_is_refused(tmp_path, trace_file, capsys, offset):
    def flip(data):
        i = offset % len(data)
        while data[i] in b'\n"{}:,':             # a bit of a value, so the line still parses as JSON
            i += 1
        data[i] ^= 0x01
    path = copy_with(tmp_path, trace_file, flip)
    err = refused(capsys, ["replay", path, "--no-locate"], path + ":")
    assert "edited" in err or "not a JSON record" in err or "not a trace record" in err


def test_a_truncated_trace_is_refused(tmp_path, trace_file, capsys):
    lines = trace_file.read_bytes().splitlines(keepends=True)
    cut = copy_with(tmp_path, trace_file, lambda d: d.__delitem__(slice(len(d) - len(lines[-1]), None)))
    refused(capsys, ["replay", cut], "cut short")
    mid = copy_with(tmp_path, trace_file, lambda d: d.__delitem__(slice(len(d) // 2, None)))
    refused(capsys, ["replay", mid], "edited.jsonl:")


def test_dropped_line_breaks_the_chain(tmp_path, trace_file, capsys):
    lines = trace_file.read_bytes().splitlines(keepends=True)
    path = tmp_path / "dropped.jsonl"
    path.write_bytes(b"".join(lines[:3] + lines[4:]))
    refused(capsys, ["replay", str(path)], "dropped.jsonl:4", "hash chain broken")


def test_unknown_major_version_is_refused_first(tmp_path, trace_file, capsys):
    """A version-2 file with a valid chain: the version, not the chain, is what is named."""
    recs = [json.loads(line) for line in trace_file.read_text().splitlines()]
    recs[0]["version"] = "2.0"
    prev = ""
    for r in recs:
        r["prev"] = prev
        r["hash"] = prev = record_hash(prev, r)
    path = tmp_path / "v2.jsonl"
    path.write_bytes(b"\n".join(canonical(r) for r in recs) + b"\n")
    refused(capsys, ["replay", str(path)], "v2.jsonl:1", "major version 2", "reads major version 1")
    recs[0]["version"] = "1.7"                      # a newer minor version of major 1 reads fine
    prev = ""
    for r in recs:
        r["prev"] = prev
        r["hash"] = prev = record_hash(prev, r)
    path.write_bytes(b"\n".join(canonical(r) for r in recs) + b"\n")
    assert read_trace(path).manifest["version"] == "1.7"


def test_another_checkpoint_is_refused(trace_file, capsys, monkeypatch):
    """The trace names its checkpoint by weight digests: another folder (the tiny preset) is refused."""
    from lockstep.harness.replay import rerun as replay_mod
    t = read_trace(trace_file)
    setup = replay_mod.recorded_setup(t)
    setup.checkpoint = {"preset": "tiny", "seed": 0, "format": "bf16"}
    with pytest.raises(TraceError, match="recorded on another checkpoint .* weight tensors differ"):
        replay_mod.check_identity(t, setup)


def test_another_checkpoint_is_refused_by_the_cli(tmp_path, trace_file, capsys):
    recs = [json.loads(line) for line in trace_file.read_text().splitlines()]
    recs[0]["checkpoint"]["ref"] = {"preset": "tiny", "seed": 0, "format": "bf16"}
    prev = ""
    for r in recs:
        r["prev"] = prev
        r["hash"] = prev = record_hash(prev, r)
    path = tmp_path / "other-ckpt.jsonl"
    path.write_bytes(b"\n".join(canonical(r) for r in recs) + b"\n")
    refused(capsys, ["replay", str(path)], "another checkpoint", "weight tensors differ")


def test_another_platform_is_refused(trace_file):
    from lockstep.harness.replay import rerun as replay_mod
    t = read_trace(trace_file)
    t.manifest["platform"] = {**t.manifest["platform"], "name": "cuda-sm90-fp32", "golden_platform": "cuda-sm90-fp32"}
    with pytest.raises(TraceError, match="recorded on platform cuda-sm90-fp32, this replay runs on cpu-fp32"):
        replay_mod.check_identity(t, replay_mod.recorded_setup(t))


def test_a_missing_file_and_bad_overrides_are_usage_errors(tmp_path, trace_file, capsys):
    refused(capsys, ["replay", str(tmp_path / "nope.jsonl")], "no such trace file")
    refused(capsys, ["replay", str(trace_file), "--order", "0,0"], "--order must list every request")


def test_record_refuses_an_unseeded_sampled_request(tmp_path, capsys):
    reqs = tmp_path / "r.jsonl"
    reqs.write_text(json.dumps({"prompt": [1, 2, 3], "sampling": {"temperature": 1.0, "max_new_tokens": 2}}) + "\n")
    refused(capsys, ["record", str(tmp_path / "t.jsonl"), "--checkpoint", "models/tiny-target", "--requests", str(reqs)],
            "request 0: sampled without a seed")
    assert not (tmp_path / "t.jsonl").exists()


def test_replay_checkpoint_option_is_checked_by_digest(tmp_path, trace_file, capsys):
    """--checkpoint names the folder here; a copy of the same weights is accepted, another refused."""
    import shutil
    copy = tmp_path / "copy-of-tiny-target"
    shutil.copytree("models/tiny-target", copy)
    assert main(["replay", str(trace_file), "--checkpoint", str(copy), "--no-locate"]) == 0
    capsys.readouterr()
    refused(capsys, ["replay", str(trace_file), "--checkpoint", "models/tiny-eagle3"], "another checkpoint")
