"""bench/_memory.py and the weights the benches hand over: a model's bytes are each storage once,
the peaks are read against them, and bench/e2e.py's experts can be made again (for the MXFP4
rows, after the dense ones are gone) and dequantized without holding both forms whole."""

import sys

import torch

from tests.conftest import REPO

sys.path.insert(0, str(REPO / "bench"))

import _memory  # noqa: E402
import e2e  # noqa: E402


def test_model_bytes_counts_each_storage_once():
    w = torch.zeros(10, 4)                       # 160 bytes
    holder = type("Holder", (), {})()
    holder.weight, holder.view, holder.again = w, w.t(), [w[2:]]
    holder.buffers = {"b": torch.zeros(3, dtype=torch.bfloat16)}
    holder.back = holder                         # a cycle
    assert _memory.model_bytes(holder) == 160 + 6
    other = type("Other", (), {})()
    other.shared, other.own = w, torch.zeros(2)
    assert _memory.model_bytes(holder, other) == 160 + 6 + 8       # the shared tensor once


METER = """
import json, sys, torch
sys.path.insert(0, sys.argv[1])
import _memory
meter = _memory.Meter("cpu")
block = torch.ones(64 << 20, dtype=torch.uint8)                 # 64 MiB touched
print(json.dumps({"figures": meter.figures(block.numel()), "line": meter.line("x", block.numel())}))
"""


def test_meter_reads_a_host_peak_above_its_start():
    """In a fresh process: a test worker keeps freed memory resident (harness/memory.py), so a new
    block there may reuse pages and leave the RSS where it was."""
    import json
    import subprocess

    out = subprocess.run([sys.executable, "-c", METER, str(REPO / "bench")], capture_output=True, text=True,
                         timeout=120, check=True).stdout
    got = json.loads(out)
    f = got["figures"]
    assert f["device_peak"] is None and f["host_above"] >= 0.9 * (64 << 20), f
    assert "target <= 1.15x on the host" in got["line"]


def test_packed_experts_made_again_are_the_same_and_dense_consumes_them():
    config = e2e.preset("tiny")
    floats, packed = e2e.random_weights(config, "cpu")
    again = e2e.random_weights(config, "cpu", only_packed=True)
    assert again[0] == {} and packed.keys() == again[1].keys()
    assert all(torch.equal(packed[n], again[1][n]) for n in packed)
    kept = e2e.dense_experts(packed)
    consumed = e2e.dense_experts(again[1], consume=True)
    assert again[1] == {} and len(packed) == 2 * len(kept)
    assert all(torch.equal(kept[n], consumed[n]) for n in kept)


def test_the_cuda_line_reads_the_allocator_peaks(monkeypatch):
    """The CUDA branch (no GPU here): the device peak against the model, the reserved peak beside it."""
    meter = _memory.Meter("cpu")
    meter.cuda = True
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: None)
    monkeypatch.setattr(torch.cuda, "max_memory_allocated", lambda device=None: 46_000_000_000)
    monkeypatch.setattr(torch.cuda, "max_memory_reserved", lambda device=None: 50_000_000_000)
    f = meter.figures(40_000_000_000)
    assert f["ratio"] == 1.15 and f["ok"] and f["device_reserved"] == 50_000_000_000
    line = meter.line("build", 40_000_000_000)
    assert "model 40.00 GB (weights and buffers); device peak 46.00 GB = 1.15x (the allocator's reserved peak " \
           "50.00 GB)" in line and line.endswith("target <= 1.15x on the device: ok"), line
    assert not meter.figures(34_000_000_000)["ok"]


def test_a_float_tensor_is_drawn_in_blocks_no_fp32_draw_above_the_bound(monkeypatch):
    """The embedding and lm_head of the 20b shape are 2.3 GB each in fp32: drawn in blocks of rows
    (FLOAT_DRAW elements), so no fp32 draw is a whole large tensor; a tensor within the bound is one
    draw, and the weights are the same on every call."""
    config = e2e.preset("tiny")
    whole, _ = e2e.random_weights(config, "cpu")
    draws, randn = [], torch.randn

    def recorded(*shape, **kw):
        t = randn(*shape, **kw)
        draws.append(t.numel())
        return t

    monkeypatch.setattr(e2e, "FLOAT_DRAW", 4096)
    monkeypatch.setattr(torch, "randn", recorded)
    blocks, _ = e2e.random_weights(config, "cpu")
    widest = max(t[0].numel() for t in whole.values() if t.dim() == 2)
    assert max(draws) <= max(4096, widest) and len(draws) > len(whole)
    small = [n for n, t in whole.items() if t.numel() <= 4096]
    assert small and all(torch.equal(whole[n], blocks[n]) for n in small)
    assert whole.keys() == blocks.keys() and all(blocks[n].dtype == torch.bfloat16 for n in blocks)
    monkeypatch.setattr(torch, "randn", randn)
    again, _ = e2e.random_weights(config, "cpu")
    assert all(torch.equal(blocks[n], again[n]) for n in blocks)
