"""Agreement with HF transformers' GptOssForCausalLM on the same synthetic checkpoints.

HF (CPU, fp32, eager attention) loads the checkpoint directory with from_pretrained, so this
also checks that make_checkpoint writes a layout HF reads (config.json, index, shards, and
MXFP4 blocks/scales, which HF dequantizes on CPU).

Tolerance: |ours - HF| <= 1e-4 + 1e-4 * |HF|. Both run in fp32 from the same bf16/MXFP4
values but sum in different orders: MKL GEMMs over all rows vs our one-row GEMVs, HF's
one-shot softmax vs our tiled online softmax, HF adding experts in expert order vs ours in
slot order. Each is a ~1e-7 relative rounding difference that grows over a few layers to
~1e-6..1e-5 (measured max ~5e-6 on logits of size ~5). A real convention error (window off
by one, sink scaled, RoPE interleaved instead of half-split, router softmax over all experts,
clamp or interleave wrong) moves values by 1e-2 or more.
"""

import pytest
import torch

transformers = pytest.importorskip("transformers")

from lockstep.engine.checkpoint import make_checkpoint  # noqa: E402
from lockstep.engine.generate import Request, generate  # noqa: E402
from lockstep.engine.model import GptOssModel  # noqa: E402
from lockstep.kernels.rmsnorm import rms_norm_portable as rms_norm  # noqa: E402
from lockstep.engine.sampling import SamplingParams  # noqa: E402

from tests.engine.helpers import prefill, random_prompt  # noqa: E402

ATOL = RTOL = 1e-4


def load_hf(path):
    from lockstep.harness.targets.hf import load_model
    return load_model(str(path))


def check_against_hf(ours: GptOssModel, hf, prompt):
    cfg = ours.config
    L, H = cfg.num_hidden_layers, cfg.hidden_size
    with torch.no_grad():
        ref = hf(torch.tensor([prompt]), output_hidden_states=True)
    out = prefill(ours, prompt, capture=list(range(L + 1)))
    assert len(ref.hidden_states) == L + 1
    for b in range(L + 1):
        state = out.captured[:, b * H:(b + 1) * H]
        if b == L:                                   # HF's last entry is after the final norm
            state = rms_norm(state, ours.norm, cfg.rms_norm_eps)
        torch.testing.assert_close(state, ref.hidden_states[b][0], atol=ATOL, rtol=RTOL,
                                   msg=lambda m: f"boundary {b}: {m}")
    torch.testing.assert_close(out.logits, ref.logits[0], atol=ATOL, rtol=RTOL)
    assert out.captured[:, :H].equal(ref.hidden_states[0][0])          # embedding: exact
    return (out.logits - ref.logits[0]).abs().max().item()


def check_greedy(ours: GptOssModel, hf, prompt, n):
    res = generate(ours, [Request(prompt, SamplingParams(greedy=True, max_new_tokens=n))])[0]
    with torch.no_grad():
        seq = hf.generate(torch.tensor([prompt]), do_sample=False, max_new_tokens=n,
                          eos_token_id=list(ours.config.eos_token_id), pad_token_id=ours.config.pad_token_id)
    assert res.tokens == seq[0, len(prompt):].tolist()
    return res


def test_tiny_bf16_and_mxfp4_agree_with_hf(tiny_model, tiny_ckpts):
    hf = load_hf(tiny_ckpts["bf16"])
    prompt = random_prompt(40, 31)                   # 5 sliding windows, past one KV tile
    check_against_hf(tiny_model, hf, prompt)
    res = check_greedy(tiny_model, hf, prompt, 24)
    assert len(res.tokens) >= 8
    # RoPE frequencies and scaling: the same numbers as HF's YaRN implementation
    rot = hf.model.rotary_emb
    torch.testing.assert_close(tiny_model.inv_freq, rot.inv_freq, atol=0, rtol=1e-6)
    assert tiny_model.mscale == pytest.approx(rot.attention_scaling, rel=1e-12)

    pytest.importorskip("accelerate", reason="HF needs accelerate to load MXFP4 checkpoints")
    hf_mx = load_hf(tiny_ckpts["mxfp4"])             # HF dequantizes MXFP4 on CPU
    for (name, p), (name2, p2) in zip(hf.named_parameters(), hf_mx.named_parameters()):
        assert name == name2 and p.equal(p2.to(p.dtype)), name
    ours_mx = GptOssModel.from_checkpoint(tiny_ckpts["mxfp4"])
    check_against_hf(ours_mx, hf_mx, prompt)


def test_small_preset_agrees_with_hf(tmp_path):
    path = make_checkpoint("small", 2, "bf16", tmp_path / "small")
    ours, hf = GptOssModel.from_checkpoint(path), load_hf(path)
    prompt = random_prompt(45, 32, vocab=1000)       # window 16: ~3 windows
    check_against_hf(ours, hf, prompt)
    check_greedy(ours, hf, prompt, 12)
