"""`lockstep check` with no --dtype / --backend runs every (dtype policy, backend) pair that has
goldens here (harness/pairs.py): which pairs, which specs support them, one row per golden folder,
MISSING for a half-recorded pair, and planted bugs that only a non-default pair can see turning
plain `lockstep check` red."""

import json
import shutil

import pytest
import torch

import lockstep.kernels.moe
from lockstep.harness import pairs
from lockstep.harness.cli import main
from lockstep.harness.golden import GoldenStore
from lockstep.harness.pairs import ALL_PAIRS, Pair
from tests.conftest import COINS, REPO
from tests.planted import module_with
from tests.repo_specs import repo_specs

SPECS = repo_specs()


def folders_of(spec_id, chosen=ALL_PAIRS, device="cpu"):
    return [folder for _, _, folder in pairs.plan([SPECS[spec_id]], list(chosen), device)]


def touch(path):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("{}")


# --------------------------------------------------------------------------- which pairs, which rows
def test_the_pairs_here_are_the_engine_folders_that_hold_goldens(tmp_path):
    touch(tmp_path / "cpu-bf16/generate/x.json")
    touch(tmp_path / "cpu-fp32-triton/kernels/y.json")
    touch(tmp_path / "cuda-sm90-bf16-triton/generate/x.json")     # another device's
    (tmp_path / "cpu-bf16-triton").mkdir()                         # a folder without goldens
    touch(tmp_path / "shared/coins/z.json")
    assert pairs.recorded(tmp_path, "cpu") == [Pair("bf16", "torch"), Pair("fp32", "triton")]
    assert pairs.recorded(tmp_path, "cuda-sm90") == [Pair("bf16", "triton")]
    assert pairs.recorded(tmp_path / "none", "cpu") == []


def test_options_narrow_the_pairs(tmp_path):
    for folder in ("cpu-fp32", "cpu-bf16", "cpu-fp32-triton"):
        touch(tmp_path / folder / "a.json")
    here = [Pair("fp32", "torch"), Pair("bf16", "torch"), Pair("fp32", "triton")]
    assert pairs.chosen("cpu", tmp_path) == here
    assert pairs.chosen("cpu", tmp_path, dtype="bf16") == [Pair("bf16", "torch")]
    assert pairs.chosen("cpu", tmp_path, backend="triton") == [Pair("fp32", "triton")]
    assert pairs.chosen("cpu", tmp_path, "bf16", "triton") == [Pair("bf16", "triton")]  # named: runs anyway
    assert pairs.chosen("cpu", tmp_path, regen=True) == list(ALL_PAIRS)                 # regen: all supported
    assert pairs.chosen("cpu", tmp_path / "none") == [pairs.DEFAULT]                    # no goldens yet
    assert pairs.chosen("cpu", tmp_path / "none", backend="triton") == [Pair("fp32", "triton")]
    shutil.rmtree(tmp_path / "cpu-fp32")
    assert pairs.chosen("cpu", tmp_path) == here                                        # fp32/torch: always


def test_one_row_per_golden_folder_and_the_interpreter_runs_the_specs_written_for_it():
    assert folders_of("generate/top-k") == ["cpu-fp32", "cpu-bf16"]                  # untagged: no interpreter
    assert folders_of("generate/interpreter-mxfp4") == ["cpu-fp32", "cpu-bf16", "cpu-fp32-triton"]
    assert folders_of("generate/top-k", device="cuda-sm90") == ["cuda-sm90-fp32", "cuda-sm90-bf16",
                                                                "cuda-sm90-fp32-triton", "cuda-sm90-bf16-triton"]
    assert folders_of("kernels/rmsnorm-n1") == ["cpu-fp32-triton"]                    # independent of the pair
    assert folders_of("coins/known-answers") == ["shared"]
    assert folders_of("mxfp4/scale-255-nan") == ["shared", "cpu-fp32-triton"]         # the kernels' decode too
    assert folders_of("generate/top-k", [Pair("bf16", "triton")]) == []
    rows = pairs.plan([SPECS["generate/top-k"]], [Pair("bf16", "triton")], "cpu", explicit=True)
    assert [f for _, _, f in rows] == ["cpu-bf16-triton"]                              # both options: runs


