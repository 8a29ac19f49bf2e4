"""Put a bug back, run the named specs, and see them turn red: the shared machinery.

`Planted` checks specs against goldens recorded in a scratch store from a clean run in this
process (before any bug is put back), so a verdict never depends on whether the repository's
engine goldens were recorded on this machine's bits (DESIGN D0 is another issue's business): the
spec turns red because the bug changed its output or broke an expectation, nothing else.
Integer and exact goldens (`shared`) are the repository's own and are used as they are.
"""

from __future__ import annotations

import torch

from harness import runner
from harness.golden import GoldenStore
from harness.platform import SHARED, detect
from harness.result import RunContext
from harness.specfile import load_specs
from tests.conftest import REPO

SPECS = {s.id: s for s in load_specs(REPO / "specs")[0]}


class Planted:
    def __init__(self, tmp_path, spec_ids, device: str = "cpu", backend: str = "torch"):
        self.ctx = RunContext(detect(device), backend=backend)
        self.repo_store = GoldenStore(REPO / "golden")
        self.store = GoldenStore(tmp_path / "golden")
        for spec_id in spec_ids:                      # clean runs, recorded as goldens
            spec = SPECS[spec_id]
            platform = runner.kinds.KINDS[spec.kind].golden_platform(spec, self.ctx)
            if platform == SHARED:
                continue
            with torch.inference_mode():
                result = runner.run_spec(spec, self.ctx)
            failed = runner.kinds.KINDS[spec.kind].check(spec, result)
            assert not failed, (spec_id, failed)
            self.store.write(platform, spec_id, result.tensors, result.data, spec.sha256, spec.kind,
                             runner.provenance(self.ctx, spec, platform))

    def outcome(self, spec_id: str) -> runner.Outcome:
        spec = SPECS[spec_id]
        platform = runner.kinds.KINDS[spec.kind].golden_platform(spec, self.ctx)
        return runner.check_spec(spec, self.ctx, self.repo_store if platform == SHARED else self.store)

    def red(self, spec_id: str) -> str:
        """The spec's report; fails the test unless the spec is red (mismatch, failed or crash)."""
        out = self.outcome(spec_id)
        assert out.status in runner.FAILING, f"{spec_id} stayed {out.status}"
        return out.report()

    def green(self, spec_id: str) -> None:
        out = self.outcome(spec_id)
        assert out.status == runner.PASS, out.report()
