"""kernels/compile_time.py: Triton's compile hooks timed and counted, the per-specialization lock
that makes processes sharing a cache compile each specialization once, the kernel log, and the
check summary's compile figures. No GPU here: the hooks are called as Triton calls them."""

import json
import os
import subprocess
import sys
import textwrap
import time

import pytest
import torch

from tests.conftest import REPO

# Triton calls its hooks with these keywords (runtime/jit.py: JITFunction._call_hook)
SIMULATE = textwrap.dedent("""
    import json, os, sys, time
    os.environ.pop("TRITON_INTERPRET", None)
    from lockstep.kernels import compile_time
    import triton
    from triton.runtime.jit import JitFunctionInfo
    assert compile_time.install() == "compiled"
    name, hold, out, at = sys.argv[1], float(sys.argv[2]), sys.argv[3], float(sys.argv[4])
    time.sleep(max(0.0, at - time.time()))                         # both processes start compiling together
    info = JitFunctionInfo("lockstep.kernels.fake", "kernel", None)
    kw = dict(key=("k", name), repr="r", fn=info, compile={"specialization_data": json.dumps({"name": name})},
              is_manual_warmup=False, already_compiled=False)
    assert triton.knobs.runtime.jit_cache_hook(**kw) is False      # False: compile it
    start = time.time()
    time.sleep(hold)                                               # "compiling"
    end = time.time()
    triton.knobs.runtime.jit_post_compile_hook(**kw)
    t = compile_time.snapshot()
    json.dump({"start": start, "end": end, "seconds": t.seconds, "compiles": t.compiles, "keys": sorted(t.keys)},
              open(out, "w"))
""")


def _run_pair(tmp_path, names, hold=0.6):
    """Two processes 'compiling' names[0] and names[1] at the same time, sharing one Triton cache."""
    env = {**os.environ, "TRITON_CACHE_DIR": str(tmp_path / "cache"), "LOCKSTEP_KERNEL_LOG": str(tmp_path / "log"),
           "PYTHONPATH": str(REPO)}
    outs = [tmp_path / f"out{i}.json" for i in range(2)]
    at = time.time() + 8                           # after both have imported triton
    procs = [subprocess.Popen([sys.executable, "-c", SIMULATE, n, str(hold), str(o), str(at)], env=env, cwd=REPO)
             for n, o in zip(names, outs)]
    assert [p.wait(timeout=120) for p in procs] == [0, 0]
    return [json.loads(o.read_text()) for o in outs]


def _overlap(a, b) -> bool:
    return a["start"] < b["end"] and b["start"] < a["end"]


def test_one_specialization_compiles_in_one_process_at_a_time(tmp_path):
    a, b = _run_pair(tmp_path, ["same", "same"])
    assert not _overlap(a, b), (a, b)              # the second waited for the first's lock
    assert a["keys"] == b["keys"] and len(a["keys"]) == 1 and a["keys"][0].startswith("lockstep.kernels.fake.kernel#")
    assert a["compiles"] == b["compiles"] == 1 and a["seconds"] >= 0.5
    log = [json.loads(line) for f in sorted((tmp_path / "log").iterdir()) for line in f.read_text().splitlines()]
    assert len(log) == 2 and {r["id"] for r in log} == {a["keys"][0].split("#")[1]}
    assert json.loads(log[0]["data"]) == {"name": "same"} and log[0]["kernel"] == "lockstep.kernels.fake.kernel"
    counted = subprocess.run([sys.executable, "scripts/triton_kernels.py", "count", str(tmp_path / "log"), "--json"],
                             cwd=REPO, capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(REPO)})
    figures = json.loads(counted.stdout)
    assert figures["kernels"] == {"lockstep.kernels.fake.kernel": 1} and figures["compiles"] == 2, figures
    assert figures["seconds"] >= 1.0 and figures["specializations"] == 1


def test_warm_skips_a_kernel_it_cannot_import(tmp_path):
    """`warm` resolves each kernel by module and name; one made inside a function is counted, not fatal."""
    sys.path.insert(0, str(REPO / "scripts"))
    import triton_kernels
    assert triton_kernels.resolve("lockstep.kernels.nowhere.kernel") is None
    assert triton_kernels.resolve("json.dumps") is None           # importable, but not a Triton kernel
    done, problems = triton_kernels._warm_share([("lockstep.kernels.f.<locals>.k", json.dumps({"name": "k"}))])
    assert done == 0 and problems == ["lockstep.kernels.f.<locals>.k: not importable by name (skipped)"]