def test_a_spec_s_rows_follow_the_order_of_the_pairs_given_and_skip_only_what_it_cannot_run():
    """plan() walks the pairs in the order given: an unsupported pair first does not end the spec's
    rows (found by mutation testing: `continue` -> `break` went unseen with ALL_PAIRS' order)."""
    triton_first = [Pair("fp32", "triton"), Pair("bf16", "torch"), Pair("fp32", "torch")]
    assert folders_of("generate/top-k", triton_first) == ["cpu-bf16", "cpu-fp32"]
    assert folders_of("generate/interpreter-mxfp4", [Pair("bf16", "triton"), Pair("fp32", "triton")]) == [
        "cpu-fp32-triton"]


def test_the_world_sizes_reach_every_row_s_context():
    assert Pair("bf16", "triton").context("cpu", (1, 2)).world_sizes == (1, 2)
    rows = pairs.plan([SPECS["generate/top-k"]], list(ALL_PAIRS), "cpu", world_sizes=(2, 4))
    assert [(ctx.world_sizes, ctx.backend, ctx.platform.dtype) for _, ctx, _ in rows] == [
        ((2, 4), "torch", "fp32"), ((2, 4), "torch", "bf16")]


def test_folders_are_every_golden_folder_a_spec_reads_on_a_device():
    """What the pytest plugin names its items by: one folder, or several ([folder] in the id)."""
    assert pairs.folders(SPECS["generate/top-k"], "cpu") == {"cpu-fp32", "cpu-bf16", "cpu-fp32-triton",
                                                             "cpu-bf16-triton"}
    assert pairs.folders(SPECS["coins/known-answers"], "cuda-sm90") == {"shared"}
    assert pairs.folders(SPECS["kernels/rmsnorm-n1"], "cuda-sm90") == {"cuda-sm90-fp32-triton"}


def test_describe_lists_the_pairs_for_a_message():
    assert pairs.describe([Pair("fp32", "torch"), Pair("bf16", "triton")]) == "fp32/torch, bf16/triton"


def test_every_spec_has_a_golden_for_every_pair_recorded_here():
    """What plain `lockstep check` would report MISSING, without running anything: a new spec, or a
    pair recorded for some specs and not others (record with `lockstep regen ID`)."""
    store = GoldenStore(REPO / "golden")
    chosen = pairs.recorded(REPO / "golden", "cpu")
    assert chosen[:2] == [Pair("fp32", "torch"), Pair("bf16", "torch")] and Pair("fp32", "triton") in chosen
    missing = [f"{folder}/{spec.id}" for spec, _, folder in pairs.plan(SPECS.values(), chosen, "cpu")
               if not store.exists(folder, spec.id)]
    assert not missing, f"no golden for {missing}"
    rows = pairs.plan(SPECS.values(), chosen, "cpu")
    bf16 = {s.id.split("/")[0] for s, _, f in rows if f == "cpu-bf16"}
    assert len([f for _, _, f in rows if f == "cpu-bf16"]) >= 40 and bf16 >= {"generate", "speculative", "topology"}
    interpreted = [s.id for s, _, f in rows if f.endswith("-triton") and pairs.runs_the_engine(s, "cpu")]
    assert len(interpreted) >= 2, interpreted


# --------------------------------------------------------------------------- the command line
MXFP4 = """\
kind: mxfp4
description: an mxfp4 decode spec
inputs:
  blocks:
    - {{bytes: [0x10, 0x32, 0x54, 0x76, 0x98, 0xBA, 0xDC, 0xFE, 0x10, 0x32, 0x54, 0x76, 0x98, 0xBA, 0xDC, 0xFE], scale: {scale}}}
expect:
  values:
    - {values}
"""
CODES = [0, 0.5, 1, 1.5, 2, 3, 4, 6, -0.0, -0.5, -1, -1.5, -2, -3, -4, -6]


