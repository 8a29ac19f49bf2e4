"""Target `hf`: HF transformers' GptOssForCausalLM (the `test` extra), on Lockstep's synthetic checkpoints.

| operation | transformers code | compared |
| --- | --- | --- |
| capture | `GptOssForCausalLM(..., output_hidden_states=True)`: entry b < L is boundary b; boundary L (HF's last entry is after the final norm) is the last decoder layer's output, taken by a forward hook | within CROSS_ATOL/RTOL of the golden |
| greedy_generate | `GptOssForCausalLM.generate(do_sample=False)`; logprobs = log_softmax of the returned scores at the chosen token | tokens exactly, logprobs within the bound |

fp32, eager attention, on the CPU. HF has no EAGLE3 loader, coins, verify or kernels: those specs are n/a.
"""

from __future__ import annotations

import functools
import json
from pathlib import Path

import torch

from lockstep.harness.target import CPU, CUDA, NotApplicable, Op, Target
from lockstep.harness.targets import peer


def load_model(path: str, dtype: torch.dtype = torch.float32):
    """GptOssForCausalLM from a checkpoint folder, eager attention, MXFP4 experts dequantized by
    transformers itself: with Hugging Face's `kernels` package installed, transformers would
    otherwise fetch Triton kernels from the Hub at load time (nothing here may reach a network)."""

    from transformers import GptOssForCausalLM, Mxfp4Config
    from transformers.utils import logging as hf_logging
    hf_logging.disable_progress_bar()        # its "Loading weights" bars would fill every check's log
    config = json.loads((Path(path) / "config.json").read_text())
    mxfp4 = (config.get("quantization_config") or {}).get("quant_method") == "mxfp4"
    extra = {"quantization_config": Mxfp4Config(dequantize=True)} if mxfp4 else {}
    return GptOssForCausalLM.from_pretrained(path, dtype=dtype, attn_implementation="eager", **extra).eval()


DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}


@functools.lru_cache(maxsize=4)
def _model(path: str, dtype: str = "fp32"):
    return load_model(path, DTYPES[dtype])


def capture(checkpoint, prompt, boundaries, dtype="fp32"):
    model = _model(str(checkpoint), dtype)
    L = model.config.num_hidden_layers
    last = {}
    hook = model.model.layers[L - 1].register_forward_hook(
        lambda mod, args, out: last.__setitem__("x", out[0] if isinstance(out, tuple) else out))
    try:
        with torch.no_grad():
            out = model(torch.tensor([prompt]), output_hidden_states=True)
    finally:
        hook.remove()
    states = [out.hidden_states[b][0] if b < L else last["x"].reshape(len(prompt), -1) for b in boundaries]
    return torch.cat(states, dim=-1).to(torch.float32)


def greedy_generate(checkpoint, prompt, max_new_tokens, stop_ids, dtype="fp32"):
    model = _model(str(checkpoint), dtype)
    eos = list(stop_ids) if stop_ids is not None else list(model.generation_config.eos_token_id or [])
    with torch.no_grad():
        out = model.generate(torch.tensor([prompt]), do_sample=False, max_new_tokens=max_new_tokens,
                             eos_token_id=eos, pad_token_id=eos[0] if eos else 0, output_scores=True,
                             return_dict_in_generate=True)
    tokens = out.sequences[0, len(prompt):].tolist()
    logprobs = torch.stack([torch.log_softmax(s[0].to(torch.float32), -1)[t] for s, t in zip(out.scores, tokens)])
    reason = "stop" if tokens and tokens[-1] in eos else "length"
    return tokens, logprobs, reason


def load(dtype: str = "fp32") -> Target:
    version = peer.installed_version("transformers")
    if version is None:
        raise NotApplicable("transformers is not installed (pip install -e '.[test]')")
    at = functools.partial
    return Target(
        name="hf", version=version, dtype=dtype, dtypes=tuple(DTYPES), at_dtype=lambda d: load(d),
        description=f"HF transformers GptOssForCausalLM ({dtype}, eager): whole-model capture and greedy generation",
        ops={"capture": Op(at(capture, dtype=dtype), (CPU, CUDA), "output_hidden_states (+ a hook for boundary L)"),
             "greedy_generate": Op(at(greedy_generate, dtype=dtype), (CPU, CUDA),
                                   "GptOssForCausalLM.generate(do_sample=False)")},
        missing={op: "HF transformers has no such operation (no seeded coins, EAGLE3 verify or Triton kernels)"
                 for op in ("eagle3_layers", "hash", "verify_coins", "gumbel", "verify_greedy", "verify_target_only",
                            "verify_rejection", "attention", "rmsnorm")} | {
            "sampling": "HF's generate samples with torch.multinomial from torch's RNG (top-k / top-p / min-p as "
                        "logits warpers), not under the coin contract: no seeded draw to judge bitwise",
            "generate": "HF's generate samples from torch's RNG, not under the coin contract; only greedy_generate "
                        "(greedy, one request at a time, no capture or chunked prefill) is driven",
            "speculative_generate": "HF transformers has no EAGLE3 speculative decoding",
            "draft_stages": "HF transformers has no EAGLE3 draft head",
            "prefix_cache": "HF transformers has no prefix cache: generate() reuses only a past_key_values the "
                            "caller passes in, with no lookup or hit counter"})

