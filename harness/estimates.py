"""What a `generate`, `record` or `make-checkpoint` command line will cost, known before it starts.

`checkpoint_size`, `generate_time` and `record_cost` are the CLI's checks: they say it up front and
refuse above a bound (harness/limits.py) unless a flag raises it. A 5 000-token prompt used to run for many
minutes printing nothing, and `make-checkpoint --preset gpt-oss-120b` wrote gigabytes with no end
in sight.

The checkpoint size is exact (the tensors' shapes are known from the preset). The generation time
is a rough model of the CPU engine on the torch backend, fitted to the tiny preset on the 2-core
CI machine (generate of prompt P and N new tokens, for P in 16 … 512 and N in 16 … 64; within
~20 %): the prefill walks every key of every query (quadratic in P), each decode step pays a fixed
cost per block plus one per key of its context, and every token passes the dense weights. It is a
guard against runs of hours, not a performance figure; the Triton interpreter is far slower still.
"""

from __future__ import annotations

import math
import os
import sys

from lockstep.engine.checkpoint import expected_tensors
from lockstep.engine.config import preset
from lockstep.harness.errors import UsageError
from lockstep.kernels.attention import KV_TILE

# Seconds, for one block-head unit (the tiny preset's 4 blocks x 4 query heads = 16 units).
PREFILL_PER_KEY = 4.5e-5         # per (query, key) pair of the prefill
DECODE_PER_BLOCK = 8.75e-3       # per decode step and block: the fixed cost of one token's ops
DECODE_PER_KEY = 5.7e-4          # per decode step and key of its context
DENSE_MACS_PER_SECOND = 1e9      # the dense weights, per token (what dominates the real-size presets)


def checkpoint_bytes(config, mxfp4: bool) -> tuple[int, int]:
    """(parameter bytes, tensor count) that make-checkpoint writes for this config: bf16 floats,
    uint8 MXFP4 blocks and scales."""

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
    return requests_seconds(config, [(p, max_new_tokens) for p in prompt_lengths])


def requests_seconds(config, lengths: list[tuple[int, int]]) -> float:
    """generate_seconds for requests of their own lengths: [(prompt tokens, new tokens)]."""
    units = config.num_hidden_layers * config.num_attention_heads / 16
    total = 0.0
    for p, n in lengths:
        total += PREFILL_PER_KEY * units * p * p
        total += n * DECODE_PER_BLOCK * config.num_hidden_layers + DECODE_PER_KEY * units * (n * p + n * n / 2)
        total += (p + n) * active_params(config) / DENSE_MACS_PER_SECOND
    return total


