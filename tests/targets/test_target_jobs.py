"""-j N on another engine (`check --target`, `report`, `expectations`): workers build the target
again by its registry name at the parent's dtype policy, with the parent's checkpoint mappings,
and the run reports exactly what -j 1 reports; a worker that dies costs its row; a target the
registry did not build runs in the parent, saying so."""

import json
import re
import shutil

import pytest

from lockstep.harness import suite_paths, targets
from lockstep.harness.cli import main
from tests.conftest import REPO
from tests.test_adopt_cli import GENERATE

# A tests-only target registered under the entry point group: Lockstep's engine from outside.py
# (its generate), with a `hash` that is right at fp32 and halved at bf16 (so the policy a worker
# runs shows in the coins specs' verdicts); with $JTOY_DIE its generate ends a worker process.
ADAPTER = """\
import dataclasses, multiprocessing, os
from lockstep.harness.target import Op
from lockstep.kernels.coins import murmur_hash32_torch
from tests.targets.outside import engine

def target(dtype="fp32"):
    base = engine("faithful", dtype)
    def hash_(seed, pos, col):
        out = murmur_hash32_torch(seed, pos, col)
        return out // 2 if dtype == "bf16" else out
    ops = dict(base.ops, hash=Op(hash_))
    if os.environ.get("JTOY_DIE") and multiprocessing.parent_process() is not None:
        ops["generate"] = dataclasses.replace(ops["generate"], fn=lambda *a, **k: os._exit(3))
    return dataclasses.replace(base, name="jtoy", ops=ops, dtypes=("fp32", "bf16"), at_dtype=target)
"""

# GENERATE: a generate spec whose checkpoint lies outside the suite: a worker without the
# parent's --checkpoint-path mapping cannot find it.
MAP = ["--checkpoint-path", f"models/big={REPO / 'models' / 'tiny-target'}"]
SPECS = ["coins/*", "generate/big"]


@pytest.fixture
def jtoy(project, tmp_path_factory, monkeypatch):
    """`project` with generate/big, and the target `jtoy` registered (a dist-info on sys.path)."""
    (project / "specs" / "generate").mkdir()
    (project / "specs" / "generate" / "big.yaml").write_text(GENERATE)
    site = tmp_path_factory.mktemp("site")
    dist = site / "jtoy-1.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: jtoy\nVersion: 1.0\n")
    (dist / "entry_points.txt").write_text("[lockstep.targets]\njtoy = jtoy_adapter:target\n")
    (site / "jtoy_adapter.py").write_text(ADAPTER)
    monkeypatch.syspath_prepend(str(site))
    monkeypatch.syspath_prepend(str(REPO))             # the workers import tests.targets.outside
    monkeypatch.setattr(suite_paths, "_MAPPED", dict(suite_paths._MAPPED))   # MAP ends with the test
    assert main(["regen", "generate/big", "--dtype", "bf16", "--backend", "torch", *MAP]) == 0
    return project


def run(capsys, *argv):
    code = main(list(argv))
    out = capsys.readouterr()
    return code, out.out, out.err


def steady(doc):
    """A document without what -j may change: the seconds."""
    if isinstance(doc, dict):
        return {k: steady(v) for k, v in doc.items() if k != "seconds"}
    if isinstance(doc, list):
        return [steady(v) for v in doc]
    return doc


def steady_text(text: str) -> str:
    return re.sub(r"\d+\.\d+s", "_s", text)


def check(capsys, jobs: str, *more):
    return run(capsys, "check", "--target", "jtoy", "--dtype", "bf16", *SPECS, *MAP, "-j", jobs, *more)


def test_check_target_with_workers_reports_what_one_process_does(jtoy, capsys):
    one, two = check(capsys, "1", "--json"), check(capsys, "2", "--json")
    a, b = json.loads(one[1]), json.loads(two[1])
    assert one[0] == two[0] == 1 and steady(a) == steady(b)
    verdicts = {s["id"]: s["verdict"] for s in a["specs"]}
    assert verdicts["generate/big"] == "pass" and verdicts["coins/known-answers"] == "fail", verdicts  # bf16: halved
    one, two = check(capsys, "1"), check(capsys, "2")
    assert one[0] == two[0] == 1 and steady_text(one[1]) == steady_text(two[1])
    assert "note:" not in two[2]


