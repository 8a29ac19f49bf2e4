"""The trace file's layout and every refusal of a hostile or garbled one, with its exact text
(harness/replay/format.py). No model runs here: the traces are built record by record."""

from __future__ import annotations

import hashlib
import json
import os
import stat

import pytest

from lockstep.harness.replay import format as fmt
from lockstep.harness.replay.format import Trace, TraceError, canonical, read_trace, record_hash, write_trace


def small_trace(rounds: bool = True) -> Trace:
    """Two requests: the first with two steps (and two verify rounds), the second with one step."""
    manifest = {"format": fmt.FORMAT, "version": fmt.TRACE_VERSION, "requests": 2, "note": "x"}
    requests = [{"index": 0, "tokens": 2, "prompt": [5, 6]}, {"index": 1, "tokens": 1, "prompt": [7]}]
    steps = [[{"request": 0, "step": 0, "token": 11}, {"request": 0, "step": 1, "token": 12}],
             [{"request": 1, "step": 0, "token": 13}]]
    rnds = [[{"request": 0, "round": 1, "accept_length": 1}, {"request": 0, "round": 2, "accept_length": 0}], []]
    return Trace(manifest, requests, steps, rnds if rounds else [])


def bare(records: list[dict]) -> list[dict]:
    """The records without their chain fields."""
    return [{k: v for k, v in r.items() if k not in ("prev", "hash")} for r in records]


def chained(records: list[dict]) -> bytes:
    """The file of `records` with a valid hash chain (whatever else is wrong with them)."""
    prev, lines = "", []
    for r in records:
        r = {**r, "prev": prev}
        r["hash"] = prev = record_hash(prev, r)
        lines.append(canonical(r))
    return b"\n".join(lines) + b"\n"


def records_of(path) -> list[dict]:
    return [json.loads(line) for line in path.read_bytes().splitlines()]


def refusal(path) -> str:
    with pytest.raises(TraceError) as e:
        read_trace(path)
    return str(e.value)


@pytest.fixture
def good(tmp_path):
    return write_trace(small_trace(), tmp_path / "t.jsonl")


def rewrite(path, edit) -> str:
    """Edit the trace's bare records and write them back with a valid chain; the path's text."""
    recs = bare(records_of(path))
    edit(recs)
    path.write_bytes(chained(recs))
    return str(path)


# ---------------------------------------------------------------- the layout
def test_canonical_json_is_sorted_compact_and_refuses_nan():
    assert canonical({"b": 1, "a": [1, 2.5, "é"]}) == '{"a":[1,2.5,"\\u00e9"],"b":1}'.encode()
    with pytest.raises(ValueError):
        canonical({"x": float("nan")})


def test_record_hash_is_sha256_over_prev_and_the_record_without_its_hash():
    rec = {"kind": "end", "records": 3, "prev": "ab"}
    want = hashlib.sha256(b'ab\n{"kind":"end","prev":"ab","records":3}').hexdigest()
    assert record_hash("ab", rec) == want
    assert record_hash("ab", {**rec, "hash": "anything"}) == want
    assert record_hash("", rec) != want


def test_float_bits_are_big_endian_float32():
    assert fmt.f32_bits(-1.5) == "bfc00000"
    assert fmt.f32_from_bits("bfc00000") == -1.5


def test_many_float_bits_at_once_are_each_ones_bits():
    import torch
    xs = [-1.5, 0.0, -0.0, float("inf"), float("-inf"), float("nan"), 1e-45, -3.4028234663852886e38, 0.1]
    xs += torch.randn(200, generator=torch.Generator().manual_seed(3)).tolist()
    assert fmt.f32_bits_all(xs) == [fmt.f32_bits(x) for x in xs]
    assert fmt.f32_bits_all([]) == []


