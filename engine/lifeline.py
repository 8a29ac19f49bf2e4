"""Child processes that end with the process that started them, and the temp folders they leave.

A helper process (a `check -j` worker, a topology rank) must not outlive its parent whatever ends
the parent, SIGKILL from the OOM killer included, which runs no cleanup in the parent. So each
child watches its own parent: on Linux the kernel sends it SIGKILL when the parent dies
(PR_SET_PDEATHSIG), and everywhere a watchdog thread sees the parent change (`os.getppid()`) and
ends the process after its own cleanup. Temp folders a run shares carry the pid of the process
that made them (`run_folder`); a later run removes those whose process is gone (`sweep`).
"""

from __future__ import annotations

import ctypes
import glob
import os
import shutil
import signal
import sys
import tempfile
import threading
import time
from collections.abc import Callable

_PR_SET_PDEATHSIG = 1
# The families of temp folders a run shares with its children; each is named PREFIX-<pid>-<random>.
PREFIXES = ("lockstep-shared-checkpoints", "lockstep-checkpoints", "lockstep-launch")


def kill_on_parent_death() -> bool:
    """Linux: ask the kernel to SIGKILL this process when the thread that started it ends (the
    parent's main thread for every start in Lockstep). False where that is not available."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(_PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def watch_parent(parent: int, on_death: Callable[[], None] | None = None, poll_s: float = 0.2,
                 launcher: int | None = None) -> None:
    """End this process (exit 1) once its parent `parent` is gone (or the process `launcher`, where a
    fork server stands between them), after `on_death()`; at once if it is gone already (a start
    that raced the parent's death)."""
    def gone() -> bool:
        return os.getppid() != parent or (launcher is not None and not _alive(launcher))

    def end() -> None:
        try:
            if on_death is not None:
                on_death()
        finally:
            os._exit(1)

    if gone():
        end()

    def loop() -> None:
        while not gone():
            time.sleep(poll_s)
        end()

    threading.Thread(target=loop, name="lockstep-lifeline", daemon=True).start()


def run_folder(prefix: str) -> str:
    """A new temp folder `PREFIX-<this pid>-<random>` in the temp dir, which `sweep` can tell apart."""
    return tempfile.mkdtemp(prefix=f"{prefix}-{os.getpid()}-")


def own_folders(pid: int | None = None) -> list[str]:
    """The run folders of process `pid` (this one by default), every family."""
    pid = os.getpid() if pid is None else pid
    root = tempfile.gettempdir()
    return [p for prefix in PREFIXES for p in glob.glob(os.path.join(root, f"{prefix}-{pid}-*"))]


def remove_own_folders(pid: int | None = None) -> None:
    for path in own_folders(pid):
        shutil.rmtree(path, ignore_errors=True)


def sweep() -> list[str]:
    """Remove the run folders (this user's, in the temp dir) whose process is gone -> their paths."""
    removed = []
    root = tempfile.gettempdir()
    for prefix in PREFIXES:
        for path in glob.glob(os.path.join(root, f"{prefix}-*-*")):
            pid = os.path.basename(path)[len(prefix) + 1:].split("-", 1)[0]
            if not pid.isdigit() or _alive(int(pid)) or not _mine(path):
                continue
            shutil.rmtree(path, ignore_errors=True)
            removed.append(path)
    return removed


def _alive(pid: int) -> bool:
    """Whether process `pid` runs (a zombie, dead but not yet reaped, does not)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:               # another user's process: alive
        return True
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
        return stat[stat.rindex(b")") + 2:stat.rindex(b")") + 3] != b"Z"
    except OSError:                       # no /proc (macOS): kill(0) is all there is
        return True


def _mine(path: str) -> bool:
    try:
        st = os.lstat(path)
    except OSError:
        return False
    return not os.path.islink(path) and st.st_uid == os.getuid()
