"""The check's own verdict machinery, each contract beside a planted fault that turns it red.

Each `pin_*` asserts one contract on the code it is given; a test runs it on the real code and
again on a copy with the fault put back (tests/planted.py's `module_with`, or a monkeypatch), where
it must fail. So a guard taken out of the code, or a test that stopped reading it, both show."""

from __future__ import annotations

import argparse
import math
from types import SimpleNamespace

import numpy
import pytest
import torch

from lockstep.harness import judges, runner, suite_paths, workers
from lockstep.harness.commands import options, session
from lockstep.harness.result import SpecResult, RunContext
from lockstep.harness.platform import bit_dependencies, detect
from lockstep.harness.targets import expectfile
from tests.deadline import deadline
from tests.planted import SPECS, module_with


def red(pin, *args) -> None:
    """The planted copy must fail the pin (an assert, or a pytest.raises that saw nothing)."""
    with pytest.raises((AssertionError, pytest.fail.Exception)):
        pin(*args)


# ---------------------------------------------------------------- exit code: 2, 1, 4, 3
def pin_exit_order(CheckSession) -> None:
    """Where several apply, the exit code is the first of 2 (spec error), 1 (a failing outcome),
    4 (INCOMPARABLE), 3 (MISSING) (docs/cli.md)."""
    def code(statuses, errors=(), strict=False, stale=(), temps=()):
        s = CheckSession(judges.GoldenJudge("golden"), golden=None, strict=strict, specs=[], errors=list(errors))
        for st in statuses:
            s.add(SimpleNamespace(status=st, messages=[st], report=lambda debug=False: "a report"))
        s.stale, s.temps = list(stale), list(temps)
        return s.exit_code()

    # --strict: a stale golden or a leftover temporary file is a failure (1), each alone; never without it
    assert code([runner.PASS], strict=True, stale=["cpu-fp32/x"]) == 1
    assert code([runner.MISSING], strict=True, temps=["golden/.x.tmp"]) == 1
    assert code([runner.PASS], strict=True) == 0
    assert code([runner.PASS], stale=["cpu-fp32/x"], temps=["golden/.x.tmp"]) == 0

    assert code([runner.PASS]) == 0
    assert code([runner.MISSING, runner.INCOMPARABLE, runner.MISMATCH]) == 1
    assert code([runner.INCOMPARABLE, runner.MISMATCH]) == 1
    assert code([runner.MISSING, runner.INCOMPARABLE]) == 4
    assert code([runner.INCOMPARABLE, runner.MISSING]) == 4
    assert code([runner.MISSING]) == 3
    assert code([runner.MISMATCH, runner.INCOMPARABLE], errors=["bad spec"]) == 2
    for failing in runner.FAILING:
        assert code([runner.INCOMPARABLE, failing]) == 1, failing


def test_exit_order():
    pin_exit_order(session.CheckSession)


@pytest.mark.parametrize("plant", [
    {"if judges.INCOMPARABLE in states:\n            return EXIT_INCOMPARABLE\n"
     "        if judges.MISSING in states:\n            return EXIT_MISSING\n":
     "if judges.MISSING in states:\n            return EXIT_MISSING\n"
     "        if judges.INCOMPARABLE in states:\n            return EXIT_INCOMPARABLE\n"},
    {"or judges.FAILED in states": "",
     "return EXIT_OK": "return EXIT_MISMATCH if judges.FAILED in states else EXIT_OK"},
], ids=["missing-before-incomparable", "incomparable-before-mismatch"])
def test_exit_order_planted(tmp_path, plant):
    red(pin_exit_order, module_with(session, plant, tmp_path).CheckSession)


# ---------------------------------------------------------------- regen: two runs agree in data too
def pin_regen_compares_data(regen_spec, monkeypatch, module, tmp_path) -> None:
    """regen refuses when two runs differ only in a data field (D1 covers data, not only tensors)."""
    from lockstep.harness.golden import GoldenStore

    spec = SPECS["coins/known-answers"]
    runs = iter([SpecResult({"x": torch.zeros(2)}, {"hashes": [1, 2]}), SpecResult({"x": torch.zeros(2)}, {"hashes": [1, 3]})])
    monkeypatch.setattr(module, "_run_and_expect", lambda s, c: (next(runs), [], None))
    out = regen_spec(spec, RunContext(detect("cpu")), GoldenStore(tmp_path / "golden"), write=False)
    assert out.status == runner.REFUSED, out.status
    assert "two runs disagree" in out.explanation[0] and "[1]" in "\n".join(out.explanation)


