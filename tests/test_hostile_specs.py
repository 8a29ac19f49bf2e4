"""Hostile spec files (issue 14): every bad input is a located error at validation (exit 2), never a
traceback, a hang, a memory blow-up or a crash at run time; the limits are harness/limits.py's."""

import shutil
import textwrap
import time

import pytest

from lockstep.harness.cli import main
from lockstep.harness.specfile import SpecErrors, load_specs, parse_spec
from tests.conftest import COINS, REPO


def errors_of(text, spec_id="x/y", root=None):
    with pytest.raises(SpecErrors) as e:
        parse_spec(textwrap.dedent(text), "f.yaml", spec_id, root=root)
    return e.value.errors


def one_error(text, **kw):
    errs = errors_of(text, **kw)
    assert len(errs) == 1, errs
    return errs[0]


def run(capsys, *argv):
    code = main(list(argv))
    out = capsys.readouterr()
    return code, out.out + out.err


def test_deep_nesting_is_a_located_error_and_the_other_specs_still_load(tmp_path):
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "good.yaml").write_text(COINS)
    (tmp_path / "a" / "deep.yaml").write_text("kind: coins\ninputs: " + "[" * 5000 + "]" * 5000 + "\n")
    (tmp_path / "a" / "deep-block.yaml").write_text("".join("  " * i + "k:\n" for i in range(200)))
    specs, errors = load_specs(tmp_path)
    assert [s.id for s in specs] == ["a/good"]
    assert sorted((e.file.rsplit("/", 1)[-1], e.message) for e in errors) == [
        ("deep-block.yaml", "nested deeper than 32 levels"), ("deep.yaml", "nested deeper than 32 levels")]


def test_a_run_of_opening_brackets_is_refused_at_once():
    start = time.perf_counter()
    err = one_error("kind: " + "[" * 60000)
    assert err.message == "nested deeper than 32 levels" and (err.line, err.column) == (1, 39)
    assert time.perf_counter() - start < 10   # PyYAML's look-ahead alone is quadratic in the run


def test_arange_with_step_zero_is_a_spec_error():
    err = one_error(COINS.replace("{arange: [0, 4]}", "{arange: [0, 4, 0]}"))
    assert (err.path, err.line) == ("inputs.columns.arange[2]", 6)
    assert "the step of an arange must not be 0" in err.message


@pytest.mark.parametrize("text,fragment", [
    ("kind: coins\nx: " + "9" * 5000 + "\n", "integer literal of 5000 characters"),
    ("kind: coins\ndescription: 2001-02-30\n", "type !!timestamp is not used by specs"),
    ("kind: coins\ndescription: !!set {a, b}\n", "type !!set"),
    ("kind: coins\nyes: 1\n", "mapping key 'yes' is not a string (YAML reads it as !!bool)"),
    ("kind: coins\n1: x\n", "mapping key '1' is not a string"),
], ids=["huge-int", "timestamp", "set", "bool-key", "int-key"])
def test_yaml_values_no_spec_uses_are_located_errors(text, fragment):
    assert fragment in one_error(text).message


def test_an_alias_bomb_is_refused_before_it_expands():
    bomb = "a: &a [x, x, x, x, x, x, x, x, x]\n" + "".join(
        f"{c}: &{c} [{', '.join([f'*{p}'] * 9)}]\n" for p, c in zip("abcdefgh", "bcdefghi"))
    assert "more than 64 aliases" in one_error(bomb).message
    six_levels = "kind: coins\n" + "\n".join(bomb.splitlines()[:7]) + "\n"    # 54 aliases, 9^6 values
    assert "more than 100000 values once its aliases are expanded" in one_error(six_levels).message
    assert "a recursive alias" in one_error("kind: &k [*k]\n").message


def test_a_file_over_the_size_limit_is_refused_unread(tmp_path):
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "big.yaml").write_text(COINS + "#" * (64 * 1024) + "\n")
    _, errors = load_specs(tmp_path)
    assert [e.message.split(":")[0] for e in errors] == ["larger than 65536 bytes"]


@pytest.mark.parametrize("change,fragment", [
    (("{arange: [0, 4]}", "{arange: [0, 1000000000000]}"), "expected 1..4194304 values, the range"),
    (("{arange: [0, 4]}", "{hashed: {count: 100000000, seed: 1}}"), "expected an integer >= 1 and <= 4194304"),
    (("seeds: [1, 2]", "seeds: {arange: [0, 4000000]}"), "the hash grid of 4000000 rows x 4 columns"),
])
def test_sizes_past_the_limits_are_spec_errors(change, fragment):
    assert fragment in " | ".join(e.message for e in errors_of(COINS.replace(*change)))


