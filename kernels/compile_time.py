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
scripts/triton_kernels.py counts them and compiles them ahead of a run.
"""

from __future__ import annotations

import hashlib
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


def _log(name: str, ident: str, data: str, seconds: float, cache_hit: bool | None) -> None:
    folder = os.environ.get(LOG_ENV)
    if not folder:
        return
    line = json.dumps({"kernel": name, "id": ident, "seconds": round(seconds, 4), "cache_hit": cache_hit,
                       "data": data}, sort_keys=True)
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