def kv_cache_bytes(config, requests: int, longest: int, dtype: str) -> int:
    """Bytes of the KV cache a run of `requests` allocates (engine/kv_cache.py: one slot per request
    plus a padding slot, each as long as the longest request rounded up to a KV tile; K and V)."""

    capacity = -(-longest // KV_TILE) * KV_TILE
    per_slot = config.num_hidden_layers * config.num_key_value_heads * capacity * config.head_dim
    return 2 * (requests + 1) * per_slot * (4 if dtype == "fp32" else 2)


# --------------------------------------------------------------------------- what the CLI says and refuses
def checkpoint_size(args) -> tuple[int, int]:
    """Say what make-checkpoint will write, and refuse above --max-gb, or into a path that cannot be
    written, before making anything: (parameter bytes, tensors)."""

    try:
        size, count = checkpoint_bytes(preset(args.preset), args.format == "mxfp4")
    except ValueError as e:
        raise UsageError(str(e)) from None
    if size > args.max_gb * 1e9:
        raise UsageError(f"preset {args.preset!r} ({args.format}) has {size / 1e9:.3g} GB of parameters in {count} "
                         f"tensors, above --max-gb {args.max_gb:g}; pass --max-gb {math.ceil(size / 1e9)} to write "
                         "it (the weights are made in memory first: it needs about as much RAM)")
    existing = next(d for d in [args.out.absolute(), *args.out.absolute().parents] if d.exists())
    if existing != args.out.absolute() and (not existing.is_dir() or not os.access(existing, os.W_OK | os.X_OK)):
        raise UsageError(f"cannot write {args.out}: {existing} is {'not writable' if existing.is_dir() else 'a file'}")
    print(f"make-checkpoint: {count} tensors, {size / 1e6:.4g} MB of parameters, into {args.out}",
          file=sys.stderr, flush=True)
    return size, count


class CheckpointProgress:
    """make-checkpoint's progress on stderr: the tensor being made (a live line on a terminal, a
    line per tenth of the tensors otherwise) and a line per shard written."""

    def __init__(self):
        self.live = sys.stderr.isatty()

    def __call__(self, stage: str, done: int, total: int, name: str) -> None:
        if stage == "tensor" and self.live:
            sys.stderr.write("\r" + f"  making tensor {done}/{total} {name}"[:100].ljust(100))
        elif stage == "tensor" and (done == 1 or done * 10 // total != (done - 1) * 10 // total):
            print(f"  making tensor {done}/{total} {name}", file=sys.stderr)
        elif stage == "shard":
            print(("\r" + " " * 100 + "\r" if self.live else "") + f"  wrote shard {done}/{total} {name}",
                  file=sys.stderr)
        sys.stderr.flush()


def generate_time(args, config, device) -> None:
    """On the CPU, say how long the run will take when it is more than a few seconds, and refuse
    above --max-seconds before it starts (generate_seconds; no estimate on a GPU)."""
    if device.type != "cpu":
        return
    seconds = generate_seconds(config, [len(p) for p in args.prompt_ids], args.max_new_tokens)
    longest = max(len(p) for p in args.prompt_ids)
    what = (f"{len(args.prompt_ids)} request(s), prompts of up to {longest} tokens, {args.max_new_tokens} new "
            f"tokens, {config.num_hidden_layers} blocks")
    if seconds > args.max_seconds:
        raise UsageError(f"generate would take about {seconds:.0f} s on the CPU ({what}; a rough estimate), above "
                         f"--max-seconds {args.max_seconds:g}; pass --max-seconds {math.ceil(seconds * 1.5)} to run "
                         "it, or shorten the prompt or --max-new-tokens")
    if seconds > 10:
        print(f"generate: about {seconds:.0f} s on the CPU ({what}; a rough estimate)", file=sys.stderr, flush=True)


def record_cost(config, lengths: list[tuple[int, int]], dtype: str, max_seconds: float, max_gb: float,
                verb: str = "record", runs: int = 2, device: str = "cpu") -> None:
    """`record`'s (and `import-peer`'s) up-front check: the KV cache it allocates (refused above
    --max-gb) and, on the CPU, its time (`runs` runs: record's recording and its teacher-forced
    check, import-peer's one teacher-forced run; refused above --max-seconds; no estimate on a GPU).
    10^6 requests used to run for minutes before a 32 GB allocation failed as an internal error."""
    longest = max(p + n for p, n in lengths)
    size = kv_cache_bytes(config, len(lengths), longest, dtype)
    what = f"{len(lengths)} request(s) of up to {longest} tokens, {config.num_hidden_layers} blocks"
    if size > max_gb * 1e9:
        raise UsageError(f"{verb} would allocate a {size / 1e9:.3g} GB KV cache ({what}), above --max-gb "
                         f"{max_gb:g}; pass --max-gb {math.ceil(size / 1e9)} to run it, or use fewer or "
                         "shorter requests")
    if device != "cpu":
        return
    seconds = runs * requests_seconds(config, lengths)
    if seconds > max_seconds:
        raise UsageError(f"{verb} would take about {seconds:.0f} s on the CPU ({what}; a rough estimate), above "
                         f"--max-seconds {max_seconds:g}; pass --max-seconds {math.ceil(seconds * 1.5)} to run it, "
                         "or use fewer or shorter requests (or --device cuda on a GPU machine)")
    if seconds > 10:
        print(f"{verb}: about {seconds:.0f} s on the CPU ({what}; a rough estimate)", file=sys.stderr, flush=True)