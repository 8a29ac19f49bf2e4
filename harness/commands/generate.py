"""`lockstep generate`: generation from a checkpoint with the reference engine, its CPU time
estimated (and bounded by --max-seconds) before it runs."""

from __future__ import annotations

import hashlib
import json
import math
import sys
from pathlib import Path

import numpy
import torch

from lockstep.engine.checkpoint import CheckpointError, checkpoint_digest
from lockstep.engine.generate import generate
from lockstep.engine.model import GptOssModel
from lockstep.engine.request import Request
from lockstep.engine.sampling import SamplingParams
from lockstep.harness.commands.exits import EXIT_OK
from lockstep.harness.commands.options import per_prompt_seeds
from lockstep.harness.errors import UsageError
from lockstep.harness.estimates import generate_time
from lockstep.harness.jsonout import emit, generate_document
from lockstep.harness.platform import detect


def _generate_settings(args) -> tuple[list, dict]:
    """Per-prompt seeds and the sampling settings, refusing silent fallbacks: a sampling setting
    without --seed (generation would be greedy)."""
    sampling = {"temperature": args.temperature, "top_k": args.top_k, "top_p": args.top_p, "min_p": args.min_p}
    given = [f"--{k.replace('_', '-')}" for k, v in sampling.items() if v is not None]
    if args.seed is None and given:
        raise UsageError(f"{', '.join(given)} without --seed: generation without a seed is greedy; pass --seed S "
                         "(one, or one per --prompt-ids) to sample")
    defaults = {"temperature": 1.0, "top_k": 0, "top_p": 1.0, "min_p": 0.0}
    return per_prompt_seeds(args.seed, len(args.prompt_ids)), {k: defaults[k] if v is None else v
                                                               for k, v in sampling.items()}


def cmd_generate(args) -> int:
    seeds, sampling = _generate_settings(args)
    try:
        platform = detect(args.device)                                # refuses cuda without a GPU
        model = GptOssModel.from_checkpoint(args.checkpoint, backend=args.backend, device=platform.torch_device)
        generate_time(args, model.config, platform.torch_device)   # refused above --max-seconds before it runs
        requests = [Request(prompt=ids, seed=seed, params=SamplingParams(
            **sampling, max_new_tokens=args.max_new_tokens, greedy=seed is None,
            stop_token_ids=tuple(args.stop_ids) if args.stop_ids is not None else None))
            for ids, seed in zip(args.prompt_ids, seeds)]
        results = generate(model, requests)
    except (CheckpointError, ValueError, OSError) as e:
        raise UsageError(str(e)) from None
    out = []
    for req, res in zip(requests, results):
        p = req.params
        item = {"prompt": req.prompt, "seed": req.seed,
                "sampling": {"greedy": p.greedy, "temperature": p.temperature, "top_k": p.top_k, "top_p": p.top_p,
                             "min_p": p.min_p, "max_new_tokens": p.max_new_tokens,
                             "stop_token_ids": list(p.stop_token_ids) if p.stop_token_ids is not None else None},
                "tokens": res.tokens, "finish_reason": res.finish_reason}
        if args.logprobs:
            item["logprobs"] = _finite_or_null(res.logprobs.tolist(), len(out), args.json)
            item["logprobs_bits"] = [f"{b & 0xFFFFFFFF:08x}" for b in res.logprobs.contiguous().view(torch.int32).tolist()]
        out.append(item)
    if args.json:
        emit(json.dumps(generate_document(checkpoint=str(args.checkpoint), checkpoint_digest=_digest(args.checkpoint),
                                           platform=platform.name, backend=args.backend, results=out), indent=2))
    else:
        for item in out:
            print(" ".join(map(str, item["tokens"])) + f"   ({item['finish_reason']})")
            if args.logprobs:                  # one line a token: its id, logprob and float32 bits
                for k, (tok, lp, bits) in enumerate(zip(item["tokens"], item["logprobs"], item["logprobs_bits"])):
                    print(f"  step {k}: token {tok}  logprob {numpy.float32(lp)} (0x{bits})")
    return EXIT_OK


def _finite_or_null(values: list[float], request: int, json_out: bool) -> list:
    """--json: a non-finite logprob is null (JSON has no NaN; logprobs_bits keeps its bits), and
    each is named on stderr by request and step."""
    if not json_out:
        return values
    for step, v in enumerate(values):
        if not math.isfinite(v):
            print(f"warning: request {request}, step {step}: logprob is {v}; null in --json "
                  f"(logprobs_bits keeps its bits)", file=sys.stderr)
    return [v if math.isfinite(v) else None for v in values]


def _digest(checkpoint: Path) -> str:
    """One sha256 over the checkpoint folder's files (name and sha256 of each, sorted by name)."""
    lines = "".join(f"{name} {sha}\n" for name, sha in checkpoint_digest(checkpoint).items())
    return "sha256:" + hashlib.sha256(lines.encode()).hexdigest()
