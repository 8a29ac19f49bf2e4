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
"""

from __future__ import annotations

import torch

from engine.kv_cache import KVCache


class DecodeGraph:
    def __init__(self, model, cache: KVCache, batch_size: int):
        if batch_size < 1:
            raise ValueError(f"DecodeGraph needs batch_size >= 1, got {batch_size}")
        self.model, self.cache, self.batch_size = model, cache, batch_size
        dev = model.device
        self.tokens = torch.zeros(batch_size, dtype=torch.int64, device=dev)
        self.positions = torch.zeros(batch_size, dtype=torch.int64, device=dev)
        self.slots = torch.zeros(batch_size, dtype=torch.int64, device=dev)
        self.graph: torch.cuda.CUDAGraph | None = None
        self.logits: torch.Tensor | None = None

    def __call__(self, tokens: torch.Tensor, positions: torch.Tensor, slots: torch.Tensor) -> torch.Tensor:
        """One decode step: tokens, positions, slots [B] int64 -> logits [B, V] fp32."""
        for name, t in (("tokens", tokens), ("positions", positions), ("slots", slots)):
            if t.shape != (self.batch_size,) or t.dtype != torch.int64:
                raise ValueError(f"DecodeGraph: {name} must be int64 [{self.batch_size}], got {t.dtype} "
                                 f"{tuple(t.shape)}")
        self.tokens.copy_(tokens)
        self.positions.copy_(positions)
        self.slots.copy_(slots)
        if self.model.device.type != "cuda":
            return self._forward()
        if self.graph is None:
            self._capture()
        self.graph.replay()
        return self.logits

    def _forward(self) -> torch.Tensor:
        return self.model.forward(self.tokens, self.positions, self.slots, self.cache).logits

    def _capture(self) -> None:
        """Warm up on a side stream (compiles the Triton kernels, fills the allocator), then record.
        The warm-up writes this step's keys and values into the cache, the same bits the replay
        writes again right after."""
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            self._forward()
        torch.cuda.current_stream().wait_stream(side)
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph):
            self.logits = self._forward()
