"""Each historical bug of the seeds, put back by monkeypatching, must turn committed specs red.

seeds/000: SGLang added one to every EAGLE3 layer id unconditionally, and captured hidden states
"before block i", which can never observe boundary L. seeds/004 and DESIGN §5: coins not clamped,
or divided by 2^32. The specs and goldens are the repository's own.
"""

import pytest
import torch

import lockstep.engine.boundaries
import lockstep.kernels.coins
from lockstep.engine.boundaries import gather_captured
from lockstep.engine.model import ForwardOutput, GptOssModel, Step
from lockstep.kernels.rmsnorm import rms_norm_portable as rms_norm
from lockstep.engine.rope import rope_cos_sin
from lockstep.harness import runner
from lockstep.harness.golden import GoldenStore
from lockstep.harness.platform import detect
from lockstep.harness.result import RunContext
from tests.conftest import REPO
from tests.repo_specs import repo_specs

SPECS = repo_specs()
CTX = RunContext(detect())
STORE = GoldenStore(REPO / "golden")


def status(spec_id):
    return runner.check_spec(SPECS[spec_id], CTX, STORE)


def test_committed_specs_pass_unpatched():
    for spec_id in ("layer_ids/120b-nvidia-v3-sglang", "layer_ids/forward-d36-nvidia-v3", "coins/top-hashes-verify"):
        assert status(spec_id).status == runner.PASS, spec_id


def test_unconditional_plus_one_on_layer_ids(monkeypatch):
    real = lockstep.engine.boundaries.resolve_boundaries

    def always_plus_one(ids, convention, *args, **kwargs):
        if convention == "sglang" and ids:
            ids = [i + 1 for i in ids]
            convention = "boundary"
        return real(ids, convention, *args, **kwargs)

    monkeypatch.setattr("lockstep.engine.boundaries.resolve_boundaries", always_plus_one)   # Lockstep's eagle3_layers
    out = status("layer_ids/120b-nvidia-v3-sglang")
    assert out.status in runner.FAILING and "outside [0, 36]" in out.report()
    assert status("layer_ids/forward-d36-nvidia-v3").status in runner.FAILING
    # where max(ids) != L the bug gives the right answer, which is how it shipped unnoticed
    assert status("layer_ids/120b-long-context-sglang").status == runner.PASS


def capture_before_block(self, tokens, positions, slots, cache, capture=(), logit_rows=None):
    """The seeds/000 loop: a boundary is recorded as the input of block i, so L is never seen,
    and only the states seen are concatenated."""
    cfg, wanted, states = self.config, set(capture), {}
    x = self.embed.index_select(0, tokens)
    step = Step(positions, slots, cache, *rope_cos_sin(positions, self.inv_freq, self.mscale))
    for i, block in enumerate(self.blocks):
        if i in wanted:
            states[i] = x
        x = block(x, step)
    h = rms_norm(x, self.norm, cfg.rms_norm_eps)
    logits = h @ self.lm_head.T
    return ForwardOutput(logits, torch.cat([states[b] for b in capture if b in states], dim=-1))


def test_capture_before_the_block(monkeypatch):
    monkeypatch.setattr(GptOssModel, "forward", capture_before_block)
    for spec_id in ("layer_ids/forward-d36-nvidia-v3", "layer_ids/forward-d36-edges"):
        out = status(spec_id)
        assert out.status in runner.FAILING, spec_id
        assert "captured width 64 != count x hidden = 96" in out.report()
    # boundaries below L are the same states either way: the bug hides until L is asked for
    assert status("layer_ids/forward-d36-long-context").status == runner.PASS


def capture_loop_before_block(self, tokens, positions, slots, cache, capture=(), logit_rows=None):
    """GptOssModel.forward with only the seeds/000 loop put back: boundary i is recorded as the
    input of block i, so boundary L is never seen. The rest is the engine's own forward, including
    lockstep.engine.boundaries.gather_captured, which must name the boundary that was never captured."""
    cfg, wanted, states = self.config, set(capture), {}
    tokens, positions, slots = tokens.to(self.device), positions.to(self.device), slots.to(self.device)
    x = self.embed_tokens(tokens)
    step = Step(positions, slots, cache, *rope_cos_sin(positions, self.inv_freq, self.mscale))
    for i, block in enumerate(self.blocks):
        if i in wanted:
            states[i] = x                                          # the bug: before block i
        x = block(x, step)
    h = self.ops.rms_norm(x, self.norm, cfg.rms_norm_eps, self.act)
    if logit_rows is not None:
        h = h.index_select(0, logit_rows.to(self.device))
    return ForwardOutput(self.logits(h), gather_captured(states, capture, cfg.num_hidden_layers))


def test_capture_before_the_block_is_reported_not_crashed(monkeypatch):
    """Issue 15 item 3: with the loop bug alone, every spec that captures boundary L fails with the
    broken contract named ("boundary L was requested and never captured"), never a KeyError crash:
    the layer_ids forward as a mismatch against its golden, speculative and topology specs as a
    failed expectation before any token is drafted."""
    monkeypatch.setattr(GptOssModel, "forward", capture_loop_before_block)
    out = status("layer_ids/forward-d36-nvidia-v3")
    assert out.status == runner.MISMATCH, out.report()
    assert "boundary 36 was requested and never captured" in out.report()
    assert "tensor 'captured': in the golden but not produced by the run" in out.report()
    for spec_id in ("speculative/synthetic-plain", "speculative/d36-nvidia-v3", "topology/speculative-target-only-tp4"):
        out = status(spec_id)
        assert out.status == runner.FAILED, out.report()
        assert "was requested and never captured" in out.report() and "KeyError" not in out.report()


@pytest.mark.parametrize("patch", [("COIN_MAX", 1.0), ("U_DIVISOR", 2**32)])
def test_wrong_coins(monkeypatch, patch):
    monkeypatch.setattr(lockstep.kernels.coins, *patch)
    out = status("coins/top-hashes-verify")
    assert out.status in runner.FAILING and "tensor 'coins'" in out.report()
