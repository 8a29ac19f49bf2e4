"""The CI and adoption fixes of issue 25: truthy CI values, dry runs under CI, reproduce lines
that reproduce, the corrupt-golden hint, the suite from another directory, explicit checkpoint
mappings, several spec directories in one pytest run, and expectations by version range."""

import os
import shutil

import pytest

from lockstep.harness.cli import main
from tests.conftest import REPO


def run(capsys, *argv):
    code = main(list(argv))
    out = capsys.readouterr()
    return code, out.out + out.err


@pytest.mark.parametrize("value", ["1", "yes", "True", "on"])
def test_any_truthy_ci_value_blocks_golden_writes(project, capsys, monkeypatch, value):
    monkeypatch.setenv("CI", value)
    shutil.rmtree(project / "golden" / "shared")
    code, out = run(capsys, "regen")
    assert code == 2 and f"CI={value}" in out and not (project / "golden" / "shared").exists()
    code, out = run(capsys, "regen", "--dry-run")                  # writes nothing: allowed
    assert code == 0 and "would write 2 golden(s)" in out and not (project / "golden" / "shared").exists()
    assert run(capsys, "regen", "--allow-ci")[0] == 0 and (project / "golden" / "shared").is_dir()


@pytest.mark.parametrize("value", ["0", "false", "no", ""])
def test_a_falsy_ci_value_does_not(project, capsys, monkeypatch, value):
    monkeypatch.setenv("CI", value)
    assert run(capsys, "regen", "coins/known-answers")[0] == 0


def test_reproduce_lines_keep_the_spec_and_golden_directories(project, capsys, tmp_path, monkeypatch):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    g = project / "golden" / "shared" / "coins" / "known-answers.safetensors"
    data = bytearray(g.read_bytes())
    data[-1] ^= 1                                                   # one flipped bit in the stored hashes
    g.write_bytes(bytes(data))
    code, out = run(capsys, "check", "--specs", str(project / "specs"), "--golden", str(project / "golden"))
    assert code == 1
    assert f"reproduce: lockstep diff coins/known-answers --specs {project / 'specs'} --golden {project / 'golden'}" \
        in out, out
    assert "lockstep regen coins/known-answers` records a new golden in its place" in out


def test_the_suite_runs_from_another_directory(project, capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path.parent)
    code, out = run(capsys, "check", "--suite", str(project), "coins/known-answers")
    assert code == 0 and "1 spec(s): 1 pass" in out


GENERATE = """\
kind: generate
description: greedy generation from a checkpoint the suite names but does not hold
inputs:
  checkpoint: {path: models/big}
  requests:
    - {prompt: [1, 2, 3], sampling: {greedy: true, max_new_tokens: 2}}
"""


def test_a_checkpoint_outside_the_suite_only_when_named_by_the_runner(project, capsys, tmp_path):
    (project / "specs" / "generate").mkdir()
    (project / "specs" / "generate" / "big.yaml").write_text(GENERATE)
    code, out = run(capsys, "validate", "generate/big")
    assert code == 2 and "no checkpoint folder at 'models/big'" in out
    (project / "models").mkdir()
    (project / "models" / "big").symlink_to(REPO / "models" / "tiny-target")   # a link out of the suite: refused
    code, out = run(capsys, "validate", "generate/big")
    assert code == 2 and "leaves the project root" in out
    code, out = run(capsys, "validate", "generate/big", "--checkpoint-path", f"models/big={REPO / 'models' / 'tiny-target'}")
    assert code == 0, out
    assert run(capsys, "validate", "generate/big", "--checkpoint-path", "../x=/tmp")[0] == 2   # spec side stays inside


def test_pytest_runs_several_spec_directories_given_relative_to_its_ini(project, tmp_path, pytester, monkeypatch):
    """The team's repository holds its own spec directory; Lockstep's suite lies beside it,
    named by a relative path in pytest.ini: both run in one session from the repository (a pytest
    run in this process, as the plugin's own tests run theirs: a subprocess cost ~4 s more)."""
    repo = tmp_path / "team"
    shutil.copytree(project / "specs", repo / "own" / "specs")
    shutil.copytree(project / "golden", repo / "own" / "golden")
    (repo / "own" / "specs" / "coins" / "gumbel-endpoints.yaml").unlink()
    (repo / "pytest.ini").write_text("[pytest]\naddopts = -p no:cacheprovider\n"
                                     f"lockstep_specs = own/specs {os.path.relpath(project / 'specs', repo)}\n"
                                     f"lockstep_golden = own/golden {os.path.relpath(project / 'golden', repo)}\n")
    monkeypatch.chdir(repo)                                   # the ini is found from here, as from a shell
    result = pytester.runpytest_inprocess("-q")
    result.assert_outcomes(passed=5)                          # 2 of its own + Lockstep's 3


@pytest.mark.parametrize("out, message", [("matrix.txt", "expected a Markdown path ending in .md"),
                                          ("dir.md", "is a directory")])
def test_report_checks_out_before_anything_runs(project, capsys, out, message):
    (project / "dir.md").mkdir()
    code, text = run(capsys, "report", "--target", "lockstep", "--out", out)
    assert code == 2 and message in text and "wrote" not in text


def test_report_runs_the_peers_that_load_and_names_the_others(project, capsys, monkeypatch):
    from lockstep.harness.commands import targets as check
    from lockstep.harness.target import NotApplicable

    real = check.get

    def get(name):
        if name == "sglang":
            raise NotApplicable("sglang is not installed (pip install --no-deps sglang==0.5.23)")
        return real("lockstep") if name == "vllm" else real(name)
    monkeypatch.setattr(check, "get", get)
    monkeypatch.setattr(check, "PEERS", ("sglang", "vllm"))
    code, text = run(capsys, "report", "--out", str(project / "m.md"), "coins/known-answers")
    assert code == 0 and "not run: sglang: sglang is not installed" in text
    assert "## Not run here" in (project / "m.md").read_text()
