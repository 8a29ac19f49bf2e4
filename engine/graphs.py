"""Forwards replayed from CUDA graphs: one capture per shape, no host round trip.

A decode step of B requests is the same sequence of kernels every time: one token per request,
static shapes, nothing read back to the host inside the step (the MoE groups its tokens by
expert on the device, the router's top-k and the attention tile ranges are computed there too).
So it is captured once with `torch.cuda.CUDAGraph` and then replayed: a replay launches the
recorded kernels with the same arguments, reading the step's tokens, positions and slots from
fixed input buffers, so its bits are exactly those of the eager step (tested on the GPU:
tests/engine/test_graphs.py).

    step = DecodeGraph(model, cache, batch_size=8)
    logits = step(tokens, positions, slots)      # [8] int64 each -> [8, V] fp32 (a view: copy to keep)

`StaticGraph` is that mechanism for any function of fixed-shape tensors (checked, copied into
its buffers); `forward_graph` is model.forward over it with captured boundary states (the
speculative verify call), DecodeGraph the logits-only decode step, and `RoundGraphs` the
speculative round's forwards (verify, draft steps, draft extend) over the run's caches.
On the CPU (no CUDA graphs) the same objects run the eager call, so callers need no branch.

`decode_steps(model, slots, capacity)` is what engine.generate uses: a fresh KV cache, one
DecodeGraph per batch bucket over it, and a SampleGraph per group composition (its sampling).
On a GPU the last one per model is kept and handed to the next generate() of the same cache
shape with its cache zeroed (the state of a new cache, so the same bits), so graphs are
captured once per shape, not once per call; `round_graphs` does the same for
engine.speculative.
"""
from __future__ import annotations

import warnings
import weakref
from collections import OrderedDict
from typing import Sequence

import torch

from lockstep.engine.kv_cache import KVCache
from lockstep.engine.model import ONE_DEVICE
from lockstep.engine.sampling import row_settings

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
    failed: str | None = None          # why the capture was refused: the step runs eagerly since
    eager_calls = 0                    # calls run eagerly before the capture (a shape seen once is not captured)

    def _replay(self, device: torch.device, step):
        if device.type != "cuda" or self.failed is not None:
            return step()
        if self.eager_calls > 0 and self.graph is None:
            self.eager_calls -= 1
            return step()
        if self.graph is None:
            # the warm-up runs the step once (a decode step writes its keys and values into the
            # cache: the bits the replay writes again right after)
            try:
                self.graph, self.out = _capture(step)
            except RuntimeError as e:
                # something in the step needs the host (a sync inside the capture): the eager
                # step instead, with its bits (the tests assert that every graph was captured)
                self.failed = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
                warnings.warn(f"{type(self).__name__}: CUDA graph capture refused ({self.failed}); running eagerly")
                return step()
        self.graph.replay()
        return self.out


class StaticGraph(_Replayed):
    """fn over fixed input buffers: each call checks its tensors against the buffers' shapes and
    dtypes, copies them in (device copies, no host read) and runs `fn(*buffers)`, captured at the
    first call on a GPU and replayed after (its output is then a view the next call rewrites:
    copy or index it to keep it). fn must read nothing but the buffers, its weights and state on
    the device: no host int that changes between calls, no host read.

        step = StaticGraph("verify", fn, [("tokens", (T,), torch.int64), ...], device)
        out = step(tokens, ...)
    """

    def __init__(self, name: str, fn, inputs, device, eager_calls: int = 0):
        self.name, self.fn, self.device, self.eager_calls = name, fn, torch.device(device), eager_calls
        self.names = [n for n, _, _ in inputs]
        with torch.inference_mode(False):      # normal tensors: copied into in and out of inference mode
            self.buffers = [torch.zeros(shape, dtype=dtype, device=self.device) for _, shape, dtype in inputs]

    def __call__(self, *args: torch.Tensor):
        if len(args) != len(self.buffers):
            raise ValueError(f"{self.name}: {len(args)} inputs, expected {len(self.buffers)} ({', '.join(self.names)})")
        for name, buf, t in zip(self.names, self.buffers, args):
            if t.shape != buf.shape or t.dtype != buf.dtype:
                raise ValueError(f"{self.name}: {name} must be {str(buf.dtype).removeprefix('torch.')} "
                                 f"{list(buf.shape)}, got {t.dtype} {list(t.shape)}")
        for buf, t in zip(self.buffers, args):
            buf.copy_(t)
        return self._replay(self.device, lambda: self.fn(*self.buffers))


def forward_graph(model, cache: KVCache, rows: int, capture: Sequence[int] = (), name: str = "ForwardGraph",
                  eager_calls: int = 0) -> StaticGraph:
    """model.forward of `rows` rows (tokens, positions, slots [rows] int64) over `cache`,
    returning `capture`'s boundary states too: -> ForwardOutput (logits [rows, V] fp32, captured)."""
    if rows < 1:
        raise ValueError(f"{name} needs batch_size >= 1, got {rows}")
    capture = tuple(capture)
    return StaticGraph(name, lambda t, p, s: model.forward(t, p, s, cache, capture=capture),
                       [(n, (rows,), torch.int64) for n in ("tokens", "positions", "slots")], model.device, eager_calls)


