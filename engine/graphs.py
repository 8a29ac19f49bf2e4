"""Decode steps replayed from CUDA graphs: one capture per batch size, no host round trip.

A decode step of B requests is the same sequence of kernels every time: one token per request,
static shapes, nothing read back to the host inside the step (the MoE groups its tokens by
expert on the device, the router's top-k and the attention tile ranges are computed there too).
So it is captured once with `torch.cuda.CUDAGraph` and then replayed: a replay launches the
recorded kernels with the same arguments, reading the step's tokens, positions and slots from
fixed input buffers, so its bits are exactly those of the eager step (tested on the GPU:
tests/engine/test_graphs.py).

    step = DecodeGraph(model, cache, batch_size=8)
    logits = step(tokens, positions, slots)      # [8] int64 each -> [8, V] fp32 (a view: copy to keep)

On the CPU (no CUDA graphs) the same object runs the eager forward, so callers need no branch.

`decode_steps(model, slots, capacity)` is what engine.generate uses: a fresh KV cache, one
DecodeGraph per batch bucket over it, and a SampleGraph per group composition (its sampling). On a GPU the last one per model is kept and handed to the
next generate() of the same cache shape with its cache zeroed (the state of a new cache, so
the same bits), so graphs are captured once per shape, not once per call.
"""

from __future__ import annotations

import weakref
from collections import OrderedDict

import torch

from engine.kv_cache import KVCache
from engine.sampling import row_settings, sample_and_logprobs

KEPT_SAMPLERS = 4          # a group's composition changes as requests finish: keep the last few


def _capture(fn):
    """-> (graph, fn's output): fn warmed up on a side stream (compiles the Triton kernels, fills
    the allocator), then recorded; replaying the graph rewrites that output in place."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        fn()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = fn()
    return graph, out


class _Replayed:
    """A step reading its inputs from fixed buffers: on a GPU captured at its first call and then
    replayed (the graph rewrites `out` in place); elsewhere the eager step."""

    graph: torch.cuda.CUDAGraph | None = None
    out = None

    def _replay(self, device: torch.device, step):
        if device.type != "cuda":
            return step()
        if self.graph is None:
            # the warm-up runs the step once (a decode step writes its keys and values into the
            # cache: the bits the replay writes again right after)
            self.graph, self.out = _capture(step)
        self.graph.replay()
        return self.out


class DecodeGraph(_Replayed):
    def __init__(self, model, cache: KVCache, batch_size: int):
        if batch_size < 1:
            raise ValueError(f"DecodeGraph needs batch_size >= 1, got {batch_size}")
        self.model, self.cache, self.batch_size = model, cache, batch_size
        dev = model.device
        self.tokens = torch.zeros(batch_size, dtype=torch.int64, device=dev)
        self.positions = torch.zeros(batch_size, dtype=torch.int64, device=dev)
        self.slots = torch.zeros(batch_size, dtype=torch.int64, device=dev)

    def __call__(self, tokens: torch.Tensor, positions: torch.Tensor, slots: torch.Tensor) -> torch.Tensor:
        """One decode step: tokens, positions, slots [B] int64 -> logits [B, V] fp32."""
        for name, t in (("tokens", tokens), ("positions", positions), ("slots", slots)):
            if t.shape != (self.batch_size,) or t.dtype != torch.int64:
                raise ValueError(f"DecodeGraph: {name} must be int64 [{self.batch_size}], got {t.dtype} "
                                 f"{tuple(t.shape)}")
        self.tokens.copy_(tokens)
        self.positions.copy_(positions)
        self.slots.copy_(slots)
        return self._replay(self.model.device, self._forward)

    def _forward(self) -> torch.Tensor:
        return self.model.forward(self.tokens, self.positions, self.slots, self.cache).logits


class SampleGraph(_Replayed):
    """engine.sampling.sample_and_logprobs for one batch's RowSettings, captured once on a GPU
    and replayed each step (one fused sampling launch, plus the filter masks of rows that have
    them). Same kernels, same arguments: the eager bits.

        sampler = SampleGraph(settings, rows=B, vocab=V, device=dev)
        tokens, logprobs = sampler(logits, positions)     # [B, V] fp32, [B] int64 -> [B], [B]
    """

    def __init__(self, settings, rows: int, vocab: int, device):
        if not settings.capturable:
            raise ValueError("SampleGraph: rows without a seed draw from a host generator: not capturable")
        self.settings = settings
        self.logits = torch.zeros(rows, vocab, dtype=torch.float32, device=device)
        self.positions = torch.zeros(rows, dtype=torch.int64, device=device)

    def __call__(self, logits: torch.Tensor, positions: torch.Tensor):
        self.logits.copy_(logits)
        self.positions.copy_(positions)
        return self._replay(self.logits.device, self._sample)

    def _sample(self):
        return sample_and_logprobs(self.logits, self.settings, self.positions)


class DecodeSteps:
    """A KV cache and one DecodeGraph per batch size over it: `steps(tokens, positions, slots)`."""

    def __init__(self, model, num_slots: int, capacity: int):
        self.model, self.shape = model, (num_slots, capacity)
        self.cache = model.new_cache(num_slots, capacity)
        self.graphs: dict[int, DecodeGraph] = {}
        self.samplers: OrderedDict[tuple, SampleGraph] = OrderedDict()   # by the rows' (params, seeds)

    def __call__(self, tokens: torch.Tensor, positions: torch.Tensor, slots: torch.Tensor) -> torch.Tensor:
        B = tokens.shape[0]
        if B not in self.graphs:
            self.graphs[B] = DecodeGraph(self.model, self.cache, B)
        return self.graphs[B](tokens, positions, slots)

    def sampler(self, params: list, seeds: list) -> SampleGraph:
        """The SampleGraph of a group whose row r has params[r] and seeds[r] (kept for reuse)."""
        key = (tuple(params), tuple(seeds))
        if key not in self.samplers:
            dev = self.model.device
            self.samplers[key] = SampleGraph(row_settings(params, seeds, dev), len(params),
                                             self.model.config.vocab_size, dev)
            while len(self.samplers) > KEPT_SAMPLERS:
                self.samplers.popitem(last=False)
        self.samplers.move_to_end(key)
        return self.samplers[key]

    def reset(self) -> None:
        for buf in self.cache.k + self.cache.v:
            buf.zero_()


_KEPT: "weakref.WeakKeyDictionary[object, DecodeSteps]" = weakref.WeakKeyDictionary()


def decode_steps(model, num_slots: int, capacity: int) -> DecodeSteps:
    """DecodeSteps over a zeroed cache of `num_slots` x `capacity`; on a GPU the model's last
    ones are reused when the shape matches (module docstring)."""
    if model.device.type != "cuda":
        return DecodeSteps(model, num_slots, capacity)
    kept = _KEPT.get(model)
    if kept is not None and kept.shape == (num_slots, capacity):
        kept.reset()
        return kept
    _KEPT.pop(model, None)                     # free the old cache and graphs before allocating
    kept = _KEPT[model] = DecodeSteps(model, num_slots, capacity)
    return kept
