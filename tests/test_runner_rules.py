"""harness/runner.py's reproduction lines, without a run: the command that reruns one spec as a
run did (each option named only when it is not the default, the pair when asked), and the flags
that name a pair for `regen`."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

from lockstep.harness import runner


def _ctx(device="cpu", dtype="fp32", backend="torch", world_sizes=()):
    return SimpleNamespace(platform=SimpleNamespace(device=device, dtype=dtype), backend=backend,
                           world_sizes=world_sizes)


def test_the_repro_command_names_only_what_is_not_the_default(monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    assert runner.repro_command("a/b", _ctx()) == "lockstep diff a/b"
    assert runner.repro_command("a/b", _ctx(), verb="check") == "lockstep check a/b"
    assert runner.repro_command("a/b", _ctx(), specs=Path("specs"), golden=tmp_path / "golden") == "lockstep diff a/b", \
        "./specs and ./golden however written"
    assert runner.repro_command("a/b", _ctx(), specs=Path("my specs"), golden=Path("g")) == \
        "lockstep diff a/b --specs 'my specs' --golden g"
    assert runner.repro_command("a/b", _ctx(), golden=Path("g")) == "lockstep diff a/b --golden g"
    assert runner.repro_command("a/b", _ctx(device="cuda:1")) == "lockstep diff a/b --device cuda"
    assert runner.repro_command("a/b", _ctx(dtype="bf16")) == "lockstep diff a/b --dtype bf16"
    assert runner.repro_command("a/b", _ctx(backend="triton")) == "lockstep diff a/b --backend triton"
    assert runner.repro_command("a/b", _ctx(), pair=True) == "lockstep diff a/b --dtype fp32 --backend torch"
    assert runner.repro_command("a/b", _ctx(world_sizes=(2, 4))) == "lockstep diff a/b --world-size 2,4"
    assert runner.repro_command("x y", _ctx(device="cuda", dtype="bf16", backend="triton", world_sizes=(2,)),
                                specs=Path("s")) == \
        "lockstep diff 'x y' --specs s --device cuda --dtype bf16 --backend triton --world-size 2"


def test_the_pair_flags_of_a_regen():
    assert runner._pair_flags("") == "" and runner._pair_flags("fp32/torch") == ""
    assert runner._pair_flags("bf16/torch") == " --dtype bf16 --backend torch"
    assert runner._pair_flags("fp32/triton") == " --dtype fp32 --backend triton"