class DecodeGraph:
    """A decode step of `batch_size` rows: forward_graph without captured states, logits only."""

    def __init__(self, model, cache: KVCache, batch_size: int):
        self.model, self.cache, self.batch_size = model, cache, batch_size
        self.step = forward_graph(model, cache, batch_size, name="DecodeGraph")

    @property
    def graph(self):
        return self.step.graph

    def __call__(self, tokens: torch.Tensor, positions: torch.Tensor, slots: torch.Tensor) -> torch.Tensor:
        """One decode step: tokens, positions, slots [B] int64 -> logits [B, V] fp32."""
        return self.step(tokens, positions, slots).logits


class SampleGraph(_Replayed):
    """A Sampler's `sample` (engine/sampling.py) for one batch's RowSettings, captured once on a GPU
    and replayed each step (the fused sampler: one launch, plus the filter masks of rows that have
    them). Same kernels, same arguments: the eager bits.

        sampler = SampleGraph(model.ops.sampler, settings, rows=B, vocab=V, device=dev)
        tokens, logprobs = sampler(logits, positions)     # [B, V] fp32, [B] int64 -> [B], [B]
    """

    def __init__(self, sampler, settings, rows: int, vocab: int, device):
        if not settings.capturable:
            raise ValueError("SampleGraph: rows without a seed draw from a host generator: not capturable")
        self.sampler, self.settings = sampler, settings
        self.logits = torch.zeros(rows, vocab, dtype=torch.float32, device=device)
        self.positions = torch.zeros(rows, dtype=torch.int64, device=device)

    def __call__(self, logits: torch.Tensor, positions: torch.Tensor):
        self.logits.copy_(logits)
        self.positions.copy_(positions)
        return self._replay(self.logits.device, self._sample)

    def _sample(self):
        return self.sampler.sample(self.logits, self.settings, self.positions)


class DecodeSteps:
    """A KV cache and one DecodeGraph per batch size over it: `steps(tokens, positions, slots)`."""

    def __init__(self, model, num_slots: int, capacity: int):
        self.model, self.shape = model, (num_slots, capacity)
        self.cache = model.new_cache(num_slots, capacity)
        self.graphs: dict[int, DecodeGraph] = {}
        self.samplers: OrderedDict[tuple, SampleGraph] = OrderedDict()   # by (sampler, rows' params, seeds)

    def __call__(self, tokens: torch.Tensor, positions: torch.Tensor, slots: torch.Tensor) -> torch.Tensor:
        B = tokens.shape[0]
        if B not in self.graphs:
            self.graphs[B] = DecodeGraph(self.model, self.cache, B)
        return self.graphs[B](tokens, positions, slots)

    def sampler(self, params: list, seeds: list) -> SampleGraph:
        """The SampleGraph of a group whose row r has params[r] and seeds[r] (kept for reuse)."""
        sampler = self.model.ops.sampler
        key = (sampler.name, tuple(params), tuple(seeds))
        if key not in self.samplers:
            dev = self.model.device
            self.samplers[key] = SampleGraph(sampler, row_settings(params, seeds, dev), len(params),
                                             self.model.config.vocab_size, dev)
            while len(self.samplers) > KEPT_SAMPLERS:
                self.samplers.popitem(last=False)
        self.samplers.move_to_end(key)
        return self.samplers[key]

    def reset(self) -> None:
        for buf in self.cache.k + self.cache.v:
            buf.zero_()


_KEPT: "weakref.WeakKeyDictionary[object, DecodeSteps]" = weakref.WeakKeyDictionary()
_KEPT_ROUNDS: "weakref.WeakKeyDictionary[object, RoundGraphs]" = weakref.WeakKeyDictionary()


def capturable(model) -> bool:
    """A model's forward can be captured: it runs on a GPU, unsharded (the expert-parallel torch
    path reads routed ids on the host, and collectives are not captured here), and records into
    no trace (a recording reads every op back to the host)."""
    return model.device.type == "cuda" and model.comm is ONE_DEVICE and model.trace is None


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


