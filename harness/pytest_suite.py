"""The pytest plugin's suite half: spec items, regen and targets, registered by
lockstep.harness.pytest_plugin once a project opts in (see that module for the settings)."""

from __future__ import annotations

import contextlib
import os
import shutil
from fnmatch import fnmatchcase
from pathlib import Path

import pytest
import torch

from lockstep.engine import lifeline
from lockstep.harness import judges, runner
from lockstep.harness.checkpoints import SHARED_ENV
from lockstep.harness.ci import ci_value, under_ci
from lockstep.harness.errors import located
from lockstep.harness.golden import GoldenLocked, GoldenStore
from lockstep.harness.memory import keep_freed_memory
from lockstep.harness.pairs import chosen, folders, plan
from lockstep.harness.platform import detect
from lockstep.harness.result import RunContext
from lockstep.harness.specfile import SPEC_SUFFIX, SpecErrors, load_spec_file, spec_files, spec_id_for, stray_error
from lockstep.harness.suite_paths import map_checkpoints, parse_mapping
from lockstep.harness.target import NotApplicable, UpstreamChanged
from lockstep.harness.targets import UnknownTarget, at_policy, expectations_path, get, load_expectations

_TARGET = pytest.StashKey[tuple]()     # (target, its expectations) under --lockstep-target
_PAIRS = pytest.StashKey[tuple]()      # (device, [Pair], explicit): what each spec is collected under


def pytest_configure(config):
    config.addinivalue_line("markers", "slow: a costly spec (ini lockstep_slow) or test; a quick gate runs "
                                       "-m 'not slow', a full one runs everything (docs/gate.md)")
    _check_settings(config)
    _warn_unmatched_slow(config)
    _share_checkpoints(config)
    if hasattr(config, "workerinput"):
        # a pytest-xdist worker: the workers already fill the cores, and more torch threads per
        # worker only contend for them (the bits do not depend on the thread count: D0)
        torch.set_num_threads(1)
    keep_freed_memory()             # spec items and tests alike: fewer page faults, no bit changes
    base = Path(config.inipath).parent if config.inipath else Path(config.rootpath)
    try:
        map_checkpoints(parse_mapping(line, base) for line in config.getini("lockstep_checkpoints"))
    except ValueError as e:
        raise pytest.UsageError(f"lockstep_checkpoints: {e}") from None
    name = config.getoption("--lockstep-target")
    if name and name != "lockstep":
        if config.getoption("--lockstep-regen"):
            raise pytest.UsageError("--lockstep-regen records Lockstep's own goldens: it takes no --lockstep-target")
        target, expected = _load_target(name, _expectations_option(config))
        config.stash[_TARGET] = (_at_dtype(target, config.getoption("--lockstep-dtype")), expected)
        # as `lockstep check --target`: an expectation of a spec in none of the spec directories is
        # warned about, not fatal (it may belong to a spec directory this run does not include)
        ids = {spec_id_for(f, d) for d, _ in _suites(config) if d.is_dir() for f in spec_files(d)}
        unknown = sorted(set(expected) - ids)
        if unknown:
            config.issue_config_time_warning(pytest.PytestConfigWarning(
                f"--lockstep-target {name}: its expectations name specs that are in no spec directory of this run: "
                f"{', '.join(unknown)} (stale, or of another suite)"), stacklevel=2)
    if not config.getoption("--lockstep-regen"):
        return
    if under_ci() and not config.getoption("--lockstep-allow-ci"):
        raise pytest.UsageError(f"--lockstep-regen refuses to run under CI={ci_value()} without --lockstep-allow-ci")
    # Hold the golden folder (shared among this session's xdist workers, which record disjoint
    # specs) so that a concurrent `lockstep regen` is refused, and this session refused while one runs.
    held = contextlib.ExitStack()
    golden = None
    try:
        for golden in dict.fromkeys(g for _, g in _suites(config)):
            held.enter_context(GoldenStore(golden).writer_lock(shared=True))
    except GoldenLocked as e:
        raise pytest.UsageError(str(e)) from None
    except OSError as e:      # the golden folder cannot be created or opened
        raise pytest.UsageError(f"--lockstep-regen: cannot record goldens in {golden}: "
                                f"{e.strerror or e}") from None
    config.add_cleanup(held.close)


