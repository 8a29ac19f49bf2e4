"""The command line under hostile use (issue 14): one error boundary (a located line, exit 1 or 2, a
traceback only with --debug), a quiet end on a closed stdout, no vacuous pass (bad option values,
selections of nothing, stale goldens under --strict), output a CI log can follow, and one regen at a
time per golden folder."""

import os
import subprocess
import sys

import pytest

from lockstep.harness.cli import main
from lockstep.harness.golden import GoldenStore
from tests.conftest import COINS, REPO, golden_bytes


def run(capsys, *argv):
    code = main(list(argv))
    out = capsys.readouterr()
    return code, out.out + out.err


def test_closed_stdout_ends_quietly(tmp_path):
    """`lockstep list | head -1`: no BrokenPipeError, exit 141 (SIGPIPE's), nothing on stderr."""
    specs = tmp_path / "specs" / "coins"
    specs.mkdir(parents=True)
    for i in range(300):
        (specs / f"spec-{i:03d}.yaml").write_text(COINS)
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.Popen([sys.executable, "-m", "lockstep", "list"], cwd=tmp_path, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    proc.stdout.close()                                   # the reader is gone before the first line
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=120) == 141 and err == ""


def test_an_unexpected_error_is_one_located_line_and_exit_1(project, capsys, monkeypatch):
    def boom(*a, **k):
        raise RuntimeError("boom")

    monkeypatch.setattr("lockstep.harness.commands.listing.load_headers", boom)
    code, out = run(capsys, "list")
    assert code == 1 and "Traceback" not in out
    assert "lockstep: internal error: RuntimeError: boom (at tests/test_hostile_cli.py:" in out and "--debug" in out
    code, out = run(capsys, "list", "--debug")
    assert code == 1 and "Traceback (most recent call last)" in out


def test_a_crash_is_one_located_line_and_its_traceback_comes_with_debug(project, capsys, monkeypatch):
    def boom(*a, **k):
        raise RuntimeError("kernel exploded")

    monkeypatch.setattr("lockstep.harness.targets.lockstep_run.MURMUR", {"torch": boom, "triton": boom})
    code, out = run(capsys, "check", "coins/known-answers")
    assert code == 1 and "crashed: RuntimeError: kernel exploded (at tests/test_hostile_cli.py:" in out
    assert "Traceback" not in out and "reproduce: lockstep diff coins/known-answers --debug" in out
    code, out = run(capsys, "check", "coins/known-answers", "--debug")
    assert code == 1 and "Traceback (most recent call last)" in out


def test_a_golden_recorded_for_an_older_spec_warns_and_fails_under_strict(project, capsys):
    spec = project / "specs/coins/known-answers.yaml"
    spec.write_text(spec.read_text().replace("tags: [", "tags: [edited, "))
    code, out = run(capsys, "check", "coins/known-answers")
    assert code == 0 and "golden may be stale: it was recorded for another version of this spec" in out
    code, out = run(capsys, "check", "--strict", "coins/known-answers")
    assert code == 1 and "STALE" in out and "1 stale" in out


def test_strict_with_a_pattern_reports_obsolete_goldens(project, capsys):
    (project / "specs/coins/known-answers.yaml").unlink()
    code, out = run(capsys, "check", "--strict", "coins/known-*")
    assert code == 1 and "golden/shared/coins/known-answers" in out
    code, out = run(capsys, "check", "--strict", "coins/gumbel-*")      # not named: not reported
    assert code == 0 and "known-answers" not in out


@pytest.mark.parametrize("value", ["0", "-1", "3", "1,,2", "2,2", "1,"])
def test_world_sizes_outside_the_design_are_usage_errors(project, capsys, value):
    code, out = run(capsys, "check", "--world-size", value)
    assert code == 2 and "argument --world-size" in out


@pytest.mark.parametrize("argv,fragment", [
    (["check", "--tag", ""], "a tag must not be empty"),
    (["check", "--tag", "no-such-tag"], "no spec carries tag(s) ['no-such-tag']"),
    (["regen", "--tag", "no-such-tag"], "no spec carries tag(s)"),
    (["list", "coins/*", "--tag", "no-such-tag"], "no spec matching the patterns carries tag(s)"),
])
def test_a_selection_of_nothing_is_a_usage_error(project, capsys, argv, fragment):
    code, out = run(capsys, *argv)
    assert code == 2 and fragment in out


def test_an_empty_spec_folder_is_a_usage_error(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "specs").mkdir()
    code, out = run(capsys, "check")
    assert code == 2 and "no specs under specs" in out


def test_check_prints_each_spec_as_it_finishes(project, capsys, monkeypatch):
    import lockstep.harness.runner as runner

    seen, real = [], runner.check_spec

    def spy(spec, *a, **k):
        seen.append(capsys.readouterr().out)    # what a CI log shows when this spec starts
        return real(spec, *a, **k)

    monkeypatch.setattr(runner, "check_spec", spy)
    assert main(["check"]) == 0
    assert "pass      coins/gumbel-endpoints" in seen[1] and "coins/known-answers" in seen[2]


