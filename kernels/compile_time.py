"""The time this process spends in Triton's compiler, and the kernel specializations it compiled.

Triton's own hooks bracket each specialization a process has not compiled yet (the runtime's
jit_cache_hook before `compile`, jit_post_compile_hook after it): the time between them is the
front end, the lowering and the disk-cache lookups; the first launch of each compiled kernel
(its launcher, the module load: CompiledKernel._init_handles) is `load_seconds`. Under the
interpreter nothing compiles (MODE "interpreter"); a Triton without the hooks is "unmeasured".

Between the two hooks the process holds a file lock named for the specialization, next to
Triton's disk cache: processes that share the cache (`check -j N`'s workers, the shards of
scripts/check_cuda.sh) compile each specialization once and read it from the cache after,
instead of all compiling it at the same time. A process holds one such lock at a time (no
deadlock); the OS drops a dead process's lock.

With $LOCKSTEP_KERNEL_LOG=DIR each specialization compiled is appended to DIR/<pid>.jsonl (its
kernel, id, seconds, whether it came from the cache, Triton's specialization data):
scripts/triton_kernels.py counts them and compiles them ahead of a run. Under the interpreter
nothing compiles, so the log gets, per process, each specialization a compiled run of the same
launches would key (`estimate`: Triton's rules applied to the arguments, "estimated": true).

Before its first lock a process computes Triton's one-time compiler key (a hash of libtriton, ~1 s):
under the lock, 16 processes that all start on the same kernel waited for it in turn (up to 17 s).
"""

from __future__ import annotations

import hashlib
import importlib
import inspect
import json
import os
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from lockstep.kernels import _common  # noqa: F401  (before triton: it picks the interpreter on a CPU)

import triton  # noqa: E402

LOG_ENV = "LOCKSTEP_KERNEL_LOG"


@dataclass
class Tally:
    """Compile figures of one process, or of a stretch of its life (`since`)."""
    seconds: float = 0.0                # between the two hooks: compiling or reading the disk cache
    load_seconds: float = 0.0           # first launches: launcher and module load
    compiles: int = 0                   # specializations this process compiled (or read from the cache)
    cache_hits: int | None = None       # of those, read from Triton's disk cache (None: not reported)
    keys: set[str] = field(default_factory=set)    # "kernel#id" of each

    def since(self, before: "Tally") -> "Tally":
        hits = None if self.cache_hits is None else self.cache_hits - (before.cache_hits or 0)
        return Tally(self.seconds - before.seconds, self.load_seconds - before.load_seconds,
                     self.compiles - before.compiles, hits, self.keys - before.keys)

    def copy(self) -> "Tally":
        return Tally(self.seconds, self.load_seconds, self.compiles, self.cache_hits, set(self.keys))


_TALLY = Tally()
_PENDING = threading.local()            # the specialization being compiled: (key, start, lock fd)
_INSTALLED: str | None = None


def mode() -> str:
    """"interpreter" (TRITON_INTERPRET=1: nothing compiles), "compiled" once the hooks are in,
    "unmeasured" for a Triton without them."""
    if os.environ.get("TRITON_INTERPRET", "0") == "1":
        if os.environ.get(LOG_ENV):
            estimate()
        return "interpreter"
    return install()


def snapshot() -> Tally:
    """This process's figures so far (install() first, or they stay zero)."""
    return _TALLY.copy()


def install() -> str:
    """Put the hooks in (once per process) -> "compiled", or "unmeasured" if this Triton has none."""
    global _INSTALLED
    if _INSTALLED is None:
        _INSTALLED = _install_hooks()
    return _INSTALLED


def _install_hooks() -> str:
    knobs = getattr(triton, "knobs", None)
    runtime = getattr(knobs, "runtime", None)
    if runtime is None or not hasattr(runtime, "jit_cache_hook") or not hasattr(runtime, "jit_post_compile_hook"):
        return "unmeasured"
    before, after = runtime.jit_cache_hook, runtime.jit_post_compile_hook

    def pre(*args, **kwargs):
        if before is not None and before(*args, **kwargs):
            return True                 # an earlier hook skips this compile: nothing to time
        _start(kwargs)
        return False

    def post(*args, **kwargs):
        _finish(kwargs)
        return after(*args, **kwargs) if after is not None else None

    runtime.jit_cache_hook, runtime.jit_post_compile_hook = pre, post
    compilation = getattr(knobs, "compilation", None)
    if compilation is not None and hasattr(compilation, "listener"):
        _TALLY.cache_hits = 0
        earlier = compilation.listener

        def listener(**kwargs):
            if kwargs.get("cache_hit"):
                _TALLY.cache_hits += 1
                _PENDING.hit = True
            if earlier is not None:
                earlier(**kwargs)

        compilation.listener = listener
    _time_first_launches()
    return "compiled"


