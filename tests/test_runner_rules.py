"""harness/runner.py's rules without a model run: the reproduction lines (each option named only
when it is not the default, the pair when asked), and check and regen on a stand-in kind (each
status and its report, the comparison with a golden, regen's refusals and what it writes)."""

from __future__ import annotations

import re
from pathlib import Path
from types import SimpleNamespace

import torch

from lockstep.engine.boundaries import CaptureError
from lockstep.harness import runner
from lockstep.harness.compare import diff_data, diff_tensors
from lockstep.harness.errors import full_traceback, located
from lockstep.harness.golden import CorruptGolden, Golden
from lockstep.harness.result import SpecResult
from lockstep.harness.specfile import Spec
from lockstep.kernels.compile_time import Tally
from tests.stand_in_kind import KIND
from tests.stand_in_kind import stand_in_kind as _kind


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


# --------------------------------------------------------------------------- check and regen on a stand-in kind
# No model and no spec file: a kind registered as KIND, a golden store that answers what a test
# gives it, and the run itself replaced where the rule under test only reads its result.



def _spec(sid="stand/one", inputs=None, file=None, content="c" * 64, whole="s" * 64):
    file = Path(f"/r/specs/{sid}.yaml" if file is None else file)
    return Spec(sid, file, KIND, "", (), inputs or {}, {}, {}, whole, content, lines={("kind",): 3})


class _Store:
    """A golden store: `golden` (or CorruptGolden(`corrupt`)) for every load, each call recorded."""

    def __init__(self, golden=None, corrupt=None, other=None, root=Path("/g"), refuse=None):
        self.golden, self.corrupt, self.other, self.root, self.refuse = golden, corrupt, other, root, refuse
        self.asked, self.written = [], []

    def other_triton(self, platform, sid, here):
        self.asked.append(("other", platform, sid, here))
        return self.other

    def load(self, platform, sid):
        self.asked.append(("load", platform, sid))
        if self.corrupt:
            raise CorruptGolden(self.corrupt)
        return self.golden

    def write(self, *args):
        if self.refuse:
            raise self.refuse
        self.written.append(args)


class _Located:
    def __init__(self, text):
        self._text = text

    def text(self):
        return self._text

    def to_json(self):
        return {"text": self._text}


def _golden(tensors, data=None, spec_sha256="c" * 64, deps=None):
    manifest = {"spec_sha256": spec_sha256} | ({"provenance": {"bit_dependencies": deps}} if deps is not None else {})
    return Golden(tensors, data or {}, manifest)


def _raised(e):
    try:
        raise e
    except Exception as caught:  # noqa: BLE001
        return caught


def test_a_failing_outcome_reads_in_full():
    d = diff_tensors({"x": torch.tensor([0.0, 1.0])}, {"x": torch.tensor([0.0, 2.0])})[0]
    o = runner.Outcome(_spec(), runner.MISMATCH, "cpu-fp32", messages=["first\nsecond", "third"], diffs=[d],
                       data_diff="a\nb", notes=["n1", "n2"], warnings=["w1"], located=[_Located("at 1\nat 2")],
                       repro="lockstep diff x", traceback="Traceback\n  frame")
    head = ["stand/one (/r/specs/stand/one.yaml:3) on cpu-fp32: MISMATCH", "  first", "  second", "  third"]
    rest = ["  " + line for line in d.describe().splitlines()] + [
        "  data differs from the golden:", "    a", "    b", "  at 1", "  at 2", "  w1", "  note: n1", "  note: n2"]
    assert o.report() == "\n".join(head + rest + ["  reproduce: lockstep diff x --debug"])
    assert o.report(debug=True) == "\n".join(head + ["  Traceback", "    frame"] + rest +
                                             ["  reproduce: lockstep diff x"])
    o.traceback = ""
    assert o.report().endswith("\n  note: n2\n  reproduce: lockstep diff x")
    o.repro = ""
    assert o.report().endswith("\n  note: n2")


