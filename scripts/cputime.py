"""CPU seconds of a command and every process under it, orphans included.

    python3 scripts/cputime.py python3 -m pytest -q tests/parallel

Prints `TIME wall W user U sys S rc RC` on stderr. It makes itself a child subreaper, so a process
whose parent exits first (multiprocessing's fork server, and the ranks it forked: engine/launch.py)
is re-parented here and waited for, and its CPU time counted; `/usr/bin/time` counts only the
children its command waits for. Linux only (prctl)."""

import ctypes
import os
import resource
import subprocess
import sys
import time

PR_SET_CHILD_SUBREAPER = 36


def main() -> int:
    ctypes.CDLL(None).prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
    start = time.time()
    rc = subprocess.Popen(sys.argv[1:]).wait()
    while True:                                     # the orphans re-parented here
        try:
            os.wait()
        except ChildProcessError:
            break
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    print(f"TIME wall {time.time() - start:.2f} user {r.ru_utime:.2f} sys {r.ru_stime:.2f} rc {rc}", file=sys.stderr)
    return rc


if __name__ == "__main__":
    sys.exit(main())
