"""Timing shared by the bench scripts: CUDA events on a GPU, wall clock on the CPU (interpreter)."""

import time

import torch

DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")
ON_GPU = DEVICE.type == "cuda"
HBM_BYTES_PER_S = 4.8e12    # H200 HBM3e peak


def timed(fn, repeat=None):
    """Seconds per call of fn() after one warm-up call (which compiles Triton kernels)."""
    repeat = repeat or (20 if ON_GPU else 1)
    fn()
    if ON_GPU:
        torch.cuda.synchronize()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(repeat):
            fn()
        end.record()
        torch.cuda.synchronize()
        return start.elapsed_time(end) / 1e3 / repeat
    t0 = time.perf_counter()
    for _ in range(repeat):
        fn()
    return (time.perf_counter() - t0) / repeat


def graph_timed(fn, repeat=20):
    """GPU seconds per call of fn(): `repeat` calls captured in one CUDA graph, the median of five
    replays. Without the host's launch cost (~20 us a Triton launch, which `timed` includes), as a
    captured decode step runs them. GPU only."""
    fn()
    torch.cuda.synchronize()
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        fn()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, stream=stream):
            for _ in range(repeat):
                fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(5):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end) / 1e3 / repeat)
    return sorted(times)[2]


def device_line():
    return f"device {torch.cuda.get_device_name() if ON_GPU else 'cpu (Triton interpreter: ratios mean little)'}"