def test_a_missing_golden_says_how_to_record_it():
    o = runner.Outcome(_spec("x y/one"), runner.MISSING, "cpu-bf16", pair="bf16/torch")
    assert o.report() == ("x y/one (/r/specs/x y/one.yaml:3) on cpu-bf16: MISSING\n"
                          "  no golden yet; record one with: lockstep regen 'x y/one' --dtype bf16 --backend torch")
    o.pair = "fp32/torch"
    assert o.report().endswith("lockstep regen 'x y/one'")
    o.status = runner.FAILED
    assert o.report() == "x y/one (/r/specs/x y/one.yaml:3) on cpu-bf16: FAILED"


def test_an_outcome_as_json():
    d = diff_tensors({"x": torch.tensor([1.0])}, {"x": torch.tensor([2.0])})[0]
    o = runner.Outcome(_spec(), runner.MISMATCH, "cpu-fp32", seconds=0.123456, messages=["m"], diffs=[d],
                       data_diff="dd", notes=["n"], warnings=["w"], located=[_Located("l")], repro="r",
                       traceback="t", stale_golden=True, pair="fp32/torch")
    expected = {"id": "stand/one", "kind": KIND, "status": "mismatch", "golden_platform": "cpu-fp32",
                "file": "/r/specs/stand/one.yaml", "seconds": 0.1235, "messages": ["m"], "diffs": [d.to_json()],
                "data_diff": "dd", "warnings": ["w"], "notes": ["n"], "repro": "r", "located": [{"text": "l"}],
                "traceback": "t", "stale_golden": True, "pair": "fp32/torch"}
    assert o.to_json() == expected
    o.compile = Tally(seconds=0.11111, load_seconds=0.22222)
    assert o.to_json() == expected | {"compile_seconds": 0.3333}


def test_a_crash_is_one_located_line_and_its_traceback():
    e = _raised(ValueError("boom"))
    c = runner.Crash.of(e)
    assert c.summary == f"crashed: {located(e)}" and c.traceback == full_traceback(e)
    assert runner.Crash.of(e, "went wrong").summary == f"went wrong: {located(e)}"


def test_a_run_is_standardised_and_its_expectations_checked(monkeypatch):
    seen = {}
    t = torch.arange(6.0).reshape(2, 3).t()

    def run(spec, ctx, target):
        seen["run"] = (spec, ctx, target.has_goldens, torch.is_inference_mode_enabled())
        return SpecResult({"t": t}, {"k": (1, 2), "m": {3: "x"}})

    def check(spec, result):
        seen["check"] = (spec, result)
        return ["one failed"]

    _kind(monkeypatch, run=run, check=check)
    spec, ctx = _spec(), _ctx_real()
    result, failed, crash = runner._run_and_expect(spec, ctx)
    assert seen["run"] == (spec, ctx, True, True), "under inference mode, on the engine judged against goldens"
    assert seen["check"] == (spec, result) and failed == ["one failed"] and crash is None
    assert result.data == {"k": [1, 2], "m": {"3": "x"}}, "data as a manifest reads it back"
    assert result.tensors["t"].is_contiguous() and torch.equal(result.tensors["t"], t)

    _kind(monkeypatch, run=lambda s, c, tg: (_ for _ in ()).throw(CaptureError("no boundary 3")))
    assert runner._run_and_expect(spec, ctx) == (None, ["the engine broke the capture contract: no boundary 3"], None)
    _kind(monkeypatch, run=lambda s, c, tg: (_ for _ in ()).throw(KeyError("lost")))
    result, failed, crash = runner._run_and_expect(spec, ctx)
    assert (result, failed) == (None, []) and crash.summary.startswith("crashed: KeyError: 'lost' (at ")


def _ctx_real(dtype="fp32", backend="torch"):
    from lockstep.harness.platform import Platform
    return runner.RunContext(Platform("cpu", dtype), backend)


def _check(monkeypatch, spec, store, run_result=(None, [], None), strict=False, ctx=None, compare=None):
    calls = []
    monkeypatch.setattr(runner, "_run_and_expect", lambda s, c: calls.append((s, c)) or run_result)
    if compare is not None:
        monkeypatch.setattr(runner, "_compare", compare)
    return runner.check_spec(spec, ctx or _ctx_real(), store, strict), calls