def test_regen_compares_data(monkeypatch, tmp_path):
    pin_regen_compares_data(runner.regen_spec, monkeypatch, runner, tmp_path)


def test_regen_compares_data_planted(monkeypatch, tmp_path):
    planted = module_with(runner, {"data_twice = diff_data(runs[0].data, runs[1].data)": "data_twice = ''"}, tmp_path)
    red(pin_regen_compares_data, planted.regen_spec, monkeypatch, planted, tmp_path)


# ---------------------------------------------------------------- check -j: the workers' mappings
class _InlinePool:
    """A harness.workers._Pool stand-in: its "worker" starts from no mappings (a fresh spawn) and
    runs the worker's set-up with the pool's initargs; what the worker then maps is recorded, and
    each row gets a PASS."""
    seen: dict | None = None

    def __init__(self, jobs, initargs):
        saved = dict(suite_paths._MAPPED)
        suite_paths._MAPPED.clear()
        try:
            parallel_module._start_worker(*initargs)
            _InlinePool.seen = suite_paths.explicit_mappings()
        finally:
            suite_paths._MAPPED.clear()
            suite_paths._MAPPED.update(saved)

    def start(self, tasks):
        self.tasks = tasks

    def result(self, index):
        fn, (spec, ctx) = self.tasks[index]
        return True, runner.Outcome(spec, runner.PASS, "cpu-fp32")

    def close(self):
        pass


parallel_module = workers


def pin_workers_take_the_mappings(check_rows, module, monkeypatch, tmp_path) -> None:
    """A `check -j N` worker starts with the parent's --checkpoint-path mappings."""
    global parallel_module
    parallel_module = module
    monkeypatch.setattr(module, "_Pool", _InlinePool)
    monkeypatch.setattr(module, "_start_worker", lambda mapped, shared: suite_paths.map_checkpoints(mapped.items()))
    monkeypatch.setattr(suite_paths, "_MAPPED", {})
    suite_paths.map_checkpoints([("ckpt/target", tmp_path / "mine")])
    _InlinePool.seen = None
    spec = SPECS["coins/known-answers"]
    rows = [(spec, RunContext(detect("cpu")), "shared")] * 2
    outs = list(check_rows(rows, None, False, 2))
    assert [o.status for o in outs] == [runner.PASS] * 2
    assert _InlinePool.seen == {"ckpt/target": tmp_path / "mine"}, _InlinePool.seen


def test_workers_take_the_mappings(monkeypatch, tmp_path):
    pin_workers_take_the_mappings(workers.check_rows, workers, monkeypatch, tmp_path)


def test_workers_take_the_mappings_planted(monkeypatch, tmp_path):
    planted = module_with(workers, {"_Pool(jobs, (suite_paths.explicit_mappings(), shared))": "_Pool(jobs, ({}, shared))"},
                          tmp_path)
    red(pin_workers_take_the_mappings, planted.check_rows, planted, monkeypatch, tmp_path)


def test_a_worker_maps_what_it_is_given(monkeypatch, tmp_path):
    """_start_worker itself (the initializer the pin above stands in for) maps its argument."""
    monkeypatch.setattr(suite_paths, "_MAPPED", {})
    monkeypatch.setattr(torch, "set_num_threads", lambda n: None)
    monkeypatch.setenv("LOCKSTEP_CHECKPOINT_CACHE", str(tmp_path))
    workers._start_worker({"a/b": tmp_path / "c"}, str(tmp_path / "shared"))
    assert suite_paths.explicit_mappings() == {"a/b": tmp_path / "c"}


# ---------------------------------------------------------------- expectations --write: a changed text is unjudged
def pin_changed_failure_is_unjudged(write, tmp_path) -> None:
    """`expectations --write` keeps a judgement only for a failure whose text is the recorded one."""
    previous = {"a": {"observed": "logits differ at 3", "judgement": "peer bug", "why": "their sampler"},
                "b": {"observed": "tokens differ", "judgement": "contract gap", "why": "no seeded coins"}}
    outcomes = [SimpleNamespace(status="fail", spec=SimpleNamespace(id="a"), message="logits differ at 4"),
                SimpleNamespace(status="fail", spec=SimpleNamespace(id="b"), message="tokens differ"),
                SimpleNamespace(status="pass", spec=SimpleNamespace(id="c"), message="")]
    path = tmp_path / "exp.yaml"
    assert write(path, "peer", "1.0", None, outcomes, previous) == 1
    got = expectfile.load(path, "peer", "1.0")
    assert got == {"a": {"observed": "logits differ at 4", "judgement": "unjudged", "why": ""},
                   "b": {"observed": "tokens differ", "judgement": "contract gap", "why": "no seeded coins"}}, got


