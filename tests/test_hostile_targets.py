"""Targets and the pytest plugin under hostile use (issue 29): a target whose code crashes is one
located line in `check --target`'s report (its traceback with --debug); a plugin target that cannot
load (a factory of the wrong type, malformed expectations), a golden folder that is a file and
wrong ini values are named usage errors (exit 2, pytest's usage-error path), never a traceback or
an INTERNALERROR."""

import shutil
import sys

import pytest

from lockstep.harness.cli import main
from tests.conftest import REPO

ADAPTER = '''
from pathlib import Path

from lockstep.harness.targets import Op, Target
from lockstep.kernels.coins import murmur_hash32_torch


def crashing_hash(seeds, positions, columns):
    import no_such_peer_module                  # a peer whose import breaks, as transformers' did


def crashing():
    return Target("crashy", "1.0", ops={"hash": Op(crashing_hash)})


def wrong_type():
    return {"name": "not a Target"}


def crashing_factory():
    import no_such_engine_module                # the engine's package is not installed


def malformed():
    return Target("malformed", "1.0", ops={"hash": Op(murmur_hash32_torch)},
                  expectations=str(Path(__file__).with_name("malformed-1.0.yaml")))
'''


def run(capsys, *argv):
    code = main(list(argv))
    out = capsys.readouterr()
    return code, out.out + out.err


@pytest.fixture
def plugins(project, monkeypatch):
    """The scratch project (three coin specs, goldens recorded) with three plugin targets registered
    through the entry point group lockstep.targets: one that crashes, one whose factory returns the
    wrong type, one whose expectations file is malformed YAML."""
    dist = project / "hostile_targets-1.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: hostile_targets\nVersion: 1.0\n")
    (dist / "entry_points.txt").write_text("[lockstep.targets]\ncrashy = hostile_adapter:crashing\n"
                                           "wrongtype = hostile_adapter:wrong_type\n"
                                           "malformed = hostile_adapter:malformed\n"
                                           "brokenfactory = hostile_adapter:crashing_factory\n")
    (project / "hostile_adapter.py").write_text(ADAPTER)
    (project / "malformed-1.0.yaml").write_text("target: malformed\nversion: '1.0'\nfailures: [unclosed\n")
    monkeypatch.syspath_prepend(str(project))
    monkeypatch.delitem(sys.modules, "hostile_adapter", raising=False)
    return project


def test_a_crashing_target_is_one_located_line_and_its_traceback_comes_with_debug(plugins, capsys):
    code, out = run(capsys, "check", "--target", "crashy", "coins/known-answers")
    assert code == 1 and "Traceback" not in out, out
    assert "crash: ModuleNotFoundError: No module named 'no_such_peer_module' (at " in out
    assert "hostile_adapter.py:" in out and "in crashing_hash)" in out
    code, out = run(capsys, "check", "--target", "crashy", "coins/known-answers", "--debug")
    assert code == 1 and "Traceback (most recent call last)" in out


def test_a_crash_recorded_as_expected_stays_the_same_observed_line(plugins, capsys):
    """The location is not part of the `observed` line an expectations file records (it names a
    path of the machine that ran it): the first line stays `crash: Type: message`."""
    from lockstep.harness.golden import GoldenStore
    from lockstep.harness.platform import detect
    from lockstep.harness.result import RunContext
    from lockstep.harness.specfile import load_specs, select
    from lockstep.harness.targets import get
    from lockstep.harness.targets.judge import FAIL, run_on_target

    specs, _ = load_specs(plugins / "specs")
    (spec,) = select(specs, ["coins/known-answers"], [])
    out = run_on_target(spec, RunContext(platform=detect("cpu")), get("crashy"), GoldenStore(plugins / "golden"))
    assert out.status == FAIL and out.message == "crash: ModuleNotFoundError: No module named 'no_such_peer_module'"
    assert "Traceback (most recent call last)" in out.traceback


@pytest.mark.parametrize("name,fragment", [
    ("wrongtype", "target 'wrongtype': its factory returned dict, not a harness.targets.Target"),
    ("malformed", "malformed-1.0.yaml:4"),
    ("brokenfactory", "its factory crashed: ModuleNotFoundError: No module named 'no_such_engine_module' (at "),
])
def test_a_plugin_target_that_cannot_load_is_a_usage_error(plugins, capsys, name, fragment):
    for argv in (["check", "--target", name], ["list", "--target", name],
                 ["report", "--target", name, "--out", str(plugins / "m.md")]):
        code, out = run(capsys, *argv)
        assert code == 2 and fragment in out and "Traceback" not in out and "internal error" not in out, (argv, out)
        assert "<unicode string>" not in out


def test_a_crashing_factory_shows_its_traceback_with_debug(plugins, capsys):
    code, out = run(capsys, "check", "--target", "brokenfactory", "--debug")
    assert code == 2 and "Traceback (most recent call last)" in out and "import no_such_engine_module" in out