class RoundGraphs:
    """lockstep.engine.speculative's round graphs over one run's target KV cache and draft KV (which it
    owns), each a StaticGraph per shape: the verify call per row count, and on the draft's cached
    path (bf16 policy) a draft step per (rows, ancestors) and the draft extend per row count;
    `replay` serves the round's other device-only pieces (the whole draft tree, the verify
    layout, the chosen logprobs) the same way. `verify` and `draft_forward` take the eager calls'
    arguments; where a forward cannot be captured they are the eager calls:
      - the target while it records into a trace or is sharded (`capturable`);
      - the fp32 portable draft head: its attend_rows sizes its key axis by kv_len, a host int
        that grows every round (the cached path's attention walks the whole slot instead);
      - graphs=False (tests compare the two).
    A graph is captured at the second call of its shape (the first runs eagerly): a run's
    requests finish at different rounds, and a shape seen once would cost a capture for nothing.
    On the CPU a StaticGraph is the eager call on its buffers, so both paths give the eager bits.
    """

    def __init__(self, target, draft, num_slots: int, dkv_slots: int, capacity: int, scratch: int,
                 graphs: bool = True):
        self.target, self.draft, self.enabled = target, draft, graphs
        self.draft_fn = draft.forward          # what the draft graphs capture (a patched head is another)
        self.shape = (num_slots, dkv_slots, capacity, scratch)
        with torch.inference_mode(False):      # normal tensors: kept ones are zeroed in and out of it
            self.cache = target.new_cache(num_slots, capacity)
            self.dkv = draft.new_kv(dkv_slots, capacity, scratch)
        self.capture = tuple(draft.boundaries)
        self.graphs: dict[tuple, StaticGraph] = {}

    def verify(self, tokens: torch.Tensor, positions: torch.Tensor, slots: torch.Tensor):
        """target.forward(tokens, positions, slots, cache, capture=the draft's boundaries)."""
        t = self.target
        if not (self.enabled and t.comm is ONE_DEVICE and t.trace is None):     # capturable but for the device
            return t.forward(tokens, positions, slots, self.cache, capture=self.capture)
        key = ("verify", tokens.shape[0])
        if key not in self.graphs:
            self.graphs[key] = forward_graph(t, self.cache, tokens.shape[0], self.capture, "verify", eager_calls=1)
        return self.graphs[key](tokens, positions, slots)

    def replay(self, key: tuple, fn, args: tuple, names: Sequence[str] = ()):
        """fn(*args) through a StaticGraph per (key, the args' shapes and dtypes). fn's closure
        must be fixed by the key (the spec, the layout sizes) and fn must read only its tensor
        arguments and the run's state on the device (the outputs are views the next call
        rewrites: anything kept past the round is cloned). `names`: the args' (error messages)."""
        if not self.enabled:
            return fn(*args)
        key = key + tuple((tuple(a.shape), a.dtype) for a in args)
        if key not in self.graphs:
            names = list(names) or [f"input {i}" for i in range(len(args))]
            self.graphs[key] = StaticGraph(str(key[0]), fn, [(n, a.shape, a.dtype) for n, a in zip(names, args)],
                                           args[0].device, eager_calls=1)
        return self.graphs[key](*args)

    def draft_forward(self, tokens, positions, hidden, kv, slots, commit: bool, prefix_lens=None,
                      ancestors=None, kv_len=None):
        """Eagle3Draft.forward with its arguments (kv_len is the portable path's only): committed
        rows are a "draft extend" graph, tree rows with ancestor tensors a "draft step" graph."""
        d = self.draft
        tree_pair = isinstance(ancestors, tuple) and isinstance(ancestors[0], torch.Tensor)
        if not (d.cached and kv is self.dkv and (commit or tree_pair)):
            return d.forward(tokens, positions, hidden, kv, slots, commit, prefix_lens=prefix_lens,
                             ancestors=ancestors, kv_len=kv_len)
        names = ("tokens", "positions", "hidden", "slots", "prefix_lens", "anc_k", "anc_v")
        if commit:
            return self.replay(("draft extend",), lambda t, p, h, s: d.forward(t, p, h, self.dkv, s, True),
                               (tokens, positions, hidden, slots), names)
        return self.replay(("draft step",), lambda t, p, h, s, pl, ak, av: d.forward(
            t, p, h, self.dkv, s, False, prefix_lens=pl, ancestors=(ak, av)),
            (tokens, positions, hidden, slots, prefix_lens, *ancestors), names)

    def reset(self) -> None:
        """The state of fresh caches (zeros), graphs kept."""
        for buf in (self.cache.k_all, self.cache.v_all, self.dkv.k, self.dkv.v):
            buf.zero_()


def round_graphs(target, draft, num_slots: int, dkv_slots: int, capacity: int, scratch: int,
                 graphs: bool = True) -> RoundGraphs:
    """RoundGraphs over zeroed caches; on a GPU the target's last ones are reused when the draft
    and the shape match (as decode_steps: captured once per shape, not once per call)."""
    graphs = graphs and target.comm is ONE_DEVICE       # a sharded run's ranks stay eager
    if target.device.type != "cuda" or not graphs:
        return RoundGraphs(target, draft, num_slots, dkv_slots, capacity, scratch, graphs)
    kept = _KEPT_ROUNDS.get(target)
    if kept is not None and kept.draft is draft and kept.draft_fn == draft.forward \
            and kept.shape == (num_slots, dkv_slots, capacity, scratch):
        kept.reset()
        return kept
    _KEPT_ROUNDS.pop(target, None)             # free the old caches and graphs before allocating
    kept = _KEPT_ROUNDS[target] = RoundGraphs(target, draft, num_slots, dkv_slots, capacity, scratch)
    return kept
