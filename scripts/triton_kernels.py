"""The Triton kernel specializations a run compiled, counted, and compiled again ahead of a run.

A run with $LOCKSTEP_KERNEL_LOG=DIR (a check, a bench, scripts/check_cuda.sh) appends each
specialization it compiles to DIR/<pid>.jsonl (kernels/compile_time.py). Then:

    python3 scripts/triton_kernels.py count DIR [--json]   # distinct specializations per kernel, compile seconds
    python3 scripts/triton_kernels.py count DIR --varying  # and the arguments whose values tell them apart
    python3 scripts/triton_kernels.py warm DIR [-j N]      # compile each distinct one once, N processes in parallel

`warm` compiles into Triton's disk cache ($TRITON_CACHE_DIR, else ~/.triton/cache) through
JITFunction.preload (Triton's own ahead-of-time entry: the same cache key the run computes), so
a later run on this GPU and Triton reads every specialization from the cache. It needs the GPU
architecture the log was written on (Triton refuses a specialization of another target), takes
this machine's libdevice path (not the log's: a log from another install still warms the keys the
run computes) and resolves each kernel by its module and name (a kernel made inside a function
is skipped and counted). A CPU run's log (the interpreter's estimate: "estimated" rows) counts
like a GPU one but is not warmed.
Run from a clone: PYTHONPATH=$PWD.
"""

from __future__ import annotations

import argparse
import importlib
import json
import multiprocessing
import sys
import time
from pathlib import Path


def read_log(folder: Path) -> list[dict]:
    """Every line of every DIR/*.jsonl, in file order (a torn last line, from a killed run, is skipped)."""
    rows = []
    for path in sorted(folder.glob("*.jsonl")):
        for line in path.read_text().splitlines():
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError:
                continue
    return rows


def count(rows: list[dict]) -> dict:
    """-> {kernels: {kernel: distinct specializations}, specializations, compiles, seconds, compile_seconds}:
    compile_seconds counts the compiles not read from the disk cache."""
    distinct: dict[str, set] = {}
    for r in rows:
        distinct.setdefault(r["kernel"], set()).add(r["id"])
    return {"kernels": {k: len(v) for k, v in sorted(distinct.items(), key=lambda kv: (-len(kv[1]), kv[0]))},
            "specializations": sum(len(v) for v in distinct.values()), "compiles": len(rows),
            "seconds": round(sum(r["seconds"] for r in rows), 3),
            "compile_seconds": round(sum(r["seconds"] for r in rows if r.get("cache_hit") is not True), 3),
            "cache_hits": sum(r.get("cache_hit") is True for r in rows)}


def varying(rows: list[dict]) -> dict[str, dict[str, list[str]]]:
    """kernel -> {argument: its distinct values} for the arguments whose dtype, constexpr value or
    alignment attributes differ between the kernel's specializations: what multiplies them."""
    seen: dict[str, dict[str, set]] = {}
    for r in {r["id"]: r for r in rows}.values():
        try:
            data = json.loads(r["data"])
            names = list(data["signature"])
        except (json.JSONDecodeError, KeyError, TypeError):
            continue
        values: dict[str, list] = {n: [f"{t}"] for n, t in data["signature"].items()}
        for path, value in zip(data.get("constant_keys", []), data.get("constant_vals", [])):
            values.setdefault(names[path[0]], []).append(f"={json.dumps(value)}")
        for path, value in zip(data.get("attrs_keys", []), data.get("attrs_vals", [])):
            values.setdefault(names[path[0]], []).append(f"{json.dumps(value)}")
        for option in ("num_warps", "num_stages"):
            values[option] = [str(data.get("options", {}).get(option))]
        for name, parts in values.items():
            seen.setdefault(r["kernel"], {}).setdefault(name, set()).add(" ".join(parts))
    return {k: {n: sorted(v) for n, v in args.items() if len(v) > 1} for k, args in sorted(seen.items())}