def test_check_spec_incomparable_runs_nothing(monkeypatch):
    _kind(monkeypatch, golden_platform=lambda spec, ctx: "cpu-fp32-triton")
    store = _Store(other="other triton")
    out, calls = _check(monkeypatch, _spec(), store)
    assert (out.status, out.messages, out.repro, calls) == (runner.INCOMPARABLE, ["other triton"], "", [])
    assert store.asked == [("other", "cpu-fp32-triton", "stand/one", runner.versions()["triton"])]


def test_check_spec_crash_failure_and_the_repro_line(monkeypatch):
    _kind(monkeypatch)
    crash = runner.Crash("crashed: X", "tb")
    out, calls = _check(monkeypatch, _spec(), _Store(), (None, [], crash), ctx=_ctx_real("bf16", "triton"))
    assert (out.status, out.messages, out.traceback) == (runner.CRASH, ["crashed: X"], "tb")
    assert out.repro == "lockstep diff stand/one --specs /r/specs --golden /g --dtype bf16 --backend triton"
    assert out.pair == "bf16/triton" and out.golden_platform == "cpu-fp32" and out.compile is None
    out, _ = _check(monkeypatch, _spec("a/b/c"), _Store(root=Path("golden")), (None, ["a", "b"], None))
    assert (out.status, out.messages) == (runner.FAILED, ["expectation failed: a", "expectation failed: b"])
    assert out.repro == "lockstep diff a/b/c --specs /r/specs"
    # a spec whose golden folder follows the dtype policy runs the engine: the pair is named
    _kind(monkeypatch, golden_platform=lambda spec, ctx: "cpu-" + ctx.platform.dtype)
    out, _ = _check(monkeypatch, _spec(), _Store(root=Path("golden")), (None, ["a"], None))
    assert out.repro == "lockstep diff stand/one --specs /r/specs --dtype fp32 --backend torch"


def test_check_spec_compares_and_keeps_a_bug_of_the_comparison_a_crash(monkeypatch):
    _kind(monkeypatch)
    result, seen = SpecResult(), []

    def compare(out, res, failed, store, strict):
        seen.append((res, failed, store, strict))
        out.status = runner.MISMATCH

    store = _Store()
    out, _ = _check(monkeypatch, _spec(), store, (result, ["f"], None), strict=True, compare=compare)
    assert seen == [(result, ["f"], store, True)] and out.status == runner.MISMATCH and out.repro
    for status in (runner.PASS, runner.MISSING):
        out, _ = _check(monkeypatch, _spec(), store, (result, [], None),
                        compare=lambda o, *a, s=status: setattr(o, "status", s))
        assert out.status == status and out.repro == "", "a pass or a missing golden has nothing to reproduce"

    def broken(out, *args):
        raise ZeroDivisionError("in the comparison")

    out, _ = _check(monkeypatch, _spec(), store, (result, [], None), compare=broken)
    assert out.status == runner.CRASH and out.traceback.startswith("Traceback")
    assert out.messages == [out.messages[0]] and out.messages[0].startswith(
        "comparing with the golden failed (a bug in lockstep, please report it): ZeroDivisionError: in the comparison")


def test_check_spec_times_the_run_and_its_compiles(monkeypatch):
    _kind(monkeypatch)
    clock = iter([10.0, 12.5])
    monkeypatch.setattr(runner, "time", SimpleNamespace(perf_counter=lambda: next(clock)))
    tallies, settled = iter([Tally(1.0, 0.5, 2), Tally(4.0, 1.5, 5)]), []
    monkeypatch.setattr(runner.compile_time, "mode", lambda: "compiled")
    monkeypatch.setattr(runner.compile_time, "snapshot", lambda: next(tallies))
    monkeypatch.setattr(runner.compile_time, "settle", lambda: settled.append(1))
    out, _ = _check(monkeypatch, _spec(), _Store(), (None, ["a"], None))
    assert out.seconds == 2.5 and settled == [1] and out.compile == Tally(3.0, 1.0, 3)
    clock = iter([1.0, 1.25])
    tallies = iter([Tally(), Tally(9.0)])
    monkeypatch.setattr(runner.compile_time, "mode", lambda: "interpreter")
    out, _ = _check(monkeypatch, _spec(), _Store(), (None, ["a"], None))
    assert out.seconds == 0.25 and out.compile is None and settled == [1]


