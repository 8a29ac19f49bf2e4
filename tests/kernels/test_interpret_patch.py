"""kernels/_interpret.py: Triton's interpreter without its per-helper-call re-patching gives the
bits of the interpreter as shipped, kernel by kernel, and really skips the re-patching (the gate's
time, docs/gate.md). Interpreter only: compiled kernels never patch anything."""

import inspect

import pytest
import torch

from lockstep.kernels import _interpret
from lockstep.kernels._common import INTERPRET
from lockstep.kernels import portable

pytestmark = pytest.mark.skipif(not INTERPRET, reason="Triton's interpreter only (TRITON_INTERPRET=1)")


def _rand(*shape, seed=0, scale=1.0):
    return portable.normal(shape, torch.Generator().manual_seed(seed)) * scale


def _attention(two_phase: bool):
    from lockstep.kernels.attention import attention_triton
    T, Hq, Hkv, D, S = 3, 4, 2, 16, 160
    q, k, v = _rand(T, Hq, D, seed=1), _rand(1, Hkv, S, D, seed=2), _rand(1, Hkv, S, D, seed=3)
    pos = torch.tensor([0, 70, 159])
    return attention_triton(q, k, v, torch.zeros(T, dtype=torch.int64), pos, _rand(Hq, seed=4), 96, 0.25,
                            _split=64, _two_phase=two_phase)


def _gumbel():
    from lockstep.kernels.sampling import gumbel_argmax_triton
    logp = torch.log_softmax(_rand(3, 300, seed=5).to(torch.float64), -1)
    return gumbel_argmax_triton(logp, torch.tensor([1, -2, 3]), torch.tensor([0, 5, 2**33]))


def _linear():
    from lockstep.kernels.matmul import linear_triton
    return linear_triton(_rand(5, 70, seed=6), _rand(33, 70, seed=7), _rand(33, seed=8))


def _router():
    from lockstep.kernels.moe import router_top_k_triton
    return torch.cat([t.to(torch.float64) for t in router_top_k_triton(_rand(4, 6, seed=9), 3, True)], 1)


def _rmsnorm():
    from lockstep.kernels.rmsnorm import rms_norm_triton
    return rms_norm_triton(_rand(3, 129, seed=10), _rand(129, seed=11), 1e-5)


KERNELS = {"attention": lambda: _attention(False), "attention split-K": lambda: _attention(True),
           "gumbel argmax": _gumbel, "linear": _linear, "router top-k": _router, "rmsnorm": _rmsnorm}


def _bytes(t: torch.Tensor) -> bytes:
    return t.contiguous().view(torch.uint8).numpy().tobytes()


def test_installed_under_the_pinned_triton():
    from triton.runtime import interpreter
    assert _interpret.install() and getattr(interpreter._patch_lang, "_lockstep", False)


@pytest.mark.parametrize("name", KERNELS)
def test_the_same_bits_as_the_interpreter_as_shipped(name):
    ours = KERNELS[name]()
    with _interpret.triton_as_shipped():
        shipped = KERNELS[name]()
    assert _bytes(ours) == _bytes(shipped)


def _patch_passes(monkeypatch, run) -> int:
    """How many inspect.getmembers passes (Triton's _patch_builtin) `run` makes."""
    calls = []
    real = inspect.getmembers
    monkeypatch.setattr(inspect, "getmembers", lambda *a, **k: calls.append(1) or real(*a, **k))
    run()
    monkeypatch.setattr(inspect, "getmembers", real)
    return len(calls)


def test_a_launch_patches_once_and_its_helper_calls_do_not(monkeypatch):
    def shipped():
        with _interpret.triton_as_shipped():
            _attention(False)
    ours, theirs = _patch_passes(monkeypatch, lambda: _attention(False)), _patch_passes(monkeypatch, shipped)
    # the launch (tl, tl.tensor, tl.math, descriptors), then the first helper seeing tl.core: at most 12
    assert 0 < ours <= 12 and 10 * ours < theirs, (ours, theirs)


