"""Running specs: check one against its golden, or regenerate its golden safely.

Both the CLI and the pytest plugin go through `check_spec` and `regen_spec`, so the two
can never disagree on what passes or on what is written.
"""

from __future__ import annotations

import shlex
import time
import traceback
from dataclasses import dataclass, field
from datetime import datetime, timezone

import torch

from engine.boundaries import CaptureError
from harness import kinds
from harness.compare import TensorDiff, diff_data, diff_tensors
from harness.golden import CorruptGolden, GoldenStore, json_roundtrip
from harness.platform import bit_dependencies, dependency_report, device_name, lockstep_revision, versions
from harness.result import Result, RunContext
from harness.specfile import Spec

# Outcome statuses, and the exit code each one earns `lockstep check` (DESIGN of the CLI).
PASS, MISMATCH, FAILED, CRASH, CORRUPT, MISSING = "pass", "mismatch", "failed", "crash", "corrupt", "missing"
FAILING = (MISMATCH, FAILED, CRASH, CORRUPT)


def repro_command(spec_id: str, ctx: RunContext, verb: str = "diff") -> str:
    args = ["lockstep", verb, spec_id]
    if ctx.platform.device != "cpu":
        args += ["--device", "cuda"]
    if ctx.platform.dtype != "fp32":
        args += ["--dtype", ctx.platform.dtype]
    if ctx.backend != "torch":
        args += ["--backend", ctx.backend]
    if ctx.world_sizes:
        args += ["--world-size", ",".join(map(str, ctx.world_sizes))]
    return shlex.join(args)


@dataclass
class Outcome:
    spec: Spec
    status: str
    golden_platform: str
    seconds: float = 0.0
    messages: list[str] = field(default_factory=list)  # failed expectations, crash or corruption text
    diffs: list[TensorDiff] = field(default_factory=list)
    data_diff: str = ""
    notes: list[str] = field(default_factory=list)  # informational, never a failure
    located: list = field(default_factory=list)  # harness.locate.Located: where runs first part
    repro: str = ""

    def report(self) -> str:
        """The text a person reads when this spec did not pass."""
        s = self.spec
        head = f"{s.id} ({s.file}:{s.line_of('kind')}) on {self.golden_platform}: {self.status.upper()}"
        lines = [head]
        if self.status == MISSING:
            lines.append(f"  no golden yet; record one with: lockstep regen {shlex.quote(s.id)}")
        for m in self.messages:
            lines += ["  " + line for line in m.splitlines()]
        for d in self.diffs:
            lines += ["  " + line for line in d.describe().splitlines()]
        if self.data_diff:
            lines.append("  data differs from the golden:")
            lines += ["    " + line for line in self.data_diff.splitlines()]
        for loc in self.located:
            lines += ["  " + line for line in loc.text().splitlines()]
        lines += ["  note: " + n for n in self.notes]
        if self.repro:
            lines.append(f"  reproduce: {self.repro}")
        return "\n".join(lines)

    def to_json(self) -> dict:
        return {
            "id": self.spec.id, "status": self.status, "golden_platform": self.golden_platform,
            "file": str(self.spec.file), "seconds": round(self.seconds, 4), "messages": self.messages,
            "diffs": [d.to_json() for d in self.diffs],
            "data_diff": self.data_diff, "notes": self.notes, "repro": self.repro,
            "located": [loc.to_json() for loc in self.located],
        }


def run_spec(spec: Spec, ctx: RunContext) -> Result:
    result = kinds.KINDS[spec.kind].run(spec, ctx)
    result.data = json_roundtrip(result.data)  # compare exactly what a manifest stores
    return result


def _run_and_expect(spec: Spec, ctx: RunContext) -> tuple[Result | None, list[str], str]:
    """(result, failed expectations, crash text): the spec run once and its expectations checked."""
    try:
        with torch.inference_mode():
            result = run_spec(spec, ctx)
        return result, kinds.KINDS[spec.kind].check(spec, result), ""
    except CaptureError as e:  # the engine reports a broken contract itself: a failure, not a crash
        return None, [f"the engine broke the capture contract: {e}"], ""
    except Exception as e:  # the implementation under test crashed: report, never propagate
        tb = traceback.format_exception(type(e), e, e.__traceback__, limit=-4)
        return None, [], "".join(tb).rstrip()