def _share_checkpoints(config) -> None:
    """The session's processes (the xdist workers, which inherit the controller's environment, and
    the CLI subprocesses tests start) make each synthetic checkpoint once, in one folder for the
    session (harness/checkpoints.py), removed when the session ends."""

    if hasattr(config, "workerinput") or os.environ.get(SHARED_ENV):
        return

    lifeline.sweep()                          # the folders of runs that were killed
    folder = lifeline.run_folder("lockstep-shared-checkpoints")
    os.environ[SHARED_ENV] = folder

    def remove():
        os.environ.pop(SHARED_ENV, None)
        shutil.rmtree(folder, ignore_errors=True)
    config.add_cleanup(remove)


def _expectations_option(config) -> Path | None:
    given = config.getoption("--lockstep-expectations")
    if given is not None:
        return given
    ini = config.getini("lockstep_expectations")
    return ini[0] if ini else None


def _load_target(name: str, explicit: Path | None = None) -> tuple:
    """(target, its expectations), loaded once per session; a target that cannot load, or a bad
    expectations file, is a usage error."""

    try:
        target = get(name)
        return target, load_expectations(target, explicit)
    except UnknownTarget as e:
        raise pytest.UsageError(str(e)) from None
    except (NotApplicable, UpstreamChanged, ValueError, TypeError) as e:
        raise pytest.UsageError(f"--lockstep-target {name}: cannot load: {e}") from None
    except Exception as e:  # noqa: BLE001 - the target's own code (its import, its factory) crashed
        raise pytest.UsageError(f"--lockstep-target {name}: cannot load: its factory crashed: {located(e)}") from None


_SUITES = pytest.StashKey[list]()


def _suites(config) -> list[tuple[Path, Path]]:
    """(spec directory, its golden directory) pairs, resolved: ini `lockstep_specs` with
    `lockstep_golden` (relative to the ini file; default specs/ and golden/ of the rootdir), then
    each ini `lockstep_suite` and `--lockstep-suite` folder's specs/ and golden/."""
    if _SUITES in config.stash:
        return config.stash[_SUITES]
    root = Path(config.inipath).parent if config.inipath else Path(config.rootpath)
    specs = config.getini("lockstep_specs")
    golden = config.getini("lockstep_golden") or [root / "golden"]
    if len(golden) not in (1, len(specs)):
        raise pytest.UsageError(f"lockstep_golden lists {len(golden)} folders for {len(specs)} spec directories: give "
                                f"one (shared) or one per spec directory")
    pairs = list(zip(specs, golden * len(specs) if len(golden) == 1 else golden))
    for suite in config.getini("lockstep_suite") + config.getoption("--lockstep-suite"):
        if not (Path(suite) / "specs").is_dir():
            raise pytest.UsageError(f"lockstep suite {suite}: no specs/ folder in it")
        pairs.append((Path(suite) / "specs", Path(suite) / "golden"))
    config.stash[_SUITES] = [(Path(os.path.abspath(d)), Path(os.path.abspath(g))) for d, g in pairs]
    return config.stash[_SUITES]


def _suite_of(config, file_path: Path) -> tuple[Path, Path] | None:
    """The (spec directory, golden directory) a file lies under (the deepest), or None."""
    here = Path(os.path.abspath(file_path))
    found = [(d, g) for d, g in _suites(config) if d in here.parents]
    return max(found, key=lambda p: len(p[0].parts)) if found else None


