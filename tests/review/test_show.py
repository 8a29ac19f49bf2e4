"""`lockstep show` prints a golden's values so that different bits never print alike; the git
diff driver makes `git diff` of a changed golden show those values."""

import json
import shutil
import subprocess
import sys

import jsonschema
import pytest
import torch
from safetensors.torch import save_file

from lockstep.harness.cli import main
from lockstep.harness.goldenview import values_text
from tests.conftest import REPO


def run(capsys, *argv):
    code = main(list(argv))
    out = capsys.readouterr()
    return code, out.out + out.err


def test_values_text_tells_every_bit_pattern_apart():
    t = torch.tensor([0.0, -0.0, 1.0, float("nan"), 1 + 2.0**-23])
    assert values_text(t) == ["0.0", "-0.0", "1.0", "nan (0x7fc00000)", "1.0000001"]
    assert values_text(t, bits=True)[1] == "-0.0 (0x80000000)"
    odd_nan = torch.tensor([0x7FC00001], dtype=torch.int32).view(torch.float32)
    assert values_text(odd_nan) == ["nan (0x7fc00001)"]
    assert values_text(torch.tensor([1.0, 1.0078125], dtype=torch.bfloat16), bits=True) == \
        ["1.0 (0x3f80)", "1.0078125 (0x3f81)"]


def test_show_prints_requests_as_steps(monkeypatch, capsys):
    monkeypatch.chdir(REPO)
    code, out = run(capsys, "show", "generate/batch-of-eight", "--pair", "fp32/torch")
    assert code == 0 and "generate/batch-of-eight on cpu-fp32" in out
    assert "request 7:" in out and "step 0: token 434  logprob -3.8219247" in out
    assert "finish_reasons" in out and "cpu-bf16" not in out
    code, out = run(capsys, "show", "generate/batch-of-eight", "--pair", "fp32/torch", "--bits")
    assert "logprob -3.8219247 (0x" in out


def test_show_json_validates(monkeypatch, capsys):
    monkeypatch.chdir(REPO)
    assert main(["show", "coins/known-answers", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    schema = json.loads((REPO / "docs/schemas/show.schema.json").read_text())
    assert not list(jsonschema.Draft202012Validator(schema).iter_errors(doc))
    (g,) = doc["goldens"]
    assert g["tensors"]["hash"]["values"][4] == "4294967295" and doc["schema_version"] == 1


def test_show_refuses_an_unknown_golden(monkeypatch, capsys):
    monkeypatch.chdir(REPO)
    code, out = run(capsys, "show", "coins/no-such")
    assert code == 2 and "no golden matches 'coins/no-such'" in out


def _git(repo, *argv):
    return subprocess.run(["git", "-C", str(repo), *argv], capture_output=True, text=True, check=True).stdout


@pytest.mark.skipif(shutil.which("git") is None, reason="needs git")
def test_git_diff_of_a_changed_golden_shows_values(tmp_path, capsys):
    repo = tmp_path / "r"
    repo.mkdir()
    _git(repo, "init", "-q")
    _git(repo, "config", "user.email", "t@t")
    _git(repo, "config", "user.name", "t")
    shutil.copy(REPO / ".gitattributes", repo / ".gitattributes")
    golden = repo / "g.safetensors"
    save_file({"logprobs_0": torch.tensor([-1.5, -2.25]), "tokens_0": torch.tensor([3, 4])}, golden)
    _git(repo, "add", ".")
    _git(repo, "commit", "-qm", "a")
    save_file({"logprobs_0": torch.tensor([-1.5, -2.2500002]), "tokens_0": torch.tensor([3, 4])}, golden)
    assert "Bin " in _git(repo, "diff", "--stat") or "Binary" in _git(repo, "diff")   # before the driver
    assert main(["diff-driver", "--repo", str(repo)]) == 0
    out = capsys.readouterr().out
    assert "diff.lockstep-golden.textconv" in out and "add this line" not in out
    assert sys.executable in _git(repo, "config", "--local", "diff.lockstep-golden.textconv")
    diff = _git(repo, "diff")
    assert "-    step 1: token 4  logprob -2.25" in diff and "+    step 1: token 4  logprob -2.2500002" in diff
    assert main(["diff-driver", "--repo", str(repo), "--uninstall"]) == 0
    assert "Binary" in _git(repo, "diff")


def test_diff_driver_names_the_missing_attributes_line(tmp_path, capsys):
    _git(tmp_path, "init", "-q")
    assert main(["diff-driver", "--repo", str(tmp_path)]) == 0
    assert "*.safetensors diff=lockstep-golden" in capsys.readouterr().out
