"""pytest plugin: every spec of a Lockstep suite is a test item named by its id.

It waits to be asked. Installed with Lockstep it is loaded into every pytest run, but it collects
nothing and imports nothing heavy unless the project opts in: an ini `lockstep_specs` or
`lockstep_suite` setting, or `--lockstep-suite=DIR` on the command line. Another project's
`specs/*.yaml` is never collected.

    pytest                         checks every spec against its golden (plus the unit tests)
    pytest -k coins                select by id or tag, as usual
    pytest --lockstep-regen        regenerate goldens through the same safe path as `lockstep regen`
    pytest --lockstep-dtype bf16   narrow the (dtype, backend) pairs, as `lockstep check --dtype` does
    pytest --lockstep-target sglang    run the specs on another implementation (harness/targets),
                                   judged against its expectations file as `lockstep check --target`

With --lockstep-target, a spec that fails as its expectations file records is xfailed (the reason
shows its judgement); one that fails differently, fails unexpectedly, or passes although a failure
is expected, fails; one the target cannot run is skipped as n/a with the target's reason.

Each spec is one item per golden folder it is checked against, as `lockstep check` runs it:
under every (dtype policy, backend) pair with goldens here (harness/pairs.py), named
`ID[FOLDER]` (`generate/top-k[cpu-bf16]`) when its folder depends on the pair, else `ID`.

A spec that does not load is one failing item whose text is file:line:column: error. A failing spec
shows the same report as `lockstep check`, located at its YAML file. Items are collected in
sorted order, and golden writes are atomic per spec, so pytest-xdist works.
Settings (ini, paths relative to the ini file): `lockstep_specs` (spec directories; setting it opts
in), `lockstep_golden` (one golden directory, or one per spec directory; default "golden"),
`lockstep_suite` (folders holding specs/ and golden/; also `--lockstep-suite=DIR`, e.g. the
installed suite that `lockstep suite` prints; with `=`, or pytest takes DIR for its rootdir),
`lockstep_checkpoints` (SPEC_PATH = DIR lines), `lockstep_expectations` (also
`--lockstep-expectations FILE`) and `lockstep_slow` (spec id globs, one a line: their items carry the
`slow` marker, so `pytest -m "not slow"` is a quick gate while a plain `pytest` still runs every spec;
a list in the ini file, not a spec tag, since a spec's tags are part of its sha256 and so of its
goldens). Spec directories outside the paths pytest walks are collected too unless the command
line names its own paths.
"""

from __future__ import annotations

from pathlib import Path

import pytest


def pytest_addoption(parser):
    group = parser.getgroup("lockstep", "Lockstep conformance specs")
    group.addoption("--lockstep-regen", action="store_true",
                    help="regenerate goldens of the collected specs (two identical runs, atomic writes)")
    group.addoption("--lockstep-allow-ci", action="store_true", help="allow --lockstep-regen under CI (any truthy CI value)")
    group.addoption("--lockstep-device", choices=["cpu", "cuda"], help="default: cuda when available, else cpu")
    group.addoption("--lockstep-dtype", choices=["fp32", "bf16"],
                    help="dtype policy (default: every (dtype, backend) pair with goldens here, see harness/pairs.py)")
    group.addoption("--lockstep-backend", choices=["torch", "triton"], help="engine backend (default: as --lockstep-dtype)")
    group.addoption("--lockstep-target", metavar="NAME",
                    help="run the specs on this target (sglang, vllm, hf, or one registered under the entry "
                         "point group lockstep.targets), judged against its expectations file; default: "
                         "Lockstep's own engine, against the goldens")
    group.addoption("--lockstep-expectations", metavar="FILE", type=Path,
                    help="the target's expectations file (default: the target's own, or the shipped one whose "
                         "version range holds its version)")
    group.addoption("--lockstep-suite", metavar="DIR", type=Path, action="append", default=[],
                    help="also run the suite in DIR (its specs/ against its golden/; repeatable), e.g. the "
                         "installed one: --lockstep-suite=\"$(lockstep suite)\" (with '=': a separate DIR is taken for "
                         "pytest's rootdir)")
    parser.addini("lockstep_specs", "spec directories, relative to the ini file (default: specs)", type="paths",
                  default=[])
    parser.addini("lockstep_golden", "golden directories, relative to the ini file: one for every spec directory, "
                                     "or one per spec directory in order (default: golden)", type="paths", default=[])
    parser.addini("lockstep_suite", "suite folders (each holding specs/ and golden/), relative to the ini file",
                  type="paths", default=[])
    parser.addini("lockstep_checkpoints", "SPEC_PATH = DIR, one a line: the checkpoint a spec names SPEC_PATH is "
                                          "read from DIR (relative to the ini file), outside the suite",
                  type="linelist", default=[])
    parser.addini("lockstep_expectations", "the target's expectations file, relative to the ini file", type="paths",
                  default=[])
    parser.addini("lockstep_slow", "spec id globs (one a line, e.g. generate/batch-of-eight or kernels/attention-*; "
                                   "'#' starts a comment) "
                                   "whose items carry the `slow` marker: deselect them with -m 'not slow'",
                  type="linelist", default=[])


def opted_in(config) -> bool:
    """Whether this project asked for Lockstep's specs: an ini `lockstep_specs` / `lockstep_suite`,
    or `--lockstep-suite` given. Without it the plugin stays out of the run."""
    return bool(config.getini("lockstep_specs") or config.getini("lockstep_suite")
                or config.getoption("--lockstep-suite"))


_ASKS = ("--lockstep-regen", "--lockstep-target", "--lockstep-expectations", "--lockstep-dtype",
         "--lockstep-backend", "--lockstep-device")


def pytest_configure(config):
    """Opted in: the suite half (torch, the engine, the goldens) joins the run; otherwise nothing
    of Lockstep's runs past this point."""
    if not opted_in(config):
        asked = [o for o in _ASKS if config.getoption(o)]
        if asked:
            raise pytest.UsageError(f"{asked[0]}: no Lockstep suite in this run: set lockstep_specs (or "
                                    f"lockstep_suite) in the ini file, or pass --lockstep-suite=DIR")
        return
    from lockstep.harness import pytest_suite
    config.pluginmanager.register(pytest_suite, "lockstep-suite")
