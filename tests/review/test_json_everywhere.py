"""--json of list, validate, diff and regen: one document on stdout with schema_version, valid
against its schema in docs/schemas/ (and a document the schema must reject)."""

import json

import jsonschema
import lockstep.kernels.coins
import pytest

from lockstep.harness.cli import main
from tests.conftest import REPO


def validator(name):
    doc = json.loads((REPO / "docs/schemas" / f"{name}.schema.json").read_text())
    jsonschema.Draft202012Validator.check_schema(doc)
    return jsonschema.Draft202012Validator(doc)


def document(capsys, *argv, code=0):
    assert main(list(argv)) == code
    return json.loads(capsys.readouterr().out)


@pytest.mark.parametrize("command, schema", [("list", "list"), ("validate", "validate"), ("diff", "check"),
                                             ("regen", "regen")])
def test_json_validates(project, capsys, command, schema):
    doc = document(capsys, command, "coins/known-answers", "--json")
    assert doc["schema_version"] == 1 and not list(validator(schema).iter_errors(doc))
    bad = dict(doc)
    del bad["schema_version"]
    assert list(validator(schema).iter_errors(bad))


def test_list_and_validate_report_spec_errors(project, capsys):
    (project / "specs/coins/broken.yaml").write_text("kind: coins\n")
    doc = document(capsys, "validate", "--json", code=2)
    assert doc["invalid_files"] == 1 and "broken.yaml" in doc["spec_errors"][0] and len(doc["valid"]) == 3


def test_regen_json_says_what_moved_and_keeps_stdout_for_the_document(project, capsys, monkeypatch):
    monkeypatch.setattr(lockstep.kernels.coins, "U_DIVISOR", 2**32)
    assert main(["regen", "--dry-run", "--json", "coins/gumbel-endpoints"]) == 0
    out = capsys.readouterr()
    doc = json.loads(out.out)
    assert "what moved" in out.err and doc["dry_run"] is True and doc["summary"]["changed"] == 1
    (g,) = doc["goldens"]
    assert g["status"] == "changed" and g["moved"]["floats"] == ["gumbel"] and g["moved"]["max_ulp"] > 0
    assert not list(validator("regen").iter_errors(doc))
