"""harness/commands/session.py's reports without a `check` run: stand-in outcomes handed to a
session, and each report read in full (the text after the table, the summary line, the --json
document, the compile figures, the --world-size lines, another target's report). The exit code's
order is pinned with its planted faults in tests/test_verdict_machinery.py."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

from lockstep.harness import judges, runner
from lockstep.harness.commands import session
from lockstep.harness.commands.display import StatusTable, TargetTable
from lockstep.harness.commands.selection import golden_folders
from lockstep.harness.jsonout import SCHEMA_VERSION
from lockstep.harness.targets.judge import FAIL, NA, PASS
from lockstep.harness.version import version
from lockstep.kernels.compile_time import Tally


def _ctx(name="cpu-fp32", backend="torch", world_sizes=()):
    return SimpleNamespace(platform=SimpleNamespace(name=name), backend=backend, world_sizes=world_sizes)


def _outcome(sid, status, platform="cpu-fp32", pair="fp32/torch", seconds=1.0, notes=(), stale=False, compile=None,
             messages=None):
    o = SimpleNamespace(spec=SimpleNamespace(id=sid), status=status, golden_platform=platform, pair=pair,
                        seconds=seconds, notes=list(notes), stale_golden=stale, compile=compile,
                        messages=messages if messages is not None else [f"why {sid}"])
    o.report = lambda debug=False: f"report of {sid}" + (" (debug)" if debug else "")
    o.to_json = lambda: {"id": sid, "status": status}
    return o


def _session(outcomes=(), errors=(), stale=(), temps=(), strict=False, specs=None, rows=(), judge=None,
             monkeypatch=None, elapsed=2.345):
    s = session.CheckSession(judge or judges.GoldenJudge(Path("golden")), Path("golden"), strict,
                             specs if specs is not None else [o.spec for o in outcomes], list(errors), rows=list(rows))
    for o in outcomes:
        s.add(o)
    s.finish(list(stale), list(temps))
    s.elapsed = elapsed
    return s


def _interpreter(monkeypatch, mode="interpreter"):
    monkeypatch.setattr(session.compile_time, "mode", lambda: mode)


def test_a_session_keeps_each_verdict_and_what_finish_found(monkeypatch):
    monkeypatch.setattr(session.time, "perf_counter", lambda: 13.5)
    s = session.CheckSession(judges.GoldenJudge(Path("golden")), Path("golden"), False, [], [], start=10.0)
    a, b = _outcome("a", runner.PASS), _outcome("b", runner.MISSING)
    s.add(a)
    s.add(b)
    assert s.outcomes == [a, b] and [v.state for v in s.verdicts] == [judges.PASSED, judges.MISSING]
    s.finish(["cpu-fp32/gone"], [Path("golden/.x.tmp")])
    assert (s.stale, s.temps, s.elapsed) == (["cpu-fp32/gone"], ["golden/.x.tmp"], 3.5)
    assert s.problems() == []


def test_the_counts_of_each_judge():
    s = _session([_outcome("a", runner.PASS), _outcome("b", runner.MISMATCH), _outcome("c", runner.MISMATCH)])
    assert s.counts() == {"pass": 1, "mismatch": 2, "failed": 0, "crash": 0, "corrupt": 0, "stale": 0, "missing": 0,
                          "incomparable": 0}
    s = _session([_outcome("a", FAIL), _outcome("b", NA), _outcome("c", FAIL)], judge=_TargetJudge())
    assert s.counts() == {PASS: 0, FAIL: 2, NA: 1}


def test_the_text_report_in_full(monkeypatch):
    _interpreter(monkeypatch)
    outcomes = [_outcome("a", runner.PASS), _outcome("b", runner.MISMATCH, "cpu-bf16"),
                _outcome("c", runner.PASS, stale=True), _outcome("d", runner.MISSING)]
    s = _session(outcomes, errors=["e1", "e2"], stale=["cpu-fp32/old"], temps=[Path("golden/.t1"), "golden/.t2"])
    explain_pass = lambda o: f"explained {o.spec.id}"          # noqa: E731
    summary = s.summary(_ctx())
    assert s.text_report(_ctx(), explain_pass, debug=False, explain=False) == "\n".join([
        "", "report of b", "", "report of c", "", "report of d",
        "", "spec errors:", "  e1", "  e2",
        "", "stale goldens (their spec no longer exists):", "  golden/cpu-fp32/old",
        "", "2 stale temporary file(s) (left by a killed golden write; `lockstep regen` removes them):",
        "  golden/.t1", "  golden/.t2",
        "", summary])
    s.strict = True
    text = s.text_report(_ctx(), explain_pass, debug=True, explain=True)
    assert text.startswith("\nexplained a\n\nreport of b (debug)\n\nexplained c\n\nreport of d (debug)\n")
    assert "\nstale goldens (their spec no longer exists) — failing under --strict:\n" in text
    assert "(left by a killed golden write; `lockstep regen` removes them) — failing under --strict:\n" in text
    s = _session([_outcome("a", runner.PASS)])
    assert s.text_report(_ctx(), explain_pass, False, False) == "\n" + s.summary(_ctx())


def test_the_summary_line(monkeypatch):
    _interpreter(monkeypatch)
    outcomes = [_outcome("a", runner.MISMATCH), _outcome("b", runner.MISMATCH, "shared"), _outcome("c", runner.CRASH)]
    s = _session(outcomes, errors=["e"], stale=["x", "y"])
    assert s.summary(_ctx("cpu-q")) == (
        "3 spec(s): 0 pass, 2 mismatch, 1 crash, 1 spec error(s), 2 stale golden(s) in 2.3s "
        "(Triton compile n/a: interpreter), run on cpu-q; goldens: golden/cpu-fp32 (2), golden/shared (1)")
    rows = [(o.spec, SimpleNamespace(platform=SimpleNamespace(name="cpu-bf16"), backend="triton"), "f")
            for o in outcomes]
    s = _session(outcomes[:2], specs=[o.spec for o in outcomes], rows=rows, elapsed=0.04)
    assert s.summary(_ctx()) == ("2 check(s) of 3 spec(s): 0 pass, 2 mismatch in 0.0s (Triton compile n/a: "
                                 "interpreter), run on cpu-bf16 (triton backend); goldens: golden/cpu-fp32 (1), "
                                 "golden/shared (1)")
    assert _session([]).summary(_ctx()).startswith("0 spec(s): 0 pass in 2.3s (")
    assert _session([]).summary(_ctx()).endswith("; goldens: none")


def test_the_world_size_lines():
    notes = [["checked at topology tp2, topology ep2", "other"], ["checked at topology tp2",
                                                                   "not run at ep4: too few experts"],
             ["not run at ep4: too few experts", "not run at tp4: heads"]]
    s = _session([_outcome(str(i), runner.PASS, notes=n) for i, n in enumerate(notes)])
    assert s.topologies(_ctx(world_sizes=(1,))) == [] and s.topologies(SimpleNamespace()) == []
    assert s.topologies(_ctx(world_sizes=(2, 4))) == [
        "\n--world-size 2,4: tp2 on 2 spec(s); ep2 on 1 spec(s)",
        "  not run at ep4: too few experts (2 spec(s))", "  not run at tp4: heads (1 spec(s))"]
    s = _session([_outcome("a", runner.PASS, notes=["not run at tp2: x"])])
    assert s.topologies(_ctx(world_sizes=(2,))) == ["\n--world-size 2: no split ran", "  not run at tp2: x (1 spec(s))"]


def test_the_compile_figures(monkeypatch):
    _interpreter(monkeypatch)
    outcomes = [_outcome("a", runner.PASS, seconds=1.23456), _outcome("b", runner.PASS, seconds=2.0)]
    s = _session(outcomes)
    s.processes = 3
    none = {"seconds": None, "load_seconds": None, "run_seconds": 3.235, "processes": 3, "specializations": None,
            "compiles": None, "cache_hits": None, "kernels": {}}
    assert s.compile_figures() == {"mode": "interpreter"} | none
    assert s.compile_text() == "Triton compile n/a: interpreter"
    _interpreter(monkeypatch, "compiled")
    assert s.compile_figures() == {"mode": "unmeasured"} | none, "compiled, but no row measured"
    assert s.compile_text() == "Triton compile not measured"
    _interpreter(monkeypatch, "unmeasured")
    assert s.compile_figures()["mode"] == "unmeasured"
    _interpreter(monkeypatch, "compiled")
    outcomes[0].compile = Tally(1.0001, 0.25, 2, 1, {"k1#1", "k2#1"})
    outcomes[1].compile = Tally(0.5, 0.0004, 3, 2, {"k1#1", "k1#2", "k3#9"})
    s = _session(outcomes + [_outcome("c", runner.PASS, seconds=0.5)])
    assert s.compile_figures() == {"mode": "compiled", "seconds": 1.5, "load_seconds": 0.25, "run_seconds": 1.984,
                                   "processes": 1, "specializations": 4, "compiles": 5, "cache_hits": 3,
                                   "kernels": {"k1": 2, "k2": 1, "k3": 1}}
    assert s.compile_text() == ("Triton compile 1.8s, run 2.0s; 4 kernel specializations, 5 compiles, "
                                "3 from the disk cache")
    s.processes = 2
    outcomes[1].compile = Tally(9.0, 0.0, 1, None, set())
    assert s.compile_figures()["cache_hits"] is None and s.compile_figures()["run_seconds"] == 0.0
    assert s.compile_text() == "Triton compile 10.2s, run 0.0s over 2 processes; 2 kernel specializations, 3 compiles"


def test_the_json_document_of_a_golden_check(monkeypatch):
    _interpreter(monkeypatch)
    outcomes = [_outcome("a", runner.PASS, pair="fp32/torch"), _outcome("b", runner.MISSING, "shared", "bf16/torch"),
                _outcome("c", runner.PASS, pair="fp32/torch")]
    s = _session(outcomes, errors=["e"], stale=["x"])
    text = s.json_document(_ctx("cpu-q", "triton"))
    assert text.startswith('{\n  "schema_version"')
    doc = json.loads(text)
    assert doc == {
        "schema_version": SCHEMA_VERSION, "command": "check", "lockstep_version": version(),
        "target": f"lockstep-{version()}", "platform": "cpu-q", "backend": "triton", "exit_code": 2, "seconds": 2.345,
        "summary": s.counts() | {"spec_errors": 1, "stale_goldens": 1},
        "specs": [{"id": "a", "status": "pass", "verdict": "pass"},
                  {"id": "b", "status": "missing", "verdict": "missing"},
                  {"id": "c", "status": "pass", "verdict": "pass"}],
        "spec_errors": ["e"], "stale_goldens": ["x"], "golden_folders": ["golden/cpu-fp32", "golden/shared"],
        "expectations_file": None, "expectation_problems": [], "pairs": ["fp32/torch", "bf16/torch"],
        "compile": s.compile_figures()}


class _TargetJudge:
    """An ExpectationsJudge stand-in: `expected` ids fail as expected, `problems` {id: line}."""
    has_goldens = False

    def __init__(self, expected=(), problems=None, reproduce=None, file=None):
        self.target = SimpleNamespace(label="peer 1.0")
        self.expected = {i: {"judgement": "known", "why": "w"} for i in expected}
        self.problems, self.reproduce, self.expectations_file = problems or {}, reproduce, file

    def verdict(self, o):
        return judges.Verdict(o.status, report=f"report of {o.spec.id}", problem=self.problems.get(o.spec.id))


def test_the_json_document_of_another_target(monkeypatch):
    _interpreter(monkeypatch)
    judge = _TargetJudge(problems={"b": "b: fails, not expected"}, reproduce=lambda sid: f"rerun {sid}",
                         file=Path("expect/peer.yaml"))
    s = _session([_outcome("a", PASS), _outcome("b", FAIL), _outcome("c", NA)], errors=["e"], judge=judge)
    doc = json.loads(s.json_document(_ctx()))
    assert doc == {
        "schema_version": SCHEMA_VERSION, "command": "check", "lockstep_version": version(), "target": "peer 1.0",
        "platform": "cpu-fp32", "backend": "torch", "exit_code": 2, "seconds": 2.345,
        "summary": {PASS: 1, FAIL: 1, NA: 1, "spec_errors": 1},
        "specs": [{"id": "a", "status": PASS, "verdict": PASS},
                  {"id": "b", "status": FAIL, "verdict": FAIL, "reproduce": "rerun b"},
                  {"id": "c", "status": NA, "verdict": NA}],
        "spec_errors": ["e"], "stale_goldens": [], "golden_folders": [], "expectations_file": "expect/peer.yaml",
        "expectation_problems": ["b: fails, not expected"], "pairs": []}
    s.judge.reproduce, s.judge.expectations_file = None, None
    doc = json.loads(s.json_document(_ctx()))
    assert "reproduce" not in doc["specs"][1] and doc["expectations_file"] is None


def test_another_targets_report(monkeypatch):
    judge = _TargetJudge(expected=["b"], problems={"c": "c: fails, not expected"}, file=Path("peer.yaml"))
    outcomes = [_outcome("a", PASS), _outcome("b", FAIL), _outcome("c", FAIL), _outcome("d", NA)]
    s = _session(outcomes, errors=["bad"], judge=judge)
    assert s.text_report(_ctx(), None, False, explain=False) == "\n".join([
        "", "report of b", "", "report of c", "",
        "peer 1.0: results differ from peer.yaml:", "  c: fails, not expected", "spec error: bad", "",
        "4 spec(s) on peer 1.0: 1 pass, 2 fail (1 expected), 1 n/a in 2.3s; DOES NOT match its expectations"])
    assert "\nreport of d" in s.text_report(_ctx(), None, False, explain=True)
    judge.problems, judge.expectations_file = {"a": "a: x"}, None
    s = _session(outcomes[:1], judge=judge)
    assert s._target_report(False).startswith("\npeer 1.0: results differ from its expectations (none):\n  a: x\n")
    judge.problems = {}
    assert _session(outcomes[:2], judge=judge)._target_report(False) == (
        "\nreport of b\n\n2 spec(s) on peer 1.0: 1 pass, 1 fail (1 expected), 0 n/a in 2.3s; matches its expectations")


def test_the_table_of_each_judge():
    rows = [(SimpleNamespace(id="a/long-name"), None, "cpu-fp32-triton"), (SimpleNamespace(id="b"), None, "x")]
    t = _session(rows=rows).table()
    assert isinstance(t, StatusTable) and (t.id_width, t.golden_width) == (11, 15)
    t = _session(rows=rows, judge=_TargetJudge(expected=["b"])).table()
    assert isinstance(t, TargetTable) and t.width == 11 and list(t.expected) == ["b"]
    assert golden_folders(Path("g"), []) == "none"


def test_the_text_report_lists_every_stale_golden_and_the_world_size_lines(monkeypatch):
    _interpreter(monkeypatch)
    s = _session([_outcome("a", runner.PASS, notes=["checked at topology tp2"])], stale=["p/x", "p/y"])
    text = s.text_report(_ctx(world_sizes=(2,)), None, False, False)
    assert text == "\n".join(["", "stale goldens (their spec no longer exists):", "  golden/p/x", "  golden/p/y",
                              "", "--world-size 2: tp2 on 1 spec(s)", "", s.summary(_ctx())])


def test_an_outcome_without_compile_figures_is_unmeasured(monkeypatch):
    _interpreter(monkeypatch, "compiled")
    o = _outcome("a", runner.PASS)
    del o.compile
    assert _session([o]).compile_figures()["mode"] == "unmeasured"


def test_another_targets_json_document_is_indented_as_the_goldens_is(monkeypatch):
    _interpreter(monkeypatch)
    s = _session([_outcome("a", PASS)], judge=_TargetJudge())
    assert s.json_document(_ctx()).startswith('{\n  "schema_version": ')
