"""Put a bug back, run the named specs, and see them turn red: the shared machinery.

`Planted(tmp_path, spec_ids)` checks the listed specs against goldens recorded in a scratch
store from a clean run in this process (before any bug is put back), so a verdict never depends
on whether the repository's engine goldens were recorded on this machine's bits (DESIGN D0 is
another issue's business): the spec turns red because the bug changed its output or broke an
expectation, nothing else. Every other spec (exact `shared` goldens, kernel specs in Triton's
interpreter) is checked against the repository's own goldens.

A planted fault is a monkeypatch in this process, which the ranks of a spec's multi-process
`topologies` (new processes that import the code afresh, engine/launch.py) never see; so specs
are recorded and checked here without those topology runs (`in_process`). No red is lost by it:
the spec's expectation is that each topology run equals its single-device run, clean ranks give
the clean bits, so a fault that makes the single-device run differ from them also makes it differ
from the clean golden recorded here.
What the topology runs pin is pinned by the spec's own item (and, for a fault in the rank code,
by editing the file: tests/parallel). Measured: the two router-ties planted tests with their clean
recording, 71.6 -> 22.4 CPU s (docs/gate.md)."""

from __future__ import annotations

import dataclasses

import torch

from lockstep.harness import runner
from lockstep.harness.golden import GoldenStore
from lockstep.harness.platform import SHARED, detect
from lockstep.harness.result import RunContext
from tests.conftest import REPO
from tests.repo_specs import repo_specs

SPECS = repo_specs()


def in_process(spec):
    """The spec as a planted check runs it: without its multi-process topologies (module docstring)."""
    if not spec.inputs.get("topologies"):
        return spec
    return dataclasses.replace(spec, inputs={**spec.inputs, "topologies": None})


class Planted:
    def __init__(self, tmp_path, spec_ids, device: str = "cpu", backend: str = "torch"):
        self.ctx = RunContext(detect(device), backend=backend)
        self.repo_store = GoldenStore(REPO / "golden")
        self.store = GoldenStore(tmp_path / "golden")
        self.recorded = set()
        for spec_id in spec_ids:                      # clean runs, recorded as goldens
            spec = in_process(SPECS[spec_id])
            platform = runner.kinds.KINDS[spec.kind].golden_platform(spec, self.ctx)
            if platform == SHARED:
                continue
            self.recorded.add(spec_id)
            with torch.inference_mode():
                result = runner.run_spec(spec, self.ctx)
            failed = runner.kinds.KINDS[spec.kind].check(spec, result)
            assert not failed, (spec_id, failed)
            self.store.write(platform, spec_id, result.tensors, result.data, spec.sha256, spec.kind,
                             runner.provenance(self.ctx, spec, platform))

    def outcome(self, spec_id: str) -> runner.Outcome:
        # a planted fault must reach what loads: drop the drafts the recording runs cached
        from lockstep.harness.targets import lockstep_run
        lockstep_run.draft.cache_clear()
        store = self.store if spec_id in self.recorded else self.repo_store
        return runner.check_spec(in_process(SPECS[spec_id]), self.ctx, store)

    def red(self, spec_id: str) -> str:
        """The spec's report; fails the test unless the spec is red (mismatch, failed or crash)."""
        out = self.outcome(spec_id)
        assert out.status in runner.FAILING, f"{spec_id} stayed {out.status}"
        return out.report()

    def green(self, spec_id: str) -> None:
        out = self.outcome(spec_id)
        assert out.status == runner.PASS, out.report()


def module_with(module, replacements: dict[str, str], tmp_path):
    """A copy of `module` (e.g. a Triton kernel file) whose source has each old text replaced by its
    new text, imported from tmp_path: a guard taken out of the kernel's own source. Each old text
    must occur exactly once, so a plant that no longer matches the source fails loudly."""
    import importlib.util
    import inspect
    import sys

    src = inspect.getsource(module)
    for old, new in replacements.items():
        assert src.count(old) == 1, f"{module.__name__}: {old!r} is not in the source exactly once: update the plant"
        src = src.replace(old, new)
    path = tmp_path / f"planted_{module.__name__.replace('.', '_')}.py"
    path.write_text(src, encoding="utf-8")
    spec = importlib.util.spec_from_file_location(path.stem, path)
    planted = importlib.util.module_from_spec(spec)
    sys.modules[path.stem] = planted          # a dataclass in the copy looks its module up by name
    spec.loader.exec_module(planted)
    return planted
