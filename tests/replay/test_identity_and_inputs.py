"""Replay's identity and inputs, each contract beside a planted fault that turns it red: a
speculative replay checks the draft's identity on the real checkpoint folders, a draft tree's
parents are compared and validated, a checkpoint's identity counts each tensor's dtype and shape,
and `replay --order` is a permutation (a repeated request is refused, not just a missing one)."""

from __future__ import annotations

import pytest
import torch
from safetensors.torch import save_file

from lockstep.harness.kinds import verify as verify_kind
from lockstep.harness.replay import identity
from lockstep.harness.replay import rerun as rp
from lockstep.harness.replay.format import TraceError
from tests.conftest import REPO
from tests.planted import module_with
from tests.replay.test_verdict_rules import result, spec_log, spec_trace, steps, trace_of


def red(pin, *args) -> None:
    with pytest.raises((AssertionError, pytest.fail.Exception)):
        pin(*args)


# ---------------------------------------------------------------- the draft's identity
def speculative_trace(draft_identity: dict):
    t = trace_of([steps([7])])
    t.manifest.update(platform=identity.platform_identity("fp32", "torch", "cpu"),
                      checkpoint={**identity.checkpoint_identity(REPO / "models/tiny-target"),
                                  "ref": {"path": "models/tiny-target"}},
                      draft={**draft_identity, "ref": {"path": "models/tiny-eagle3", "convention": "sglang"}})
    return t


def pin_draft_identity(check_identity, monkeypatch) -> None:
    """A speculative replay is refused on another draft than the recorded one, named as the draft."""
    monkeypatch.chdir(REPO)
    real = identity.checkpoint_identity(REPO / "models/tiny-eagle3")
    check_identity(*(lambda t: (t, rp.recorded_setup(t)))(speculative_trace(real)))      # the same draft: fine
    name = sorted(real["tensors"])[0]
    other = {**real, "tensors": {**real["tensors"], name: "0" * 64}, "sha256": "1" * 64}
    t = speculative_trace(other)
    with pytest.raises(TraceError) as e:
        check_identity(t, rp.recorded_setup(t))
    assert "recorded on another draft" in str(e.value) and f"first {name}" in str(e.value), e.value


def test_draft_identity(monkeypatch):
    pin_draft_identity(rp.check_identity, monkeypatch)


@pytest.mark.parametrize("plant", [
    {"    if setup.draft is not None:\n        check_checkpoint(trace.manifest[\"draft\"]": "    if False:\n        "
     "check_checkpoint(trace.manifest[\"draft\"]"},
    {'check_checkpoint(trace.manifest["draft"], draft_folder(setup), "draft")':
     'check_checkpoint(trace.manifest["checkpoint"], checkpoint_folder(setup), "draft")'},
], ids=["draft-unchecked", "target-checked-twice"])
def test_draft_identity_planted(monkeypatch, tmp_path, plant):
    planted = module_with(rp, plant, tmp_path)
    red(pin_draft_identity, planted.check_identity, monkeypatch)


# ---------------------------------------------------------------- a draft tree's parents
def pin_parents_compared(speculative_control) -> None:
    """A round whose drafted tokens agree but whose parents differ is a control verdict."""
    for r, parents in ((1, [-1, -1]), (2, [0])):
        v = speculative_control(spec_trace(), 0, result([7, 8, 9, 4], accept=[2, 1]),
                                spec_log({(r, "draft.parents"): parents}))
        assert v is not None and v.status.value == "control" and v.detail.startswith(f"verify round {r}: another "
                                                                                       "draft tree"), (r, v)


def test_parents_compared():
    pin_parents_compared(rp._speculative_control)


def test_parents_compared_planted(tmp_path):
    planted = module_with(rp, {' or ev.get("draft.parents") != rec["draft_parents"]': ""}, tmp_path)
    red(pin_parents_compared, planted._speculative_control)


def pin_parents_validated(validate_draft, validate_tree) -> None:
    """A verify spec's tree and draft candidates: every parent precedes its child (the root's is -1)."""
    ok = {"parents": [-1, 0, -1], "tokens": [1, 2, 3], "scores": [-1.0, -2.0, -1.5], "nodes": 4}
    assert validate_draft(ok) == []
    for bad in ([-1, 1, -1], [-1, 2, -1], [-1, -2, 0], [0, 0, 0]):
        probs = validate_draft({**ok, "parents": bad})
        assert probs and "parent precedes it" in probs[0].message, (bad, probs)
    assert validate_tree({"tree": {"parents": [-1, 0, 1, 0], "tokens": 5}}) == []
    for bad in ([-1, 0, 2, 0], [-1, 0, 1, 4], [-1, -1, 0], [0, 0]):
        assert validate_tree({"tree": {"parents": bad, "tokens": 5}}), bad


def test_parents_validated():
    pin_parents_validated(verify_kind._validate_draft, verify_kind._validate_tree)


@pytest.mark.parametrize("plant", [{"if not -1 <= p < c:": "if not -1 <= p:"}, {"if not 0 <= p < i:": "if p < -1:"}],
                         ids=["draft", "tree"])
def test_parents_validated_planted(tmp_path, plant):
    planted = module_with(verify_kind, plant, tmp_path)
    red(pin_parents_validated, planted._validate_draft, planted._validate_tree)


# ---------------------------------------------------------------- a checkpoint's identity: dtype and shape
def pin_identity_counts_dtype_and_shape(checkpoint_identity, tmp_path) -> None:
    """The same bytes as another dtype, or in another shape, are another checkpoint."""
    base = torch.arange(6, dtype=torch.float32).reshape(2, 3)
    ids = []
    for i, t in enumerate((base, base.reshape(3, 2), base.view(torch.int32), base.reshape(6))):
        folder = tmp_path / f"c{i}"
        folder.mkdir(parents=True)
        (folder / "config.json").write_text("{}")
        save_file({"w": t.contiguous()}, str(folder / "model.safetensors"))
        ids.append(checkpoint_identity(folder))
    assert len({i["sha256"] for i in ids}) == 4, ids
    assert len({i["tensors"]["w"] for i in ids}) == 4


def test_identity_counts_dtype_and_shape(tmp_path):
    pin_identity_counts_dtype_and_shape(identity.checkpoint_identity, tmp_path)


def test_identity_counts_dtype_and_shape_planted(tmp_path):
    planted = module_with(identity, {'h = hashlib.sha256(f"{t.dtype}{list(t.shape)}".encode())':
                                     "h = hashlib.sha256()"}, tmp_path)
    red(pin_identity_counts_dtype_and_shape, planted.checkpoint_identity, tmp_path / "run")


# ---------------------------------------------------------------- replay --order: a permutation
def pin_order_is_a_permutation(replay_setup) -> None:
    """--order lists every request exactly once: a repeat is refused even when every index is there."""
    t = trace_of([steps([7]), steps([8])])
    assert replay_setup(t, {"order": [1, 0]}).order == [1, 0]
    for bad in ([0, 1, 0], [1, 1, 0], [0], [0, 2], [0, 0]):
        with pytest.raises(TraceError, match="--order must list every request index 0..1 once"):
            replay_setup(t, {"order": bad})


def test_order_is_a_permutation():
    pin_order_is_a_permutation(rp.replay_setup)


def test_order_is_a_permutation_planted(tmp_path):
    planted = module_with(rp, {"sorted(order) != list(range(len(trace.requests)))":
                               "set(order) != set(range(len(trace.requests)))"}, tmp_path)
    red(pin_order_is_a_permutation, planted.replay_setup)
