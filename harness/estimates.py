"""What a `generate` or `make-checkpoint` command line will cost, known before it starts.

The CLI says it up front and refuses above a bound (harness/limits.py) unless a flag raises it:
a 5 000-token prompt used to run for many minutes printing nothing, and `make-checkpoint --preset
gpt-oss-120b` wrote gigabytes with no end in sight.

The checkpoint size is exact (the tensors' shapes are known from the preset). The generation time
is a rough model of the CPU engine on the torch backend, fitted to the tiny preset on the 2-core
CI machine (generate of prompt P and N new tokens, for P in 16 … 512 and N in 16 … 64; within
~20 %): the prefill walks every key of every query (quadratic in P), each decode step pays a fixed
cost per block plus one per key of its context, and every token passes the dense weights. It is a
guard against runs of hours, not a performance figure; the Triton interpreter is far slower still.
"""

from __future__ import annotations

import math

# Seconds, for one block-head unit (the tiny preset's 4 blocks x 4 query heads = 16 units).
PREFILL_PER_KEY = 4.5e-5         # per (query, key) pair of the prefill
DECODE_PER_BLOCK = 8.75e-3       # per decode step and block: the fixed cost of one token's ops
DECODE_PER_KEY = 5.7e-4          # per decode step and key of its context
DENSE_MACS_PER_SECOND = 1e9      # the dense weights, per token (what dominates the real-size presets)


def checkpoint_bytes(config, mxfp4: bool) -> tuple[int, int]:
    """(parameter bytes, tensor count) that make-checkpoint writes for this config: bf16 floats,
    uint8 MXFP4 blocks and scales."""
    from engine.checkpoint import expected_tensors

    layout = expected_tensors(config, mxfp4_experts=mxfp4)
    return sum(math.prod(shape) * (2 if kind == "float" else 1) for shape, kind in layout.values()), len(layout)


def active_params(config) -> int:
    """Weights one token multiplies by: attention projections, router, its top-k experts, lm_head."""
    H, I, L = config.hidden_size, config.intermediate_size, config.num_hidden_layers
    q, kv = config.num_attention_heads * config.head_dim, config.num_key_value_heads * config.head_dim
    per_block = 2 * H * q + 2 * H * kv + config.num_local_experts * H + config.num_experts_per_tok * 3 * H * I
    return L * per_block + config.vocab_size * H


def generate_seconds(config, prompt_lengths: list[int], max_new_tokens: int) -> float:
    """Rough seconds the CPU engine takes for these requests (each run as if alone: an upper bound
    for a batch, whose decode steps share the fixed cost)."""
    units = config.num_hidden_layers * config.num_attention_heads / 16
    total = 0.0
    for p in prompt_lengths:
        n = max_new_tokens
        total += PREFILL_PER_KEY * units * p * p
        total += n * DECODE_PER_BLOCK * config.num_hidden_layers + DECODE_PER_KEY * units * (n * p + n * n / 2)
        total += (p + n) * active_params(config) / DENSE_MACS_PER_SECOND
    return total