def test_records_are_manifest_requests_then_each_requests_steps_and_rounds():
    kinds = [(r["kind"], r.get("request"), r.get("step"), r.get("round")) for r in small_trace().records()]
    assert kinds == [("manifest", None, None, None), ("request", None, None, None), ("request", None, None, None),
                     ("step", 0, 0, None), ("step", 0, 1, None), ("round", 0, None, 1), ("round", 0, None, 2),
                     ("step", 1, 0, None)]
    assert [r["kind"] for r in small_trace(rounds=False).records()] == ["manifest", "request", "request",
                                                                        "step", "step", "step"]


def test_the_written_file_in_full(good):
    """Canonical lines, each chained to the one before, an end record counting the others, a final newline."""
    raw = good.read_bytes()
    assert raw.endswith(b"}\n") and not raw.endswith(b"\n\n")
    lines = raw.split(b"\n")[:-1]
    recs = [json.loads(x) for x in lines]
    assert [canonical(r) for r in recs] == lines
    assert recs[-1] == {"kind": "end", "records": 8, "prev": recs[-2]["hash"], "hash": recs[-1]["hash"]}
    prev = ""
    for r in recs:
        assert r["prev"] == prev and r["hash"] == record_hash(prev, r)
        prev = r["hash"]
    assert bare(recs) == small_trace().records() + [{"kind": "end", "records": 8}]


def test_write_is_atomic_with_mode_0644(tmp_path, monkeypatch):
    old = os.umask(0o077)
    try:
        path = write_trace(small_trace(), tmp_path / "t.jsonl")
    finally:
        os.umask(old)
    assert path == tmp_path / "t.jsonl"
    assert stat.S_IMODE(path.stat().st_mode) == 0o644
    assert sorted(p.name for p in tmp_path.iterdir()) == ["t.jsonl"]
    seen = []
    real = os.replace

    def failing_replace(src, dst):
        seen.append((os.path.dirname(src), os.path.basename(src)))
        raise OSError("disk full")
    monkeypatch.setattr(os, "replace", failing_replace)
    with pytest.raises(OSError, match="disk full"):
        write_trace(small_trace(), tmp_path / "u.jsonl")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["t.jsonl"]     # the temporary file is gone
    folder, name = seen[0]
    assert folder == str(tmp_path) and name.startswith("u.jsonl.") and name.endswith(".tmp-lockstep")
    monkeypatch.setattr(os, "replace", real)
    monkeypatch.chdir(tmp_path)
    assert read_trace(write_trace(small_trace(), "rel.jsonl")).requests == small_trace().requests


def test_a_written_trace_reads_back_as_it_was(good):
    t = read_trace(good)
    want = small_trace()
    assert (t.manifest, t.requests, t.steps, t.rounds) == (want.manifest, want.requests, want.steps, want.rounds)


# ---------------------------------------------------------------- refusals, each with its text
def test_too_big_missing_unreadable_and_empty_files(tmp_path, good, monkeypatch):
    size = good.stat().st_size
    monkeypatch.setattr(fmt, "MAX_TRACE_BYTES", size)
    assert len(read_trace(good).requests) == 2                     # exactly the limit reads
    monkeypatch.setattr(fmt, "MAX_TRACE_BYTES", size - 1)
    assert refusal(good) == f"{good}: larger than {size - 1} bytes; refused"
    monkeypatch.undo()
    assert refusal(tmp_path / "nope") == f"{tmp_path / 'nope'}: no such trace file"
    assert refusal(tmp_path) == f"{tmp_path}: a folder, not a regular trace file: refused"
    empty = tmp_path / "e.jsonl"
    empty.write_bytes(b"")
    assert refusal(empty) == f"{empty}: empty file, not a trace"
    empty.write_bytes(b"\n")                                 # one empty line: a record that is not JSON
    assert refusal(empty) == f"{empty}:1: not a JSON record (the file is cut short or edited)"


def test_a_trace_without_its_final_newline_reads(good):
    good.write_bytes(good.read_bytes().rstrip(b"\n"))
    assert len(read_trace(good).requests) == 2


