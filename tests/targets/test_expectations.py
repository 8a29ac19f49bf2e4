"""Expectations files by version range, their errors located, the writer, and refusals judged by
their facts (a target's own exception types count; an undeclared one is a crash)."""

import pathlib

import pytest
import yaml

from lockstep.harness import cli
from lockstep.harness.golden import GoldenStore
from lockstep.harness.platform import detect
from lockstep.harness.result import RunContext
from lockstep.harness.specfile import load_specs, select
from lockstep.harness.target import Op, Target
from lockstep.harness.targets.expectfile import ExpectationsError, find, load
from lockstep.harness.targets.judge import FAIL, PASS, error_facts, run_on_target

ROOT = pathlib.Path(__file__).resolve().parents[2]
ENTRY = ("failures:\n  coins/known-answers:\n    observed: the first line\n    judgement: peer bug\n"
         "    why: a reason\n")


def write(tmp_path, head, body=ENTRY):
    p = tmp_path / "exp.yaml"
    p.write_text(head + body)
    return p


@pytest.mark.parametrize("version, holds", [("1.0.0", True), ("1.3.0.dev4+g1a2b3c", True), ("1.9rc1", True),
                                            ("0.9", False), ("2.0.0", False), ("2.0.0.dev1", False)])
def test_a_version_range_holds_what_pep_440_says(tmp_path, version, holds):
    p = write(tmp_path, "target: toy\nversions: '>=1.0,<2'\n")
    if holds:
        assert load(p, "toy", version)["coins/known-answers"]["judgement"] == "peer bug"
    else:
        with pytest.raises(ExpectationsError, match=rf"exp.yaml:1: is for toy >=1.0,<2, not toy {version}"):
            load(p, "toy", version)


def test_an_exact_version_still_works_and_another_target_is_refused(tmp_path):
    p = write(tmp_path, "target: toy\nversion: 0.3.1\n")
    assert load(p, "toy", "0.3.1")
    with pytest.raises(ExpectationsError, match="not toy 0.3.2.dev4"):
        load(p, "toy", "0.3.2.dev4")
    with pytest.raises(ExpectationsError, match="is for toy 0.3.1, not other 0.3.1"):
        load(p, "other", "0.3.1")


@pytest.mark.parametrize("body, message", [
    (ENTRY.replace("peer bug", "peer bugg"), r"exp.yaml:6: coins/known-answers: judgement 'peer bugg' is not one of"),
    (ENTRY.replace("    why: a reason\n", ""), r"exp.yaml:4: coins/known-answers: missing 'why'"),
    ("failures: [1, 2]\n", r"exp.yaml:3: 'failures' must map"),
    ("failures:\n  a: [\n", r"exp.yaml:\d+:\d+: invalid YAML"),
])
def test_a_bad_file_is_a_located_user_error(tmp_path, body, message):
    p = write(tmp_path, "target: toy\nversions: '>=1'\n", body)
    with pytest.raises(ExpectationsError, match=message):
        load(p, "toy", "1.0")


def test_a_bad_versions_range_is_located(tmp_path):
    p = write(tmp_path, "target: toy\nversions: 'about one'\n")
    with pytest.raises(ExpectationsError, match="exp.yaml:2: versions 'about one' is not a PEP 440 specifier set"):
        load(p, "toy", "1.0")


def test_the_shipped_file_is_found_by_name_and_an_explicit_one_wins(tmp_path):
    assert find("vllm", "0.33.0").name == "vllm-0.33.0.yaml"
    assert find("vllm", "0.34.0") is None
    p = write(tmp_path, "target: vllm\nversions: '>=0.33'\n")
    assert find("vllm", "0.34.0", explicit=p) == p
    with pytest.raises(ExpectationsError, match="no such file"):
        find("vllm", "0.34.0", explicit=tmp_path / "missing.yaml")


# --------------------------------------------------------------------------- CLI with a toy target
def _toy(halved: bool):
    from lockstep.kernels.coins import murmur_hash32_torch

    def bad_hash(seed, pos, col):
        return murmur_hash32_torch(seed, pos, col) // 2
    return Target("toy", "1.2.0.dev3", ops={"hash": Op(bad_hash if halved else murmur_hash32_torch)})


