"""`replay --dp N` and `import-peer --dp N` spread a trace's requests over N data-parallel ranks
(harness.replay.spread, Lockstep's launcher, gloo on the CPU) and print the same document and exit
code as one process, bit for bit, for a trace with divergences planted in some of its requests;
a wrong gathering planted in the parent shows."""

from __future__ import annotations

import json

import pytest

from lockstep.harness.cli import main
from lockstep.harness.replay import spread
from lockstep.harness.replay.format import f32_from_bits, read_trace, write_trace

# one xdist worker runs the module: the trace is recorded once
pytestmark = pytest.mark.xdist_group("replay-ranks")

PROMPTS = [[3, 5, 7], list(range(20, 31)), [9, 300, 41], [100, 101, 102, 103, 104, 105], [8, 2], [450, 7, 7, 1]]


@pytest.fixture(scope="module")
def traces(tmp_path_factory):
    """{"clean": path, "edited": path}: six requests (seeded and greedy, of several lengths); the
    edited copy has request 1's step 2 logprob one ULP off and request 4's step 1 another token."""
    root = tmp_path_factory.mktemp("ranks")
    clean, edited = root / "clean.jsonl", root / "edited.jsonl"
    args = ["record", str(clean), "--checkpoint", "models/tiny-target", "--max-new-tokens", "4", "--seed",
            "11,0,12,13,14,15"]
    for p in PROMPTS:
        args += ["--prompt-ids", ",".join(map(str, p))]
    assert main(args) == 0
    t = read_trace(clean)
    s = t.steps[1][2]
    s["logprob_bits"] = f"{int(s['logprob_bits'], 16) + 1:08x}"
    s["logprob"] = f32_from_bits(s["logprob_bits"])
    t.steps[4][1]["token"] = (t.steps[4][1]["token"] + 1) % 500
    write_trace(t, edited)
    return {"clean": clean, "edited": edited}


def _replay(capsys, trace, *extra) -> tuple[int, str]:
    code = main(["replay", str(trace), "--json", *extra])
    return code, capsys.readouterr().out


@pytest.mark.parametrize("mode", ["free-run", "teacher-forced"])
def test_one_two_and_three_ranks_print_the_same_document(traces, capsys, mode):
    one = _replay(capsys, traces["edited"], "--mode", mode)
    assert one[0] == 1
    doc = json.loads(one[1])
    assert doc["first"]["request"] in (1, 4) and doc["counts"]["bitwise"] < sum(doc["counts"].values())
    for dp in ("2", "3"):
        assert _replay(capsys, traces["edited"], "--mode", mode, "--dp", dp) == one, dp


def test_ranks_keep_the_batch_order_and_chunking_asked_for(traces, capsys):
    args = ("--mode", "teacher-forced", "--order", "5,3,1,0,2,4", "--max-batch", "2", "--prefill-chunk", "2",
            "--no-locate")
    one = _replay(capsys, traces["clean"], *args)
    assert one[0] == 0 and json.loads(one[1])["bitwise"]
    assert _replay(capsys, traces["clean"], *args, "--dp", "4") == one


def test_a_wrong_gathering_shows(traces, capsys, monkeypatch):
    """Planted: the ranks' outcomes handed back in reverse rank order (each rank's results under
    another rank's request indices): the document is no longer one process's."""
    one = _replay(capsys, traces["edited"], "--no-locate")
    on_ranks = spread._on_ranks
    monkeypatch.setattr(spread, "_on_ranks", lambda n, args, device: on_ranks(n, args, device)[::-1])
    assert _replay(capsys, traces["edited"], "--no-locate", "--dp", "2") != one


