"""The comparator and golden-loader self-check: each planted break of the judge turns `lockstep check`
red (an internal error, exit 1) before any spec runs, where without the self-check every spec would
stay green."""

import inspect
import json
import shutil
import textwrap

import pytest
import torch

from lockstep.harness import compare, golden, runner, selfcheck
from lockstep.harness.cli import main
from lockstep.harness.platform import detect
from lockstep.harness.result import RunContext
from lockstep.harness.specfile import load_specs

_bits = compare._bits


def zeros_equal(t: torch.Tensor) -> torch.Tensor:
    """A comparator's bit view that calls -0.0 equal to 0.0 (compares `x + 0.0`, which is +0.0 for both)."""
    t = t.detach().contiguous().cpu()
    return _bits(t + 0.0 if t.dtype.is_floating_point else t)


def nans_equal(t: torch.Tensor) -> torch.Tensor:
    """A comparator's bit view that calls any NaN equal to any NaN (each replaced by the canonical one)."""
    t = t.detach().contiguous().cpu()
    return _bits(torch.where(t.isnan(), torch.full_like(t, float("nan")), t) if t.dtype.is_floating_point else t)


def data_by_value(expected, actual) -> str:
    """The comparator's data half as it was before it compared bits: deepdiff's ==, -0.0 == 0.0."""
    from deepdiff import DeepDiff
    dd = DeepDiff(expected, actual, ignore_order=False, verbose_level=2)
    return dd.pretty() if dd else ""


def check(capsys, *argv) -> tuple[int, str]:
    code = main(["check", *argv])
    out = capsys.readouterr()
    return code, out.out + out.err


def test_the_sound_judge_passes_its_own_check(project, capsys):
    runner.self_check()
    assert check(capsys)[0] == 0


ZERO = ({"t": selfcheck._f32(0x80000000)}, {"t": selfcheck._f32(0x00000000)})
NAN = ({"t": selfcheck._f32(0x7FC00001)}, {"t": selfcheck._f32(0x7FC00000)})


@pytest.mark.parametrize("attr, planted, pair, says", [
    ("_bits", zeros_equal, ZERO, "calls fp32 -0.0 and 0.0 equal"),
    ("_bits", nans_equal, NAN, "calls two fp32 quiet NaN payloads equal"),
    ("diff_data", data_by_value, ({"x": -0.0}, {"x": 0.0}), "calls -0.0 and 0.0 in data equal"),
])
def test_a_comparator_that_calls_distinct_bits_equal_turns_check_red(project, capsys, monkeypatch, attr, planted,
                                                                     pair, says):
    monkeypatch.setattr(compare, attr, planted)
    monkeypatch.setattr(runner, "diff_data", compare.diff_data)   # the runner holds its own reference
    compared = runner.diff_data if attr == "diff_data" else runner.diff_tensors
    assert not compared(*pair)   # the break is real: the runner's comparator now hides the difference
    code, out = check(capsys)
    assert code == 1 and "internal error: SelfCheckFailed" in out and says in out, out
    assert "pass" not in out    # no spec ran, so none can pass


def loader_without_platform_check():
    """GoldenStore.load with the manifest's platform no longer compared with the folder it sits in:
    its own source with that one comparison taken out, compiled among harness.golden's names."""
    src = textwrap.dedent(inspect.getsource(golden.GoldenStore.load))
    old = '(("spec", spec_id), ("platform", platform))'
    assert src.count(old) == 1, "GoldenStore.load changed: update the plant"
    planted = {}
    exec(compile(src.replace(old, '(("spec", spec_id),)'), "planted GoldenStore.load", "exec"), vars(golden), planted)
    return planted["load"]


def test_a_loader_that_skips_the_platform_check_turns_check_red(project, capsys, monkeypatch):
    spec = {s.id: s for s in load_specs(project / "specs")[0]}["coins/gumbel-endpoints"]
    ctx = RunContext(detect("cpu"))
    store = golden.GoldenStore(project / "golden")
    # the cpu-fp32 golden as one recorded for another platform would read, put in cpu-fp32's place
    path = store.paths("cpu-fp32", spec.id)[1]
    manifest = json.loads(path.read_text())
    path.write_text(json.dumps(manifest | {"platform": "cuda-sm90-fp32"}, indent=2, sort_keys=True) + "\n")
    assert runner.check_spec(spec, ctx, store).status == runner.CORRUPT

    monkeypatch.setattr(golden.GoldenStore, "load", loader_without_platform_check())
    assert runner.check_spec(spec, ctx, store).status == runner.PASS   # the break is real: a foreign golden passes
    code, out = check(capsys, "coins/known-answers")
    assert code == 1 and "internal error: SelfCheckFailed" in out and "accepts a golden of another platform" in out


def test_the_pytest_plugin_refuses_specs_under_a_broken_comparator(pytester, monkeypatch):
    """A plugin session reads the same self-check: under a planted comparator every spec item fails."""
    from tests.conftest import REPO
    specs = pytester.path / "specs" / "coins"
    specs.mkdir(parents=True)
    shutil.copy(REPO / "specs/coins/known-answers.yaml", specs)
    shutil.copytree(REPO / "golden/shared/coins", pytester.path / "golden/shared/coins",
                    ignore=lambda d, names: [n for n in names if not n.startswith("known-answers")])
    pytester.makeini("[pytest]\nlockstep_specs = specs\n")
    pytester.makeconftest("import torch\nfrom lockstep.harness import compare\n_b = compare._bits\n"
                          "compare._bits = lambda t: _b(t.detach().contiguous().cpu() + 0.0 "
                          "if t.dtype.is_floating_point else t)\n")
    monkeypatch.setenv("PYTHONPATH", str(REPO))        # this checkout's harness, in the subprocess too
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-q")   # the plant must not leak into this process
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*calls fp32 -0.0 and 0.0 equal*"])
