"""D1 (run to run), D3 (prefill = chunked prefill = decode) and boundary capture, bitwise."""

import pytest
import torch

from lockstep.kernels.matmul import linear_portable as linear
from lockstep.engine.model import GptOssModel, Step
from lockstep.kernels.rmsnorm import rms_norm_portable as rms_norm
from lockstep.engine.rope import rope_cos_sin

from tests.engine.helpers import prefill, random_prompt

T = 50   # > 6 sliding windows of 8, and past the first KV tile


def chunked(model, prompt, chunk, capture=()):
    """Feed `prompt` in chunks of `chunk` tokens (chunk 1 = token-by-token decode)."""
    cache = model.new_cache(1, len(prompt))
    logits, states = [], []
    for start in range(0, len(prompt), chunk):
        piece = prompt[start:start + chunk]
        out = model.forward(torch.tensor(piece), torch.arange(start, start + len(piece)),
                            torch.zeros(len(piece), dtype=torch.int64), cache, capture=capture)
        logits.append(out.logits)
        if capture:
            states.append(out.captured)
    return torch.cat(logits), (torch.cat(states) if capture else None)


def test_d1_run_to_run(tiny_ckpts):
    prompt = random_prompt(T, 1)
    a = prefill(GptOssModel.from_checkpoint(tiny_ckpts["bf16"]), prompt, capture=[0, 2, 4])
    b = prefill(GptOssModel.from_checkpoint(tiny_ckpts["bf16"]), prompt, capture=[0, 2, 4])
    assert a.logits.equal(b.logits) and a.captured.equal(b.captured)


def test_mxfp4_and_bf16_checkpoints_give_the_same_bits(tiny_model, tiny_ckpts):
    prompt = random_prompt(20, 2)
    a = prefill(tiny_model, prompt)
    b = prefill(GptOssModel.from_checkpoint(tiny_ckpts["mxfp4"]), prompt)
    assert a.logits.equal(b.logits)


def test_d3_prefill_equals_chunked_prefill_equals_decode(tiny_model):
    prompt = random_prompt(T, 3)
    capture = [4, 0, 2]
    full = prefill(tiny_model, prompt, capture=capture)
    assert torch.isfinite(full.logits).all()
    for chunk in (1, 3, 7):                      # chunk 1 is decode, one token per step
        logits, states = chunked(tiny_model, prompt, chunk, capture)
        assert logits.equal(full.logits), chunk
        assert states.equal(full.captured), chunk


def test_d3_decode_inside_a_mixed_batch(tiny_model):
    """Position t decoded next to another request's prefill chunk gives the same bits."""
    prompt, other = random_prompt(T, 4), random_prompt(T, 5)
    full = prefill(tiny_model, prompt)
    cache = tiny_model.new_cache(3, T)
    for t in range(T):
        lo, hi = min(3 * t, T), min(3 * t + 3, T)                         # other: chunks of 3
        toks = [prompt[t]] + other[lo:hi]
        pos = [t] + list(range(lo, hi))
        slots = [2] + [0] * (hi - lo)
        out = tiny_model.forward(torch.tensor(toks), torch.tensor(pos), torch.tensor(slots), cache)
        assert out.logits[0].equal(full.logits[t]), t


def test_cache_capacity_does_not_change_bits(tiny_model):
    prompt = random_prompt(40, 6)
    assert prefill(tiny_model, prompt, capacity=40).logits.equal(prefill(tiny_model, prompt, capacity=300).logits)


def test_capture_matches_blocks_run_by_hand(tiny_model):
    """Boundary 0 = embedding; boundary i + 1 = output of block i (pre final norm), incl. L."""
    m, cfg = tiny_model, tiny_model.config
    L = cfg.num_hidden_layers
    prompt = random_prompt(30, 7)
    tokens, pos, slots = torch.tensor(prompt), torch.arange(30), torch.zeros(30, dtype=torch.int64)
    order = [L, 0, 3, 1, 2]                                           # any order, boundary L included
    out = m.forward(tokens, pos, slots, m.new_cache(1, 30), capture=order)
    assert out.captured.shape == (30, len(order) * cfg.hidden_size)
    assert out.logits.equal(prefill(m, prompt).logits)                # capture changes nothing

    step = Step(pos, slots, m.new_cache(1, 30), *rope_cos_sin(pos, m.inv_freq, m.mscale))
    x = m.embed[tokens]
    by_hand = [x]
    with torch.inference_mode():
        for blk in m.blocks:                                          # each sublayer: x + f(rms_norm(x))
            x = x + blk.attn.attend(rms_norm(x, blk.attn.norm, cfg.rms_norm_eps), step)
            x = x + blk.mlp.moe(rms_norm(x, blk.mlp.norm, cfg.rms_norm_eps))
            by_hand.append(x)
    H = cfg.hidden_size
    for j, b in enumerate(order):
        assert out.captured[:, j * H:(j + 1) * H].equal(by_hand[b]), b
    final = rms_norm(by_hand[L], m.norm, cfg.rms_norm_eps)
    assert out.logits.equal(torch.stack([linear(final[i:i + 1], m.lm_head)[0] for i in range(30)]))


def test_capture_rejects_out_of_range(tiny_model):
    with pytest.raises(ValueError, match="outside"):
        tiny_model.forward(torch.tensor([1]), torch.tensor([0]), torch.tensor([0]),
                           tiny_model.new_cache(1, 1), capture=[5])


def test_decode_step_reads_no_tensor_value_on_the_host(tiny_model, monkeypatch):
    """A decode step must be graph-capturable later: no .item(), .tolist(), bool() or int() of
    a tensor inside forward (a host sync on a GPU). Not caught here: indexing with a 0-dim tensor
    (C++ reads it); model.py uses index_select for every tensor-valued index instead."""
    cache = tiny_model.new_cache(4, 64)
    prompt = random_prompt(20, 8)
    tiny_model.forward(torch.tensor(prompt), torch.arange(20), torch.zeros(20, dtype=torch.int64), cache)

    def forbidden(*args, **kwargs):
        raise AssertionError("host read of a tensor value inside forward")
    for name in ("item", "tolist", "__bool__", "__int__", "__index__", "__float__", "nonzero"):
        monkeypatch.setattr(torch.Tensor, name, forbidden)
    monkeypatch.setattr(torch, "nonzero", forbidden)
    out = tiny_model.forward(torch.tensor([5, 7, 0, 0]), torch.tensor([20, 0, 0, 0]),
                             torch.tensor([0, 1, 3, 3]), cache, capture=[0, 4])
    monkeypatch.undo()
    assert out.logits.shape == (4, 512) and torch.isfinite(out.logits).all()


@pytest.mark.parametrize("backend", ["torch", "triton"])
def test_a_model_is_freed_with_its_last_reference(tiny_ckpts, backend):
    """No reference cycle keeps a model (and its weights) alive until the garbage collector or the
    interpreter's exit: a rank's model freed after its process group makes torchrun's ranks abort."""
    import gc
    import weakref
    gc.disable()
    try:
        model = GptOssModel.from_checkpoint(tiny_ckpts["bf16"], backend=backend)
        prefill(model, random_prompt(3, seed=1))
        alive = weakref.ref(model)
        del model
        assert alive() is None
    finally:
        gc.enable()
