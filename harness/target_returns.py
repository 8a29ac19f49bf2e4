"""What a target's operation returns, checked against the interface (harness/target.py)
before a kind uses it: a wrong type or shape is the target's fault, named as such, never an
IndexError or TypeError that seems to come from Lockstep's own code."""

from __future__ import annotations

import functools
from collections.abc import Callable

import torch


class WrongReturn(TypeError):
    """A target's operation returned what the interface does not allow."""


def _tensor(value) -> bool:
    return isinstance(value, torch.Tensor)


def _grid(args, kwargs, value, dtype: str) -> str | None:
    """hash/gumbel(seed [n], pos [n], col [m]) -> [n, m] of `dtype`."""
    try:
        want = (len(args[0]), len(args[2]))
    except (IndexError, TypeError):
        return None if _tensor(value) else f"a [n, m] {dtype} tensor"
    if not _tensor(value) or tuple(value.shape) != want or str(value.dtype) != f"torch.{dtype}":
        return f"a {list(want)} {dtype} tensor"
    return None


def _like_query(args, kwargs, value) -> str | None:
    q = args[0] if args else kwargs.get("q")
    if not _tensor(value) or (_tensor(q) and value.shape != q.shape):
        return f"a tensor of the query's shape {list(q.shape) if _tensor(q) else '[T, Hq, D]'}"
    return None


def _per_request(args, kwargs, value) -> str | None:
    requests = next((a for a in args if isinstance(a, list)), kwargs.get("requests"))
    if not isinstance(value, list) or (isinstance(requests, list) and len(value) != len(requests)):
        return f"a list of one Result per request ({len(requests) if isinstance(requests, list) else 'n'})"
    return None


def _pair(args, kwargs, value) -> str | None:
    if not (isinstance(value, (tuple, list)) and len(value) == 2 and all(_tensor(v) for v in value)):
        return "a pair of tensors (coins [n, N], final [n])"
    return None


def _ids_per_row(args, kwargs, value) -> str | None:
    """sampling(logp or logits [R, V], …) -> [R] int64."""
    rows = args[0] if args else kwargs.get("logp")
    want = [len(rows)] if _tensor(rows) else ["R"]
    if not _tensor(value) or str(value.dtype) != "torch.int64" or (_tensor(rows) and list(value.shape) != want):
        return f"a {want} int64 tensor (one token id per row)"
    return None


def _a_tensor(args, kwargs, value) -> str | None:
    return None if _tensor(value) else "a tensor"


CHECKS: dict[str, Callable] = {
    "hash": lambda a, k, v: _grid(a, k, v, "int64"),
    "gumbel": lambda a, k, v: _grid(a, k, v, "float64"),
    "verify_coins": _pair,
    "attention": _like_query,
    "capture": _a_tensor,
    "mxfp4_decode": _a_tensor,
    "generate": _per_request,
    "speculative_generate": _per_request,
    "sampling": _ids_per_row,
}


def checked(target: str, name: str, fn: Callable) -> Callable:
    """`fn` (operation `name` of `target`), its return value checked where the interface says one."""
    check = CHECKS.get(name)
    if check is None:
        return fn

    @functools.wraps(fn)
    def call(*args, **kwargs):
        value = fn(*args, **kwargs)
        want = check(args, kwargs, value)
        if want is not None:
            got = type(value).__name__ + (f" {list(value.shape)} {str(value.dtype).replace('torch.', '')}"
                                          if _tensor(value) else "")
            raise WrongReturn(f"target {target!r}: its {name} operation returned {got}; the interface "
                              f"(harness/target.py) says {want}")
        return value
    return call
