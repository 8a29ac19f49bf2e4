"""lockstep.engine.graphs: a replayed CUDA graph (DecodeGraph, forward_graph, StaticGraph) gives the eager call's bits.

On the CPU the DecodeGraph runs the eager forward (checked against a plain forward); on a GPU
the step is captured once and replayed for several steps, each compared bitwise with an eager
model on its own cache."""

from __future__ import annotations

import pytest
import torch

from lockstep.engine.checkpoint import load_checkpoint
from lockstep.engine.graphs import DecodeGraph, StaticGraph, forward_graph
from lockstep.engine.model import GptOssModel
from tests.engine.helpers import random_prompt
from tests.kernels.conftest import DEVICE


def _prefilled(model, prompts):
    cache = model.new_cache(len(prompts), 64)
    for s, p in enumerate(prompts):
        model.forward(torch.tensor(p), torch.arange(len(p)), torch.full((len(p),), s), cache)
    return cache


@pytest.mark.parametrize("backend", ["torch", pytest.param("triton", marks=(pytest.mark.gpu, pytest.mark.skipif(
    DEVICE.type != "cuda", reason="on the CPU a DecodeGraph is the eager forward: the torch case covers it")))])
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


# ---------------------------------------------------------------------- StaticGraph, forward_graph
def test_static_graph_refuses_a_wrong_input_naming_it():
    step = StaticGraph("verify", lambda t, h: t, [("tokens", (4,), torch.int64), ("hidden", (4, 3), torch.float32)],
                       "cpu")
    with pytest.raises(ValueError, match=r"verify: tokens must be int64 \[4\], got torch.int64 \[5\]"):
        step(torch.zeros(5, dtype=torch.int64), torch.zeros(4, 3))
    with pytest.raises(ValueError, match=r"verify: hidden must be float32 \[4, 3\], got torch.bfloat16 \[4, 3\]"):
        step(torch.zeros(4, dtype=torch.int64), torch.zeros(4, 3, dtype=torch.bfloat16))
    with pytest.raises(ValueError, match=r"verify: 1 inputs, expected 2 \(tokens, hidden\)"):
        step(torch.zeros(4, dtype=torch.int64))
    with pytest.raises(ValueError, match="batch_size >= 1"):
        forward_graph(None, None, 0)


def test_static_graph_reads_its_buffers_not_the_callers_tensors():
    """Each call's content reaches fn through the buffers (on the CPU: fn runs on them eagerly)."""
    seen = []
    step = StaticGraph("f", lambda a: seen.append(a) or a * 2, [("a", (3,), torch.int64)], "cpu")
    for k in range(3):
        x = torch.arange(3) + k
        assert torch.equal(step(x), x * 2)
        assert seen[-1] is step.buffers[0] and seen[-1] is not x


@pytest.mark.parametrize("backend", ["torch", pytest.param("triton", marks=(pytest.mark.gpu, pytest.mark.skipif(
    DEVICE.type != "cuda", reason="on the CPU a StaticGraph is the eager forward: the torch case covers it")))])
@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
def test_forward_graph_with_captured_states_equals_eager_verify_calls(tiny_ckpts, backend, dtype):
    """A verify-shaped call (W consecutive positions per slot, boundary states captured) through
    forward_graph, several times with new tokens and positions: logits, captured states and the
    cache hold the eager call's bits (on a GPU: captured once, then replayed)."""
    config, weights = load_checkpoint(tiny_ckpts["mxfp4"], packed_mxfp4=True)
    model = GptOssModel(config, weights, backend=backend, device=DEVICE, dtype=dtype)
    prompts = [random_prompt(5, 1), random_prompt(9, 2)]
    eager_cache, graph_cache = _prefilled(model, prompts), _prefilled(model, prompts)
    W, capture = 3, (1, 2)
    step = forward_graph(model, graph_cache, len(prompts) * W, capture, name="verify")
    starts = torch.tensor([len(p) for p in prompts])
    g = torch.Generator().manual_seed(0)
    for _ in range(3):
        tokens = torch.randint(0, 500, (len(prompts) * W,), generator=g)
        positions = (starts[:, None] + torch.arange(W)).reshape(-1)
        slots = torch.arange(len(prompts)).repeat_interleave(W)
        eager = model.forward(tokens, positions, slots, eager_cache, capture=capture)
        got = step(tokens.to(DEVICE), positions.to(DEVICE), slots.to(DEVICE))
        assert torch.equal(got.logits, eager.logits) and torch.equal(got.captured, eager.captured)
        starts = starts + 1                                   # the next round starts one further
    assert torch.equal(graph_cache.k_all, eager_cache.k_all) and torch.equal(graph_cache.v_all, eager_cache.v_all)
    assert (step.graph is not None) == (DEVICE.type == "cuda")


@pytest.mark.gpu
@pytest.mark.skipif(DEVICE.type != "cuda", reason="the capture (and its refusal) happens on a GPU only")
def test_a_step_that_reads_the_host_is_refused_by_the_capture_and_runs_eagerly():
    """A step with a host read inside cannot be captured: the StaticGraph says why (`failed`),
    warns, and gives the eager step's result at every call."""
    def reads_the_host(a):
        return a * int(a.sum())                                  # a sync: refused while capturing
    step = StaticGraph("reads", reads_the_host, [("a", (3,), torch.int64)], DEVICE)
    with pytest.warns(UserWarning, match="capture refused"):
        first = step(torch.arange(3, device=DEVICE))
    assert step.graph is None and step.failed
    assert torch.equal(first, torch.arange(3, device=DEVICE) * 3)
    assert torch.equal(step(torch.ones(3, dtype=torch.int64, device=DEVICE)), torch.full((3,), 3, device=DEVICE))