def test_a_blank_line_inside_or_two_at_the_end_is_not_json(good):
    raw = good.read_bytes()
    good.write_bytes(raw + b"\n")
    assert refusal(good) == f"{good}:10: not a JSON record (the file is cut short or edited)"
    good.write_bytes(raw.replace(b"\n", b"\n\n", 1))
    assert refusal(good) == f"{good}:2: not a JSON record (the file is cut short or edited)"
    good.write_bytes(b"\xff\xfe" + raw)
    assert refusal(good) == f"{good}:1: not a JSON record (the file is cut short or edited)"


@pytest.mark.parametrize("line", [b"[1, 2]", b'{"kind": "note"}', b'{"prev": ""}', b"7"])
def test_a_record_that_is_not_a_trace_record(good, line):
    raw = good.read_bytes().split(b"\n")
    good.write_bytes(b"\n".join(raw[:3] + [line] + raw[4:]))
    assert refusal(good) == f"{good}:4: not a trace record (kind must be one of manifest, request, step, round, end)"


def test_the_first_record_must_be_a_lockstep_manifest(good):
    text = f"{good}:1: not a lockstep-trace file (its first record must be the manifest)"
    recs = bare(records_of(good))
    good.write_bytes(chained(recs[1:2] + recs[:1] + recs[2:]))
    assert refusal(good) == text
    good.write_bytes(chained([{**recs[0], "format": "lockstep-trac"}] + recs[1:]))
    assert refusal(good) == text
    good.write_bytes(chained([{k: v for k, v in recs[0].items() if k != "format"}] + recs[1:]))
    assert refusal(good) == text


@pytest.mark.parametrize("version, text", [
    ("x.1", "trace version 'x.1' is not MAJOR.MINOR"),
    (None, "trace version '' is not MAJOR.MINOR"),
    ("", "trace version '' is not MAJOR.MINOR"),
    ("2.0", "trace format version 2.0 has major version 2; this lockstep reads major version 1 only"),
    ("0.9", "trace format version 0.9 has major version 0; this lockstep reads major version 1 only"),
    ("11", "trace format version 11 has major version 11; this lockstep reads major version 1 only"),
])
def test_a_version_this_reader_cannot_read(good, version, text):
    def edit(recs):
        if version is None:
            del recs[0]["version"]
        else:
            recs[0]["version"] = version
    rewrite(good, edit)
    assert refusal(good) == f"{good}:1: {text}"


@pytest.mark.parametrize("version", ["1", "1.9", "01.0", 1])
def test_any_version_of_major_1_reads(good, version):
    rewrite(good, lambda recs: recs[0].update(version=version))
    assert read_trace(good).manifest["version"] == version


def test_a_second_manifest(good):
    rewrite(good, lambda recs: recs.insert(2, recs[0]))
    assert refusal(good) == f"{good}:3: a second manifest"


def test_a_broken_chain_and_an_edited_line(good):
    lines = good.read_bytes().split(b"\n")
    good.write_bytes(b"\n".join(lines[:4] + lines[5:]))
    assert refusal(good) == (f"{good}:5: hash chain broken (prev does not name line 4's hash): "
                             f"lines were dropped, reordered or edited")
    rec = json.loads(lines[0])
    rec["prev"] = "00"
    good.write_bytes(b"\n".join([canonical(rec)] + lines[1:]))
    assert refusal(good) == (f"{good}:1: hash chain broken (prev does not name line 0's hash): "
                             f"lines were dropped, reordered or edited")
    rec = json.loads(lines[3])
    rec["token"] += 1
    good.write_bytes(b"\n".join(lines[:3] + [canonical(rec)] + lines[4:]))
    assert refusal(good) == f"{good}:4: record hash mismatch: this line was edited"
    rec = json.loads(lines[3])
    del rec["hash"]
    good.write_bytes(b"\n".join(lines[:3] + [canonical(rec)] + lines[4:]))
    assert refusal(good) == f"{good}:4: record hash mismatch: this line was edited"