@pytest.hookimpl(trylast=True)
def pytest_sessionstart(session):
    """Spec directories outside the paths pytest walks (another clone, an installed suite) are
    collected too, unless the command line named its own paths."""
    config = session.config
    if config.args_source == pytest.Config.ArgsSource.ARGS:
        return
    walked = [Path(os.path.abspath(a.split("::")[0])) for a in config.args]
    for d, _ in _suites(config):
        if d.is_dir() and not any(w == d or w in d.parents for w in walked):
            config.args.append(str(d))


def pytest_collect_file(parent, file_path: Path):
    if file_path.suffix.lower() not in (".yaml", ".yml") or _suite_of(parent.config, file_path) is None:
        return None
    if file_path.suffix != SPEC_SUFFIX:  # `x.yml`: an error, not silently skipped
        return StrayFile.from_parent(parent, path=file_path)
    return SpecFile.from_parent(parent, path=file_path)


@pytest.hookimpl(tryfirst=True)
def pytest_collect_directory(path: Path, parent):
    """A folder of a spec suite is collected by SpecDir, which also reports what pytest's walk skips."""
    if _suite_of(parent.config, Path(path) / "_") is None:
        return None
    return SpecDir.from_parent(parent, path=Path(path))


class SpecDir(pytest.Dir):
    """pytest's folder walk, plus each `*.yaml`/`*.yml` entry it skips because it is not a regular
    file (a dangling link, a link to a device, a FIFO): a failing item, as the CLI reports it."""

    def collect(self):
        yield from super().collect()
        for entry in sorted(os.scandir(self.path), key=lambda e: e.name):
            if entry.name.lower().endswith((".yaml", ".yml")) and not entry.is_dir() and not entry.is_file():
                yield StrayFile.from_parent(self, path=Path(entry.path))


class StrayFile(pytest.File):
    """A file under specs/ that looks like a spec but would be ignored (another YAML suffix)."""

    def collect(self):
        specs_dir, _ = _suite_of(self.config, self.path)
        error = stray_error(Path(os.path.relpath(self.path, self.config.rootpath)))
        yield InvalidSpecItem.from_parent(self, name=os.path.relpath(self.path, specs_dir), errors=SpecErrors([error]))


class SpecFile(pytest.File):
    def collect(self):
        specs_dir, golden_dir = _suite_of(self.config, self.path)
        try:
            shown = os.path.relpath(self.path, self.config.rootpath)
            spec = load_spec_file(Path(os.path.abspath(self.path)), specs_dir, shown_as=shown)
        except SpecErrors as e:
            # A bad spec is one failing item, not a collection error: the other specs still run.
            yield InvalidSpecItem.from_parent(self, name=spec_id_for(Path(os.path.abspath(self.path)), specs_dir),
                                              errors=e)
            return
        if _TARGET in self.config.stash:        # a target runs each spec once, under the options given
            yield SpecItem.from_parent(self, name=spec.id, spec=spec, ctx=_target_context(self.config),
                                       golden=golden_dir)
            return
        # one item per golden folder the spec is checked against (per (dtype, backend) pair), named
        # `ID[FOLDER]` when the folder depends on the pair, so JUnit shows the pairs apart
        device, chosen, explicit = _pairs(self.config, golden_dir)
        for _, ctx, folder in plan([spec], chosen, device, explicit=explicit):
            name = f"{spec.id}[{folder}]" if len(folders(spec, device)) > 1 else spec.id
            item = SpecItem.from_parent(self, name=name, spec=spec, ctx=ctx, golden=golden_dir)
            if is_slow(self.config, spec.id):
                item.add_marker(pytest.mark.slow)
            yield item


def is_slow(config, spec_id: str) -> bool:
    """Whether ini `lockstep_slow` names this spec (a glob of its id): all its items are slow."""
    return any(fnmatchcase(spec_id, g) for g in _slow_globs(config))


def _slow_globs(config) -> list[str]:
    return [g for g in (line.split("#")[0].strip() for line in config.getini("lockstep_slow")) if g]


