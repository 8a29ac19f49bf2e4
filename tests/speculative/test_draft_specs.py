"""specs/draft/ (kind `draft`): the EAGLE3 draft head's own computation (DESIGN §4). Each bug below
is put back by monkeypatching and the specs named beside it must turn red, the others stay green."""

import pytest
import torch

import lockstep.engine.spec_draft
from lockstep.engine.eagle3 import Eagle3Draft
from lockstep.kernels.rmsnorm import rms_norm_portable as rms_norm
from tests.planted import Planted

# one xdist worker runs the module (pyproject --dist loadgroup): its clean recordings (tests/planted.py) once a run
pytestmark = pytest.mark.xdist_group("draft-specs")
NORMS = ["draft/plain", "draft/norm-before-fc", "draft/fc-norm", "draft/both", "draft/plain-no-d2t",
         "draft/both-no-d2t", "draft/written-aux"]
ALL = NORMS + ["draft/top-k-ties", "draft/shipped-fitted"]


@pytest.fixture(scope="module")
def planted(tmp_path_factory):
    return Planted(tmp_path_factory.mktemp("draft"), ALL)


def test_the_specs_pass_clean(planted):
    for spec_id in ALL:
        planted.green(spec_id)


def fc_norm_before_input_norm(self, aux):
    """Eagle3Draft.fc_input with the two norms in the wrong order (DESIGN §4: input_norm first)."""
    x = aux.to(torch.float32)
    eps = self.config.rms_norm_eps
    if self.fc_norm is not None:
        x = torch.cat([rms_norm(c, w, eps) for c, w in zip(x.chunk(self.n_aux, dim=-1), self.fc_norm)], dim=-1)
    if self.input_norm is not None:
        x = rms_norm(x, self.input_norm, eps)
    return x


def test_fc_norm_before_input_norm_turns_the_both_specs_red(planted, monkeypatch):
    """Issue 15's example: every speculative spec passes with this bug; these do not."""
    monkeypatch.setattr(Eagle3Draft, "fc_input", fc_norm_before_input_norm)
    for spec_id in ("draft/both", "draft/both-no-d2t", "draft/written-aux"):
        report = planted.red(spec_id)
        assert "DESIGN §4 (input_norm over all of A, then fc_norm per chunk) gives" in report, report
        assert "tensor 'fc_input'" in report and "tensor 'logits'" in report
    for spec_id in ("draft/plain", "draft/norm-before-fc", "draft/fc-norm", "draft/plain-no-d2t",
                    "draft/shipped-fitted"):
        planted.green(spec_id)                      # one norm or none: the order cannot matter


def test_a_d2t_map_read_as_the_target_id_turns_the_d2t_specs_red(planted, monkeypatch):
    monkeypatch.setattr(Eagle3Draft, "to_target_ids", lambda self, ids: self.d2t.index_select(0, ids.reshape(-1))
                        .reshape(ids.shape))          # d2t[d] instead of d + d2t[d]
    for spec_id in ("draft/plain", "draft/both", "draft/shipped-fitted", "draft/top-k-ties"):
        report = planted.red(spec_id)
        assert "d + d2t[d] gives" in report and "tensor 'top_target_ids'" in report, report


def higher_index_first(logits, k, backend="torch"):
    """top_k_lowest_index with ties to the higher index: a stable ascending sort, reversed."""
    values, ids = torch.sort(logits, dim=-1, stable=True)
    return values.flip(-1)[..., :k], ids.flip(-1)[..., :k]


def test_the_draft_top_k_with_ties_to_the_higher_id_turns_the_ties_spec_red(planted, monkeypatch):
    monkeypatch.setattr(lockstep.engine.spec_draft, "top_k_lowest_index", higher_index_first)
    report = planted.red("draft/top-k-ties")
    assert "the draft's top-4 is [200, 41, 40, 9], the 4 largest logits with equal logits by the lower draft id " \
           "are [3, 9, 40, 41]" in report, report
    for spec_id in ("draft/plain", "draft/both"):   # no ties there: the rule is not exercised
        planted.green(spec_id)


def test_the_written_aux_spec_needs_no_target_forward(planted, monkeypatch):
    from lockstep.engine.model import GptOssModel

    def no_forward(*args, **kwargs):
        raise AssertionError("draft/written-aux ran a target forward")

    monkeypatch.setattr(GptOssModel, "forward", no_forward)
    planted.green("draft/written-aux")


def errors_of(text):
    from lockstep.harness.specfile import SpecErrors, parse_spec
    with pytest.raises(SpecErrors) as e:
        parse_spec(text, "specs/draft/bad.yaml", "draft/bad")
    return [str(x) for x in e.value.errors]


def test_spec_errors_are_located():
    head = "kind: draft\ndescription: d\ninputs:\n  target: {preset: tiny}\n"
    assert errors_of(head + "  draft: {seed: 1, convention: sglang, lm_head_ties: {ids: [3, 300]}}\n"
                            "  prompt: [1, 2, 3]\n") == [
        "specs/draft/bad.yaml:5:60: inputs.draft.lm_head_ties.ids: expected distinct draft ids below the draft "
        "vocabulary size 256, found [3, 300]"]
    assert errors_of(head + "  draft: {seed: 1, convention: sglang}\n  aux: [[1, 2, 3]]\n  tokens: [1, 2]\n") == [
        "specs/draft/bad.yaml:7:11: inputs.tokens: expected one token per aux row (1)",
        "specs/draft/bad.yaml:6:9: inputs.aux[0]: expected rows of A = 3 x target hidden = 288 values, found 3"]
    assert errors_of("kind: draft\ndescription: d\ninputs:\n  target: {preset: tiny, router_ties: {experts: [0, 4]}}\n"
                     "  draft: {seed: 1, convention: sglang}\n  prompt: [1, 2]\n") == [
        "specs/draft/bad.yaml:4:49: inputs.target.router_ties.experts: expected distinct expert ids below 4 "
        "(preset tiny), found [0, 4]"]
