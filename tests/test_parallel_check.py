"""`lockstep check -j N` (harness/workers.py) reports exactly what a serial run reports: the same
table and report in the same order, the same JSON document and the same exit code, the seconds
aside. The project mixes a pass, a mismatch (an edited spec against its old golden) and a missing
golden, so the order of non-passing rows and the exit code are both at stake."""

import json
import re

import pytest

from lockstep.harness.cli import main

from .conftest import COINS


def scenario(project):
    spec = project / "specs" / "coins" / "known-answers.yaml"
    spec.write_text(spec.read_text().replace("[1, 7, 1]", "[1, 7, 2]"))   # bits move: MISMATCH
    (project / "specs" / "coins" / "zz-new.yaml").write_text(COINS)      # no golden: MISSING


def check(capsys, *argv):
    code = main(["check", *argv])
    return code, capsys.readouterr().out


def without_seconds(text: str) -> str:
    return re.sub(r" *\d+\.\d+s", " <t>s", text)


def test_two_workers_report_what_one_reports(project, capsys):
    scenario(project)
    serial, serial_out = check(capsys, "-j", "1")
    parallel, parallel_out = check(capsys, "-j", "2")
    assert serial == parallel == 1                    # a mismatch outranks a missing golden
    assert "MISMATCH  coins/known-answers" in serial_out and "MISSING" in serial_out
    assert without_seconds(parallel_out) == without_seconds(serial_out)


def test_two_workers_write_the_serial_json(project, capsys):
    scenario(project)
    docs = []
    for jobs in ("1", "2"):
        code, out = check(capsys, "--json", "-j", jobs)
        doc = json.loads(out)
        assert doc["exit_code"] == code == 1
        doc.pop("seconds")
        assert doc["compile"].pop("processes") == int(jobs)      # the one field -j is meant to change
        doc["compile"].pop("run_seconds")
        for s in doc["specs"]:
            s.pop("seconds")
        docs.append(doc)
    assert docs[0] == docs[1]
    assert {s["status"] for s in docs[0]["specs"]} == {"pass", "mismatch", "missing"}


@pytest.mark.parametrize("bad", ["0", "-1", "two"])
def test_jobs_must_be_a_positive_number(tmp_path, monkeypatch, capsys, bad):
    monkeypatch.chdir(tmp_path)
    assert main(["check", "-j", bad]) == 2                 # a usage error, before anything runs
    err = capsys.readouterr().err                          # the one shared integer option type's words
    assert "argument -j/--jobs" in err and repr(bad).strip("'") in err
    assert ("must be at least 1" if bad.lstrip("-").isdigit() else "expected a whole number") in err