def test_after_a_launch_the_language_is_restored():
    import triton.language as tl
    before = {name: getattr(tl, name) for name in ("range", "reduce", "exp", "sum")}
    _attention(True)
    assert {name: getattr(tl, name) for name in before} == before


def _operands():
    """Binary operations over the dtype pairs `_install_operand_checks` decides: same dtypes with no
    cast (fp32, bf16, int32), same dtypes cast for a division (bf16 / bf16 in fp32), mixed dtypes
    (fp32 with bf16 and fp16, int32 with fp32), comparisons, and numbers (Triton's own path)."""
    import triton
    import triton.language as tl

    @triton.jit
    def mixed(f_ptr, b_ptr, i_ptr, out_ptr, iout_ptr, N: tl.constexpr):
        o = tl.arange(0, N)
        f, b, i = tl.load(f_ptr + o), tl.load(b_ptr + o), tl.load(i_ptr + o)
        tl.store(out_ptr + 0 * N + o, f + f * f - f / (f + 3.0))
        tl.store(out_ptr + 1 * N + o, (b / b).to(tl.float32) + (b * b - b).to(tl.float32))
        tl.store(out_ptr + 2 * N + o, f * b + f - b.to(tl.float16))
        tl.store(out_ptr + 3 * N + o, i * f + (f < f * 0.5).to(tl.float32) + (i >= i * 2).to(tl.float32))
        tl.store(out_ptr + 4 * N + o, (f[:, None] * f[None, :]).sum(axis=1) % f)
        tl.store(iout_ptr + o, i * i + i // (i + 7) - i % 5 + (i & (i >> 1)))

    N = 64
    f = _rand(N, seed=12)
    b = _rand(N, seed=13).to(torch.bfloat16)
    i = torch.arange(-30, N - 30, dtype=torch.int32) * 3
    out, iout = torch.empty(5, N), torch.empty(N, dtype=torch.int32)
    mixed[(1,)](f, b, i, out, iout, N)
    return torch.cat([out.reshape(-1).view(torch.int32), iout])


def test_operand_checks_give_the_interpreters_bits_and_types():
    ours = _operands()
    with _interpret.triton_as_shipped():
        shipped = _operands()
    assert _bytes(ours) == _bytes(shipped)
    assert ("fp32", "fp32", True, False) in _interpret._NO_CASTS        # the fast path was taken
    assert _interpret._NO_CASTS[("bf16", "bf16", True, True)] is False  # bf16 / bf16 is cast to fp32


def test_a_wrong_no_cast_decision_changes_the_bits(monkeypatch):
    """The decision is what keeps the bits: deciding that bf16 / bf16 needs no cast (it is computed
    in fp32) changes the division's result (bf16 arithmetic), so the comparison above would fail."""
    right = _operands()
    monkeypatch.setitem(_interpret._NO_CASTS, ("bf16", "bf16", True, True), True)
    assert _bytes(_operands()) != _bytes(right)


def _linear_of_specials():
    from lockstep.kernels.matmul import linear_triton
    x = _rand(2, 40, seed=14)
    x[0, 3], x[1, 5] = float("inf"), float("nan")           # inf * 0 and NaN: numpy's "invalid value"
    return linear_triton(x, _rand(8, 40, seed=15) * torch.tensor([0.0, 1.0]).repeat(20), None)


def test_special_values_are_values_not_warnings():
    """A launch runs under np.errstate(all="ignore"), as a compiled kernel warns about nothing; Triton
    as shipped prints numpy's RuntimeWarning for the same launch, with the same bytes."""
    import warnings
    with warnings.catch_warnings(record=True) as ours:
        warnings.simplefilter("always")
        got = _linear_of_specials()
    with _interpret.triton_as_shipped(), warnings.catch_warnings(record=True) as shipped:
        warnings.simplefilter("always")
        expected = _linear_of_specials()
    assert _bytes(got) == _bytes(expected) and torch.isnan(got).any()
    assert not [w for w in ours if issubclass(w.category, RuntimeWarning)]
    assert [w for w in shipped if issubclass(w.category, RuntimeWarning)]
