"""Peak host and device memory of a bench's stretch (a model build, a whole run) against the
model's own bytes: what the process held at its highest, over what the model itself holds.

The target (every bench at the 20b shape in bf16 on an 80 GB card) is a peak at most
TARGET times the model's bytes on the memory that holds the model (the device on CUDA, the host
on the CPU). Device: torch.cuda.max_memory_allocated after reset_peak_memory_stats (the caching
allocator's peak; the CUDA context and cached-but-free blocks are not in it; max_memory_reserved,
which has those blocks, is printed beside it: what the card must really hold). Host: the process's
peak RSS (VmHWM, reset by writing 5 to /proc/self/clear_refs; where that cannot be reset or read,
ru_maxrss: the process's lifetime peak), above its RSS before any weight was made.
"""

from __future__ import annotations

import gc
import resource
import sys
import types

import torch

TARGET = 1.15
GB = 1e9


def model_bytes(*roots) -> int:
    """Bytes of every distinct tensor storage reachable from `roots` through attributes, lists,
    tuples and dicts (a model's weights and buffers; a view or a tensor two roots share counts once)."""
    seen, storages, total = set(), set(), 0
    stack = list(roots)
    skip = (type, types.ModuleType, types.FunctionType, types.MethodType, types.BuiltinFunctionType, torch.device,
            torch.dtype, str, bytes, int, float, bool, type(None))
    while stack:
        obj = stack.pop()
        if isinstance(obj, skip) or id(obj) in seen:
            continue
        seen.add(id(obj))
        if isinstance(obj, torch.Tensor):
            storage = obj.untyped_storage()
            key = (str(storage.device), storage.data_ptr())
            if key not in storages:
                storages.add(key)
                total += storage.nbytes()
        elif isinstance(obj, dict):
            stack.extend(obj.values())
        elif isinstance(obj, (list, tuple, set, frozenset)):
            stack.extend(obj)
        elif hasattr(obj, "__dict__"):
            stack.extend(vars(obj).values())
    return total


def _status_kb(field: str) -> int | None:
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1])
    except OSError:
        pass
    return None


def host_rss() -> int:
    kb = _status_kb("VmRSS")
    return kb * 1024 if kb is not None else host_peak()


def host_peak() -> int:
    """Peak RSS in bytes since the last reset_host_peak (VmHWM), else the process's lifetime peak."""
    kb = _status_kb("VmHWM")
    if kb is not None:
        return kb * 1024
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak if sys.platform == "darwin" else peak * 1024          # macOS reports bytes, Linux KiB


def reset_host_peak() -> bool:
    """Set VmHWM to the current RSS -> whether it could (Linux >= 4.0, /proc writable)."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


class Meter:
    """Peaks of one stretch of a bench: start() at its beginning, line() at its end."""

    def __init__(self, device):
        self.device = torch.device(device)
        self.cuda = self.device.type == "cuda"
        if self.cuda:
            torch.zeros(1, device=self.device)        # the CUDA context belongs to the baseline, not the model
        gc.collect()
        self.host_base = host_rss()                   # the process before any weight: imports, context
        self.start()

    def start(self) -> None:
        gc.collect()
        self.resettable = reset_host_peak()
        if self.cuda:
            torch.cuda.synchronize(self.device)
            torch.cuda.reset_peak_memory_stats(self.device)

    def figures(self, nbytes: int) -> dict:
        """-> model, device_peak (None on the CPU), host_peak, host_above (above the baseline), ratio (of
        the memory that holds the model), ok."""
        device_peak = reserved = None
        if self.cuda:
            torch.cuda.synchronize(self.device)
            device_peak = torch.cuda.max_memory_allocated(self.device)
            reserved = torch.cuda.max_memory_reserved(self.device)
        host = host_peak()
        above = max(0, host - self.host_base)
        held = device_peak if self.cuda else above
        ratio = held / nbytes if nbytes else float("inf")
        return {"model": nbytes, "device_peak": device_peak, "device_reserved": reserved, "host_peak": host,
                "host_above": above,
                "ratio": ratio, "ok": ratio <= TARGET}

    def line(self, label: str, nbytes: int) -> str:
        """One line: the model's bytes, both peaks, the ratio against TARGET."""
        f = self.figures(nbytes)
        device = (f"device peak {size(f['device_peak'])} = {f['device_peak'] / nbytes:.2f}x (the allocator's "
                  f"reserved peak {size(f['device_reserved'])})" if self.cuda else "device n/a (cpu)")
        since = "" if self.resettable else " (the process's lifetime peak: not resettable here)"
        return (f"memory, {label}: model {size(nbytes)} (weights and buffers); {device}; host peak RSS "
                f"{size(f['host_peak'])}{since}, +{size(f['host_above'])} over the process before its weights = "
                f"{f['host_above'] / nbytes:.2f}x; target <= {TARGET}x on the {'device' if self.cuda else 'host'}: "
                f"{'ok' if f['ok'] else 'OVER'}")


def size(nbytes: float) -> str:
    return f"{nbytes / GB:.2f} GB" if nbytes >= 0.1 * GB else f"{nbytes / 1e6:.2f} MB"