def test_a_huge_kernel_shape_is_a_spec_error():
    err = one_error("kind: kernel\ndescription: x\ninputs: {kernel: matmul, shape: {M: 1000000, K: 1000000, N: 1}}\n")
    assert err.path == "inputs.shape" and "more than 33,554,432" in err.message


GENERATE = """\
kind: generate
description: x
inputs:
  checkpoint: {preset: tiny}
  requests:
    - prompt: [1, 2, 3]
      sampling: {greedy: true, max_new_tokens: 2}
"""


@pytest.mark.parametrize("change,path,fragment", [
    (("preset: tiny", "preset: tinny"), "inputs.checkpoint.preset", "unknown preset 'tinny'"),
    (("preset: tiny", "preset: gpt-oss-120b"), "inputs.checkpoint.preset", "116,829,156,672 parameters"),
    (("{preset: tiny}", "{path: ../../etc}"), "inputs.checkpoint.path", "leaves the project root"),
    (("{preset: tiny}", "{path: /etc}"), "inputs.checkpoint.path", "expected a path relative to the project root"),
    (("{preset: tiny}", "{path: models/none}"), "inputs.checkpoint.path", "no checkpoint folder at 'models/none'"),
    (("[1, 2, 3]", "[1, 2, 512]"), "inputs.requests[0].prompt", "token id 512 is outside the checkpoint's vocabulary"),
    (("[1, 2, 3]", "{arange: [0, 600]}"), "inputs.requests[0].prompt", "token id 599 is outside"),
    (("[1, 2, 3]", "{hashed: {count: 4, seed: 1}}"), "inputs.requests[0].prompt.hashed", "give 'below'"),
    (("max_new_tokens: 2", "max_new_tokens: 2, stop_token_ids: [9999]"),
     "inputs.requests[0].sampling.stop_token_ids[0]", "token id 9999 is outside"),
])
def test_generate_values_are_checked_at_validation(change, path, fragment):
    err = one_error(GENERATE.replace(*change), root=REPO)
    assert err.path == path and fragment in err.message, err


def test_a_shipped_checkpoint_path_is_read_for_its_vocabulary():
    err = one_error(GENERATE.replace("{preset: tiny}", "{path: models/tiny-target}").replace("[1, 2, 3]", "[600]"),
                    root=REPO)
    assert "token id 600 is outside the checkpoint's vocabulary [0, 512)" in err.message


def test_validate_reports_run_time_refusals_as_spec_errors(project, capsys):
    (project / "specs/coins/gen.yaml").write_text(GENERATE.replace("preset: tiny", "preset: nope"))
    code, out = run(capsys, "validate")
    assert code == 2 and "specs/coins/gen.yaml:4:24: inputs.checkpoint.preset: unknown preset 'nope'" in out


@pytest.mark.parametrize("tolerance", [".nan", ".inf", "-.inf", "-1.0e-5"])
def test_a_kernel_tolerance_that_cannot_fail_is_refused(tolerance):
    err = one_error("kind: kernel\ndescription: x\ninputs: {kernel: matmul, shape: {M: 1, K: 1, N: 1}}\n"
                    f"expect: {{tolerance: {tolerance}}}\n")
    assert err.path == "expect.tolerance" and "expected a finite number >= 0.0" in err.message


def test_stray_files_under_specs_are_errors(project, capsys):
    shutil.copy(project / "specs/coins/known-answers.yaml", project / "specs/coins/copy.yml")
    (project / "specs/coins/gone.yaml").symlink_to("nowhere.yaml")
    code, out = run(capsys, "validate")
    assert code == 2 and "3 spec(s) valid, 2 invalid" in out
    assert "specs/coins/copy.yml: spec files end in .yaml: this file would be ignored" in out
    assert "specs/coins/gone.yaml: a broken symbolic link" in out
    assert run(capsys, "list")[0] == 2


def test_coins_in_keys_mode_with_one_key(project, capsys):
    (project / "specs/coins/one-key.yaml").write_text(
        "kind: coins\ndescription: one key\ninputs: {keys: [[0, 0, 0]], outputs: [hash, coins, gumbel]}\n"
        "expect: {hash: [2167721464]}\n")
    code, out = run(capsys, "regen", "coins/one-key")
    assert code == 0 and "new       coins/one-key" in out
    assert run(capsys, "check", "coins/one-key")[0] == 0


def test_speculative_decoding_sizes_are_bounded():
    text = GENERATE.replace("  checkpoint: {preset: tiny}\n", "  checkpoint: {preset: tiny}\n  draft: {seed: 0, convention: "
                            "sglang}\n  speculative: {num_steps: 1000000000, draft_token_num: 4}\n")
    err = one_error(text, root=REPO)
    assert err.path == "inputs.speculative.num_steps" and "expected an integer >= 1 and <= 32" in err.message