def _compared(spec, result, failed=(), golden=None, corrupt=None, strict=False, **outcome):
    out = runner.Outcome(spec, runner.PASS, "cpu-fp32", **outcome)
    store = _Store(golden, corrupt)
    runner._compare(out, result, list(failed), store, strict)
    return out, store


def test_compare_a_corrupt_or_missing_golden(monkeypatch):
    _kind(monkeypatch)
    res = SpecResult(notes=["new note"], located=["new place"])
    out, store = _compared(_spec("x y/1"), res, ["e"], corrupt="bad bytes", notes=["old note"], located=["old"])
    assert store.asked == [("load", "cpu-fp32", "x y/1")]
    assert out.status == runner.CORRUPT and out.messages == [
        "expectation failed: e", "corrupt golden: bad bytes",
        "if the spec is right, `lockstep regen 'x y/1'` records a new golden in its place "
        "(review the change before committing it)"]
    assert out.notes == ["old note", "new note"] and out.located == ["old", "new place"]
    assert _compared(_spec(), SpecResult(), ["e"])[0].status == runner.FAILED
    out, _ = _compared(_spec(), SpecResult())
    assert (out.status, out.messages, out.diffs, out.data_diff) == (runner.MISSING, [], [], "")


def test_compare_a_mismatch_locates_and_names_the_dependencies(monkeypatch):
    located_with = []
    _kind(monkeypatch, locate_golden=lambda spec, g, r: located_with.append((spec, g, r)) or "where")
    g = {"x": torch.tensor([1.0, 2.0])}
    r = {"x": torch.tensor([1.0, 3.0])}
    deps = {"torch": "0.0-not-this-one"}
    out, _ = _compared(_spec(), SpecResult(r, {"d": 1}), ["e"], _golden(g, {"d": 1}, deps=deps))
    assert out.status == runner.MISMATCH and out.diffs == diff_tensors(g, r) and out.data_diff == ""
    assert located_with == [(out.spec, g, r)] and out.located == ["where"]
    assert out.messages == ["expectation failed: e", runner.dependency_report(deps, "cpu-fp32")]
    assert out.warnings == [] and not out.stale_golden
    out, _ = _compared(_spec(), SpecResult(r), golden=_golden(g))
    assert out.messages == [runner.dependency_report(None, "cpu-fp32")], "no recorded dependencies"
    _kind(monkeypatch, locate_golden=lambda spec, g, r: None)
    assert _compared(_spec(), SpecResult(r), golden=_golden(g))[0].located == []
    _kind(monkeypatch)
    assert _compared(_spec(), SpecResult(r), golden=_golden(g))[0].located == [], "a kind that cannot locate"
    # data alone: a mismatch, nothing to locate
    _kind(monkeypatch, locate_golden=lambda spec, g, r: located_with.append(1) or "where")
    out, _ = _compared(_spec(), SpecResult(g, {"d": 2}), golden=_golden(g, {"d": 1}))
    assert out.status == runner.MISMATCH and out.data_diff == diff_data({"d": 1}, {"d": 2}) and out.located == []
    assert len(located_with) == 2


