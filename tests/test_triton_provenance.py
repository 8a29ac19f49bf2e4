"""A golden recorded under another Triton is reported INCOMPARABLE (exit 4), naming both
versions, instead of crashing or mismatching (docs/triton.md; harness.golden.other_triton)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import triton

from lockstep.harness.cli import main
from lockstep.harness.commands.exits import EXIT_INCOMPARABLE, EXIT_OK
from lockstep.harness.golden import GoldenStore

ROOT = Path(__file__).resolve().parent.parent
SPEC = "primitives/log64-triton"
FOLDER = "cpu-fp32-triton"


def golden_under(tmp_path, version: str) -> Path:
    """A copy of the spec's golden whose provenance names `version` as its Triton."""
    src = ROOT / "golden" / FOLDER / SPEC
    dst = tmp_path / "golden" / FOLDER / SPEC
    dst.parent.mkdir(parents=True)
    shutil.copy(str(src) + ".safetensors", str(dst) + ".safetensors")
    manifest = json.loads(Path(str(src) + ".json").read_text())
    manifest["provenance"]["bit_dependencies"]["triton"] = version
    Path(str(dst) + ".json").write_text(json.dumps(manifest))
    return tmp_path / "golden"


def test_other_triton_names_both_versions_and_only_for_triton_folders(tmp_path):
    store = GoldenStore(golden_under(tmp_path, "3.0.0"))
    msg = store.other_triton(FOLDER, SPEC, "3.6.0")
    assert msg and "triton 3.0.0" in msg and "triton 3.6.0" in msg and msg.startswith("not comparable")
    assert store.other_triton(FOLDER, SPEC, "3.0.0") is None          # the same Triton: compared as usual
    assert store.other_triton("cpu-fp32", SPEC, "3.6.0") is None      # a torch folder does not depend on it
    assert store.other_triton(FOLDER, "primitives/none-such", "3.6.0") is None   # no golden: MISSING as before


def test_check_reports_incomparable_with_its_exit_code(tmp_path, capsys):
    golden = golden_under(tmp_path, "0.0.1")
    argv = ["check", SPEC, "--golden", str(golden), "--dtype", "fp32", "--backend", "triton"]
    assert main(argv) == EXIT_INCOMPARABLE
    out = capsys.readouterr().out
    assert "INCOMPARABLE" in out and "triton 0.0.1" in out and f"triton {triton.__version__}" in out, out
    assert "CRASH" not in out and "MISMATCH" not in out


def test_the_recorded_triton_is_compared_as_before(tmp_path, capsys):
    golden = golden_under(tmp_path, triton.__version__)
    assert main(["check", SPEC, "--golden", str(golden), "--dtype", "fp32", "--backend", "triton"]) == EXIT_OK, \
        capsys.readouterr().out


def golden_with_provenance(tmp_path, edit) -> Path:
    golden = golden_under(tmp_path, triton.__version__)
    path = golden / FOLDER / (SPEC + ".json")
    manifest = json.loads(path.read_text())
    edit(manifest["provenance"]["bit_dependencies"])
    path.write_text(json.dumps(manifest))
    return golden


def test_an_unreadable_triton_version_is_shown_cut_at_40_characters(tmp_path):
    version = list(range(30))
    golden = golden_with_provenance(tmp_path, lambda deps: deps.update(triton=version))
    text = GoldenStore(golden).other_triton(FOLDER, SPEC, triton.__version__)
    assert f"(provenance.bit_dependencies.triton is not a string: {repr(version)[:40]}), and a Triton" in text, text


@pytest.mark.parametrize("edit,words", [
    (lambda deps: deps.pop("triton"), "is missing"),
    (lambda deps: deps.update(triton=3.6), "not a string: 3.6"),
    (lambda deps: deps.update(triton=None), "missing"),
])
def test_a_triton_golden_without_a_readable_version_fails_closed(tmp_path, capsys, edit, words):
    golden = golden_with_provenance(tmp_path, edit)
    assert GoldenStore(golden).other_triton(FOLDER, SPEC, triton.__version__).startswith("not comparable")
    argv = ["check", SPEC, "--golden", str(golden), "--dtype", "fp32", "--backend", "triton", "--json"]
    assert main(argv) == EXIT_INCOMPARABLE
    doc = json.loads(capsys.readouterr().out)
    assert doc["exit_code"] == EXIT_INCOMPARABLE and doc["specs"][0]["status"] == "incomparable"
    assert words in " ".join(doc["specs"][0]["messages"])
    import jsonschema
    schema = json.loads((ROOT / "docs" / "schemas" / "check.schema.json").read_text())
    assert not [e.message for e in jsonschema.Draft202012Validator(schema).iter_errors(doc)]