def _key(kwargs) -> tuple[str, str, str]:
    """-> (kernel name, id, specialization data): the id names the specialization alike in every process."""
    fn = kwargs.get("fn")
    name = f"{getattr(fn, 'module', '?')}.{getattr(fn, 'name', '?')}"
    data = (kwargs.get("compile") or {}).get("specialization_data") or repr(kwargs.get("key"))
    return name, hashlib.sha256(data.encode()).hexdigest()[:16], data


def _start(kwargs) -> None:
    _release()                          # a compile that raised never reached its post hook
    _prime()
    name, ident, data = _key(kwargs)
    _PENDING.job = (name, ident, data, time.perf_counter(), _lock(ident))
    _PENDING.hit = False


def _finish(kwargs) -> None:
    job = getattr(_PENDING, "job", None)
    if job is None:
        return
    name, ident, data, start, _ = job
    seconds = time.perf_counter() - start
    _release()
    _TALLY.seconds += seconds
    _TALLY.compiles += 1
    _TALLY.keys.add(f"{name}#{ident}")
    _log(name, ident, data, seconds, getattr(_PENDING, "hit", False) if _TALLY.cache_hits is not None else None)


_PRIMED = False


def _prime() -> None:
    """Triton's compiler key (functools-cached; it hashes libtriton, ~1 s), once per process, outside
    any lock: inside one, every process starting on the same kernel paid it in turn."""
    global _PRIMED
    if _PRIMED:
        return
    _PRIMED = True
    for module in ("triton.compiler.compiler", "triton.runtime.cache"):
        try:
            getattr(importlib.import_module(module), "triton_key")()
            break
        except Exception:  # noqa: BLE001 - a Triton without it (or failing) just compiles as before
            continue
    try:                                # and the backend's own hash (the ptxas version: a subprocess)
        from triton.compiler.compiler import make_backend
        from triton.runtime.driver import driver
        make_backend(driver.active.get_current_target()).hash()
    except Exception:  # noqa: BLE001 - as above
        pass


def settle() -> None:
    """Drop a lock a compile that raised still holds (its post hook never ran): called after each row."""
    _release()


def _release() -> None:
    job = getattr(_PENDING, "job", None)
    _PENDING.job = None
    if job is not None and job[4] is not None:
        os.close(job[4])                # closing the descriptor drops its flock


def cache_dir() -> Path:
    """Triton's disk cache: its knob where this Triton has one, else $TRITON_CACHE_DIR, else ~/.triton/cache."""
    knob = getattr(getattr(triton, "knobs", None), "cache", None)
    found = getattr(knob, "dir", None) if knob is not None else None
    return Path(found or os.environ.get("TRITON_CACHE_DIR") or Path.home() / ".triton" / "cache")


def _lock(ident: str) -> int | None:
    """An exclusive flock on this specialization's lock file (waits while another process compiles it)."""
    try:
        import fcntl
        folder = cache_dir() / "lockstep-locks"
        folder.mkdir(parents=True, exist_ok=True)
        fd = os.open(folder / f"{ident}.lock", os.O_RDWR | os.O_CREAT, 0o644)
    except (ImportError, OSError):
        return None                     # no locks (Windows, a read-only cache): each process compiles
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
    except OSError:
        os.close(fd)
        return None
    return fd


def _log(name: str, ident: str, data: str, seconds: float, cache_hit: bool | None, **extra) -> None:
    folder = os.environ.get(LOG_ENV)
    if not folder:
        return
    line = json.dumps({"kernel": name, "id": ident, "seconds": round(seconds, 4), "cache_hit": cache_hit,
                       "data": data, **extra}, sort_keys=True)
    Path(folder).mkdir(parents=True, exist_ok=True)
    with open(Path(folder) / f"{os.getpid()}.jsonl", "a") as f:     # one line per write: appends do not interleave
        f.write(line + "\n")


def _time_first_launches() -> None:
    """load_seconds: CompiledKernel._init_handles (the launcher, the module load) where this Triton has it."""
    try:
        from triton.compiler.compiler import CompiledKernel
    except ImportError:
        return
    init = getattr(CompiledKernel, "_init_handles", None)
    if init is None:
        return

    def timed_init(self):
        if getattr(self, "module", None) is not None:
            return init(self)           # already loaded: the fast path stays untimed
        start = time.perf_counter()
        try:
            return init(self)
        finally:
            _TALLY.load_seconds += time.perf_counter() - start

    CompiledKernel._init_handles = timed_init


