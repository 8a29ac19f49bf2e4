"""A promoted trace becomes a generate spec; regen records its golden (two identical runs), check
passes, and a mutated engine fails it. Promote refuses a trace that does not replay bitwise."""

from __future__ import annotations

import pytest
import yaml

import lockstep.kernels.attention
import lockstep.engine.model
from lockstep.engine.generate import Request
from lockstep.engine.sampling import SamplingParams
from lockstep.harness.cli import main
from lockstep.harness.replay.format import TraceError, read_trace, write_trace
from lockstep.harness.replay.promote import promote
from lockstep.harness.replay.record import record
from lockstep.harness.replay.run import Setup
from tests.engine import planted

PRESET = {"preset": "tiny", "seed": 0, "format": "bf16"}    # synthetic: a scratch project needs no folder


@pytest.fixture(scope="module")
def trace(tmp_path_factory):
    reqs = [Request(list(range(30, 44)), SamplingParams(temperature=0.8, max_new_tokens=5, stop_token_ids=()), seed=9),
            Request([4, 8, 15, 16, 23, 42], SamplingParams(greedy=True, max_new_tokens=4))]
    return write_trace(record(Setup(PRESET, prefill_chunk=4), reqs), tmp_path_factory.mktemp("t") / "trace.jsonl")


def test_promoted_spec_is_guarded_by_check(tmp_path, trace, monkeypatch, capsys):
    monkeypatch.delenv("CI", raising=False)
    specs, golden = tmp_path / "specs", tmp_path / "golden"
    assert main(["promote", str(trace), "replay/incident-1", "--specs", str(specs)]) == 0
    doc = yaml.safe_load((specs / "replay" / "incident-1.yaml").read_text())
    t = read_trace(trace)
    assert doc["kind"] == "generate" and doc["inputs"]["checkpoint"] == PRESET
    assert [r["prompt"] for r in doc["inputs"]["requests"]] == [r["prompt"] for r in t.requests]
    assert doc["expect"]["last_tokens"] == [s[-1]["token"] for s in t.steps]
    assert doc["inputs"]["schedule"] == {"max_batch": 8, "prefill_chunk": 4}
    dirs = ["--specs", str(specs), "--golden", str(golden)]
    assert main(["regen", *dirs, "replay/*"]) == 0
    assert main(["check", *dirs, "replay/*"]) == 0
    capsys.readouterr()

    attend = lockstep.kernels.attention._attend              # the torch ops' attention reads it per call

    def mutated(*args, **kwargs):                  # the engine's attention, one ULP-ish off
        return attend(*args, **kwargs) * (1 + 2 ** -12)
    monkeypatch.setattr(lockstep.kernels.attention, "_attend", mutated)
    assert main(["check", *dirs, "replay/*"]) == 1


def test_promote_refuses_what_does_not_replay_bitwise(tmp_path, trace, monkeypatch):
    planted.different_tile_when_alone(monkeypatch)       # decode steps of one row now differ...
    t = read_trace(trace)
    t.manifest["settings"]["max_batch"] = 1              # ...and this trace says it ran one row at a time
    with pytest.raises(TraceError, match="does not replay bitwise here"):
        promote(t, "replay/x", specs_dir=tmp_path)
    assert not (tmp_path / "replay" / "x.yaml").exists()


def test_promote_refuses_bad_ids_and_existing_specs(tmp_path, trace):
    t = read_trace(trace)
    with pytest.raises(TraceError, match="spec id"):
        promote(t, "../escape", specs_dir=tmp_path, check=False)
    with pytest.raises(TraceError, match="distinct request indices"):
        promote(t, "replay/y", [0, 5], specs_dir=tmp_path, check=False)
    promote(t, "replay/y", [1], specs_dir=tmp_path, check=False)
    with pytest.raises(TraceError, match="exists"):
        promote(t, "replay/y", specs_dir=tmp_path, check=False)
