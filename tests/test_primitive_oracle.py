"""D0, first proof: every torch op the CPU reference calls is a correctly rounded IEEE operation
(or an exact one) on this CPU, checked on 10^6 inputs per op against harness.oracle's
machine-independent arithmetic; and the reference calls no op outside that checked list."""

import math

import numpy as np
import pytest
import torch

from lockstep.harness import fingerprint, oracle
from lockstep.kernels import portable

N = 1_000_000


slow_oracle = pytest.mark.slow     # 10^6 inputs per op: ~15 s on a 2-core CPU (docs/gate.md)
# one xdist worker runs the whole module (tests/conftest.py): `findings` (70 CPU s) and the reference
# fingerprint are each computed once per run
pytestmark = pytest.mark.xdist_group("primitive-oracle")


@pytest.fixture(scope="module")
def findings():
    return oracle.check_all(N)


@slow_oracle
def test_every_primitive_is_ieee_on_this_cpu(findings):
    wrong = [f for f in findings if not f.ok]
    assert not wrong, "not IEEE on this CPU:\n" + "\n".join(
        f"  {f.op}: {f.wrong} of {f.checked} wrong {f.example}" for f in wrong)
    assert all(f.checked >= N for f in findings if "scalar" not in f.op and "amax" not in f.op
               and "argmax" not in f.op and "sort" not in f.op)


@slow_oracle
def test_the_oracle_covers_every_checked_op(findings):
    named = " ".join(f.op for f in findings)
    aliases = {"add_": "add", "_to_copy": "cast", "to": "cast", "copy_": "cast", "nan_to_num": "where"}
    missing = [op for op in oracle.CHECKED_OPS if aliases.get(op, op) not in named]
    assert not missing, f"ops claimed checked but with no oracle check: {missing}"


# The oracle itself, at a few thousand inputs (quick): it sees a non-IEEE op, and its bulk
# expectations (numpy) are held to each op's Python definition element by element.
SMALL = 4096


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_the_oracle_sees_a_division_by_a_reciprocal(dtype, monkeypatch):
    """Planted: a / b as a * (1 / b), two roundings: not IEEE division."""
    _, py, bulk = oracle._BINARY["div"]
    monkeypatch.setitem(oracle._BINARY, "div", (lambda a, b: a * (1 / b), py, bulk))
    with np.errstate(all="ignore"):
        found = {f.op: f for f in oracle.check_binary(SMALL, dtype)}
    name = "f32" if dtype == torch.float32 else "f64"
    assert found[f"div {name}"].wrong > 0 and found[f"div {name} (tails)"].wrong > 0
    assert found[f"mul {name}"].ok and found[f"add {name}"].ok


def test_the_oracle_sees_round_half_up(monkeypatch):
    """Planted: round as floor(x + 0.5): ties away from even, and an extra rounding."""
    monkeypatch.setattr(torch, "round", lambda t: torch.floor(t + 0.5))
    with np.errstate(all="ignore"):
        found = {f.op: f for f in oracle.check_exact(SMALL, torch.float64)}
    assert found["round f64"].wrong > 0 and found["floor f64"].ok


def _sqrt_off_in_short_calls(x):
    """portable.sqrt, but one ulp up whenever it is called on fewer than 9 elements: a bug of a
    vector loop's scalar tail."""
    y = _SQRT(x)
    return torch.nextafter(y, torch.full_like(y, math.inf)) if x.numel() < 9 else y


_SQRT = portable.sqrt


@pytest.mark.parametrize("plant", ["no correction", "short calls"])
def test_the_oracle_sees_a_wrong_portable_sqrt(plant, monkeypatch):
    """Planted: sqrt64 without its move to the nearest double (wrong on some inputs), and a sqrt
    wrong only in calls of a few elements (which `tails` makes for a sixteenth of the inputs)."""
    wrong = (_sqrt_off_in_short_calls if plant == "short calls" else
             lambda x: portable._reduced_sqrt(x, portable._newton_sqrt, subnormal=True))
    monkeypatch.setattr(portable, "sqrt", wrong)
    with np.errstate(all="ignore"):
        found = oracle.check_sqrt(SMALL, torch.float64)[0]
    assert found.checked == SMALL and found.wrong > 0


def _mul_one_ulp_up(x, y):
    return np.nextafter(np.multiply(x, y), np.inf)


def _prefix_sums_by_np_sum(x, chunk):
    rows = oracle._chunks(x, chunk)               # numpy's sum adds pairwise, not left to right
    return np.stack([rows[:, :j + 1].sum(axis=1) for j in range(chunk)], axis=1)


def _order_key_signed_zeros(x):
    b = x.view(np.int64)                           # -0 below +0: a tie broken by the sign
    return np.where(b < 0, b ^ np.int64(0x7FFFFFFFFFFFFFFF), b)