# --------------------------------------------------------------------------- the interpreter's estimate
_ESTIMATING = False
_ESTIMATED: set[str] = set()
_TYPES = {"float32": "fp32", "bfloat16": "bf16", "float16": "fp16", "float64": "fp64", "int64": "i64",
          "int32": "i32", "int16": "i16", "int8": "i8", "uint8": "u8", "bool": "i1"}


def estimate() -> bool:
    """Under the interpreter: log each launch's specialization key as a compiled Triton would form it
    (once per process and key), so a CPU run counts what a GPU run of the same launches compiles.
    False where this Triton's interpreter has no InterpretedFunction.run to wrap."""
    global _ESTIMATING
    if _ESTIMATING:
        return True
    try:
        from triton.runtime.interpreter import InterpretedFunction
    except ImportError:
        return False
    run = getattr(InterpretedFunction, "run", None)
    if run is None:
        return False

    def logged_run(self, *args, **kwargs):
        try:
            launch = {k: v for k, v in kwargs.items() if k not in ("grid", "warmup")}
            name, ident, data = specialization(self, args, launch)
        except Exception:  # noqa: BLE001 - a launch the estimate cannot read still runs
            name = None
        if name is not None and f"{name}#{ident}" not in _ESTIMATED:
            _ESTIMATED.add(f"{name}#{ident}")
            _log(name, ident, data, 0.0, None, estimated=True)
        return run(self, *args, **kwargs)

    InterpretedFunction.run = logged_run
    _ESTIMATING = True
    return True


def _int_key(value: int, specialize: bool, align: bool) -> tuple[str, object]:
    """Triton's rule for an int argument: 1 becomes a constant; else i32/i64, divisible by 16 noted."""
    if specialize and value == 1:
        return "constexpr", 1
    kind = "i32" if -2**31 <= value < 2**31 else "i64"
    return kind, ([["tt.divisibility", 16]] if specialize and align and value % 16 == 0 else [])


def specialization(fn, args, kwargs) -> tuple[str, str, str]:
    """(kernel, id, data) of one launch of interpreted kernel `fn`: its constexpr values, argument
    types, the ints equal to 1, the ints and pointers divisible by 16 (less the kernel's
    do_not_specialize / do_not_specialize_on_alignment) and the launch options, as JSON in the
    field names of Triton's own specialization data."""
    sig = inspect.signature(fn.fn)
    bound = sig.bind(*args, **{k: v for k, v in kwargs.items() if k in sig.parameters})
    bound.apply_defaults()
    dns = set((getattr(fn, "kwargs", {}) or {}).get("do_not_specialize") or ())
    dnsa = set((getattr(fn, "kwargs", {}) or {}).get("do_not_specialize_on_alignment") or ())
    signature, const_keys, const_vals, attr_keys, attr_vals = {}, [], [], [], []
    for i, (name, param) in enumerate(sig.parameters.items()):
        value = bound.arguments[name]
        specialize = name not in dns and i not in dns
        align = name not in dnsa and i not in dnsa
        if "constexpr" in str(param.annotation) or value is None:
            kind, attr = "constexpr", getattr(value, "value", value)
        elif isinstance(value, bool):
            kind, attr = "u1", None
        elif isinstance(value, int):
            kind, attr = _int_key(value, specialize, align)
        elif isinstance(value, float):
            kind, attr = "fp32", None
        elif hasattr(value, "data_ptr"):
            kind = "*" + _TYPES.get(str(value.dtype).replace("torch.", ""), str(value.dtype))
            attr = [["tt.divisibility", 16]] if specialize and align and value.data_ptr() % 16 == 0 else []
        else:
            kind, attr = type(value).__name__, None
        signature[name] = kind
        if kind == "constexpr":
            const_keys.append([i])
            const_vals.append(attr if isinstance(attr, (int, float, str, bool, type(None))) else repr(attr))
        elif attr is not None:
            attr_keys.append([i])
            attr_vals.append(attr)
    options = {k: v for k, v in sorted(kwargs.items()) if k not in sig.parameters}
    name = f"{fn.fn.__module__}.{fn.fn.__qualname__}"
    data = json.dumps({"name": name, "signature": signature, "constant_keys": const_keys,
                       "constant_vals": const_vals, "attrs_keys": attr_keys, "attrs_vals": attr_vals,
                       "options": options})     # not sorted: the indices follow the parameters' order
    return name, hashlib.sha256(data.encode()).hexdigest()[:16], data
