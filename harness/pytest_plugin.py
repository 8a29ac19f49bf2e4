"""pytest plugin: every spec under the project's `specs/` is a test item named by its id.

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
Settings (ini): `lockstep_specs` (default "specs"), `lockstep_golden` (default "golden").
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

import pytest

from harness import runner
from harness.golden import GoldenLocked, GoldenStore
from harness.pairs import chosen, folders, plan
from harness.platform import detect
from harness.result import RunContext
from harness.specfile import SPEC_SUFFIX, SpecErrors, load_spec_file, spec_files, spec_id_for, stray_error

_TARGET = pytest.StashKey[tuple]()     # (target, its expectations) under --lockstep-target
_PAIRS = pytest.StashKey[tuple]()      # (device, [Pair], explicit): what each spec is collected under


def pytest_addoption(parser):
    group = parser.getgroup("lockstep", "Lockstep conformance specs")
    group.addoption("--lockstep-regen", action="store_true",
                    help="regenerate goldens of the collected specs (two identical runs, atomic writes)")
    group.addoption("--lockstep-allow-ci", action="store_true", help="allow --lockstep-regen when CI=true")
    group.addoption("--lockstep-device", choices=["cpu", "cuda"], help="default: cuda when available, else cpu")
    group.addoption("--lockstep-dtype", choices=["fp32", "bf16"],
                    help="dtype policy (default: every (dtype, backend) pair with goldens here, see harness/pairs.py)")
    group.addoption("--lockstep-backend", choices=["torch", "triton"], help="engine backend (default: as --lockstep-dtype)")
    group.addoption("--lockstep-target", metavar="NAME",
                    help="run the specs on this target (sglang, vllm, hf, or one registered under the entry "
                         "point group lockstep.targets), judged against its expectations file; default: "
                         "Lockstep's own engine, against the goldens")
    parser.addini("lockstep_specs", "spec directory, relative to the rootdir", default="specs")
    parser.addini("lockstep_golden", "golden directory, relative to the rootdir", default="golden")


def pytest_configure(config):
    if hasattr(config, "workerinput"):
        # a pytest-xdist worker: the workers already fill the cores, and more torch threads per
        # worker only contend for them (the bits do not depend on the thread count: D0)
        import torch
        torch.set_num_threads(1)
    name = config.getoption("--lockstep-target")
    if name and name != "lockstep":
        if config.getoption("--lockstep-regen"):
            raise pytest.UsageError("--lockstep-regen records Lockstep's own goldens: it takes no --lockstep-target")
        config.stash[_TARGET] = _load_target(name)
        expected = config.stash[_TARGET][1]
        specs_dir, _ = _dirs(config)
        if specs_dir.is_dir():     # as `lockstep check --target`: an expectation of no spec is stale
            ids = {spec_id_for(f, specs_dir) for f in spec_files(specs_dir)}
            unknown = sorted(set(expected) - ids)
            if unknown:
                raise pytest.UsageError(f"--lockstep-target {name}: its expectations name specs that do not exist "
                                        f"under {specs_dir}: {', '.join(unknown)} (remove them from the expectations)")
    if not config.getoption("--lockstep-regen"):
        return
    if os.environ.get("CI", "").lower() == "true" and not config.getoption("--lockstep-allow-ci"):
        raise pytest.UsageError("--lockstep-regen refuses to run under CI=true without --lockstep-allow-ci")
    # Hold the golden folder (shared among this session's xdist workers, which record disjoint
    # specs) so that a concurrent `lockstep regen` is refused, and this session refused while one runs.
    held = contextlib.ExitStack()
    try:
        held.enter_context(GoldenStore(_dirs(config)[1]).writer_lock(shared=True))
    except GoldenLocked as e:
        raise pytest.UsageError(str(e)) from None
    config.add_cleanup(held.close)


def _load_target(name: str) -> tuple:
    """(target, its expectations), loaded once per session; a target that cannot load is a usage error."""
    from harness.targets import UnknownTarget, get
    from harness.targets.base import NotApplicable, UpstreamChanged
    from harness.targets.check import load_expectations

    try:
        target = get(name)
        return target, load_expectations(target)
    except UnknownTarget as e:
        raise pytest.UsageError(str(e)) from None
    except (NotApplicable, UpstreamChanged, ValueError, TypeError) as e:
        raise pytest.UsageError(f"--lockstep-target {name}: cannot load: {e}") from None


def _dirs(config) -> tuple[Path, Path]:
    root = Path(config.rootpath)
    return root / config.getini("lockstep_specs"), root / config.getini("lockstep_golden")


def pytest_collect_file(parent, file_path: Path):
    specs_dir, _ = _dirs(parent.config)
    if file_path.suffix.lower() not in (".yaml", ".yml") or specs_dir.resolve() not in file_path.resolve().parents:
        return None
    if file_path.suffix != SPEC_SUFFIX:  # `x.yml`: an error, not silently skipped
        return StrayFile.from_parent(parent, path=file_path)
    return SpecFile.from_parent(parent, path=file_path)


class StrayFile(pytest.File):
    """A file under specs/ that looks like a spec but would be ignored (another YAML suffix)."""

    def collect(self):
        specs_dir, _ = _dirs(self.config)
        error = stray_error(Path(os.path.relpath(self.path, self.config.rootpath)))
        yield InvalidSpecItem.from_parent(self, name=os.path.relpath(self.path, specs_dir), errors=SpecErrors([error]))


class SpecFile(pytest.File):
    def collect(self):
        specs_dir, _ = _dirs(self.config)
        try:
            shown = os.path.relpath(self.path, self.config.rootpath)
            spec = load_spec_file(Path(self.path), specs_dir, shown_as=shown)
        except SpecErrors as e:
            # A bad spec is one failing item, not a collection error: the other specs still run.
            yield InvalidSpecItem.from_parent(self, name=spec_id_for(Path(self.path), specs_dir), errors=e)
            return
        if _TARGET in self.config.stash:        # a target runs each spec once, under the options given
            yield SpecItem.from_parent(self, name=spec.id, spec=spec, ctx=_target_context(self.config))
            return
        # one item per golden folder the spec is checked against (per (dtype, backend) pair), named
        # `ID[FOLDER]` when the folder depends on the pair, so JUnit shows the pairs apart
        device, chosen, explicit = _pairs(self.config)
        for _, ctx, folder in plan([spec], chosen, device, explicit=explicit):
            name = f"{spec.id}[{folder}]" if len(folders(spec, device)) > 1 else spec.id
            yield SpecItem.from_parent(self, name=name, spec=spec, ctx=ctx)


def _pairs(config) -> tuple:
    if _PAIRS not in config.stash:
        opt = config.getoption
        device = detect(opt("--lockstep-device")).device
        dtype, backend = opt("--lockstep-dtype"), opt("--lockstep-backend")
        config.stash[_PAIRS] = (device, chosen(device, _dirs(config)[1], dtype, backend,
                                               regen=opt("--lockstep-regen")), bool(dtype and backend))
    return config.stash[_PAIRS]


def _target_context(config) -> RunContext:
    opt = config.getoption
    return RunContext(detect(opt("--lockstep-device"), opt("--lockstep-dtype") or "fp32"),
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
    def __init__(self, *, spec, ctx: RunContext, **kwargs):
        super().__init__(**kwargs)
        self.spec, self.ctx = spec, ctx
        self.extra_keyword_matches.update(spec.tags)  # so `-k clamp` selects by tag too

    def _context(self) -> RunContext:
        return self.ctx

    def runtest(self):
        _, golden_dir = _dirs(self.config)
        store = GoldenStore(golden_dir)
        if _TARGET in self.config.stash:
            return self._run_on_target(store)
        if self.config.getoption("--lockstep-regen"):
            out = runner.regen_spec(self.spec, self._context(), store)
            if out.status == runner.REFUSED:
                raise SpecFailure(out.report(debug=True))
            return
        out = runner.check_spec(self.spec, self._context(), store)
        self.user_properties.append(("lockstep_status", out.status))
        if out.status != runner.PASS:
            raise SpecFailure(out.report(debug=True))

    def _run_on_target(self, store):
        from harness.targets.check import verdict
        from harness.targets.runners import FAIL, NA, run_on_target

        target, expected = self.config.stash[_TARGET]
        out = run_on_target(self.spec, self._context(), target, store)
        self.user_properties += [("lockstep_target", target.label), ("lockstep_status", out.status)]
        want = expected.get(self.spec.id)
        problem = verdict(out, want)
        if problem:
            lines = [f"{self.spec.id} on {target.label}: {out.status.upper()}, which its expectations "
                     f"({_expectations_shown(target, self.config)}) do not say:", "  " + problem.replace("\n", "\n  ")]
            if out.status == FAIL:
                lines += ["  " + m.replace("\n", "\n  ") for m in out.messages]
            raise SpecFailure("\n".join(lines))
        if out.status == FAIL:
            pytest.xfail(f"expected on {target.label} ({want['judgement']}: {want['why']}): {out.message}")
        if out.status == NA:
            why = f"n/a on {target.label}: {out.message}"
            try:        # reported at the spec's YAML, as a skip marker would be (pytest >= 7)
                raise pytest.skip.Exception(why, _use_item_location=True)
            except TypeError:
                pytest.skip(why)

    def repr_failure(self, excinfo):
        if isinstance(excinfo.value, SpecFailure):
            return excinfo.value.report
        return super().repr_failure(excinfo)

    def reportinfo(self):
        return self.path, self.spec.line_of("kind") - 1, f"spec {self.spec.id}"


def _expectations_shown(target, config) -> str:
    from harness.targets import expectations_path

    path = expectations_path(target)
    try:
        return os.path.relpath(path, config.rootpath)
    except ValueError:
        return str(path)