@pytest.mark.parametrize("plant, check", [
    ("mul", lambda: oracle.check_binary(SMALL, torch.float64)),
    ("_order_key", lambda: oracle.check_reductions(SMALL)),
    ("_running_sums", lambda: oracle.check_reductions(SMALL)),
])
def test_a_bulk_expectation_that_leaves_its_python_definition_is_refused(plant, check, monkeypatch):
    """Planted in the oracle: numpy's product one ulp up; +0 and -0 ordered apart in the sort and
    argmax keys; running sums by np.sum (pairwise, not left to right)."""
    if plant == "mul":
        torch_fn, py, _ = oracle._BINARY["mul"]
        monkeypatch.setitem(oracle._BINARY, "mul", (torch_fn, py, _mul_one_ulp_up))
    elif plant == "_order_key":
        monkeypatch.setattr(oracle, "_order_key", _order_key_signed_zeros)
    else:
        monkeypatch.setattr(oracle, "_running_sums", _prefix_sums_by_np_sum)
    with np.errstate(all="ignore"), pytest.raises(oracle.OracleDisagrees):
        check()


@pytest.fixture(scope="module")
def reference_fingerprint():
    return fingerprint.fingerprint()


@pytest.fixture(scope="module")
def reference_ops(reference_fingerprint):
    return fingerprint.ops_called(reference_fingerprint)


def test_no_nan_reaches_a_bf16_cast_in_the_reference(reference_fingerprint):
    """torch's f32 -> bf16 cast gives a NaN CPU-dependent bits (0xFFFF in the AVX-512 body, 0x7FC0
    in the scalar code): portable only while no NaN reaches it."""
    casts = {name: s["nan_to_bf16"] for name, s in reference_fingerprint["sections"].items() if name != "primitives"}
    assert not any(casts.values()), f"NaNs cast to bf16: {casts}"


def test_the_reference_calls_only_checked_ops(reference_ops):
    outside = sorted(reference_ops - oracle.REFERENCE_OPS)
    assert not outside, (f"the CPU reference calls torch ops that are not checked against IEEE: {outside} "
                         "(check them in harness/oracle.py, or replace them with kernels.portable code)")
    assert {"add", "mul", "div", "_to_copy"} <= reference_ops          # the census saw the model run


def test_torch_sqrt_put_back_is_caught(monkeypatch):
    """Planted: RMSNorm and Box-Muller back on torch.sqrt (MKL's, not correctly rounded)."""
    monkeypatch.setattr(portable, "sqrt", torch.sqrt)
    monkeypatch.setattr(portable, "sqrt32", torch.sqrt)
    monkeypatch.setattr(portable, "sqrt64", torch.sqrt)
    seen = fingerprint.ops_called(fingerprint.fingerprint(("forward",)))
    assert "sqrt" in seen and "sqrt" not in oracle.REFERENCE_OPS


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_portable_sqrt_special_values(dtype):
    x = torch.tensor([0.0, -0.0, math.inf, -math.inf, math.nan, -1.0, 4.0, 2.0], dtype=dtype)
    y = portable.sqrt(x)
    assert y[0].item() == 0 and math.copysign(1, y[0].item()) == 1
    assert y[1].item() == 0 and math.copysign(1, y[1].item()) == -1
    assert y[2].item() == math.inf and all(math.isnan(v) for v in y[3:6].tolist())
    assert y[6].item() == 2.0 and y[7].item() == float(torch.tensor(math.sqrt(2.0), dtype=dtype))


def test_portable_sqrt_on_every_float32_exponent_and_neighbours():
    """Exhaustive over exponents: each float32 exponent's first, last and middle mantissas and
    their neighbours (including every subnormal power of two)."""
    bits = []
    for e in range(256):
        for m in (0, 1, 2, (1 << 22) - 1, 1 << 22, (1 << 22) + 1, (1 << 23) - 2, (1 << 23) - 1):
            bits.append((e << 23) | m)
    x = torch.tensor(bits, dtype=torch.int64).to(torch.int32).view(torch.float32)
    want = oracle.round_to_f32(torch.tensor([math.sqrt(v) for v in x.double().tolist()], dtype=torch.float64).numpy())
    got = portable.sqrt(x).double().numpy()
    ok = (got == want) | ((got != got) & (want != want))
    assert ok.all(), x[torch.from_numpy(~ok)][:5].tolist()


def test_doctor_runs_the_oracle_and_names_what_it_found(capsys):
    import subprocess
    import sys

    from lockstep.harness.cli import main

    r = subprocess.run([sys.executable, "-m", "lockstep", "doctor", "--inputs", "2048"], capture_output=True,
                       text=True, timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "primitive checks are IEEE on this CPU" in r.stdout and "torch.sqrt f32 (not used)" in r.stdout
    # refused at the argument (the entry point's exit code and stderr: the same main, no new process)
    assert main(["doctor", "--inputs", "5"]) == 2 and "at least 1024" in capsys.readouterr().err


def test_a_portable_golden_that_mismatches_is_not_called_a_sure_change_in_results():
    from lockstep.harness.platform import dependency_report

    line = dependency_report({}, "cpu-fp32")
    assert "either the code changed" in line and "lockstep doctor" in line