def resolve(full_name: str):
    """The JITFunction named module.qualname, or None (a kernel defined inside a function, a module gone)."""
    parts = full_name.split(".")
    for cut in range(len(parts) - 1, 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        for attr in parts[cut:]:
            obj = getattr(obj, attr, None)
        return obj if hasattr(obj, "preload") else None
    return None


def _warm_share(jobs: list[tuple[str, str]]) -> tuple[int, list[str]]:
    """One worker: preload each (kernel, specialization data) -> (compiled, problems)."""
    import lockstep.kernels._common  # noqa: F401  (before triton)
    done, problems = 0, []
    for name, data in jobs:
        fn = resolve(name)
        if fn is None:
            problems.append(f"{name}: not importable by name (skipped)")
            continue
        try:
            fn.preload(data)
            done += 1
        except Exception as e:  # noqa: BLE001 - one specialization that fails to compile is reported, not fatal
            problems.append(f"{name}: {type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''}")
    return done, problems


def portable(data: str) -> str:
    """The specialization data without the logging machine's install paths (the libdevice path in
    the options): this machine's backend fills its own in, as the run it warms for does."""
    try:
        obj = json.loads(data)
        obj.get("options", {}).pop("extern_libs", None)
        return json.dumps(obj)
    except (json.JSONDecodeError, AttributeError):
        return data


def warm(rows: list[dict], jobs: int) -> int:
    """Compile each distinct specialization of `rows` once, in `jobs` spawned processes; 1 if one failed.
    Rows a CPU run estimated (kernels/compile_time.py `estimate`) are not Triton's data: skipped."""
    estimated = sum(r.get("estimated") is True for r in rows)
    unique = sorted({r["id"]: (r["kernel"], portable(r["data"])) for r in rows if r.get("estimated") is not True}.values())
    if estimated:
        print(f"warm: {estimated} estimated rows (a CPU run's keys, not Triton's specialization data) skipped")
    if not unique:
        print("warm: nothing to compile")
        return 0
    shares = [unique[i::jobs] for i in range(jobs) if unique[i::jobs]]
    start = time.perf_counter()
    with multiprocessing.get_context("spawn").Pool(len(shares) or 1) as pool:
        results = pool.map(_warm_share, shares) if shares else []
    done = sum(d for d, _ in results)
    problems = [p for _, ps in results for p in ps]
    print(f"warm: {done} of {len(unique)} distinct specializations compiled into the cache in "
          f"{time.perf_counter() - start:.1f}s ({len(shares)} processes)")
    for p in problems[:20]:
        print(f"  {p}")
    return 0 if all("not importable" in p for p in problems) else 1


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="command", required=True)
    c = sub.add_parser("count", help="distinct specializations per kernel")
    c.add_argument("log", type=Path)
    c.add_argument("--json", action="store_true")
    c.add_argument("--fields", action="store_true", help="one line of key=value fields (scripts/device_61.sh)")
    c.add_argument("--varying", action="store_true", help="per kernel, the arguments whose values differ "
                                                          "between its specializations")
    w = sub.add_parser("warm", help="compile each distinct specialization once, in parallel")
    w.add_argument("log", type=Path)
    w.add_argument("-j", "--jobs", type=int, default=max(1, multiprocessing.cpu_count()))
    args = ap.parse_args(argv)
    rows = read_log(args.log)
    if args.command == "warm":
        return warm(rows, max(1, args.jobs))
    figures = count(rows)
    if args.json:
        print(json.dumps(figures, indent=2))
        return 0
    if args.fields:
        print(" ".join(f"{k}={figures[k]}" for k in ("specializations", "compiles", "cache_hits", "seconds",
                                                     "compile_seconds")))
        return 0
    print(f"{figures['specializations']} distinct kernel specializations of {len(figures['kernels'])} kernels; "
          f"{figures['compiles']} compiles over all processes ({figures['cache_hits']} from the disk cache), "
          f"{figures['seconds']:.1f}s in the compiler ({figures['compile_seconds']:.1f}s not from the cache)")
    vary = varying(rows) if args.varying else {}
    for kernel, n in figures["kernels"].items():
        print(f"  {n:4d}  {kernel}")
        for name, values in vary.get(kernel, {}).items():
            print(f"          {name}: {' | '.join(values)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