def test_compare_a_pass_a_failure_and_a_stale_golden(monkeypatch):
    _kind(monkeypatch)
    g = {"x": torch.tensor([1.0])}
    out, _ = _compared(_spec(), SpecResult(dict(g)), golden=_golden(g))
    assert (out.status, out.messages, out.warnings, out.stale_golden) == (runner.PASS, [], [], False)
    assert _compared(_spec(), SpecResult(dict(g)), golden=_golden(g, spec_sha256="s" * 64))[0].warnings == [], \
        "a golden recorded for the whole document's hash is current"
    out, _ = _compared(_spec(), SpecResult(dict(g)), ["e"], golden=_golden(g))
    assert (out.status, out.messages) == (runner.FAILED, ["expectation failed: e"])
    old = "0123456789abcdef"
    warning = (f"golden may be stale: it was recorded for another version of this spec (spec_sha256 "
               f"{old[:12]}…, the spec is now {'c' * 12}…); review the spec's change "
               f"and record it again with: lockstep regen 'x y'")
    for strict, status, tail in ((False, runner.PASS, " (check --strict fails on this)"), (True, runner.STALE, "")):
        out, _ = _compared(_spec("x y"), SpecResult(dict(g)), golden=_golden(g, spec_sha256=old), strict=strict)
        assert (out.status, out.warnings, out.stale_golden) == (status, [warning + tail], True)
    out, _ = _compared(_spec(), SpecResult(dict(g)), ["e"], golden=_golden(g, spec_sha256=old), strict=True)
    assert out.status == runner.FAILED and out.stale_golden
    out, _ = _compared(_spec(), SpecResult({"x": torch.tensor([2.0])}), golden=_golden(g, spec_sha256=old), strict=True)
    assert out.status == runner.MISMATCH and len(out.warnings) == 1
    assert runner.current_for({}, _spec()) is False


def test_the_specs_folder_a_spec_came_from():
    assert runner._specs_dir(_spec("a/b/c")) == Path("/r/specs")
    assert runner._specs_dir(_spec("one")) == Path("/r/specs")
    assert runner._specs_dir(_spec("one", file="")) == Path("")


def test_a_regen_outcome_reads_in_full():
    o = runner.RegenOutcome(_spec(), runner.NEW, "cpu-fp32", ["x: one\ntwo", "y"], traceback="tb\n  at")
    assert o.report() == "new       stand/one (cpu-fp32)\n    x: one\n    two\n    y"
    o.written = True
    assert o.report(debug=True) == ("new       stand/one (cpu-fp32)  [written]\n    x: one\n    two\n    y\n"
                                    "    tb\n      at")


def test_the_topologies_and_provenance_recorded(monkeypatch):
    assert runner._topologies_checked(_spec(), None) == [{"world_size": 1, "tp": 1, "ep": 1}]
    assert runner._topologies_checked(_spec(inputs={"topologies": [[2, 3], [1, 4]]}), None) == [
        {"world_size": 1, "tp": 1, "ep": 1}, {"world_size": 6, "tp": 2, "ep": 3}, {"world_size": 4, "tp": 1, "ep": 4}]
    for name, value in (("lockstep_revision", "rev"), ("dirty_paths", ["a.py"]), ("versions", {"torch": "9"}),
                        ("device_name", "the cpu")):
        monkeypatch.setattr(runner, name, lambda *a, v=value: v)
    monkeypatch.setattr(runner, "bit_dependencies", lambda platform: {"of": platform})
    ctx = _ctx_real("bf16", "triton")
    p = runner.provenance(ctx, _spec(inputs={"topologies": [[2, 1]]}), "cpu-x")
    created = p.pop("created")
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\+00:00", created)
    assert p == {"lockstep_revision": "rev", "dirty_paths": ["a.py"], "torch": "9", "device": "the cpu",
                 "platform": ctx.platform.name, "dtype_policy": "bf16", "backend": "triton",
                 "topologies": [{"world_size": 1, "tp": 1, "ep": 1}, {"world_size": 2, "tp": 2, "ep": 1}],
                 "regen_command": "lockstep regen stand/one --dtype bf16 --backend triton",
                 "bit_dependencies": {"of": "cpu-x"}}
    monkeypatch.setattr(runner, "dirty_paths", lambda: [])
    assert "dirty_paths" not in runner.provenance(ctx, _spec(), "cpu-x")


def _regen(monkeypatch, runs, store, write=True, spec=None):
    runs = iter(runs)
    monkeypatch.setattr(runner, "_run_and_expect", lambda s, c: next(runs))
    monkeypatch.setattr(runner, "provenance", lambda ctx, s, platform: ("provenance", s.id, platform))
    return runner.regen_spec(spec or _spec(), _ctx_real(), store, write)


