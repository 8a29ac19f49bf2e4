"""The bf16 dtype policy's CPU goldens (golden/cpu-bf16), checked like the fp32 ones.

The pytest plugin runs every spec under the default policy (fp32). Here every spec whose golden
depends on the policy (the ones that run the engine: draft, generate, layer_ids, speculative,
topology over gloo) is checked once more under `--dtype bf16`, through the same
`runner.check_spec` as `lockstep check --dtype bf16`. The list comes from the specs, not from the
golden folder, so a new engine spec without a cpu-bf16 golden fails here (record one with
`lockstep regen --dtype bf16 SPEC`).
"""

from pathlib import Path

import pytest

from harness import kinds, runner
from harness.golden import GoldenStore
from harness.platform import detect
from harness.result import RunContext
from harness.specfile import load_specs

REPO = Path(__file__).resolve().parents[1]
CTX = RunContext(detect("cpu", "bf16"), "torch")
SPECS = [s for s in load_specs(REPO / "specs")[0]
         if kinds.KINDS[s.kind].golden_platform(s, CTX) == CTX.platform.name]


def test_the_bf16_policy_has_engine_specs():
    assert len(SPECS) >= 40 and {s.id.split("/")[0] for s in SPECS} >= {"generate", "speculative", "topology"}


@pytest.mark.parametrize("spec", SPECS, ids=[s.id for s in SPECS])
def test_spec_under_the_bf16_policy(spec):
    out = runner.check_spec(spec, CTX, GoldenStore(REPO / "golden"))
    assert out.status == runner.PASS, out.report(debug=True)
