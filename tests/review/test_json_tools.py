"""--json of suite, doctor, make-checkpoint, diff-driver, record, promote and expectations: one document on stdout
with schema_version and ok, valid against its schema in docs/schemas/ (which rejects a document
without them), the text report kept off stdout."""

import json
import shutil
import subprocess

import jsonschema
import pytest

from lockstep.harness.cli import main
from lockstep.harness.replay.format import read_trace
from tests.conftest import REPO


def validator(name):
    doc = json.loads((REPO / "docs/schemas" / f"{name}.schema.json").read_text())
    jsonschema.Draft202012Validator.check_schema(doc)
    return jsonschema.Draft202012Validator(doc)


def valid(name: str, doc: dict) -> dict:
    v = validator(name)
    errors = [e.message for e in v.iter_errors(doc)]
    assert not errors, errors
    assert doc["schema_version"] == 1 and doc["command"] == name
    for key in ("schema_version", "ok"):                    # the schema can fail
        assert list(v.iter_errors({k: x for k, x in doc.items() if k != key}))
    return doc


def document(capsys, *argv, code=0) -> dict:
    assert main(list(argv)) == code
    out = capsys.readouterr().out
    return json.loads(out)                                  # stdout holds the document only


def test_suite_json(tmp_path, monkeypatch, capsys):
    (tmp_path / "specs").mkdir()
    monkeypatch.setenv("LOCKSTEP_SUITE", str(tmp_path))
    doc = valid("suite", document(capsys, "suite", "--json"))
    assert doc["ok"] and doc["specs"] == str(tmp_path / "specs") and doc["models"] is None


def test_doctor_json(capsys):
    code = main(["doctor", "--inputs", "1024", "--json"])
    doc = valid("doctor", json.loads(capsys.readouterr().out))
    assert doc["ok"] == (code == 0) and doc["inputs"] == 1024 and doc["checks"]
    assert all(c["ieee"] == (c["wrong"] == 0) for c in doc["checks"])
    assert doc["ok"] == all(c["ieee"] for c in doc["checks"])


def test_make_checkpoint_json(tmp_path, capsys):
    doc = valid("make-checkpoint", document(capsys, "make-checkpoint", "--preset", "tiny", str(tmp_path / "ck"),
                                            "--json"))
    assert doc["ok"] and doc["preset"] == "tiny" and "config.json" in doc["files"] and doc["parameter_bytes"] > 0


@pytest.mark.skipif(shutil.which("git") is None, reason="needs git")
def test_diff_driver_json(tmp_path, capsys):
    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)
    doc = valid("diff-driver", document(capsys, "diff-driver", "--repo", str(tmp_path), "--json"))
    assert (doc["action"], doc["attributes_routed"]) == ("installed", False)
    (tmp_path / ".gitattributes").write_text(doc["attributes_line"] + "\n")
    assert valid("diff-driver", document(capsys, "diff-driver", "--repo", str(tmp_path), "--json"))["attributes_routed"]
    assert valid("diff-driver", document(capsys, "diff-driver", "--repo", str(tmp_path), "--uninstall",
                                         "--json"))["action"] == "removed"
    assert valid("diff-driver", document(capsys, "diff-driver", "--repo", str(tmp_path), "--uninstall",
                                         "--json"))["action"] == "absent"


def test_record_and_promote_json(tmp_path, capsys):
    trace = tmp_path / "t.jsonl"
    doc = valid("record", document(capsys, "record", str(trace), "--preset", "tiny", "--prompt-ids", "5,6,7",
                                   "--prompt-ids", "9,10", "--max-new-tokens", "2", "--device", "cpu", "--json"))
    t = read_trace(trace)
    assert doc["ok"] and (doc["requests"], doc["source"]) == (2, "lockstep") and doc["out"] == str(trace)
    assert doc["steps"] == sum(len(s) for s in t.steps) and doc["finish_reasons"] == [r["finish_reason"]
                                                                                      for r in t.requests]
    specs = tmp_path / "specs"
    doc = valid("promote", document(capsys, "promote", str(trace), "replay/one", "--specs", str(specs), "--json"))
    assert (doc["kind"], doc["requests"]) == ("generate", 2) and (specs / "replay" / "one.yaml").exists()
    assert doc["regen"] == f"lockstep regen --specs {specs} replay/one"


def test_expectations_json(tmp_path, monkeypatch, capsys):
    """An outside engine with a planted sampler bug: the file written, its one failure, to judge."""
    from tests.targets.outside import engine

    monkeypatch.chdir(REPO)
    monkeypatch.setattr("lockstep.harness.commands.targets.get", lambda name: engine("seed-offset"))
    out = tmp_path / "exp.yaml"
    assert main(["expectations", "--target", "outside", "--write", str(out), "--json", "generate/top-k"]) == 0
    printed = capsys.readouterr()
    doc = valid("expectations", json.loads(printed.out))           # stdout holds the document only
    assert doc["ok"] and doc["file"] == str(out) and out.is_file()
    assert (doc["specs"], doc["failures"], doc["unjudged"], doc["not_applicable"]) == (1, 1, 1, 0), doc
    assert f"wrote {out}: 1 failure(s)" in printed.err