def check_spec(spec: Spec, ctx: RunContext, store: GoldenStore) -> Outcome:
    start = time.perf_counter()
    platform = kinds.KINDS[spec.kind].golden_platform(spec, ctx)
    out = Outcome(spec, PASS, platform, repro=repro_command(spec.id, ctx))
    result, failed, crash = _run_and_expect(spec, ctx)
    if crash:
        out.status, out.messages = CRASH, [crash]
    elif result is None:                       # a contract the engine checks itself was broken
        out.status, out.messages = FAILED, [f"expectation failed: {m}" for m in failed]
    else:
        out.messages = [f"expectation failed: {m}" for m in failed]
        out.notes += result.notes
        out.located += result.located
        try:
            golden = store.load(platform, spec.id)
        except CorruptGolden as e:
            out.status, out.messages = CORRUPT, out.messages + [f"corrupt golden: {e}"]
            golden = None
        if golden is None and out.status != CORRUPT:
            out.status = MISSING
        elif golden is not None:
            out.diffs = diff_tensors(golden.tensors, result.tensors)
            out.data_diff = diff_data(golden.data, result.data)
            if golden.manifest.get("spec_sha256") != spec.sha256:
                out.notes.append("the spec was edited after this golden was recorded")
            if out.diffs or out.data_diff:
                out.status = MISMATCH
                locate = getattr(kinds.KINDS[spec.kind], "locate_golden", None)
                where = locate(spec, golden.tensors, result.tensors) if locate and out.diffs else None
                out.located += [where] if where else []
                recorded = golden.manifest.get("provenance", {}).get("bit_dependencies")
                out.messages.append(dependency_report(recorded, platform))
        if failed and out.status in (PASS, MISSING):
            out.status = FAILED
    if out.status in (PASS, MISSING):
        out.repro = ""
    out.seconds = time.perf_counter() - start
    return out


# --------------------------------------------------------------------------- regeneration
NEW, CHANGED, UNCHANGED, REFUSED = "new", "changed", "unchanged", "refused"


@dataclass
class RegenOutcome:
    spec: Spec
    status: str
    golden_platform: str
    explanation: list[str] = field(default_factory=list)
    written: bool = False

    def report(self) -> str:
        lines = [f"{self.status:<9} {self.spec.id} ({self.golden_platform})" + ("  [written]" if self.written else "")]
        return "\n".join(lines + ["    " + line for e in self.explanation for line in e.splitlines()])


def _topologies_checked(spec: Spec, ctx: RunContext) -> list[dict]:
    """One device, plus the (tp, ep) pairs the spec itself lists; `--world-size` adds more at check time."""
    pairs = [(1, 1)] + [tuple(t) for t in spec.inputs.get("topologies") or []]
    return [{"world_size": tp * ep, "tp": tp, "ep": ep} for tp, ep in pairs]


def provenance(ctx: RunContext, spec: Spec, golden_platform: str) -> dict:
    return {
        "lockstep_revision": lockstep_revision(),
        **versions(),
        "device": device_name(ctx.platform),
        "platform": ctx.platform.name,
        "dtype_policy": ctx.platform.dtype,
        "backend": ctx.backend,
        "topologies": _topologies_checked(spec, ctx),
        "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "regen_command": repro_command(spec.id, ctx, "regen"),
        "bit_dependencies": bit_dependencies(golden_platform),
    }


def regen_spec(spec: Spec, ctx: RunContext, store: GoldenStore, write: bool = True) -> RegenOutcome:
    """Run twice; refuse unless both runs agree bitwise and every expectation holds; then write.

    A golden whose bits and spec hash are unchanged is left untouched, byte for byte.
    """
    platform = kinds.KINDS[spec.kind].golden_platform(spec, ctx)
    out = RegenOutcome(spec, REFUSED, platform)
    runs = []
    for attempt in ("first", "second"):
        result, failed, crash = _run_and_expect(spec, ctx)
        if crash:
            out.explanation = [f"the {attempt} run crashed:", crash]
            return out
        if failed:
            out.explanation = [f"expectation failed: {m}" for m in failed] + [loc.text() for loc in result.located]
            return out
        runs.append(result)
    twice = diff_tensors(runs[0].tensors, runs[1].tensors)
    data_twice = diff_data(runs[0].data, runs[1].data)
    if twice or data_twice:
        out.explanation = ["two runs disagree, so there is no golden to record (D1 run-to-run):"]
        out.explanation += [d.describe() for d in twice] + ([data_twice] if data_twice else [])
        locate = getattr(kinds.KINDS[spec.kind], "locate_golden", None)
        where = locate(spec, runs[0].tensors, runs[1].tensors, ("the first run", "the second run")) \
            if locate and twice else None
        out.explanation += [where.text()] if where else []
        return out
    new = runs[0]
    try:
        old = store.load(platform, spec.id)
    except CorruptGolden as e:
        old, out.explanation = None, [f"replacing a corrupt golden: {e}"]
    if old is None:
        out.status = NEW if not out.explanation else CHANGED
        out.explanation += [f"{name}: {t.dtype} {list(t.shape)}" for name, t in sorted(new.tensors.items())]
    else:
        changes = diff_tensors(old.tensors, new.tensors)
        data_change = diff_data(old.data, new.data)
        spec_edited = old.manifest.get("spec_sha256") != spec.sha256
        if not changes and not data_change and not spec_edited:
            out.status = UNCHANGED
            return out
        out.status = CHANGED
        out.explanation = [d.describe() for d in changes] + ([f"data:\n{data_change}"] if data_change else [])
        if spec_edited and not changes and not data_change:
            out.explanation.append("same bits; the spec text changed, so the manifest's spec hash is updated")
    if write:
        store.write(platform, spec.id, new.tensors, new.data, spec.sha256, spec.kind,
                    provenance(ctx, spec, platform))
        out.written = True
    return out
