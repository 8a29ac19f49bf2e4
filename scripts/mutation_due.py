#!/usr/bin/env python3
"""Which modules are due a mutation run: those changed since their last recorded run (or never run).

    python3 scripts/mutation_due.py                 # the modules due, each with its [tool.mutmut] lines
    python3 scripts/mutation_due.py --stage harness/compare.py /tmp/stage   # a copy to run mutmut in
    python3 scripts/mutation_due.py --record harness/compare.py   # after recording its row in docs/contributing.md

The modules that decide a verdict or a bit, and the test selection that pins each, are SELECTION
below (the table "The selection per module" in docs/contributing.md says the same). The last
recorded run of each is a line "module commit" in scripts/mutation_runs.txt; a module is due when
`git diff COMMIT HEAD -- module` is not empty, or it has no line. --record writes HEAD for a module
(commit the file with the table row it goes with). --stage copies the checkout into a folder in the
wheel's layout (mutmut names a mutant by its file's path, the tests import `lockstep.*`) with
[tool.mutmut] set for one module."""

from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RUNS = ROOT / "scripts" / "mutation_runs.txt"

# module (mutmut's source_paths) -> the test selection (pytest_add_cli_args_test_selection)
SELECTION = {
    "harness/compare.py": ["tests/test_compare.py"],
    "harness/golden.py": ["tests/test_golden.py", "tests/test_hostile_goldens.py", "tests/test_triton_provenance.py"],
    "harness/pairs.py": ["tests/test_pairs.py"],
    "harness/commands/session.py": ["tests/test_session_rules.py", "tests/test_verdict_machinery.py"],
    "harness/commands/selection.py": ["tests/test_selection_rules.py"],
    "harness/runner.py": ["tests/test_runner_rules.py", "tests/test_verdict_machinery.py", "tests/test_selfcheck.py"],
    # tests/test_parallel_check.py spawns real workers (seconds a mutant): the rules file stands in
    "harness/workers.py": ["tests/test_worker_rules.py", "tests/test_verdict_machinery.py"],
    "harness/targets/judge.py": ["tests/targets/test_judge_rules.py"],
    "harness/targets/expectfile.py": ["tests/targets/test_expectfile_rules.py", "tests/targets/test_expectations.py",
                                      "tests/test_verdict_machinery.py"],
    "harness/kinds/primitive.py": ["tests/test_primitive_rules.py", "tests/test_primitive_nan_sides.py"],
    "harness/replay/rerun.py": ["tests/replay/test_verdicts.py", "tests/replay/test_verdict_rules.py",
                                "tests/replay/test_locate_inputs.py", "tests/replay/test_identity_and_inputs.py",
                                "tests/replay/test_replay_inputs.py"],
    "harness/replay/identity.py": ["tests/replay/test_trace_identity.py", "tests/replay/test_identity_and_inputs.py"],
    "harness/replay/format.py": ["tests/replay/test_trace_refusals.py", "tests/replay/test_trace_format.py"],
    # acceptance and layout (engine/speculative.py is the round's driver now)
    "engine/spec_accept.py": ["tests/speculative/test_acceptance_pins.py", "tests/speculative/test_inverse_cdf_rows.py",
                              "tests/speculative/test_batched_round.py", "tests/speculative/test_verify_rules.py"],
    "engine/spec_tree.py": ["tests/speculative/test_acceptance_pins.py", "tests/speculative/test_batched_round.py",
                            "tests/speculative/test_verify_rules.py"],
    "engine/sampling.py": ["tests/engine/test_sampling_rows.py", "tests/engine/test_token_sampling.py",
                           "tests/engine/test_engine_seams.py", "tests/engine/test_sampling_decisions.py"],
    "engine/prefix_cache.py": ["tests/engine/test_prefix_cache_blocks.py", "tests/engine/test_engine_seams.py"],
    # tests/parallel/test_launch*.py start real ranks (seconds a mutant): the rules file stands in
    "engine/launch.py": ["tests/engine/test_launch_rules.py"],
    "kernels/portable.py": ["tests/test_portable.py", "tests/test_portable_reductions.py", "tests/test_portable_chunks.py"],
}


# module -> the tests its selection leaves out (pytest -k), slow ones a mutant would rerun in full
KEEP_OUT = {
    "harness/golden.py": "not killed_writer and not sigterm_at_any_moment and not compared_as_before",
    "harness/pairs.py": "not interpreted_engine_kernel and not collects_one_item and not bf16_policy_alone",
    "engine/sampling.py": "not test_gumbel_max_follows_the_distribution",
    # a pytester subprocess: it does not see mutmut's trampolines (nor mutmut itself)
    "harness/runner.py": "not the_pytest_plugin_refuses_specs_under_a_broken_comparator",
    "engine/spec_accept.py": "not test_a_biased_verifier_is_caught and not test_rejection_output_follows_the_target_distribution",
    "engine/spec_tree.py": "not test_a_biased_verifier_is_caught and not test_rejection_output_follows_the_target_distribution",
}


