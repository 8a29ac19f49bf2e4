"""engine.graphs.DecodeGraph: a replayed CUDA graph gives the eager decode step's bits.

On the CPU the DecodeGraph runs the eager forward (checked against a plain forward); on a GPU
the step is captured once and replayed for several steps, each compared bitwise with an eager
model on its own cache."""

from __future__ import annotations

import pytest
import torch

from engine.checkpoint import load_checkpoint
from engine.graphs import DecodeGraph
from engine.model import GptOssModel
from tests.engine.helpers import random_prompt
from tests.kernels.conftest import DEVICE


def _prefilled(model, prompts):
    cache = model.new_cache(len(prompts), 64)
    for s, p in enumerate(prompts):
        model.forward(torch.tensor(p), torch.arange(len(p)), torch.full((len(p),), s), cache)
    return cache


@pytest.mark.parametrize("backend", ["torch", pytest.param("triton", marks=pytest.mark.skipif(
    DEVICE.type != "cuda", reason="on the CPU a DecodeGraph is the eager forward: the torch case covers it"))])
@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
def test_decode_graph_equals_eager_steps(tiny_ckpts, backend, dtype):
    config, weights = load_checkpoint(tiny_ckpts["mxfp4"], packed_mxfp4=True)
    model = GptOssModel(config, weights, backend=backend, device=DEVICE, dtype=dtype)
    prompts = [random_prompt(5, 1), random_prompt(9, 2), random_prompt(2, 3)]
    eager_cache, graph_cache = _prefilled(model, prompts), _prefilled(model, prompts)
    step = DecodeGraph(model, graph_cache, batch_size=3)
    tokens = torch.tensor([7, 8, 9])
    positions = torch.tensor([len(p) for p in prompts])
    slots = torch.arange(3)
    for _ in range(3):
        eager = model.forward(tokens, positions, slots, eager_cache).logits
        replayed = step(tokens.to(DEVICE), positions.to(DEVICE), slots.to(DEVICE)).clone()
        assert torch.equal(replayed, eager)
        tokens = eager.argmax(-1).cpu()
        positions = positions + 1
    if DEVICE.type == "cuda":
        assert step.graph is not None                   # captured once, replayed since


def test_decode_graph_checks_its_inputs(tiny_model):
    step = DecodeGraph(tiny_model, tiny_model.new_cache(2, 8), batch_size=2)
    with pytest.raises(ValueError, match=r"int64 \[2\]"):
        step(torch.tensor([1]), torch.tensor([0]), torch.tensor([0]))
    with pytest.raises(ValueError, match="batch_size"):
        DecodeGraph(tiny_model, tiny_model.new_cache(2, 8), batch_size=0)