@pytest.fixture
def scratch(tmp_path, monkeypatch):
    """A project with a coins spec and two mxfp4 decode specs (golden in shared, and in
    cpu-fp32-triton for the kernels' decode): every pair recorded by a plain regen."""
    monkeypatch.delenv("CI", raising=False)
    (tmp_path / "specs/coins").mkdir(parents=True)
    (tmp_path / "specs/mxfp4").mkdir()
    (tmp_path / "specs/coins/c.yaml").write_text(COINS)
    nan = ".nan"
    (tmp_path / "specs/mxfp4/one.yaml").write_text(MXFP4.format(scale=127, values=CODES * 2))
    (tmp_path / "specs/mxfp4/nan.yaml").write_text(MXFP4.format(scale=255, values=f"[{', '.join([nan] * 32)}]"))
    monkeypatch.chdir(tmp_path)
    return tmp_path


def run(capsys, *argv):
    code = main(list(argv))
    out = capsys.readouterr()
    return code, out.out + out.err


def test_plain_regen_records_every_pair_and_plain_check_reads_every_folder(scratch, capsys):
    code, out = run(capsys, "regen")
    assert code == 0 and "5 recording(s) of 3 spec(s): 5 new" in out
    assert (scratch / "golden/cpu-fp32-triton/mxfp4/nan.json").is_file()
    code, out = run(capsys, "check")
    assert code == 0 and "5 check(s) of 3 spec(s): 5 pass" in out
    assert "goldens: golden/shared (3), golden/cpu-fp32-triton (2)" in out
    assert "run on cpu-fp32 (torch), cpu-fp32 (triton)" in out
    report = json.loads(_json(capsys))
    assert report["pairs"] == ["fp32/torch", "fp32/triton"]
    assert sorted(s["golden_platform"] for s in report["specs"]) == ["cpu-fp32-triton"] * 2 + ["shared"] * 3


def _json(capsys) -> str:
    main(["check", "--json"])
    return capsys.readouterr().out


def test_a_pair_recorded_for_some_specs_and_not_others_is_missing(scratch, capsys):
    assert run(capsys, "regen")[0] == 0
    for suffix in (".json", ".safetensors"):
        (scratch / f"golden/cpu-fp32-triton/mxfp4/nan{suffix}").unlink()
    code, out = run(capsys, "check")
    assert code == 3 and "MISSING   mxfp4/nan" in out and "pass      mxfp4/nan" in out   # its shared row passes
    assert run(capsys, "check", "--backend", "torch")[0] == 0                             # narrowed: not read
    code, out = run(capsys, "regen")
    assert code == 0 and "new       mxfp4/nan (cpu-fp32-triton)  [written]" in out
    assert run(capsys, "check")[0] == 0


def test_a_pair_no_selected_spec_supports_is_a_usage_error(capsys, monkeypatch):
    monkeypatch.chdir(REPO)
    code, out = run(capsys, "check", "generate/top-k", "--backend", "triton")
    assert code == 2 and "tagged 'interpreter'" in out


def test_pytest_collects_one_item_per_golden_folder(scratch, pytester, monkeypatch):
    monkeypatch.chdir(scratch)                 # pytester moved to its own folder
    assert main(["regen"]) == 0
    shutil.copytree(scratch / "specs", pytester.path / "specs")
    shutil.copytree(scratch / "golden", pytester.path / "golden")
    pytester.makeini("[pytest]\ntestpaths = specs\nlockstep_specs = specs\n")
    monkeypatch.chdir(pytester.path)
    result = pytester.runpytest("--collect-only", "-q")
    result.stdout.fnmatch_lines(["specs/coins/c.yaml::coins/c", "specs/mxfp4/nan.yaml::mxfp4/nan[[]shared[]]",
                                 "specs/mxfp4/nan.yaml::mxfp4/nan[[]cpu-fp32-triton[]]", "*5 tests collected*"])
    pytester.runpytest("--lockstep-backend", "torch").assert_outcomes(passed=3)
    pytester.runpytest().assert_outcomes(passed=5)