def test_import_peer_over_ranks_gives_the_same_report(traces, tmp_path, capsys):
    """A peer's rollouts (the clean trace's tokens, one logprob moved past the threshold), raw and
    temperature-processed logprobs (a StepLog per rank that also keeps the processed values)."""
    t = read_trace(traces["clean"])
    rows = []
    for r, steps in zip(t.requests, t.steps):
        lps = [f32_from_bits(s["logprob_bits"]) for s in steps]
        rows.append({"prompt_ids": r["prompt"], "response_ids": [s["token"] for s in steps], "logprobs": lps})
    rows[2]["logprobs"][1] -= 0.01
    peer = tmp_path / "peer.jsonl"
    peer.write_text("".join(json.dumps(r) + "\n" for r in rows))
    for extra in ([], ["--peer-logprobs", "temperature", "--temperature", "0.7"]):
        args = ["import-peer", str(peer), "--format", "rollouts", "--checkpoint", "models/tiny-target", "--json",
                "--device", "cpu", *extra]
        got = []
        for dp in ([], ["--dp", "2"], ["--dp", "3"]):
            got.append((main(args + dp), capsys.readouterr().out))
        assert got[0][0] == 1 and json.loads(got[0][1])["first_off"], extra
        assert got[1] == got[0] and got[2] == got[0], extra


def test_speculative_free_run_over_ranks(tmp_path, capsys):
    """Tree speculative decoding: draft trees and accept lengths judged per request, each rank a
    target and draft of its own."""
    trace = tmp_path / "tree.jsonl"
    assert main(["record", str(trace), "--checkpoint", "models/tiny-target", "--draft", "models/tiny-eagle3",
                 "--draft-topk", "2", "--num-steps", "2", "--draft-token-num", "4", "--max-new-tokens", "5",
                 "--seed", "8", "--prompt-ids", "40,41,42,43,44", "--prompt-ids", "3,5,7", "--prompt-ids", "9,9"]) == 0
    capsys.readouterr()
    one = _replay(capsys, trace)
    assert one[0] == 0 and json.loads(one[1])["bitwise"]
    assert _replay(capsys, trace, "--dp", "2") == one


@pytest.mark.parametrize("args, words", [
    (["--dp", "2", "--tp", "2"], "--dp 2 with --tp 2 --ep 1: data-parallel ranks each run a whole model"),
    (["--dp", "0"], "argument --dp: must be at least 1, got 0"),
    (["--dp", "65"], "argument --dp: must be at most 64, got 65"),
])
def test_what_cannot_spread_is_a_usage_error(traces, capsys, args, words):
    assert main(["replay", str(traces["clean"]), *args]) == 2
    assert words in capsys.readouterr().err


def test_the_degree_under_torchrun_is_its_world(monkeypatch):
    from lockstep.engine import world
    monkeypatch.setattr(world, "joined", lambda: 3)
    assert spread.degree(None, 1, 1) == 3 and spread.degree(3, 1, 1) == 3
    assert spread.degree(None, 2, 1) == 1                    # a topology runs on the world as before
    with pytest.raises(ValueError, match="torchrun's world has 3 ranks"):
        spread.degree(2, 1, 1)
    monkeypatch.setattr(world, "joined", lambda: 0)
    assert spread.degree(None, 1, 1) == 1 and spread.degree(5, 1, 1) == 5


def test_shares_are_round_robin_in_run_order():
    assert spread.shares([5, 3, 1, 0, 2, 4], 4) == [[5, 2], [3, 4], [1], [0]]
    assert spread.shares([0, 1], 3) == [[0], [1], []]


def test_a_failed_rank_is_named_not_the_busy_ones_stopped_after_it(monkeypatch):
    from lockstep.engine import launch as launcher

    def failing(*args, **kwargs):
        raise launcher.RankFailure("launch(world_size=3) failed ...", {0: "hung: still running, no result; killed",
                                                                     1: "raised MemoryError", 2: "finished"})
    monkeypatch.setattr(launcher, "launch", failing)
    with pytest.raises(RuntimeError, match=r"^data-parallel run of 3 ranks failed: rank 1 raised MemoryError\n"):
        spread._on_ranks(3, (), "cpu")
