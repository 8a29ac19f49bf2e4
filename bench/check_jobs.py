"""`lockstep check -j N` against `-j 1` on the same specs, in the same run: wall seconds of each, the
ratio, and whether the two reports agree once the seconds are masked (they must: harness/workers.py).

    python3 bench/check_jobs.py [PATTERN ...] [--jobs N]      (default: 'kernels/*', N = the cores)

Run it on a quiet machine: on a shared one the ratio measures the neighbours.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

from lockstep.harness.workers import default_jobs

ROOT = Path(__file__).resolve().parent.parent


def check(patterns: list[str], jobs: int) -> tuple[float, dict]:
    start = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "lockstep", "check", *patterns, "--json", "-j", str(jobs)],
                          cwd=ROOT, capture_output=True, text=True)
    seconds = time.perf_counter() - start
    doc = json.loads(done.stdout)
    doc.pop("seconds")
    per_spec = {}
    for s in doc["specs"]:
        per_spec[f"{s['id']} {s['golden_platform']}"] = s.pop("seconds")
    return seconds, {"doc": doc, "per_spec": per_spec}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("patterns", nargs="*", default=["kernels/*"])
    p.add_argument("--jobs", type=int, default=default_jobs())
    args = p.parse_args()
    serial_s, serial = check(args.patterns, 1)
    parallel_s, parallel = check(args.patterns, args.jobs)
    print(f"{len(serial['per_spec'])} check(s) of {' '.join(args.patterns)}")
    print(f"-j 1: {serial_s:7.1f}s   -j {args.jobs}: {parallel_s:7.1f}s   ratio {serial_s / parallel_s:.2f}x")
    print(f"reports identical (seconds masked): {serial['doc'] == parallel['doc']}")
    top = sorted(serial["per_spec"].items(), key=lambda kv: -kv[1])[:10]
    print("costliest under -j 1:")
    for name, s in top:
        print(f"  {s:8.2f}s  {name}")


if __name__ == "__main__":
    main()