def test_regen_refuses_a_crash_a_failure_or_two_runs_that_differ(monkeypatch):
    _kind(monkeypatch, golden_platform=lambda spec, ctx: "cpu-q")
    ok = (SpecResult({"x": torch.zeros(1)}), [], None)
    out = _regen(monkeypatch, [(None, [], runner.Crash("crashed: X", "tb"))], _Store())
    assert (out.status, out.golden_platform, out.explanation, out.traceback) == (
        runner.REFUSED, "cpu-q", ["the first run crashed: X"], "tb")
    out = _regen(monkeypatch, [ok, (None, [], runner.Crash("crashed: Y", "tb2"))], _Store())
    assert (out.explanation, out.traceback) == (["the second run crashed: Y"], "tb2")
    failing = SpecResult(located=[_Located("here\nthere")])
    out = _regen(monkeypatch, [(failing, ["a", "b"], None)], _Store())
    assert out.status == runner.REFUSED and out.explanation == [
        "expectation failed: a", "expectation failed: b", "here\nthere"]
    out = _regen(monkeypatch, [ok, (None, ["c"], None)], _Store())
    assert out.explanation == ["expectation failed: c"]
    other = SpecResult({"x": torch.ones(1)}, {"d": 1})
    out = _regen(monkeypatch, [ok, (other, [], None)], _Store())
    assert out.status == runner.REFUSED and out.explanation == [
        "two runs disagree, so there is no golden to record (D1 run-to-run):",
        diff_tensors(ok[0].tensors, other.tensors)[0].describe(), diff_data({}, {"d": 1})]
    assert not out.written


def test_regen_records_a_new_golden_or_one_in_place_of_a_corrupt_one(monkeypatch):
    _kind(monkeypatch, golden_platform=lambda spec, ctx: "cpu-q")
    new = SpecResult({"b": torch.zeros(2, dtype=torch.int32), "a": torch.zeros(1, 3)}, {"d": 1})
    store = _Store()
    out = _regen(monkeypatch, [(new, [], None)] * 2, store)
    assert (out.status, out.written) == (runner.NEW, True)
    assert out.explanation == ["a: torch.float32 [1, 3]", "b: torch.int32 [2]"]
    assert store.asked == [("load", "cpu-q", "stand/one")]
    assert store.written == [("cpu-q", "stand/one", new.tensors, new.data, "c" * 64, KIND,
                              ("provenance", "stand/one", "cpu-q"))]
    out = _regen(monkeypatch, [(new, [], None)] * 2, _Store(corrupt="torn"))
    assert out.status == runner.CHANGED and out.explanation == [
        "replacing a corrupt golden: torn", "a: torch.float32 [1, 3]", "b: torch.int32 [2]"]
    store = _Store()
    out = _regen(monkeypatch, [(new, [], None)] * 2, store, write=False)
    assert (out.status, out.written, store.written) == (runner.NEW, False, [])


def test_regen_leaves_an_unchanged_golden_and_explains_a_changed_one(monkeypatch):
    _kind(monkeypatch)
    t = {"x": torch.tensor([1.0, 2.0])}
    same = SpecResult(dict(t), {"d": 1})
    store = _Store(_golden(t, {"d": 1}))
    out = _regen(monkeypatch, [(same, [], None)] * 2, store)
    assert (out.status, out.written, out.explanation, store.written, out.moved) == (
        runner.UNCHANGED, False, [], [], None)
    # the whole document's hash is current too
    out = _regen(monkeypatch, [(same, [], None)] * 2, _Store(_golden(t, {"d": 1}, spec_sha256="s" * 64)))
    assert out.status == runner.UNCHANGED
    out = _regen(monkeypatch, [(same, [], None)] * 2, _Store(_golden(t, {"d": 1}, spec_sha256="old")))
    assert out.status == runner.CHANGED and out.written and out.explanation == [
        "same bits; the spec text changed, so the manifest's spec hash is updated"]
    moved = SpecResult({"x": torch.tensor([1.0, 3.0])}, {"d": 2})
    store = _Store(_golden(t, {"d": 1}, spec_sha256="old"))
    out = _regen(monkeypatch, [(moved, [], None)] * 2, store)
    changes = diff_tensors(t, moved.tensors)
    assert out.status == runner.CHANGED and out.explanation == [
        changes[0].describe(), "data:\n" + diff_data({"d": 1}, {"d": 2})]
    assert out.moved == runner.moved(t, moved.tensors, changes, {"d": 1}, {"d": 2})
    assert len(store.written) == 1
    out = _regen(monkeypatch, [(SpecResult(dict(t), {"d": 2}), [], None)] * 2, _Store(_golden(t, {"d": 1})))
    assert out.status == runner.CHANGED and out.explanation == ["data:\n" + diff_data({"d": 1}, {"d": 2})]