def test_no_end_record_or_a_wrong_count(good):
    recs = bare(records_of(good))
    good.write_bytes(chained(recs[:-1]))
    assert refusal(good) == f"{good}:8: the trace has no end record: it was cut short"
    good.write_bytes(chained(recs[:-1] + [{"kind": "end", "records": 7}]))
    assert refusal(good) == f"{good}:9: the end record counts 7 records, the file has 8"
    good.write_bytes(chained(recs[:-1] + [{"kind": "end"}]))
    assert refusal(good) == f"{good}:9: the end record counts None records, the file has 8"


@pytest.mark.parametrize("requests, text", [
    (3, "the manifest lists 3 requests, the file holds 2"),
    ("2", "the manifest lists 2 requests, the file holds 2"),
    (None, "the manifest lists None requests, the file holds 2"),
])
def test_the_manifest_must_count_the_requests(good, requests, text):
    rewrite(good, lambda recs: recs[0].update(requests=requests))
    assert refusal(good) == f"{good}: {text}"


@pytest.mark.parametrize("index", [2, -1, "0", None])
def test_a_step_or_round_of_no_request(good, index):
    rewrite(good, lambda recs: recs[6].update(request=index))
    assert refusal(good) == f"{good}:7: request index {index!r} is outside [0, 2)"


def test_a_step_of_the_last_request_reads(good):
    t = read_trace(good)
    assert t.steps[1] == [{"request": 1, "step": 0, "token": 13}] and t.rounds[1] == []
    assert t.rounds[0] == [{"request": 0, "round": 1, "accept_length": 1}, {"request": 0, "round": 2, "accept_length": 0}]


@pytest.mark.parametrize("edit, text", [
    (lambda recs: recs[2].update(index=0), "request record 1 carries index 0"),
    (lambda recs: recs[1].pop("index"), "request record 0 carries index None"),
    (lambda recs: recs[4].update(step=2), "request 0's steps are not numbered 0, 1, ..."),
    (lambda recs: recs[7].update(step=1), "request 1's steps are not numbered 0, 1, ..."),
    (lambda recs: recs[5].update(round=0), "request 0's verify rounds are not numbered 1, 2, ..."),
    (lambda recs: recs[6].update(round=3), "request 0's verify rounds are not numbered 1, 2, ..."),
    (lambda recs: recs[2].update(tokens=2), "request 1 lists 2 tokens, the file holds 1 steps"),
    (lambda recs: recs[1].pop("tokens"), "request 0 lists None tokens, the file holds 2 steps"),
])
def test_the_requests_steps_and_rounds_must_agree(good, edit, text):
    rewrite(good, edit)
    assert refusal(good) == f"{good}: {text}"


def test_a_non_finite_number_is_refused_before_anything_is_written(tmp_path):
    t = small_trace()
    t.steps[0][1]["logprob"] = float("nan")                   # record 5: manifest, 2 requests, then steps
    path = tmp_path / "t.jsonl"
    with pytest.raises(TraceError) as e:
        write_trace(t, path)
    assert str(e.value) == (f"{path}: record 5 (step) (request 0, step 1): logprob is nan; a trace holds finite "
                            f"numbers only (non-finite weights or logits?); nothing written")
    assert list(tmp_path.iterdir()) == []


def test_a_non_finite_number_in_a_file_is_refused_with_its_line(good):
    lines = good.read_bytes().splitlines()
    rec = json.loads(lines[4])
    rec["logprob"] = float("inf")                               # json writes Infinity, which json reads back
    lines[4] = json.dumps(rec).encode()
    good.write_bytes(b"\n".join(lines) + b"\n")
    assert refusal(good) == (f"{good}:5: logprob (request 0, step 1) is inf, not a finite number (JSON has no NaN "
                             f"or infinity): refused")
