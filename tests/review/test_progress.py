"""Long commands show progress: a plain line every $LOCKSTEP_PROGRESS_SECONDS in a CI log (none
for a run shorter than that), and per-spec lines for check --target, report and expectations."""

import io
import time

from lockstep.harness.cli import main
from lockstep.harness.heartbeat import Heartbeat


def test_a_heartbeat_prints_plain_lines_off_a_terminal(monkeypatch):
    monkeypatch.setenv("LOCKSTEP_PROGRESS_SECONDS", "0.05")
    out = io.StringIO()
    counter = iter(range(1000))
    with Heartbeat("run of 2 request(s) on cpu", 40, lambda: next(counter), stream=out) as hb:
        time.sleep(0.3)
    lines = out.getvalue().splitlines()
    assert hb.lines >= 2 and lines[0].startswith("lockstep: run of 2 request(s) on cpu: 0/40 steps,")
    assert "\r" not in out.getvalue()


def test_a_short_run_prints_nothing(monkeypatch):
    monkeypatch.delenv("LOCKSTEP_PROGRESS_SECONDS", raising=False)
    out = io.StringIO()
    with Heartbeat("run", stream=out):
        pass
    assert out.getvalue() == ""


def test_record_and_replay_say_where_they_are_in_a_ci_log(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("LOCKSTEP_PROGRESS_SECONDS", "0.01")
    trace = tmp_path / "t.jsonl"
    assert main(["record", str(trace), "--checkpoint", "models/tiny-target", "--prompt-ids", "1,2,3",
                 "--max-new-tokens", "6", "--device", "cpu"]) == 0
    err = capsys.readouterr().err
    assert "lockstep: run of 1 request(s) on cpu:" in err and "lockstep: teacher-forced run of 1 request(s)" in err
    assert main(["replay", str(trace)]) == 0
    assert "lockstep: run of 1 request(s) on cpu:" in capsys.readouterr().err


def test_check_target_prints_a_line_per_spec_in_a_ci_log(capsys, monkeypatch):
    """As on the engine path: the table's row as each spec finishes (stdout), and under --json, where
    stdout is the document, a progress line per spec on stderr."""
    from tests.conftest import REPO
    monkeypatch.chdir(REPO)
    assert main(["check", "--target", "hf", "coins/known-answers", "layer_ids/error-count"]) in (0, 1)
    rows = [line.split()[:2] for line in capsys.readouterr().out.splitlines() if line.split()[:1] in (["pass"], ["fail"], ["n/a"])]
    assert [spec for _, spec in rows] == ["coins/known-answers", "layer_ids/error-count"], rows
    assert main(["check", "--json", "--target", "hf", "coins/known-answers", "layer_ids/error-count"]) in (0, 1)
    err = capsys.readouterr().err
    assert "[1/2]" in err and "[2/2]" in err


def test_numpy_warnings_never_reach_the_terminal(capsys):
    import subprocess
    import sys

    from tests.conftest import REPO
    done = subprocess.run([sys.executable, "-m", "lockstep", "doctor", "--inputs", "1024"], cwd=REPO,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0 and "Warning" not in done.stderr + done.stdout


def test_generic_numpy_warning_is_filtered_without_debug(monkeypatch):
    import warnings

    import numpy

    from lockstep.harness import cli

    def noisy(args):
        numpy.array([1.0]) / numpy.array([0.0])
        return 0
    monkeypatch.setattr("lockstep.harness.commands.suite.cmd_suite", noisy)
    for argv, shown in ((["suite"], False), (["--debug", "suite"], True)):
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            assert cli.main(argv) == 0
        assert any("divide by zero" in str(w.message) for w in seen) is shown


def _toys(monkeypatch):
    from lockstep.harness.target import Op, Target
    from lockstep.kernels.coins import murmur_hash32_torch

    toys = {n: Target(n, "1.0", ops={"hash": Op(murmur_hash32_torch)}) for n in ("a", "b")}
    monkeypatch.setattr("lockstep.harness.commands.targets.get", lambda name: toys[name])


def test_report_and_expectations_print_a_line_per_spec_in_a_ci_log(project, capsys, monkeypatch):
    """Off a terminal: a line per finished spec on stderr, naming the target, counted over every
    target `report` runs."""
    _toys(monkeypatch)
    specs = ["coins/known-answers", "coins/gumbel-endpoints"]
    assert main(["report", "--target", "a", "--target", "b", "--out", "m.md", *specs]) == 0
    lines = [line for line in capsys.readouterr().err.splitlines() if line.startswith("[")]
    assert lines == ["[1/4] n/a     coins/gumbel-endpoints on a-1.0", "[2/4] pass    coins/known-answers on a-1.0",
                     "[3/4] n/a     coins/gumbel-endpoints on b-1.0", "[4/4] pass    coins/known-answers on b-1.0"]
    assert main(["expectations", "--target", "a", "--write", "a.yaml", *specs]) == 0
    lines = [line for line in capsys.readouterr().err.splitlines() if line.startswith("[")]
    assert lines == ["[1/2] n/a     coins/gumbel-endpoints on a-1.0", "[2/2] pass    coins/known-answers on a-1.0"]


def test_report_shows_a_counter_on_a_terminal(project, monkeypatch):
    """On a terminal: the counter line, rewritten in place (no per-spec lines), cleared at the end."""
    import sys

    class Terminal(io.StringIO):
        def isatty(self):
            return True
    _toys(monkeypatch)
    monkeypatch.setattr(sys, "stderr", Terminal())
    assert main(["report", "--target", "a", "--target", "b", "--out", "m.md", "coins/known-answers"]) == 0
    err = sys.stderr.getvalue()
    assert "\r[1/2]" in err and "\r[2/2]" in err and "coins/known-answers" in err
    assert "[1/2] pass" not in err and err.endswith("\r")          # cleared: the line is blank again