def test_report_and_expectations_with_workers_write_what_one_process_does(jtoy, capsys, tmp_path):
    outs = {}
    for jobs in ("1", "2"):
        code, out, err = run(capsys, "report", "--target", "jtoy", "--dtype", "bf16", *SPECS, *MAP, "-j", jobs,
                             "--out", str(tmp_path / f"m{jobs}.md"))
        assert code == 1, err                                  # the halved hashes: failures no file expects
        outs[jobs] = [(tmp_path / f"m{jobs}{ext}").read_text() for ext in (".md", ".json")]
        assert "[4/4] pass    generate/big on jtoy-1.0" in err
    assert outs["1"] == outs["2"]
    assert json.loads(outs["2"][1])["specs"]["generate/big"]["jtoy-1.0"]["status"] == "pass"
    for jobs in ("1", "2"):
        code, out, err = run(capsys, "expectations", "--target", "jtoy", "--dtype", "bf16", *SPECS, *MAP, "-j", jobs,
                             "--write", str(tmp_path / f"e{jobs}.yaml"), "--json")
        outs[jobs] = (code, steady(json.loads(out)) | {"file": None}, (tmp_path / f"e{jobs}.yaml").read_text())
    assert outs["1"] == outs["2"] and outs["2"][1]["failures"] == 1


@pytest.mark.parametrize("plant", ["mapping", "dtype"])
def test_workers_that_lose_the_parents_setup_turn_the_comparison_red(jtoy, capsys, monkeypatch, plant):
    """Planted: the workers start without the --checkpoint-path mappings, or build the target at its
    declared policy instead of the run's: -j 2 no longer reports what -j 1 does."""
    want = json.loads(check(capsys, "1", "--json")[1])
    if plant == "mapping":
        monkeypatch.setattr(suite_paths, "explicit_mappings", lambda: {})
    else:
        real = targets.recipe
        monkeypatch.setattr(targets, "recipe", lambda t: real(t) and (real(t)[0], "fp32"))
    got = json.loads(check(capsys, "2", "--json")[1])
    assert steady(got) != steady(want)
    changed = {s["id"] for s, w in zip(got["specs"], want["specs"]) if steady(s) != steady(w)}
    if plant == "mapping":
        assert changed == {"generate/big"}, changed
    else:                                                  # fp32's hashes are right: the coins specs pass
        assert "coins/known-answers" in changed, changed


def test_a_worker_that_dies_costs_only_its_row(jtoy, capsys, monkeypatch):
    monkeypatch.setenv("JTOY_DIE", "1")
    code, out, err = check(capsys, "2", "--json")
    specs = {s["id"]: s for s in json.loads(out)["specs"]}
    assert code == 1 and "died (exit code 3)" in specs["generate/big"]["message"]
    assert [specs[f"coins/{n}"]["verdict"] for n in ("gumbel-endpoints", "known-answers", "top-hashes-verify")] \
        == ["n/a", "fail", "n/a"]                      # as -j 1 gives them (jtoy hashes, draws no coins)


def test_a_target_not_built_by_name_runs_in_this_process_and_says_so(project, capsys, monkeypatch):
    from lockstep.harness.target import Op, Target
    from lockstep.kernels.coins import murmur_hash32_torch

    toy = Target("toy", "1.0", ops={"hash": Op(murmur_hash32_torch)})
    monkeypatch.setattr("lockstep.harness.commands.targets.get", lambda name: toy)
    assert targets.recipe(toy) is None
    one, two = run(capsys, "check", "--target", "toy", "-j", "1"), run(capsys, "check", "--target", "toy", "-j", "2")
    assert one[0] == two[0] == 0 and steady_text(one[1]) == steady_text(two[1])
    assert "note:" not in one[2]
    note = [line for line in two[2].splitlines() if line.startswith("note:")]
    assert note == ["note: target toy-1.0 was not loaded by name (--target, the entry point group lockstep.targets), "
                    "so no worker process can build it: its 3 spec(s) run in this process"]


def test_the_registry_remembers_what_it_built_at_which_policy():
    built = targets.get("lockstep")
    assert targets.recipe(built) == ("lockstep", "fp32")
    assert targets.recipe(shutil) is None and targets.recipe(object()) is None