def test_regen_says_why_a_golden_cannot_be_written(monkeypatch):
    _kind(monkeypatch)
    new = (SpecResult({"x": torch.zeros(1)}), [], None)
    out = _regen(monkeypatch, [new] * 2, _Store(refuse=IsADirectoryError(21, "Is a directory", "/g/x.safetensors")))
    assert (out.status, out.written) == (runner.REFUSED, False)
    assert out.explanation[-1] == "cannot write the golden: Is a directory: /g/x.safetensors"
    out = _regen(monkeypatch, [new] * 2, _Store(refuse=OSError("no space"), root=Path("/the/golden")))
    assert out.explanation[-1] == "cannot write the golden: no space: /the/golden"


def test_the_self_check_is_handed_the_judge_check_spec_uses(monkeypatch):
    seen = []
    monkeypatch.setattr(runner, "verify", lambda *a: seen.append(a))
    runner.self_check()
    assert seen == [(diff_tensors, diff_data, runner.GoldenStore, CorruptGolden)]


def test_the_defaults_check_is_not_strict_and_regen_writes(monkeypatch):
    _kind(monkeypatch)
    g = {"x": torch.tensor([1.0])}
    monkeypatch.setattr(runner, "_run_and_expect", lambda s, c: (SpecResult(dict(g)), [], None))
    out = runner.check_spec(_spec(), _ctx_real(), _Store(_golden(g, spec_sha256="old")))
    assert (out.status, out.stale_golden) == (runner.PASS, True)
    store = _Store()
    assert runner.regen_spec(_spec(), _ctx_real(), store).written and len(store.written) == 1


def test_the_pair_is_named_by_the_device_the_check_ran_on(monkeypatch):
    # golden folders that follow the dtype policy everywhere but on the CPU: the pair matters elsewhere only
    _kind(monkeypatch, golden_platform=lambda spec, ctx: "cpu-x" if ctx.platform.device == "cpu" else
          f"gpu-{ctx.platform.dtype}")
    out, _ = _check(monkeypatch, _spec(), _Store(root=Path("golden")), (None, ["a"], None))
    assert out.repro == "lockstep diff stand/one --specs /r/specs"


def test_a_mismatch_keeps_what_the_run_located_beside_the_goldens_place(monkeypatch):
    _kind(monkeypatch, locate_golden=lambda spec, g, r: "where")
    g = {"x": torch.tensor([1.0, 2.0])}
    out, _ = _compared(_spec(), SpecResult({"x": torch.tensor([1.0, 3.0])}, located=["from the run"]),
                       golden=_golden(g), located=["before"])
    assert out.located == ["before", "from the run", "where"]


def test_regen_explains_a_tensor_change_alone(monkeypatch):
    _kind(monkeypatch)
    t = {"x": torch.tensor([1.0, 2.0])}
    moved = SpecResult({"x": torch.tensor([1.0, 3.0])}, {"d": 1})
    out = _regen(monkeypatch, [(moved, [], None)] * 2, _Store(_golden(t, {"d": 1})))
    assert out.status == runner.CHANGED and out.explanation == [diff_tensors(t, moved.tensors)[0].describe()]
    other = SpecResult({"x": torch.tensor([1.0, 4.0])}, {"d": 1})
    out = _regen(monkeypatch, [(moved, [], None), (other, [], None)], _Store())
    assert out.explanation == ["two runs disagree, so there is no golden to record (D1 run-to-run):",
                               diff_tensors(moved.tensors, other.tensors)[0].describe()], "no data line"
