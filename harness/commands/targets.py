"""Targets other than Lockstep's engine in the commands: loading one, its dtype policy and its
judge for `check --target NAME` (the run itself is check's one pipeline, harness/judges.py), and
`list --target`, `report` (the matrix) and `expectations --write`.

An expectations file (harness/targets/expectations/<name>-<version>.yaml, or a plugin target's own
`Target.expectations` path) lists every spec that fails on that target version. `observed` is the
failure's first line exactly as `check --target` prints it under the spec (the first line of the
first message, at most 300 characters; a crash's without its location); `judgement` is `peer bug`
or `contract gap`, and `why` one line. An entry of harness/targets/expectations/vllm-0.33.0.yaml:

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

`expectfile.verdict` judges one outcome against its entry (through harness/judges.py, for the CLI
and the pytest plugin's --lockstep-target alike).
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from lockstep.harness.commands.selection import context
from lockstep.harness.errors import UsageError, located
from lockstep.harness.golden import GoldenStore
from lockstep.harness.jsonout import emit, print_document, report_document, tool_document
from lockstep.harness.judges import ExpectationsJudge, GoldenJudge, reproduce_command
from lockstep.harness.target import NotApplicable, Target, TargetInterface, UpstreamChanged
from lockstep.harness.targets import UnknownTarget, at_policy, get, load_expectations
from lockstep.harness.targets.expectfile import ExpectationsError, compare, load, version_range, write
from lockstep.harness.targets.judge import FAIL, NA, PASS, applicability


def _expected(target: Target, args) -> dict:
    """load_expectations for the CLI: a bad file is a usage error (exit 2), located."""

    try:
        return load_expectations(target, getattr(args, "expectations", None))
    except ExpectationsError as e:
        raise _usage(str(e)) from None


def load_target(name: str) -> Target:
    """The target and, read once up front, its expectations: either failing is a usage error
    before any spec runs (a factory of the wrong type, malformed expectations)."""

    try:
        target = get(name)
        load_expectations(target)
        return target
    except UnknownTarget as e:
        raise UsageError(str(e)) from None
    except (NotApplicable, UpstreamChanged, TypeError, ValueError) as e:
        raise UsageError(f"target {name!r} cannot load: {e}") from None
    except Exception as e:  # noqa: BLE001 - the target's own code (its import, its factory) crashed
        raise UsageError(f"target {name!r} cannot load: its factory crashed: {located(e)}", cause=e) from None


def run_target(specs, ctx, target: Target, store: GoldenStore, progress=None, jobs: int | None = 1, done: int = 0):
    """Each spec on `target` in order, in `jobs` worker processes (its outcomes judged later against
    its expectations); progress counts on from `done` (report: the targets before this one)."""
    judge = ExpectationsJudge(target, {}, store.root)
    waiting = (lambda i, sid: progress.show(done + i, sid)) if progress else None
    outcomes = []
    for i, outcome in enumerate(judge.outcomes([(s, ctx, "") for s in specs], jobs, waiting=waiting), done + 1):
        outcomes.append(outcome)
        if progress:                        # a CI log's line per spec (progress.lines: stderr not a terminal)
            progress.clear()
            progress.finished(i, f"{outcome.status:<7} {outcome.spec.id} on {target.label}")
    if progress:
        progress.clear()
    return outcomes


def at_run_policy(targets: list, args, ctx) -> list[tuple]:
    """[(each target at the run's dtype policy, its run context)] (target_context for each), before
    any runs: a --dtype one of them does not offer is a usage error up front."""
    asked, out = args.dtype, []
    for target in targets:
        args.dtype = asked
        out.append(target_context(target, args, ctx))
    args.dtype = asked
    return out


def judge_for(args, ctx):
    """(the judge of `check --target NAME`, the run context): for `lockstep` (the default) its
    goldens, bit for bit; any other target its expectations file, at its dtype policy."""
    if args.target == "lockstep":
        return GoldenJudge(args.golden, args.strict, getattr(args, "debug", False)), ctx
    target, ctx = target_context(load_target(args.target), args, ctx)
    return ExpectationsJudge(target, _expected(target, args), args.golden, getattr(args, "expectations", None),
                             reproduce_command(args, target), getattr(args, "debug", False)), ctx


def target_context(target: TargetInterface, args, ctx):
    """(the target at the run's dtype policy, the run context): its declared policy, or the one
    --dtype names where the target offers it (`Target.dtypes`); the calibrated judge compares it
    with the reference at that policy (docs/targets.md)."""
    try:
        target = at_policy(target, args.dtype)
    except ValueError as e:
        raise _usage(f"--dtype {e}; its outputs are judged at the policy it runs") from None
    args.dtype = target.dtype
    if ctx.platform.dtype == target.dtype:
        return target, ctx
    return target, context(args)


def cmd_write_expectations(args, specs, errors, ctx, progress=None, jobs: int | None = 1) -> int:
    """`lockstep expectations --target X --write FILE`: the observed failures as an expectations file.
    Failures that match the file's previous entry keep their judgement; the others are `unjudged`."""

    if args.target == "lockstep":
        raise _usage("the lockstep target has no expectations: its specs must pass")
    target = load_target(args.target)
    if args.versions is not None:
        try:
            if not version_range({"versions": args.versions}).contains(target.version, prereleases=True):
                raise _usage(f"--versions {args.versions!r} does not hold {target.label}'s version")
        except ValueError as e:
            raise _usage(f"--versions: {e}") from None
    previous = {}
    if args.write.is_file():
        try:
            previous = load(args.write, target.name, target.version)
        except ExpectationsError:
            previous = {}                        # rewritten from scratch: its entries do not apply
    ((target, ctx),) = at_run_policy([target], args, ctx)
    outcomes = run_target(specs, ctx, target, GoldenStore(args.golden), progress, jobs)
    unjudged = write(args.write, target.name, target.version, args.versions, outcomes, previous)
    fails = sum(o.status == FAIL for o in outcomes)
    as_json = getattr(args, "json", False)
    print(f"wrote {args.write}: {fails} failure(s) of {len(outcomes)} spec(s) on {target.label}, {unjudged} to "
          f"judge (judgement: unjudged)", file=sys.stderr if as_json else sys.stdout)
    for e in errors:
        print(f"spec error: {e}", file=sys.stderr if as_json else sys.stdout)
    if as_json:
        print_document(tool_document("expectations", not errors, file=str(args.write), target=target.label,
                                     specs=len(outcomes), failures=fails, unjudged=unjudged,
                                     not_applicable=sum(o.status == NA for o in outcomes),
                                     spec_errors=[str(e) for e in errors]))
    return 2 if errors else 0


def cmd_list_target(args, specs) -> int:
    target = load_target(args.target)
    print(f"# {target.label}: {target.description}")
    for name, op in target.ops.items():
        features = f" [{', '.join(sorted(op.features))}]" if op.features else ""
        print(f"#   {name:<19} {', '.join(op.where):<28} {op.note}{features}")
    for name, why in target.missing.items():
        print(f"#   {name:<19} {'n/a':<28} {why}")
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


PEERS = ("sglang", "vllm", "hf")      # what `report` runs without --target, each only if it loads here


def report_out(out: str) -> Path:
    """--out, checked before any target runs: a .md file whose folder can be written."""

    path = Path(out)
    if path.suffix != ".md":
        raise _usage(f"--out {out}: expected a Markdown path ending in .md (the JSON is written beside it)")
    if path.is_dir():
        raise _usage(f"--out {out} is a directory; name the .md file")
    parent = path.parent
    while not parent.exists():
        parent = parent.parent
    if not os.access(parent, os.W_OK):
        raise _usage(f"--out {out}: {parent} cannot be written")
    return path


def _usage(text: str):
    return UsageError(text)


def report_targets(names) -> tuple[list[Target], dict[str, str]]:
    """The targets to report and, without --target, the peers skipped here with the reason.
    A target named with --target must load; a default peer that does not is listed, not fatal."""
    if names:
        return [load_target(n) for n in names], {}
    loaded, skipped = [], {}
    for name in PEERS:
        try:
            loaded.append(get(name))
        except (NotApplicable, UpstreamChanged, ImportError) as e:
            skipped[name] = str(e)
    if not loaded:
        raise _usage("none of the peers " + ", ".join(PEERS) + " loads here: " +
                     "; ".join(f"{n}: {why}" for n, why in skipped.items()))
    return loaded, skipped


def cmd_report(args, specs, errors, ctx, progress=None, jobs: int | None = 1) -> int:
    out = report_out(args.out)
    targets, skipped = report_targets(args.target)
    for name, why in skipped.items():
        print(f"not run: {name}: {why}", file=sys.stderr)
    if getattr(args, "expectations", None) is not None and len(targets) != 1:
        raise _usage("--expectations names one file: report one --target with it")
    expected = {t.label: _expected(t, args) for t in targets}     # bad files are refused before any run
    if progress:
        progress.total = len(specs) * len(targets)
    results, problems = {}, []
    for n, (target, run_ctx) in enumerate(at_run_policy(targets, args, ctx)):
        store = GoldenStore(args.golden)
        outcomes = run_target(specs, run_ctx, target, store, progress, jobs, done=n * len(specs))
        results[target.label] = outcomes
        problems += [f"{target.label}: {p}" for p in compare(outcomes, expected[target.label])]
    m = matrix(results, expected)
    out.parent.mkdir(parents=True, exist_ok=True)
    text = markdown(m)
    if skipped:
        text += "\n## Not run here\n\n" + "".join(f"- {n}: {why}\n" for n, why in skipped.items())
    out.write_text(text)
    doc = report_document(m | {"not_installed": skipped})
    out.with_suffix(".json").write_text(json.dumps(doc, indent=1, sort_keys=True) + "\n")
    as_json = getattr(args, "json", False)
    print(f"wrote {out} and {out.with_suffix('.json')}", file=sys.stderr if as_json else sys.stdout)
    for p in problems:
        print(p, file=sys.stderr)
    if as_json:                             # the document of the file beside --out, on stdout
        emit(json.dumps(doc, indent=1, sort_keys=True))
    return 2 if errors else (1 if problems else 0)
