"""DESIGN §3 rows driving a real draft on targets with the real depths (tiny-d36, tiny-d24)."""

import pytest
import torch

from lockstep.engine.boundaries import LayerIdError
from lockstep.engine.eagle3 import Eagle3Draft, load_draft, make_draft_checkpoint
from lockstep.engine.generate import Request, generate
from lockstep.kernels.matmul import linear_portable as linear
from lockstep.kernels.rmsnorm import rms_norm_portable as rms_norm
from lockstep.engine.sampling import SamplingParams
from lockstep.engine.speculative import SpecParams, speculative_generate

ROWS = [  # (target, ids, convention, boundaries, norm_before_fc)
    ("tiny-d36", [24, 30, 36], "sglang", [24, 30, 36], True),       # nvidia Eagle3-v3
    ("tiny-d36", [1, 17, 32], "sglang", [2, 18, 33], False),        # nvidia long-context
    ("tiny-d36", [1, 17, 32], "boundary", [1, 17, 32], False),
    ("tiny-d36", None, "output-index", [2, 18, 33], False),
    ("tiny-d24", None, "sglang", [2, 12, 21], False),
]
PROMPT = [7, 100, 31, 250]


@pytest.mark.parametrize("name, ids, convention, expect, nbf", ROWS)
def test_row_drives_a_real_draft(deep_targets, tmp_path, monkeypatch, name, ids, convention, expect, nbf):
    target = deep_targets[name]
    L, H = target.config.num_hidden_layers, target.config.hidden_size
    path = make_draft_checkpoint(name, 1, tmp_path / "draft", aux_layer_ids=ids, norm_before_fc=nbf)
    draft = load_draft(path, target, convention=convention)
    assert draft.boundaries == expect and draft.fc.shape[1] == 3 * H

    seen = []
    real = Eagle3Draft.combine_aux
    monkeypatch.setattr(Eagle3Draft, "combine_aux", lambda self, aux: seen.append(aux) or real(self, aux))
    req = [Request(PROMPT, SamplingParams(greedy=True, max_new_tokens=2))]
    res = speculative_generate(target, draft, req, SpecParams(num_steps=1, topk=2, draft_token_num=3))[0]
    assert res.tokens == generate(target, req)[0].tokens

    # what the draft saw for the prompt = the target's boundary states, in config order
    aux = seen[0]
    assert aux.shape == (len(PROMPT), 3 * H)
    cache = target.new_cache(1, len(PROMPT))
    out = target.forward(torch.tensor(PROMPT), torch.arange(len(PROMPT)), torch.zeros(len(PROMPT), dtype=torch.int64),
                         cache, capture=expect)
    assert aux.equal(out.captured)
    chunks = aux.split(H, dim=-1)
    for b, chunk in zip(expect, chunks):
        if b == L:   # boundary L is the last block's output before the final norm
            assert linear(rms_norm(chunk, target.norm, target.config.rms_norm_eps), target.lm_head).equal(out.logits)
        if b == 0:
            assert chunk.equal(target.embed[torch.tensor(PROMPT)])
    # the chunks are distinct boundaries (a shifted capture would repeat or miss one)
    assert len({c.numpy().tobytes() for c in chunks}) == 3


def test_v3_ids_under_output_index_fail_at_load(deep_targets, tmp_path):
    path = make_draft_checkpoint("tiny-d36", 1, tmp_path / "v3", aux_layer_ids=[24, 30, 36], norm_before_fc=True)
    with pytest.raises(LayerIdError) as err:
        load_draft(path, deep_targets["tiny-d36"], convention="output-index")
    for part in (str(path), "'output-index'", "[24, 30, 36]", "[25, 31, 37]", "L=36", "[37]"):
        assert part in str(err.value)


def test_default_ids_on_a_four_block_target_are_refused(tmp_path, fitted):
    """L = 4 gives the default [2, 2, 1]: a duplicate, refused at load, never a shape crash later."""
    target, _ = fitted
    path = make_draft_checkpoint("tiny", 1, tmp_path / "d", aux_layer_ids=None)
    with pytest.raises(LayerIdError, match=r"\[2\] appear more than once"):
        load_draft(path, target, convention="sglang")