def test_different_specializations_compile_side_by_side(tmp_path):
    a, b = _run_pair(tmp_path, ["one", "two"], hold=1.0)
    assert _overlap(a, b), (a, b)                  # the lock is per specialization, not one for all
    assert a["keys"] != b["keys"]


def test_summary_reports_compile_apart_from_run(monkeypatch):
    from lockstep.harness import judges
    from lockstep.harness.commands.session import CheckSession
    from lockstep.harness.runner import Outcome
    from lockstep.kernels import compile_time
    from lockstep.kernels.compile_time import Tally

    monkeypatch.setattr(compile_time, "mode", lambda: "compiled")
    rows = [Outcome(None, "pass", "cuda-bf16", seconds=3.0, compile=Tally(1.0, 0.5, 2, 1, {"m.k#1", "m.k#2"})),
            Outcome(None, "pass", "cuda-bf16", seconds=2.0, compile=Tally(0.5, 0.0, 2, 0, {"m.k#1", "m.j#3"}))]
    session = CheckSession(judges.GoldenJudge("golden"), "golden", False, [], [], outcomes=rows, processes=2)
    c = session.compile_figures()
    assert (c["seconds"], c["load_seconds"], c["run_seconds"]) == (1.5, 0.5, 3.0)
    assert (c["specializations"], c["compiles"], c["cache_hits"]) == (3, 4, 1)
    assert c["kernels"] == {"m.j": 1, "m.k": 2} and c["processes"] == 2
    assert session.compile_text() == ("Triton compile 2.0s, run 3.0s over 2 processes; 3 kernel specializations, "
                                      "4 compiles, 1 from the disk cache")
    rows[1].compile.cache_hits = None              # a Triton without the listener: hits unknown, not 0
    assert session.compile_figures()["cache_hits"] is None
    monkeypatch.setattr(compile_time, "mode", lambda: "interpreter")
    assert session.compile_figures()["seconds"] is None and "interpreter" in session.compile_text()


SETTLE = textwrap.dedent("""
    import fcntl, json, os
    os.environ.pop("TRITON_INTERPRET", None)
    from lockstep.kernels import compile_time
    import triton
    from triton.runtime.jit import JitFunctionInfo
    compile_time.install()
    kw = dict(key=("k",), repr="r", fn=JitFunctionInfo("m", "k", None),
              compile={"specialization_data": json.dumps({"name": "raises"})}, is_manual_warmup=False,
              already_compiled=False)
    triton.knobs.runtime.jit_cache_hook(**kw)          # the compile then raises: no post hook

    def free():
        (path,) = (compile_time.cache_dir() / "lockstep-locks").iterdir()
        fd = os.open(path, os.O_RDWR)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return True
        except BlockingIOError:
            return False
        finally:
            os.close(fd)

    held = not free()
    compile_time.settle()                              # what check_spec does after each row
    print(json.dumps({"held": held, "free_after_settle": free(), "compiles": compile_time.snapshot().compiles}))
""")


def test_a_compile_that_raised_releases_its_lock_after_the_row(tmp_path):
    env = {**os.environ, "TRITON_CACHE_DIR": str(tmp_path / "cache"), "PYTHONPATH": str(REPO)}
    env.pop("LOCKSTEP_KERNEL_LOG", None)
    out = subprocess.run([sys.executable, "-c", SETTLE], env=env, cwd=REPO, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout) == {"held": True, "free_after_settle": True, "compiles": 0}


def test_varying_names_what_tells_a_kernels_specializations_apart():
    sys.path.insert(0, str(REPO / "scripts"))
    import triton_kernels

    def row(ident, block, dtype):
        data = {"name": "m.k", "signature": {"x": dtype, "n": "i32", "BLOCK": "constexpr"}, "constant_keys": [[2]],
                "constant_vals": [block], "attrs_keys": [[0]], "attrs_vals": [[["tt.divisibility", 16]]],
                "options": {"num_warps": 4, "num_stages": 2}}
        return {"kernel": "m.k", "id": ident, "seconds": 0.5, "cache_hit": False, "data": json.dumps(data)}

    rows = [row("1", 64, "*fp32"), row("2", 128, "*fp32"), row("3", 64, "*bf16"), row("3", 64, "*bf16")]
    assert triton_kernels.varying(rows) == {"m.k": {
        "x": ['*bf16 [["tt.divisibility", 16]]', '*fp32 [["tt.divisibility", 16]]'],
        "BLOCK": ["constexpr =128", "constexpr =64"]}}
    assert triton_kernels.count(rows)["specializations"] == 3 and triton_kernels.count(rows)["compiles"] == 4


