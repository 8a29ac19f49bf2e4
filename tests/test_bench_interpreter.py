"""bench/interpreter.py at a few operations a kernel: every case runs under both interpreters and
gives the same bytes (the bench exits 3 otherwise), so the script cannot rot. No timing is asserted."""

import importlib.util

import pytest

from lockstep.kernels._common import INTERPRET
from tests.conftest import REPO

pytestmark = pytest.mark.skipif(not INTERPRET, reason="Triton's interpreter only (TRITON_INTERPRET=1)")


def test_interpreter_bench_runs_and_its_bytes_agree(capsys):
    spec = importlib.util.spec_from_file_location("bench_interpreter", REPO / "bench" / "interpreter.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    assert bench.main(["--ops", "16"]) == 0
    lines = capsys.readouterr().out.splitlines()[1:]
    assert len(lines) == 4 and all(line.endswith("identical") for line in lines), lines
