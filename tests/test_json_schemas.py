"""Every `--json` output validates against its schema in docs/schemas/, and carries schema_version."""

import json
import pathlib

import jsonschema
import pytest

from lockstep.harness import cli
from lockstep.harness.jsonout import SCHEMA_VERSION

ROOT = pathlib.Path(__file__).resolve().parents[1]
SCHEMAS = ROOT / "docs" / "schemas"


def schema(name):
    doc = json.loads((SCHEMAS / f"{name}.schema.json").read_text())
    jsonschema.Draft202012Validator.check_schema(doc)
    return jsonschema.Draft202012Validator(doc)


def test_every_schema_is_valid_and_versioned():
    names = sorted(p.name for p in SCHEMAS.glob("*.schema.json"))
    assert names == ["check.schema.json", "diff-driver.schema.json", "doctor.schema.json", "expectations.schema.json",
                     "generate.schema.json",
                     "import-peer.schema.json", "list.schema.json", "make-checkpoint.schema.json",
                     "promote.schema.json", "record.schema.json", "regen.schema.json", "replay.schema.json",
                     "report.schema.json", "show.schema.json", "suite.schema.json", "validate.schema.json"]
    for n in names:
        assert json.loads((SCHEMAS / n).read_text())["properties"]["schema_version"] == {"const": SCHEMA_VERSION}


@pytest.mark.parametrize("target", ["lockstep", None])
def test_check_json_has_one_shape_with_or_without_a_target(target, monkeypatch, capsys):
    monkeypatch.chdir(ROOT)
    argv = ["check", "--json", "--device", "cpu", "coins/known-answers", "layer_ids/error-count"]
    assert cli.main(argv + (["--target", target] if target else [])) == 0
    doc = json.loads(capsys.readouterr().out)
    errors = [e.message for e in schema("check").iter_errors(doc)]
    assert not errors, errors
    assert doc["target"].startswith("lockstep-") and [s["id"] for s in doc["specs"]] == \
        ["coins/known-answers", "layer_ids/error-count"]


def test_a_document_the_schema_rejects():
    """The schema can fail: a document without schema_version, or with a made-up status."""
    v = schema("check")
    good = {"schema_version": 1, "command": "check", "lockstep_version": "0.1.0", "target": "lockstep-0.1.0",
            "platform": "cpu-fp32", "backend": "torch", "exit_code": 0, "seconds": 0.1, "summary": {"pass": 1},
            "specs": [{"id": "a/b", "kind": "coins", "status": "pass", "seconds": 0.0, "messages": [], "verdict": "pass"}],
            "spec_errors": [], "stale_goldens": [], "golden_folders": [], "expectations_file": None,
            "expectation_problems": []}
    assert not list(v.iter_errors(good))
    assert list(v.iter_errors({k: x for k, x in good.items() if k != "schema_version"}))
    assert list(v.iter_errors(good | {"specs": [good["specs"][0] | {"status": "green"}]}))
    assert list(v.iter_errors(good | {"specs": [good["specs"][0] | {"verdict": "ok"}]}))


def test_generate_json(tmp_path, capsys):
    ck = tmp_path / "ck"
    assert cli.main(["make-checkpoint", "--preset", "tiny", str(ck)]) == 0
    capsys.readouterr()
    assert cli.main(["generate", "--checkpoint", str(ck), "--prompt-ids", "1,2,3", "--seed", "4",
                     "--temperature", "0.8", "--max-new-tokens", "3", "--logprobs", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert not [e.message for e in schema("generate").iter_errors(doc)]
    assert doc["results"][0]["sampling"]["temperature"] == 0.8


def test_report_json(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(ROOT)
    out = tmp_path / "m.md"
    assert cli.main(["report", "--device", "cpu", "--target", "lockstep", "--out", str(out), "coins/known-answers"]) == 0
    doc = json.loads(out.with_suffix(".json").read_text())
    assert not [e.message for e in schema("report").iter_errors(doc)]
    assert doc["specs"]["coins/known-answers"][doc["targets"][0]]["status"] == "pass"
    capsys.readouterr()
    assert cli.main(["report", "--device", "cpu", "--target", "lockstep", "--out", str(out), "coins/known-answers",
                     "--json"]) == 0
    got = capsys.readouterr()
    assert json.loads(got.out) == json.loads(out.with_suffix(".json").read_text()) == doc    # --json: that document
    assert "wrote" in got.err and "wrote" not in got.out


def test_the_committed_conformance_matrix_validates():
    doc = json.loads((ROOT / "docs" / "conformance.json").read_text())
    assert not [e.message for e in schema("report").iter_errors(doc)]


def test_the_committed_conformance_matrix_validates():
    doc = json.loads((ROOT / "docs" / "conformance.json").read_text())
    assert not [e.message for e in schema("report").iter_errors(doc)]


def test_version_from_a_clone_that_was_never_installed(monkeypatch):
    import importlib.metadata

    import lockstep.harness.version as v

    def missing(name):
        raise importlib.metadata.PackageNotFoundError(name)
    monkeypatch.setattr(v, "_dist_version", missing)
    assert v.version() == v._PYPROJECT.read_text().split('version = "')[1].split('"')[0] + "+clone"