def _warn_unmatched_slow(config) -> None:
    """A `lockstep_slow` glob that names no spec (a typo, a renamed spec) is warned about: the spec
    it meant would run in the quick gate."""
    globs = _slow_globs(config)
    if not globs:
        return
    ids = {spec_id_for(f, d) for d, _ in _suites(config) if d.is_dir() for f in spec_files(d)}
    unmatched = [g for g in globs if not any(fnmatchcase(i, g) for i in ids)]
    if unmatched:
        config.issue_config_time_warning(pytest.PytestConfigWarning(
            f"lockstep_slow: these globs name no spec: {', '.join(unmatched)}"), stacklevel=2)


def _pairs(config, golden: Path) -> tuple:
    """(device, the pairs to run, whether both --lockstep-dtype and --lockstep-backend were
    given) for specs whose goldens are in `golden`; one answer per golden folder and session."""
    known = config.stash.setdefault(_PAIRS, {})
    if golden not in known:
        opt = config.getoption
        try:
            device = detect(opt("--lockstep-device")).device
        except ValueError as e:                   # --lockstep-device cuda without a GPU
            raise pytest.UsageError(f"--lockstep-device: {e}") from None
        dtype, backend = opt("--lockstep-dtype"), opt("--lockstep-backend")
        known[golden] = (device, chosen(device, golden, dtype, backend, regen=opt("--lockstep-regen")),
                         bool(dtype and backend))
    return known[golden]


def _at_dtype(target, dtype: str | None):
    """The target at --lockstep-dtype, as `check --target --dtype` (harness.targets.at_policy)."""
    try:
        return at_policy(target, dtype)
    except ValueError as e:
        raise pytest.UsageError(f"--lockstep-dtype {e}") from None


def _target_context(config) -> RunContext:
    opt = config.getoption
    dtype = getattr(config.stash[_TARGET][0], "dtype", "fp32") if _TARGET in config.stash else None
    return RunContext(detect(opt("--lockstep-device"), dtype or opt("--lockstep-dtype") or "fp32"),
                      opt("--lockstep-backend") or "torch")


class InvalidSpecItem(pytest.Item):
    def __init__(self, *, errors: SpecErrors, **kwargs):
        super().__init__(**kwargs)
        self.errors = errors

    def runtest(self):
        raise self.errors

    def repr_failure(self, excinfo):
        return "invalid spec:\n" + "\n".join(f"  {err}" for err in self.errors.errors)

    def reportinfo(self):
        return self.path, 0, f"invalid spec {self.name}"


class SpecFailure(Exception):
    def __init__(self, report: str):
        super().__init__(report)
        self.report = report


class SpecItem(pytest.Item):
    def __init__(self, *, spec, ctx: RunContext, golden: Path, **kwargs):
        super().__init__(**kwargs)
        self.spec, self.ctx, self.golden = spec, ctx, golden
        self.extra_keyword_matches.update(spec.tags)  # so `-k clamp` selects by tag too

    def _context(self) -> RunContext:
        return self.ctx

    def runtest(self):
        """The spec through the check pipeline (harness/judges.py), its verdict as a pytest outcome:
        a failure, an expected failure (xfail), n/a or an incomparable golden (skip)."""
        if _TARGET not in self.config.stash and self.config.getoption("--lockstep-regen"):
            out = runner.regen_spec(self.spec, self._context(), GoldenStore(self.golden))
            if out.status == runner.REFUSED:
                raise SpecFailure(out.report(debug=True))
            return
        judge = _judge(self.config, self.golden)
        if judge.has_goldens:
            _self_check(self.config)
        out = judge.run(self.spec, self._context())
        verdict = judge.verdict(out)
        self.user_properties += verdict.properties
        if verdict.state in (judges.FAILED, judges.MISSING):
            if verdict.problem is None:
                raise SpecFailure(verdict.report)
            raise SpecFailure(f"{self.spec.id} on {judge.target.label}: {out.status.upper()}, which its expectations "
                              f"({_expectations_shown(judge.target, self.config)}) do not say:\n  "
                              + verdict.problem.replace("\n", "\n  ") + "\n" + verdict.report)
        if verdict.state == judges.EXPECTED:
            pytest.xfail(verdict.headline)
        if verdict.state == judges.INCOMPARABLE:
            pytest.skip(verdict.headline)
        if verdict.state == judges.NOT_APPLICABLE:
            try:        # reported at the spec's YAML, as a skip marker would be (pytest >= 7)
                raise pytest.skip.Exception(verdict.headline, _use_item_location=True)
            except TypeError:
                pytest.skip(verdict.headline)

    def repr_failure(self, excinfo):
        if isinstance(excinfo.value, SpecFailure):
            return excinfo.value.report
        return super().repr_failure(excinfo)

    def reportinfo(self):
        return self.path, self.spec.line_of("kind") - 1, f"spec {self.spec.id}"


