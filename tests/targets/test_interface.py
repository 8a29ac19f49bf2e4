"""The typed target interface (harness/target.py: TargetInterface, a Protocol): every built-in
target conforms to it, Lockstep's engine implements every operation Lockstep's peer view has and is
the one judged against goldens, and no spec kind asks which implementation it runs on."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from lockstep.harness import kinds
from lockstep.harness.platform import detect
from lockstep.harness.result import RunContext
from lockstep.harness.targets import BUILTIN, NotApplicable, TargetInterface, UpstreamChanged, get
from lockstep.harness.target import Op, Target
from lockstep.harness.targets.lockstep import engine, load


@pytest.mark.parametrize("name", list(BUILTIN))
def test_every_builtin_target_conforms(name):
    try:
        target = get(name)
    except (NotApplicable, UpstreamChanged) as e:      # a peer that is not installed here
        pytest.skip(str(e))
    assert isinstance(target, TargetInterface)
    assert not target.has_goldens                      # judged against its expectations file


def test_the_engine_implements_every_operation_and_has_the_goldens():
    ctx = RunContext(detect("cpu"))
    target = engine(ctx)
    assert isinstance(target, TargetInterface) and target.has_goldens
    assert set(load().ops) == set(target.ops) and not load().has_goldens    # one builder, default settings
    assert target.offers("hash", "backends") and load().offers("hash", "backends")


def test_the_engine_binds_the_kernels_the_modules_hold_when_a_spec_runs(monkeypatch):
    # the operations look the kernel up when called: a fault planted in a kernel module is what runs
    import torch

    import lockstep.kernels.matmul as matmul
    ctx = RunContext(detect("cpu"))
    matmul_op = engine(ctx).ops["matmul"].fn

    def planted(*args, **kw):
        raise AssertionError("planted")
    monkeypatch.setattr(matmul, "linear_triton", planted)
    for fn in (matmul_op, engine(ctx).ops["matmul"].fn, load().ops["matmul"].fn):
        with pytest.raises(AssertionError, match="planted"):
            fn(torch.ones(1, 1), torch.ones(1, 1), None)


def test_an_object_without_the_interface_is_refused():
    class HalfTarget:
        name, version = "half", "1.0"
    assert not isinstance(HalfTarget(), TargetInterface)
    assert isinstance(Target("toy", "1.0", ops={"hash": Op(print)}), TargetInterface)


def test_op_names_the_kind_s_reason_only_where_the_target_gives_none():
    bare = Target("bare", "1.0", missing={"primitive": "bare's own reason"})
    with pytest.raises(NotApplicable, match="bare's own reason"):
        bare.op("primitive", why="the kind's reason")
    with pytest.raises(NotApplicable, match="the kind's reason"):
        Target("bare", "1.0").op("record_trace", why="the kind's reason")


def test_no_kind_asks_which_target_it_runs_on():
    """A kind runs its spec through operations and features; which implementation it is (its
    name, its goldens, an engine flag) is never a branch in a kind."""
    asks = re.compile(r"(?<!lockstep)\.(engine|has_goldens)\b|\.name\s*[!=]=|\blabel\s*[!=]=")
    for module in kinds.KINDS.values():
        text = Path(module.__file__).read_text(encoding="utf-8")
        assert not asks.findall(text), f"{module.__file__} asks which target it runs on"