def test_changed_failure_is_unjudged(tmp_path):
    pin_changed_failure_is_unjudged(expectfile.write, tmp_path)


def test_changed_failure_is_unjudged_planted(tmp_path):
    planted = module_with(expectfile, {'same(was["observed"], o.message) and ': ""}, tmp_path)
    red(pin_changed_failure_is_unjudged, planted.write, tmp_path)


# ---------------------------------------------------------------- --max-seconds, --max-gb: no NaN
def pin_bounds(bound) -> None:
    """A bound is a positive number or inf (no bound); NaN, 0, negatives and words are refused."""
    assert bound("300") == 300.0 and bound("0.5") == 0.5 and bound("inf") == math.inf
    for bad in ("nan", "NaN", "-nan", "0", "-1", "-inf", "many", ""):
        with pytest.raises(argparse.ArgumentTypeError):
            bound(bad)


def test_bounds():
    pin_bounds(options.bound)


def test_bounds_planted(tmp_path):
    planted = module_with(options, {"if not value > 0:": "if value <= 0:"}, tmp_path)   # NaN compares False
    red(pin_bounds, planted.bound)


NAN_BOUNDS = [
    ["generate", "--checkpoint", "models/tiny-target", "--device", "cpu", "--prompt-ids", "1,2,3",
     "--max-new-tokens", "100000", "--max-seconds", "nan"],
    ["make-checkpoint", "--preset", "gpt-oss-120b", "--max-gb", "nan", "OUT"],
]


def pin_nan_refused_end_to_end(cli, argv, seconds, tmp_path, capsys) -> None:
    """End to end: exit 2 naming the bound, before any work; a NaN taken as "no bound" would start
    the 100 000-token generation or write the 120b checkpoint, which the deadline fails."""
    argv = [str(tmp_path / "out") if a == "OUT" else a for a in argv]
    with deadline(seconds):
        code = cli.main(argv)
    assert code == 2 and "must be a positive number" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("argv", NAN_BOUNDS, ids=["max-seconds", "max-gb"])
def test_a_nan_bound_is_refused_before_any_work(tmp_path, monkeypatch, capsys, argv):
    from lockstep.harness import cli
    from tests.conftest import REPO

    monkeypatch.chdir(REPO)
    pin_nan_refused_end_to_end(cli, argv, 20, tmp_path, capsys)


@pytest.mark.parametrize("argv", NAN_BOUNDS, ids=["max-seconds", "max-gb"])
def test_a_nan_bound_is_refused_before_any_work_planted(tmp_path, monkeypatch, capsys, argv):
    """With the bound taking NaN the run starts: the test fails at its deadline, it does not wait."""
    from lockstep.harness import cli
    from tests.conftest import REPO
    from tests.deadline import DeadlinePassed

    monkeypatch.chdir(REPO)
    planted = module_with(options, {"if not value > 0:": "if value <= 0:"}, tmp_path)
    monkeypatch.setattr(cli, "bound", planted.bound)
    with pytest.raises(DeadlinePassed):
        pin_nan_refused_end_to_end(cli, argv, 3, tmp_path, capsys)


# ---------------------------------------------------------------- numpy in an interpreter golden's provenance
def pin_numpy_in_provenance(bit_dependencies) -> None:
    """The interpreter's goldens depend on numpy (Triton's interpreter computes with it): its
    version is recorded, and checked, beside Triton's."""
    import triton

    assert bit_dependencies("cpu-fp32-triton") == {"triton": triton.__version__, "numpy": numpy.__version__}
    assert bit_dependencies("cpu-bf16-triton")["numpy"] == numpy.__version__
    assert bit_dependencies("cpu-fp32") == {}


def test_numpy_in_provenance():
    pin_numpy_in_provenance(bit_dependencies)


def test_numpy_in_provenance_planted(tmp_path):
    from lockstep.harness import platform

    planted = module_with(platform, {', "numpy": numpy.__version__}': "}"}, tmp_path)
    red(pin_numpy_in_provenance, planted.bit_dependencies)


def test_the_recorded_interpreter_goldens_name_numpy():
    """Every interpreter golden in the repository records the numpy it was made with."""
    import json

    from tests.conftest import REPO

    manifests = sorted((REPO / "golden" / "cpu-fp32-triton").rglob("*.json"))
    assert manifests
    for m in manifests:
        deps = json.loads(m.read_text())["provenance"]["bit_dependencies"]
        assert "numpy" in deps and "triton" in deps, m