def test_help_and_list_do_not_import_torch(project):
    probe = ("import sys; from lockstep.harness.cli import main; code = main(sys.argv[1:]); "
             "assert 'torch' not in sys.modules, 'torch imported'; sys.exit(code)")
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    for argv in (["--help"], ["list"], ["check", "--help"]):
        proc = subprocess.run([sys.executable, "-c", probe, *argv], cwd=project, env=env, capture_output=True,
                              text=True, timeout=120)
        assert proc.returncode == 0, proc.stderr


def test_list_columns_stay_aligned_with_long_tags(project, capsys):
    spec = project / "specs/coins/known-answers.yaml"
    spec.write_text(spec.read_text().replace("tags: [", "tags: [a-very-long-tag-name-that-is-long, "))
    code, out = run(capsys, "list")
    lines = out.splitlines()
    descriptions = [line.index(word) for line, word in zip(lines, ("Gumbel", "The known", "Real verify"))]
    assert code == 0 and len(set(descriptions)) == 1, out


def test_check_columns_fit_long_platform_names(project, capsys, monkeypatch):
    monkeypatch.setattr("lockstep.harness.kinds.coins.golden_platform",
                        lambda spec, ctx: "cuda-sm90-fp32-triton-long" if "gumbel" in spec.id else "shared")
    code, out = run(capsys, "check")
    lines = out.splitlines()
    table = [lines[0]] + [line for line in lines if line.startswith(("pass ", "MISSING "))]
    assert code == 3 and len(table) == 4 and table[0].startswith("STATUS")
    golden = table[0].index("GOLDEN")
    assert all(row[golden:].startswith(("shared ", "cuda-sm90")) for row in table[1:]), table
    assert len({len(line) for line in table}) == 1, table                # TIME ends in one column


def test_summaries_name_the_golden_folders(project, capsys):
    code, out = run(capsys, "check")
    assert code == 0 and "goldens: golden/cpu-fp32 (1), golden/shared (2)" in out
    (project / "golden/shared/coins/known-answers.json").unlink()
    (project / "golden/shared/coins/known-answers.safetensors").unlink()
    code, out = run(capsys, "regen")
    assert code == 0 and "wrote 1 golden(s) to golden/shared (1)" in out


def test_a_second_regen_of_the_same_goldens_is_refused(project, capsys):
    before = golden_bytes(project)
    with GoldenStore(project / "golden").writer_lock():          # a regen in another process, meanwhile
        code, out = run(capsys, "regen")
    assert code == 2 and "another process is recording goldens in golden" in out
    assert golden_bytes(project) == before
    assert run(capsys, "regen", "--dry-run")[0] == 0                # a dry run writes nothing: not refused
    assert run(capsys, "regen")[0] == 0                              # released with its holder


def test_make_checkpoint_refusal_names_the_flag(tmp_path, capsys):
    (tmp_path / "ck").mkdir()
    (tmp_path / "ck" / "x").write_text("x")
    code, out = run(capsys, "make-checkpoint", "--preset", "tiny", str(tmp_path / "ck"))
    assert code == 2 and "use --overwrite to replace it" in out and "overwrite=True" not in out


# --------------------------------------------------------------------------- issue 29: messages that name the problem
def test_a_nonexistent_golden_folder_is_named_not_every_spec_missing(project, capsys):
    for argv in (["check"], ["diff", "coins/known-answers"]):
        code, out = run(capsys, *argv, "--golden", "no-such-golden")
        assert code == 2 and "--golden no-such-golden: no such folder" in out and "MISSING" not in out, out
    assert run(capsys, "regen", "--golden", "new-golden", "coins/known-answers")[0] == 0     # regen creates it


def test_a_symlinked_spec_folder_is_reported_not_skipped(project, capsys):
    (project / "specs/linked").symlink_to(project / "specs/coins", target_is_directory=True)
    code, out = run(capsys, "validate")
    assert code == 2 and "specs/linked: a symbolic link to a folder" in out and "0 invalid" not in out, out


@pytest.mark.parametrize("argv,fragment", [
    (["make-checkpoint", "--preset", "tiny", "--seed", str(2**64), "OUT"], "argument --seed: must be an integer in [0, 2^63)"),
    (["make-checkpoint", "--preset", "tiny", "--seed", "-1", "OUT"], "argument --seed: must be an integer in [0, 2^63)"),
    (["generate", "--checkpoint", "models/tiny-target", "--prompt-ids", "1", "--seed", str(2**64)],
     "must be an int in [-2^63, 2^64)"),
    (["generate", "--checkpoint", "models/tiny-target", "--prompt-ids", "-1,2"],
     "argument --prompt-ids: token ids are >= 0, got -1 (a negative id is not a token)"),
    (["generate", "--checkpoint", "models/tiny-target", "--prompt-ids", "-3"],
     "argument --prompt-ids: token ids are >= 0, got -3"),
    (["generate", "--checkpoint", "models/tiny-target", "--prompt-ids", "1", "--stop-ids", "-5,2"],
     "argument --stop-ids: token ids are >= 0, got -5"),
])
def test_out_of_range_numbers_are_named_usage_errors(tmp_path, capsys, monkeypatch, argv, fragment):
    monkeypatch.chdir(REPO)
    argv = [str(tmp_path / "out") if a == "OUT" else a for a in argv]
    code, out = run(capsys, *argv)
    assert code == 2 and fragment in out and "Overflow" not in out and "expected one argument" not in out, out


