"""Bad draft/target pairs (issue 5, "Bad input"): a draft and a target that disagree on vocabulary,
depth or aux count are refused with an error naming the field. (Hidden size, out-of-range topk and
draft_token_num, and a tree deeper than the context: tests/speculative/test_spec_generate.py.)"""

import pytest

from lockstep.engine.boundaries import LayerIdError
from lockstep.engine.checkpoint import make_checkpoint
from lockstep.engine.eagle3 import load_draft, make_draft_checkpoint
from lockstep.engine.generate import Request
from lockstep.engine.model import GptOssModel
from lockstep.engine.sampling import SamplingParams
from lockstep.engine.speculative import speculative_generate

REQ = [Request([1, 2, 3], SamplingParams(greedy=True, max_new_tokens=2))]


@pytest.fixture(scope="module")
def d24_draft(tmp_path_factory, deep_targets):
    """A draft bound to tiny-d24: hidden 32, vocabulary 256, 24 blocks."""
    path = make_draft_checkpoint("tiny-d24", 0, tmp_path_factory.mktemp("d24") / "draft")
    return load_draft(path, deep_targets["tiny-d24"], convention="sglang")


def test_vocabulary_mismatch(tmp_path, d24_draft):
    vocab8 = GptOssModel.from_checkpoint(make_checkpoint("tiny-vocab8", 0, "bf16", tmp_path / "t"))  # hidden 32 too
    with pytest.raises(ValueError, match=r"draft vocab_size=256 does not match the target's vocab_size=8"):
        speculative_generate(vocab8, d24_draft, REQ)


def test_depth_mismatch(deep_targets, d24_draft):
    with pytest.raises(ValueError, match=r"draft was bound to a target with num_hidden_layers=24, "
                                         r"this target has 36"):
        speculative_generate(deep_targets["tiny-d36"], d24_draft, REQ)


def test_aux_count_mismatch(tmp_path, fitted):
    """Two aux layer ids for a draft whose fc reads three target states: refused at load time."""
    target, _ = fitted
    path = make_draft_checkpoint("tiny", 0, tmp_path / "draft", aux_layer_ids=[1, 2], n_aux=3)
    with pytest.raises(LayerIdError, match=r"eagle_aux_hidden_state_layer_ids=\[1, 2\] .* the draft expects 3 aux "
                                           r"states \(fc input width / target hidden size\), got 2"):
        load_draft(path, target, convention="sglang")