def recorded() -> dict[str, str]:
    if not RUNS.is_file():
        return {}
    pairs = (line.split() for line in RUNS.read_text().splitlines() if line.strip() and not line.startswith("#"))
    return {module: commit for module, commit in pairs}


def git(*args: str) -> str:
    return subprocess.run(["git", *args], cwd=ROOT, check=True, capture_output=True, text=True).stdout.strip()


def due() -> list[tuple[str, str]]:
    """(module, why) of every module in SELECTION that changed since its recorded run."""
    runs, out = recorded(), []
    for module in SELECTION:
        commit = runs.get(module)
        if commit is None:
            out.append((module, "never recorded"))
        elif git("diff", "--name-only", commit, "HEAD", "--", module):
            out.append((module, f"changed since {commit[:10]}"))
    return out


def record(module: str) -> None:
    if module not in SELECTION:
        sys.exit(f"{module}: not in SELECTION (scripts/mutation_due.py)")
    runs = recorded() | {module: git("rev-parse", "HEAD")}
    RUNS.write_text("# module, the commit of its last recorded mutation run (scripts/mutation_due.py)\n" +
                    "".join(f"{m} {c}\n" for m, c in sorted(runs.items())))


def mutmut_config(module: str) -> str:
    """The [tool.mutmut] table that runs MODULE's mutants in a staged copy."""
    # a planted-fault test copies the module's source, which mutmut has rewritten: it pins nothing there
    keep_out = " and ".join(["not planted"] + ([f"({KEEP_OUT[module]})"] if module in KEEP_OUT else []))
    args = ["-p", "no:cacheprovider", "-p", "no:randomly", "-x", "-q", "-k", keep_out]
    quote = lambda xs: "[" + ", ".join(f'"{x}"' for x in xs) + "]"
    return ("[tool.mutmut]\n"
            f"source_paths = {quote(['lockstep/' + module])}\n"
            f"also_copy = {quote(['lockstep/', 'models/', 'specs/', 'golden/', 'tests/', 'docs/'])}\n"
            f"pytest_add_cli_args = {quote(args)}\n"
            f"pytest_add_cli_args_test_selection = {quote(SELECTION[module])}\n")


def stage(module: str, folder: Path) -> None:
    """Copy the checkout into FOLDER in the wheel's layout, [tool.mutmut] set for MODULE."""
    if module not in SELECTION:
        sys.exit(f"{module}: not in SELECTION (scripts/mutation_due.py)")
    if folder.exists():
        sys.exit(f"{folder}: exists; stage into a new folder (mutmut keeps its state in mutants/ there)")
    ignore = shutil.ignore_patterns("__pycache__", "mutants", ".hypothesis")
    (folder / "lockstep").mkdir(parents=True)
    for f in (ROOT / "lockstep").glob("*.py"):
        shutil.copy2(f, folder / "lockstep" / f.name)
    for sub in ("harness", "engine", "kernels"):
        shutil.copytree(ROOT / sub, folder / "lockstep" / sub, ignore=ignore)
    # the preset checkpoints beside the package too: harness/fingerprint.py finds them there, as in the wheel
    shutil.copytree(ROOT / "models", folder / "lockstep" / "models", ignore=ignore, symlinks=True)
    for sub in ("tests", "models", "specs", "golden", "docs"):           # docs: the JSON schemas some tests read
        shutil.copytree(ROOT / sub, folder / sub, ignore=ignore, symlinks=True)
    text = (ROOT / "pyproject.toml").read_text()
    text = re.sub(r"(?ms)^\[tool\.mutmut\]\n.*?(?=^\[|\Z)", "", text)
    (folder / "pyproject.toml").write_text(text.rstrip() + "\n\n" + mutmut_config(module))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--record", metavar="MODULE", help="write HEAD as MODULE's last recorded run")
    p.add_argument("--stage", nargs=2, metavar=("MODULE", "FOLDER"),
                   help="copy the checkout into FOLDER in the wheel's layout, set to run MODULE's mutants")
    args = p.parse_args()
    if args.stage:
        stage(args.stage[0], Path(args.stage[1]))
        return
    if args.record:
        record(args.record)
        return
    for module, why in due():
        print(f"{module}  ({why})\n  source_paths = [\"{module}\"]\n"
              f"  pytest_add_cli_args_test_selection = {SELECTION[module]!r}".replace("'", '"'))


if __name__ == "__main__":
    main()