@pytest.mark.parametrize("where,fragment", [
    ("missing/m.md", "the directory missing does not exist"),
    ("adir", "is a directory"),
])
def test_report_refuses_an_output_path_before_running_anything(project, capsys, monkeypatch, where, fragment):
    (project / "adir").mkdir()
    ran = []
    monkeypatch.setattr("lockstep.harness.commands.targets.run_target", lambda *a, **k: ran.append(1) or [])
    code, out = run(capsys, "report", "--target", "lockstep", "--out", where)
    assert code == 2 and fragment in out and not ran and "Traceback" not in out, out


# --------------------------------------------------------------------------- issue 29: bounded generate and make-checkpoint
def _prompt(n):
    return ",".join(str(i % 500) for i in range(n))


def test_generate_refuses_a_run_estimated_above_max_seconds_before_it_starts(capsys, monkeypatch):
    monkeypatch.chdir(REPO)
    calls = []
    monkeypatch.setattr("lockstep.harness.commands.generate.generate", lambda model, requests, **k: calls.append(requests) or [])
    base = ["generate", "--checkpoint", "models/tiny-target", "--device", "cpu", "--prompt-ids", _prompt(5000)]
    code, out = run(capsys, *base)
    assert code == 2 and not calls and "above --max-seconds 300; pass --max-seconds" in out, out
    assert "prompts of up to 5000 tokens, 16 new tokens, 4 blocks" in out and "Traceback" not in out
    code, out = run(capsys, *base, "--max-seconds", "100000")        # raised: it runs, and says how long first
    assert code == 0 and len(calls) == 1 and len(calls[0][0].prompt) == 5000
    assert "generate: about " in out and " s on the CPU" in out


def test_generate_bound_counts_new_tokens_too(capsys, monkeypatch):
    monkeypatch.chdir(REPO)
    calls = []
    monkeypatch.setattr("lockstep.harness.commands.generate.generate", lambda model, requests, **k: calls.append(requests) or [])
    base = ["generate", "--checkpoint", "models/tiny-target", "--device", "cpu", "--prompt-ids", "1,2,3"]
    assert run(capsys, *base, "--max-new-tokens", "16")[0] == 0 and len(calls) == 1   # a short run: no word
    code, out = run(capsys, *base, "--max-new-tokens", "8000")
    assert code == 2 and len(calls) == 1 and "8000 new tokens" in out and "--max-seconds" in out, out


def test_make_checkpoint_refuses_a_real_size_preset_before_writing_anything(tmp_path, capsys):
    out_dir = tmp_path / "big"
    code, out = run(capsys, "make-checkpoint", "--preset", "gpt-oss-120b", "--format", "mxfp4", str(out_dir))
    assert code == 2 and "preset 'gpt-oss-120b' (mxfp4) has 65.2 GB of parameters in 687 tensors" in out, out
    assert "above --max-gb 1; pass --max-gb 66" in out and not out_dir.exists() and list(tmp_path.iterdir()) == []


def test_make_checkpoint_says_its_size_and_shows_progress(tmp_path, capsys):
    code, out = run(capsys, "make-checkpoint", "--preset", "tiny", "--max-gb", "0.001", str(tmp_path / "a"))
    assert code == 2 and "has 0.0011 GB of parameters" in out and not (tmp_path / "a").exists(), out
    code = main(["make-checkpoint", "--preset", "tiny", str(tmp_path / "b")])
    err = capsys.readouterr().err
    assert code == 0 and "make-checkpoint: 71 tensors, 1.096 MB of parameters" in err
    assert "making tensor 1/71 model.embed_tokens.weight" in err and "making tensor 71/71 lm_head.weight" in err
    assert "wrote shard 1/2 model-00001-of-00002.safetensors" in err and "wrote shard 2/2" in err


def test_make_checkpoint_refuses_an_unwritable_out_before_making_weights(tmp_path, capsys, monkeypatch):
    made = []
    monkeypatch.setattr("lockstep.engine.checkpoint.synthetic_weights", lambda *a, **k: made.append(1) or {})
    (tmp_path / "file").write_text("x")
    code, out = run(capsys, "make-checkpoint", "--preset", "tiny", str(tmp_path / "file" / "sub" / "ck"))
    assert code == 2 and "is a file" in out and not made, out