_JUDGES = pytest.StashKey[dict]()


def _judge(config, golden: Path):
    """The session's judge for specs whose goldens are in `golden`: the target's expectations
    under --lockstep-target, else the goldens; made once per golden folder."""
    made = config.stash.setdefault(_JUDGES, {})
    if golden not in made:
        if _TARGET in config.stash:
            target, expected = config.stash[_TARGET]
            made[golden] = judges.ExpectationsJudge(target, expected, golden, _expectations_option(config), debug=True)
        else:
            made[golden] = judges.GoldenJudge(golden, debug=True)
    return made[golden]


_SELF_CHECK = pytest.StashKey[str]()     # '' once the comparator and loader passed, else the reason


def _self_check(config) -> None:
    """As `lockstep check`: no spec item passes while the comparator or the golden loader is unsound
    (harness/selfcheck.py); run once per session, and every spec item fails with its reason."""
    if _SELF_CHECK not in config.stash:
        try:
            runner.self_check()
            config.stash[_SELF_CHECK] = ""
        except runner.SelfCheckFailed as e:
            config.stash[_SELF_CHECK] = str(e)
    if config.stash[_SELF_CHECK]:
        raise SpecFailure(config.stash[_SELF_CHECK])


def _expectations_shown(target, config) -> str:
    path = expectations_path(target, _expectations_option(config))
    if path is None:
        return "none"
    try:
        return os.path.relpath(path, config.rootpath)
    except ValueError:
        return str(path)


# --------------------------------------------------------------------------- settings
def _check_settings(config) -> None:
    """A wrong `lockstep_specs` / `lockstep_golden` value is a usage error naming the setting: a
    path that is not a folder, or a folder set explicitly that does not exist (a golden folder
    only outside --lockstep-regen, which creates it)."""
    regen = config.getoption("--lockstep-regen")
    try:                      # `--lockstep-device cuda` without a GPU: once here, not once per spec
        detect(config.getoption("--lockstep-device"), config.getoption("--lockstep-dtype") or "fp32")
    except ValueError as e:
        raise pytest.UsageError(f"--lockstep-device: {e}") from None
    where = f" (in {os.path.relpath(config.inipath, config.rootpath)})" if config.inipath else ""
    for key, may_be_missing in (("lockstep_specs", False), ("lockstep_golden", regen)):
        explicit = bool(config.getini(key))
        for value, path in _ini_paths(config, key):
            if path.exists() and not path.is_dir():
                raise pytest.UsageError(f"{key} = {value}{where}: {path} is not a folder")
            if explicit and not path.exists() and not may_be_missing:
                raise pytest.UsageError(f"{key} = {value}{where}: no folder {path}")


def _ini_paths(config, key: str) -> list[tuple[str, Path]]:
    """(as written, resolved) for each path an ini key gives (one string, or a list of paths)."""
    value = config.getini(key)
    values = value if isinstance(value, list) else [value]
    return [(str(v), Path(config.rootpath) / v) for v in values]
