"""A wall-clock deadline for a test whose fault would make it wait instead of fail (a bound that
no longer bounds, a worker that never answers): the test fails with TimeoutError at the deadline."""

from __future__ import annotations

import signal
import threading
from contextlib import contextmanager


class DeadlinePassed(BaseException):
    """Not an Exception: no error boundary of the code under test (`cli.main`) can turn it into an
    exit code; it reaches pytest and fails the test."""


@contextmanager
def deadline(seconds: float):
    """Raise DeadlinePassed in the block after `seconds` (SIGALRM: the main thread, POSIX only)."""
    if threading.current_thread() is not threading.main_thread() or not hasattr(signal, "setitimer"):
        yield                                   # no alarm here: the suite's own time limit applies
        return

    def expired(signum, frame):
        raise DeadlinePassed(f"passed the test's {seconds:g} s deadline (a bound or refusal that should stop it did not)")

    old = signal.signal(signal.SIGALRM, expired)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)
