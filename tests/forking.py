"""Many short child processes for one module import: a server that imports the modules once, then
forks a child per script. For tests that kill a process at varied moments (tests/test_golden.py,
tests/test_hostile_goldens.py): each fresh `python -c` paid ~2 CPU s and ~3 s of wall importing
torch and the harness before it reached the moments the test aims at (docs/history/gate.md, "Measured by
tests5").

    with Forker(["torch", "lockstep.harness.golden"]) as forker:
        child = forker.start(SCRIPT, ["arg"], cwd=tmp_path, env=env, stdout=tmp_path / "out")
        child.send_signal(signal.SIGTERM)
        child.wait()            # -15, as subprocess reports a death by signal

A child is a fork of the server, which has imported its modules and run nothing else (no torch op,
so no thread pool exists to be lost by the fork, as engine/launch.py's fork server). The child
takes `cwd`, `env` and `sys.argv` = ["-c", *argv] as a `python -c SCRIPT argv...` would, its stdin
is /dev/null, its stdout and stderr go to the file `stdout` (or /dev/null), and SIGTERM and SIGINT
have a fresh interpreter's handlers (the default action; KeyboardInterrupt). It runs SCRIPT as __main__; SystemExit gives its code, an exception 1.
What differs from a fresh interpreter: the modules are already imported (from the server's
sys.path and environment at its start), and nothing of interpreter start-up runs.
"""

from __future__ import annotations

import json
import os
import selectors
import subprocess
import sys
from pathlib import Path

SERVER = r"""
import importlib, json, os, signal, sys, traceback
for name in json.loads(sys.argv[1]):
    importlib.import_module(name)
print("ready", flush=True)
for line in sys.stdin:
    cmd = json.loads(line)
    if cmd["op"] == "wait":
        _, status = os.waitpid(cmd["pid"], 0)
        print(json.dumps({"exit": os.waitstatus_to_exitcode(status)}), flush=True)
        continue
    pid = os.fork()
    if pid:
        print(json.dumps({"pid": pid}), flush=True)
        continue
    code = 1
    try:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        out = os.open(cmd["stdout"] or os.devnull, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        sys.stdout.flush()
        os.dup2(out, 1)
        os.dup2(out, 2)
        os.chdir(cmd["cwd"])
        os.environ.clear()
        os.environ.update(cmd["env"])
        sys.argv = ["-c", *cmd["argv"]]
        try:
            exec(compile(cmd["script"], "<forked -c>", "exec"), {"__name__": "__main__"})
            code = 0
        except SystemExit as e:
            code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    except BaseException:
        traceback.print_exc()
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
"""


class Child:
    def __init__(self, forker: "Forker", pid: int):
        self.forker, self.pid, self.returncode = forker, pid, None

    def send_signal(self, sig: int) -> None:
        if self.returncode is None:
            os.kill(self.pid, sig)

    def wait(self, timeout: float = 120) -> int:
        """The exit code, subprocess's way (-N: killed by signal N); the server's reply has `timeout`."""
        if self.returncode is None:
            self.returncode = self.forker._ask({"op": "wait", "pid": self.pid}, timeout)["exit"]
        return self.returncode


class Forker:
    def __init__(self, modules: list[str], env: dict | None = None):
        self.proc = subprocess.Popen([sys.executable, "-c", SERVER, json.dumps(modules)], env=env, text=True,
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        self.children: list[Child] = []
        line = self.proc.stdout.readline()
        if line.strip() != "ready":
            raise RuntimeError(f"the fork server did not start (said {line!r})")

    def _ask(self, cmd: dict, timeout: float = 30) -> dict:
        self.proc.stdin.write(json.dumps(cmd) + "\n")
        self.proc.stdin.flush()
        with selectors.DefaultSelector() as sel:
            sel.register(self.proc.stdout, selectors.EVENT_READ)
            if not sel.select(timeout):
                raise TimeoutError(f"the fork server did not answer {cmd['op']} within {timeout} s")
        return json.loads(self.proc.stdout.readline())

    def start(self, script: str, argv: list[str], cwd: Path, env: dict, stdout: Path | None = None) -> Child:
        reply = self._ask({"op": "start", "script": script, "argv": [str(a) for a in argv], "cwd": str(cwd),
                           "env": dict(env), "stdout": str(stdout) if stdout else None})
        self.children.append(Child(self, reply["pid"]))
        return self.children[-1]

    def __enter__(self) -> "Forker":
        return self

    def __exit__(self, *exc) -> None:
        for child in self.children:             # a test that failed before waiting: no child outlives it
            if child.returncode is None:
                try:
                    os.kill(child.pid, 9)
                    child.wait(timeout=30)
                except (OSError, TimeoutError, ValueError):
                    pass
        self.proc.stdin.close()
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