# --------------------------------------------------------------------------- planted: only a non-default pair sees it
def check_json(capsys, monkeypatch, *patterns) -> dict:
    """Plain `lockstep check PATTERN ...` in the repository (its specs and goldens), as JSON."""
    monkeypatch.chdir(REPO)
    code = main(["check", *patterns, "--json"])
    report = json.loads(capsys.readouterr().out)
    assert code == report["exit_code"]
    return report


def statuses(report) -> dict:
    return {s["golden_platform"]: s["status"] for s in report["specs"]}


def truncating_bf16_casts(monkeypatch):
    """Tensor.to(torch.bfloat16) from a wider float truncates instead of rounding to nearest even
    (what Triton's interpreter does, and a hand-written cast easily does): a bug of the bf16 policy
    alone, since the fp32 policy never casts to bf16 while running."""
    to = torch.Tensor.to

    def truncating(self, *args, **kwargs):
        wanted = kwargs.get("dtype", next((a for a in args if isinstance(a, torch.dtype)), None))
        if wanted is torch.bfloat16 and self.dtype in (torch.float32, torch.float64):
            bits = to(self, torch.float32).view(torch.int32) & -0x10000     # drop the low 16 bits
            return to(bits.view(torch.float32), *args, **kwargs)            # now exact in bf16
        return to(self, *args, **kwargs)

    monkeypatch.setattr(torch.Tensor, "to", truncating)


def test_a_bug_of_the_bf16_policy_alone_turns_plain_check_red(capsys, monkeypatch):
    from lockstep.harness.checkpoints import checkpoint_dir

    checkpoint_dir("tiny", 0, "bf16")                       # made before the plant (it casts to bf16 itself)
    truncating_bf16_casts(monkeypatch)
    report = check_json(capsys, monkeypatch, "generate/custom-stop-ids")
    assert report["exit_code"] == 1
    assert statuses(report) == {"cpu-fp32": "pass", "cpu-bf16": "mismatch"}


def test_a_bug_of_an_interpreted_engine_kernel_alone_turns_plain_check_red(capsys, monkeypatch, tmp_path):
    """The grouped gate_up kernel (the engine's triton ops; also pinned by the kernels/experts-*
    specs, which plain `check` runs on the fp32-triton pair too) skips expert 0's blocks as if they
    were unused."""
    buggy = module_with(lockstep.kernels.moe, {"    if e >= 0:                                                           # program-uniform":
                                      "    if e > 0:"}, tmp_path)
    monkeypatch.setattr(lockstep.kernels.moe, "_grouped_gate_up_kernel", buggy._grouped_gate_up_kernel)
    report = check_json(capsys, monkeypatch, "generate/interpreter-mxfp4")
    assert report["exit_code"] == 1
    got = statuses(report)
    assert got.pop("cpu-fp32-triton") in ("mismatch", "failed", "crash")
    assert set(got.values()) == {"pass"} and {"cpu-fp32", "cpu-bf16"} <= set(got)


def test_the_in_kernel_mxfp4_decode_without_its_nan_scale_turns_plain_check_red(capsys, monkeypatch, tmp_path):
    """The tile decode the grouped-expert and matmul kernels share, with scale 255 decoded as an
    ordinary exponent (2^128: inf for nonzero codes, 0 for code 0) instead of NaN."""
    import lockstep.kernels.matmul

    buggy = module_with(lockstep.kernels.matmul, {'    return tl.where(scale == 255, float("nan"), value)': "    return value"},
                        tmp_path)
    monkeypatch.setattr(lockstep.kernels.matmul, "_mxfp4_decode_kernel", buggy._mxfp4_decode_kernel)
    report = check_json(capsys, monkeypatch, "mxfp4/scale-255-nan")
    assert report["exit_code"] == 1
    got = statuses(report)
    assert got["shared"] == "pass" and got["cpu-fp32-triton"] in ("mismatch", "failed")
    assert "expectation failed: block 1 (scale 255), element 0" in report["specs"][1]["messages"][0]