@pytest.fixture
def toy(monkeypatch):
    import lockstep.harness.targets as targets
    made = {}

    def get(name):
        if name == "toy":
            return made["target"]
        raise targets.UnknownTarget(name)
    monkeypatch.setattr("lockstep.harness.commands.targets.get", get)
    monkeypatch.chdir(ROOT)
    return made


def test_expectations_are_written_from_observed_results_and_then_hold(toy, tmp_path, capsys):
    toy["target"] = _toy(halved=True)
    out = tmp_path / "toy.yaml"
    argv = ["coins/known-answers", "coins/wraparound", "--target", "toy", "--device", "cpu"]
    assert cli.main(["expectations", *argv, "--write", str(out), "--versions", ">=1.2.0.dev0,<1.3"]) == 0
    doc = yaml.safe_load(out.read_text())
    assert doc["versions"] == ">=1.2.0.dev0,<1.3" and set(doc["failures"]) == {"coins/known-answers",
                                                                               "coins/wraparound"}
    assert {e["judgement"] for e in doc["failures"].values()} == {"unjudged"}
    capsys.readouterr()
    assert cli.main(["check", *argv, "--expectations", str(out)]) == 0        # matches, and warns
    assert "2 expected failure(s) not judged yet" in capsys.readouterr().err
    toy["target"] = _toy(halved=False)                                          # fixed: both now pass
    assert cli.main(["check", *argv, "--expectations", str(out)]) == 1
    assert "EXPECTED FAILURE now passes: coins/known-answers" in capsys.readouterr().out
    toy["target"] = Target("toy", "1.3.0", ops=toy["target"].ops)               # outside the range: exit 2
    assert cli.main(["check", *argv, "--expectations", str(out)]) == 2
    assert "not toy 1.3.0" in capsys.readouterr().err
    assert cli.main(["expectations", *argv, "--write", str(out), "--versions", "<1"]) == 2


# --------------------------------------------------------------------------- refusals
class EngineError(Exception):
    pass


def _run(target, spec_id):
    specs, _ = load_specs(ROOT / "specs")
    (spec,) = select(specs, [spec_id], [])
    return run_on_target(spec, RunContext(platform=detect("cpu", "fp32")), target, GoldenStore(ROOT / "golden"))


def _resolver(message, exc=EngineError):
    def resolve(draft_config, convention, L, fc_in, hidden, name, direct_ids=False):
        raise exc(message)
    return resolve


def test_error_facts_are_the_numbers_of_the_fragments():
    assert error_facts(["[40]", "outside [0, 36]", "'boundary'", "L=36"]) == [40, 0, 36, 36]
    assert error_facts(["[-2]", "nvidia/gpt-oss-120b-Eagle3-v3"]) == [-2]
    assert error_facts(["model.layers.2.mlp.experts.down_proj_scales", "block [3, 17, 1]", "scale 255"]) == \
        ["model.layers.2.mlp.experts.down_proj_scales", 3, 17, 1, 255]


def test_a_refusal_in_the_engines_own_words_and_type_passes_when_it_names_the_facts():
    t = Target("toy", "1", ops={"eagle3_layers": Op(_resolver("layer 40 is past the last boundary 36 (from 0)"))},
               conventions=("boundary",), refusals=(EngineError,))
    assert _run(t, "layer_ids/error-above-l").status == PASS


def test_a_refusal_that_omits_a_fact_fails_and_an_undeclared_type_is_a_crash():
    t = Target("toy", "1", ops={"eagle3_layers": Op(_resolver("bad layer ids"))}, conventions=("boundary",),
               refusals=(EngineError,))
    o = _run(t, "layer_ids/error-above-l")
    assert o.status == FAIL and o.message == "the refusal does not name [40, 0, 36, 36]: bad layer ids"
    t.refusals = ()
    o = _run(t, "layer_ids/error-above-l")
    assert o.status == FAIL and o.message.startswith("crash: EngineError: bad layer ids")