# ------------------------------------------------------------------ what a run would compile, estimated on the CPU
ESTIMATE = textwrap.dedent("""
    import json, sys
    import torch
    from lockstep.kernels import compile_time
    from lockstep.kernels.matmul import linear_triton
    from lockstep.kernels.rmsnorm import rms_norm_triton
    assert compile_time.mode() == "interpreter"
    w = torch.randn(24, 32)
    for m in (1, 5, 16, 32):                   # M is not specialized: one key for every batch
        linear_triton(torch.randn(m, 32), w)
    for n in (1, 16, 17):                      # N (the weight's) is: 1, divisible by 16, neither
        rms_norm_triton(torch.randn(3, n), torch.ones(n), 1e-5)
    rms_norm_triton(torch.randn(4, 16), torch.ones(16), 1e-5)    # a key seen before: not logged again
""")


@pytest.mark.skipif(torch.cuda.is_available(), reason="the estimate is the CPU's, in Triton's interpreter (a GPU image's "
                                                     "Triton, 3.6, cannot interpret these kernels); a GPU run logs real compiles")
def test_the_interpreter_logs_the_keys_a_compiled_run_would_compile(tmp_path):
    env = {**os.environ, "TRITON_INTERPRET": "1", "LOCKSTEP_KERNEL_LOG": str(tmp_path / "log"),
           "PYTHONPATH": str(REPO)}
    out = subprocess.run([sys.executable, "-c", ESTIMATE], env=env, cwd=REPO, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    rows = [json.loads(line) for f in (tmp_path / "log").iterdir() for line in f.read_text().splitlines()]
    assert all(r["estimated"] is True and r["cache_hit"] is None for r in rows)
    sys.path.insert(0, str(REPO / "scripts"))
    import triton_kernels
    assert triton_kernels.count(rows)["kernels"] == {"lockstep.kernels.rmsnorm._rmsnorm_kernel": 3,
                                                     "lockstep.kernels.matmul._linear_kernel": 1}
    vary = triton_kernels.varying(rows)["lockstep.kernels.rmsnorm._rmsnorm_kernel"]
    assert vary == {"N": ["constexpr =1", 'i32 [["tt.divisibility", 16]]', "i32 []"]}, vary
    assert triton_kernels.warm(rows, 1) == 0     # nothing to preload: estimated rows are not Triton's data


def test_every_do_not_specialize_names_a_parameter():
    """A misspelt name is ignored by Triton (the argument stays specialized): each must be a parameter."""
    import importlib
    import inspect
    import pkgutil
    import lockstep.kernels as package
    checked = 0
    for info in pkgutil.iter_modules(package.__path__):
        module = importlib.import_module(f"lockstep.kernels.{info.name}")
        for obj in vars(module).values():
            names = (getattr(obj, "kwargs", None) or {}).get("do_not_specialize") \
                if hasattr(obj, "kwargs") else getattr(obj, "do_not_specialize", None)
            if not names or not hasattr(obj, "fn"):
                continue
            params = list(inspect.signature(obj.fn).parameters)
            assert set(names) <= set(params), (obj.fn.__qualname__, set(names) - set(params))
            assert not any("constexpr" in str(inspect.signature(obj.fn).parameters[n].annotation) for n in names)
            checked += 1
    assert checked >= 12, checked


def test_prime_computes_the_compiler_key_once_outside_any_lock(monkeypatch):
    from lockstep.kernels import compile_time
    import triton.compiler.compiler as compiler
    calls = []
    monkeypatch.setattr(compiler, "triton_key", lambda: calls.append(1) or "k", raising=False)
    monkeypatch.setattr(compile_time, "_PRIMED", False)
    compile_time._prime()
    compile_time._prime()
    assert calls == [1]


def test_the_first_compile_primes_before_it_takes_its_lock(monkeypatch):
    """The fix itself: a process's one-time key comes before the lock (under it, 16 processes queued)."""
    from lockstep.kernels import compile_time
    order = []
    monkeypatch.setattr(compile_time, "_prime", lambda: order.append("prime"))
    monkeypatch.setattr(compile_time, "_lock", lambda ident: order.append("lock"))
    compile_time._start({"fn": None, "compile": {"specialization_data": "{}"}})
    compile_time._PENDING.job = None
    assert order == ["prime", "lock"]
