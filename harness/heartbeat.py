"""Progress of one long phase (a recording, a replay's run, an import's teacher-forced run) on stderr.

On a terminal a line is rewritten every second; otherwise (a CI log) a plain line is printed every
`every` seconds ($LOCKSTEP_PROGRESS_SECONDS, default 10), so a log shows a long run alive and how
far it has got, and a short run prints nothing. A background thread only reads a counter (the
steps observed so far): it never touches the run.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from typing import Callable

DEFAULT_EVERY = 10.0


def _every() -> float:
    try:
        return max(0.01, float(os.environ.get("LOCKSTEP_PROGRESS_SECONDS", DEFAULT_EVERY)))
    except ValueError:
        return DEFAULT_EVERY


class Heartbeat:
    def __init__(self, label: str, total: int | None = None, done: Callable[[], int] | None = None,
                 stream=None):
        self.label, self.total, self.done = label, total, done
        self.stream = stream or sys.stderr
        self.live = self.stream.isatty()
        self.every = 1.0 if self.live else _every()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.lines = 0                                   # plain lines printed (tests read it)

    def text(self) -> str:
        elapsed = time.perf_counter() - self.start
        count = ""
        if self.done is not None:
            try:
                count = f" {self.done()}" + (f"/{self.total}" if self.total else "") + " steps,"
            except Exception:  # noqa: BLE001 - a counter read mid-update: skip it this time
                count = ""
        return f"lockstep: {self.label}:{count} {elapsed:.0f} s"

    def _beat(self) -> None:
        while not self._stop.wait(self.every):
            if self.live:
                self.stream.write("\r" + self.text()[:100].ljust(100))
            else:
                print(self.text(), file=self.stream)
                self.lines += 1
            self.stream.flush()

    def __enter__(self) -> "Heartbeat":
        self.start = time.perf_counter()
        self._thread = threading.Thread(target=self._beat, name="lockstep-heartbeat", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        if self.live:
            self.stream.write("\r" + " " * 100 + "\r")
            self.stream.flush()
