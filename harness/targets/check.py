"""`lockstep check/list/diff --target NAME` and `lockstep report`: runs, expectations, the matrix.

An expectations file (harness/targets/expectations/<name>-<version>.yaml, or a plugin target's own
`Target.expectations` path) lists every spec that fails on that target version. `observed` is the
failure's first line exactly as `check --target` prints it under the spec (the first line of the
first message, at most 300 characters); `judgement` is `peer bug` or `contract gap`, and `why`
one line. An entry of harness/targets/expectations/vllm-0.33.0.yaml:

    target: vllm
    version: 0.33.0
    failures:
      layer_ids/error-above-l:
        observed: the resolver accepted the ids (boundaries [24, 30]); the spec expects an error
        judgement: peer bug
        why: 'ids are not validated against [0, L] or for duplicates: a bad id silently captures fewer
          states than the draft''s fc expects'

`check --target X` is green (exit 0) when the specs that fail are exactly those listed, each failing
with its recorded `observed` line; n/a specs are not failures and are not listed. Otherwise it
exits 1 and names each difference, for example (the file edited on purpose):

    vllm-0.33.0: results differ from harness/targets/expectations/vllm-0.33.0.yaml:
      EXPECTED FAILURE now passes: layer_ids/120b-default-boundary (remove it from the expectations)
      NEW FAILURE layer_ids/error-duplicates: the resolver accepted the ids (boundaries [17, 33]); the spec expects an error
      FAILS DIFFERENTLY layer_ids/error-negative: the resolver accepted the ids (boundaries [5, 10]); the spec expects an error
        expected: the resolver accepted the ids (boundaries [4, 10]); the spec expects an error

`verdict` judges one outcome against its entry; the pytest plugin's --lockstep-target uses it too.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import yaml

from harness.golden import GoldenStore
from harness.targets import expectations_path, get
from harness.targets.base import NotApplicable, Target, UpstreamChanged
from harness.targets.runners import FAIL, NA, PASS, run_on_target

JUDGEMENTS = ("peer bug", "contract gap")


def load_expectations(target: Target) -> dict:
    path = expectations_path(target)
    if not path.is_file():
        return {}
    doc = yaml.safe_load(path.read_text()) or {}
    if doc.get("target") != target.name or str(doc.get("version")) != target.version:
        raise ValueError(f"{path}: names {doc.get('target')} {doc.get('version')}, not {target.name} {target.version}")
    failures = doc.get("failures") or {}
    for sid, entry in failures.items():
        if not isinstance(entry, dict) or not entry.get("observed") or entry.get("judgement") not in JUDGEMENTS \
                or not entry.get("why"):
            raise ValueError(f"{path}: {sid}: expected observed, judgement ({' | '.join(JUDGEMENTS)}) and why")
    return failures


def verdict(outcome, want: dict | None) -> str | None:
    """How one outcome differs from its expectation (`want`: its entry in the expectations file,
    or None), or None when it matches. The CLI (`compare`) and the pytest plugin share this."""
    o = outcome
    if o.status == FAIL and want is None:
        return f"NEW FAILURE {o.spec.id}: {o.message}"
    if o.status == FAIL and o.message != want["observed"]:
        return f"FAILS DIFFERENTLY {o.spec.id}: {o.message}\n    expected: {want['observed']}"
    if o.status != FAIL and want is not None:
        what = "now passes" if o.status == PASS else f"is now n/a ({o.message})"
        return f"EXPECTED FAILURE {what}: {o.spec.id} (remove it from the expectations)"
    return None


def compare(outcomes, expected: dict, selected_ids: set[str]) -> list[str]:
    """Differences between the outcomes and the expectations (empty: they match exactly)."""
    problems = [p for p in (verdict(o, expected.get(o.spec.id)) for o in outcomes) if p]
    for sid in sorted(set(expected) - {o.spec.id for o in outcomes}):
        if sid in selected_ids or not selected_ids:
            problems.append(f"EXPECTED FAILURE of an unknown spec: {sid}")
    return problems


def load_target(name: str) -> Target:
    from harness.errors import UsageError
    from harness.targets import UnknownTarget

    try:
        return get(name)
    except UnknownTarget as e:
        raise UsageError(str(e)) from None
    except (NotApplicable, UpstreamChanged) as e:
        raise UsageError(f"target {name!r} cannot load: {e}") from None


def run_target(specs, ctx, target: Target, store: GoldenStore, progress=None):
    outcomes = []
    for i, spec in enumerate(specs, 1):
        if progress:
            progress.show(i, spec.id)
        outcomes.append(run_on_target(spec, ctx, target, store))
    if progress:
        progress.clear()
    return outcomes


def cmd_check_target(args, specs, errors, ctx, explain=False, progress=None) -> int:
    target = load_target(args.target)
    store = GoldenStore(args.golden)
    start = time.perf_counter()
    outcomes = run_target(specs, ctx, target, store, progress)
    expected = load_expectations(target)
    partial = bool(args.patterns or args.tag)
    problems = compare(outcomes, expected, {s.id for s in specs} if partial else set())
    code = 2 if errors else (1 if problems else 0)
    counts = {s: sum(o.status == s for o in outcomes) for s in (PASS, FAIL, NA)}
    if getattr(args, "json", False):
        print(json.dumps({"target": target.label, "exit_code": code, "summary": counts,
                          "expectation_problems": problems, "specs": [o.to_json() for o in outcomes]}, indent=2))
        return code
    width = max([len(o.spec.id) for o in outcomes] + [4])
    print(f"{'STATUS':<7} {'SPEC':<{width}}  {'EXPECTED':<8} {'HOW':<9} {'TIME':>7}")
    for o in outcomes:
        exp = "fail" if o.spec.id in expected else ("" if o.status == NA else "pass")
        print(f"{o.status:<7} {o.spec.id:<{width}}  {exp:<8} {o.compare:<9} {o.seconds:6.2f}s")
    for o in outcomes:
        if o.status == FAIL or (explain and o.status == NA):
            why = expected.get(o.spec.id)
            print(f"\n{o.spec.id} on {target.label}: {o.status.upper()}"
                  + (f" (expected: {why['judgement']}: {why['why']})" if why else ""))
            for m in (o.messages if o.status == FAIL else [o.message]):
                print("  " + m.replace("\n", "\n  "))
    if problems:
        print(f"\n{target.label}: results differ from {expectations_path(target)}:")
        for p in problems:
            print("  " + p)
    for e in errors:
        print(f"spec error: {e}")
    print(f"\n{len(outcomes)} spec(s) on {target.label}: {counts[PASS]} pass, {counts[FAIL]} fail "
          f"({counts[FAIL] - sum(1 for o in outcomes if o.status == FAIL and o.spec.id not in expected)} expected), "
          f"{counts[NA]} n/a in {time.perf_counter() - start:.1f}s"
          + ("; matches its expectations" if not problems else "; DOES NOT match its expectations"))
    return code


def cmd_list_target(args, specs) -> int:
    target = load_target(args.target)
    print(f"# {target.label}: {target.description}")
    for name, op in target.ops.items():
        print(f"#   {name:<19} {', '.join(op.where):<28} {op.note}")
    for name, why in target.missing.items():
        print(f"#   {name:<19} {'n/a':<28} {why}")
    from harness.targets.runners import applicability
    for s in specs:
        how, why = applicability(s, target)
        print(f"{s.id:<44} {s.kind:<10} {how:<9} {why}")
    return 0


# --------------------------------------------------------------------------- report
def matrix(results: dict[str, list], expected: dict[str, dict]) -> dict:
    """{'targets': [...], 'specs': {id: {target: {status, compare, message, judgement, why}}}}"""
    out = {"targets": list(results), "specs": {}}
    for label, outcomes in results.items():
        for o in outcomes:
            cell = {"status": o.status, "compare": o.compare, "message": o.message}
            want = expected[label].get(o.spec.id)
            if want and o.status == FAIL:
                cell |= {"judgement": want["judgement"], "why": want["why"]}
            out["specs"].setdefault(o.spec.id, {"kind": o.spec.kind})[label] = cell
    return out


def _md_cell(c: dict) -> str:
    if c["status"] == PASS:
        return f"pass ({c['compare']})"
    if c["status"] == NA:
        return "n/a"
    return f"**fail** — {c.get('judgement', 'unexpected')}: {c.get('why', c['message'])}"


def markdown(m: dict) -> str:
    labels = m["targets"]
    lines = ["# Conformance matrix", "",
             "Written by `lockstep report` (do not edit by hand; `tests/targets/test_targets.py` keeps it true).",
             "Cells: pass (bitwise: the same golden bit for bit; tolerance: the spec's tolerance or the "
             "cross-implementation bound), **fail** with the judgement of the expectations file, n/a (the reason "
             "is listed below the table).", ""]
    counts = {l: {s: sum(1 for row in m["specs"].values() if row.get(l, {}).get("status") == s) for s in (PASS, FAIL, NA)}
              for l in labels}
    lines += ["| target | pass | fail | n/a |", "| --- | --- | --- | --- |"]
    lines += [f"| {l} | {counts[l][PASS]} | {counts[l][FAIL]} | {counts[l][NA]} |" for l in labels]
    lines += ["", "| spec | " + " | ".join(labels) + " |", "| --- |" + " --- |" * len(labels)]
    for sid, row in sorted(m["specs"].items()):
        lines.append(f"| {sid} | " + " | ".join(_md_cell(row[l]) if l in row else "—" for l in labels) + " |")
    lines += ["", "## Failures: the first mismatch", ""]
    for sid, row in sorted(m["specs"].items()):
        for l in labels:
            c = row.get(l)
            if c and c["status"] == FAIL:
                lines.append(f"- `{sid}` on {l}: {c['message']}")
    lines += ["", "## n/a: why", ""]
    for l in labels:
        reasons = {}
        for sid, row in sorted(m["specs"].items()):
            c = row.get(l)
            if c and c["status"] == NA:
                reasons.setdefault(c["message"], []).append(sid)
        for why, ids in reasons.items():
            shown = ", ".join(f"`{i}`" for i in ids[:4]) + (f" and {len(ids) - 4} more" if len(ids) > 4 else "")
            lines.append(f"- {l} ({len(ids)}): {why} — {shown}")
    return "\n".join(lines) + "\n"


def cmd_report(args, specs, errors, ctx, progress=None) -> int:
    results, expected, problems = {}, {}, []
    for name in args.target or ["sglang", "vllm", "hf"]:
        target = load_target(name)
        store = GoldenStore(args.golden)
        outcomes = run_target(specs, ctx, target, store, progress)
        results[target.label] = outcomes
        expected[target.label] = load_expectations(target)
        problems += [f"{target.label}: {p}" for p in compare(outcomes, expected[target.label],
                                                               {s.id for s in specs} if (args.patterns or args.tag)
                                                               else set())]
    m = matrix(results, expected)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(markdown(m))
    out.with_suffix(".json").write_text(json.dumps(m, indent=1, sort_keys=True) + "\n")
    print(f"wrote {out} and {out.with_suffix('.json')}")
    for p in problems:
        print(p, file=sys.stderr)
    return 2 if errors else (1 if problems else 0)