# --------------------------------------------------------------------------- the pytest plugin
@pytest.fixture
def scratch(pytester, monkeypatch):
    monkeypatch.delenv("CI", raising=False)
    (pytester.path / "specs/coins").mkdir(parents=True)
    shutil.copy(REPO / "specs/coins/known-answers.yaml", pytester.path / "specs/coins")
    return pytester


def usage_error(result, fragment):
    assert result.ret == pytest.ExitCode.USAGE_ERROR, result.stdout.str() + result.stderr.str()
    text = result.stdout.str() + result.stderr.str()
    assert "INTERNALERROR" not in text and "Traceback" not in text, text
    assert fragment in text, text


def test_plugin_regen_into_a_golden_folder_that_is_a_file(scratch):
    scratch.makeini("[pytest]\ntestpaths = specs\nlockstep_specs = specs\nlockstep_golden = golden.txt\n")
    (scratch.path / "golden.txt").write_text("not a folder")
    usage_error(scratch.runpytest("--lockstep-regen"), "golden.txt")


@pytest.mark.parametrize("ini,fragment", [
    ("lockstep_specs = no-such-specs", "no-such-specs (in tox.ini)"),       # resolved against the ini file
    ("lockstep_specs = specs\nlockstep_golden = no-such-golden", "no-such-golden (in tox.ini)"),
    ("lockstep_specs = specs/coins/known-answers.yaml", "is not a folder"),
])
def test_plugin_names_a_wrong_ini_value(scratch, ini, fragment):
    scratch.makeini(f"[pytest]\ntestpaths = specs\n{ini}\n")
    usage_error(scratch.runpytest(), fragment)


OPENAPI = "openapi: 3.1.0\ninfo: {title: pets, version: '1'}\npaths: {}\n"


def test_plugin_stays_out_of_a_project_that_did_not_opt_in(pytester):
    """Installed, the plugin loads into every pytest run: a project with its own specs/*.yaml (an
    OpenAPI file) and one test runs green, with no item and no warning of Lockstep's."""
    (pytester.path / "specs").mkdir()
    (pytester.path / "specs" / "api.yaml").write_text(OPENAPI)
    pytester.makepyfile(test_x="def test_x():\n    pass\n")
    # -W error for every deprecation (pytest's own removals included); -p no:benchmark: pytest-benchmark
    # warns that xdist is active whenever this suite runs under -n
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-p", "no:benchmark", "-W", "error::DeprecationWarning")
    result.assert_outcomes(passed=1)
    shown = [line for line in result.stdout.lines if not line.startswith("plugins:")]   # pytest lists it there
    assert not [line for line in shown if "warning" in line.lower() or "lockstep" in line.lower()], shown


def test_plugin_collects_the_same_project_once_it_opts_in(pytester):
    """The planted counterpart: with lockstep_specs set, specs/api.yaml is collected and refused as a
    spec, so the test above would see it if opting in were not required."""
    (pytester.path / "specs").mkdir()
    (pytester.path / "specs" / "api.yaml").write_text(OPENAPI)
    pytester.makeini("[pytest]\nlockstep_specs = specs\n")
    result = pytester.runpytest("-p", "no:cacheprovider")
    result.assert_outcomes(failed=1)
    assert "missing required key 'kind'" in result.stdout.str(), result.stdout.str()


def test_a_lockstep_option_without_a_suite_says_how_to_opt_in(pytester):
    pytester.makepyfile(test_x="def test_x():\n    pass\n")
    usage_error(pytester.runpytest("--lockstep-regen"), "no Lockstep suite in this run: set lockstep_specs")


@pytest.mark.parametrize("name,fragment", [
    ("wrongtype", "its factory returned dict, not a harness.targets.Target"),
    ("malformed", "malformed-1.0.yaml:4"),
    ("brokenfactory", "its factory crashed: ModuleNotFoundError: No module named 'no_such_engine_module' (at "),
])
def test_plugin_target_that_cannot_load_is_a_usage_error(scratch, monkeypatch, name, fragment):
    scratch.makeini("[pytest]\ntestpaths = specs\nlockstep_specs = specs\n")
    dist = scratch.path / "hostile_targets-1.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: hostile_targets\nVersion: 1.0\n")
    (dist / "entry_points.txt").write_text("[lockstep.targets]\nwrongtype = hostile_adapter:wrong_type\n"
                                           "malformed = hostile_adapter:malformed\n"
                                           "brokenfactory = hostile_adapter:crashing_factory\n")
    (scratch.path / "hostile_adapter.py").write_text(ADAPTER)
    (scratch.path / "malformed-1.0.yaml").write_text("target: malformed\nversion: '1.0'\nfailures: [unclosed\n")
    monkeypatch.syspath_prepend(str(scratch.path))
    monkeypatch.delitem(sys.modules, "hostile_adapter", raising=False)
    usage_error(scratch.runpytest("--lockstep-target", name), fragment)


def test_plugin_device_without_a_gpu_is_one_usage_error(scratch):
    import torch

    if torch.cuda.is_available():
        pytest.skip("a GPU is present")
    scratch.makeini("[pytest]\ntestpaths = specs\nlockstep_specs = specs\n")
    usage_error(scratch.runpytest("--lockstep-device", "cuda"), "--lockstep-device: ")
