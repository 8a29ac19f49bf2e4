"""Running specs: check one against its golden, or regenerate its golden safely.

Both the CLI and the pytest plugin go through `check_spec` and `regen_spec`, so the two
can never disagree on what passes or on what is written.
"""

from __future__ import annotations

import shlex
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

import torch

from lockstep.engine.boundaries import CaptureError
from lockstep.harness import kinds
from lockstep.harness.compare import TensorDiff, diff_data, diff_tensors
from lockstep.harness.errors import full_traceback, located
from lockstep.harness.golden import CorruptGolden, GoldenStore, json_roundtrip, standard
from lockstep.harness.moved import moved
from lockstep.harness.pairs import runs_the_engine
from lockstep.harness.platform import (bit_dependencies, dependency_report, device_name, dirty_paths,
                                       lockstep_revision, versions)
from lockstep.harness.result import SpecResult, RunContext
from lockstep.harness.selfcheck import SelfCheckFailed, verify  # noqa: F401 - SelfCheckFailed is re-exported
from lockstep.harness.specfile import Spec
from lockstep.harness.targets.lockstep import engine
from lockstep.kernels import compile_time
from lockstep.kernels.compile_time import Tally

# Outcome statuses, and the exit code each one earns `lockstep check` (DESIGN of the CLI).
# STALE: the bits match, but the golden was recorded for another version of the spec (--strict).
# INCOMPARABLE: the golden holds another Triton's bits (GoldenStore.other_triton): not run.
PASS, MISMATCH, FAILED, CRASH, CORRUPT, MISSING, STALE = ("pass", "mismatch", "failed", "crash", "corrupt",
                                                          "missing", "stale")
INCOMPARABLE = "incomparable"
FAILING = (MISMATCH, FAILED, CRASH, CORRUPT, STALE)
STATUSES = (PASS, MISMATCH, FAILED, CRASH, CORRUPT, STALE, MISSING, INCOMPARABLE)


def repro_command(spec_id: str, ctx: RunContext, verb: str = "diff", specs: Path | None = None,
                  golden: Path | None = None, pair: bool = False) -> str:
    """The command that reruns one spec as this run did; `specs` / `golden` are named when they
    are not the defaults (./specs, ./golden); `pair`: name the dtype policy and the backend even
    when they are the defaults (without both, a spec runs under every pair: harness/pairs)."""
    args = ["lockstep", verb, spec_id]
    for flag, path, default in (("--specs", specs, "specs"), ("--golden", golden, "golden")):
        if path is not None and Path(path).resolve() != Path(default).resolve():
            args += [flag, str(path)]
    if ctx.platform.device != "cpu":
        args += ["--device", "cuda"]
    if pair or ctx.platform.dtype != "fp32":
        args += ["--dtype", ctx.platform.dtype]
    if pair or ctx.backend != "torch":
        args += ["--backend", ctx.backend]
    if ctx.world_sizes:
        args += ["--world-size", ",".join(map(str, ctx.world_sizes))]
    return shlex.join(args)


def _pair_flags(pair: str) -> str:
    """' --dtype D --backend B' for a pair other than the default fp32/torch: a bare `regen ID` records
    only the pairs the spec supports here, which need not hold the one a check asked for."""
    dtype, _, backend = pair.partition("/")
    return "" if pair in ("", "fp32/torch") else f" --dtype {dtype} --backend {backend}"


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
    warnings: list[str] = field(default_factory=list)  # shown even for a pass; may fail under --strict
    located: list = field(default_factory=list)  # harness.locate.Located: where runs first part
    repro: str = ""
    traceback: str = ""  # of a crash: shown with --debug (and by pytest)
    stale_golden: bool = False  # recorded for another version of the spec (its spec_sha256 differs)
    pair: str = ""  # "fp32/torch": the dtype policy and backend it ran under (harness/pairs)
    compile: Tally | None = None  # Triton's compiles while it ran (kernels/compile_time.py); None: not measured

    def report(self, debug: bool = False) -> str:
        """The text a person reads when this spec did not pass (a crash's traceback with `debug`)."""
        s = self.spec
        head = f"{s.id} ({s.file}:{s.line_of('kind')}) on {self.golden_platform}: {self.status.upper()}"
        lines = [head]
        if self.status == MISSING:
            lines.append(f"  no golden yet; record one with: lockstep regen {shlex.quote(s.id)}{_pair_flags(self.pair)}")
        for m in self.messages:
            lines += ["  " + line for line in m.splitlines()]
        if self.traceback and debug:
            lines += ["  " + line for line in self.traceback.splitlines()]
        for d in self.diffs:
            lines += ["  " + line for line in d.describe().splitlines()]
        if self.data_diff:
            lines.append("  data differs from the golden:")
            lines += ["    " + line for line in self.data_diff.splitlines()]
        for loc in self.located:
            lines += ["  " + line for line in loc.text().splitlines()]
        lines += ["  " + w for w in self.warnings]
        lines += ["  note: " + n for n in self.notes]
        if self.repro:
            more = " --debug" if self.traceback and not debug else ""
            lines.append(f"  reproduce: {self.repro}{more}")
        return "\n".join(lines)

    def to_json(self) -> dict:
        return {
            "id": self.spec.id, "kind": self.spec.kind, "status": self.status, "golden_platform": self.golden_platform,
            "file": str(self.spec.file), "seconds": round(self.seconds, 4), "messages": self.messages,
            "diffs": [d.to_json() for d in self.diffs],
            "data_diff": self.data_diff, "warnings": self.warnings, "notes": self.notes, "repro": self.repro,
            "located": [loc.to_json() for loc in self.located],
            "traceback": self.traceback, "stale_golden": self.stale_golden, "pair": self.pair,
        } | ({"compile_seconds": round(self.compile.seconds + self.compile.load_seconds, 4)} if self.compile else {})


def self_check() -> None:
    """SelfCheckFailed unless the comparator and golden loader that `check_spec` uses give the right
    verdict on known pairs (-0.0 vs 0.0, NaN payloads, adjacent floats, a golden of another platform):
    a judge that called them equal or valid would pass every spec (harness/selfcheck.py)."""
    verify(diff_tensors, diff_data, GoldenStore, CorruptGolden)


def run_spec(spec: Spec, ctx: RunContext) -> SpecResult:
    """The spec's kind run on Lockstep's engine, the default target (harness/targets/lockstep.py)."""
    result = kinds.KINDS[spec.kind].run(spec, ctx, engine(ctx))
    result.tensors = {name: standard(t) for name, t in result.tensors.items()}  # what a golden stores
    result.data = json_roundtrip(result.data)  # compare exactly what a manifest stores
    return result


@dataclass
class Crash:
    """An exception of the code under test: one located line, and the traceback for --debug."""

    summary: str
    traceback: str

    @classmethod
    def of(cls, e: BaseException, what: str = "crashed") -> "Crash":
        return cls(f"{what}: {located(e)}", full_traceback(e))


def _run_and_expect(spec: Spec, ctx: RunContext) -> tuple[SpecResult | None, list[str], Crash | None]:
    """(result, failed expectations, crash): the spec run once and its expectations checked."""
    try:
        with torch.inference_mode():
            result = run_spec(spec, ctx)
        return result, kinds.KINDS[spec.kind].check(spec, result), None
    except CaptureError as e:  # the engine reports a broken contract itself: a failure, not a crash
        return None, [f"the engine broke the capture contract: {e}"], None
    except Exception as e:  # the implementation under test crashed: report, never propagate
        return None, [], Crash.of(e)


def check_spec(spec: Spec, ctx: RunContext, store: GoldenStore, strict: bool = False) -> Outcome:
    """Run the spec and compare it with its golden. `strict`: a golden recorded for another version
    of the spec fails (STALE) even when its bits match."""
    start = time.perf_counter()
    measured = compile_time.mode() == "compiled"
    compiled_before = compile_time.snapshot()
    platform = kinds.KINDS[spec.kind].golden_platform(spec, ctx)
    out = Outcome(spec, PASS, platform, repro=repro_command(spec.id, ctx, specs=_specs_dir(spec), golden=store.root,
                                                           pair=runs_the_engine(spec, ctx.platform.device)),
                  pair=f"{ctx.platform.dtype}/{ctx.backend}")
    other = store.other_triton(platform, spec.id, versions()["triton"])
    if other:                                  # neither a pass nor a mismatch: say which versions
        out.status, out.messages, out.repro = INCOMPARABLE, [other], ""
        return out
    result, failed, crash = _run_and_expect(spec, ctx)
    if crash:
        out.status, out.messages, out.traceback = CRASH, [crash.summary], crash.traceback
    elif result is None:                       # a contract the engine checks itself was broken
        out.status, out.messages = FAILED, [f"expectation failed: {m}" for m in failed]
    else:
        try:
            _compare(out, result, failed, store, strict)
        except Exception as e:  # noqa: BLE001 - a bug of the comparison must not stop the other specs
            crash = Crash.of(e, "comparing with the golden failed (a bug in lockstep, please report it)")
            out.status, out.messages, out.traceback = CRASH, [crash.summary], crash.traceback
    if out.status in (PASS, MISSING):
        out.repro = ""
    out.seconds = time.perf_counter() - start
    if measured:
        compile_time.settle()                  # a compile that raised must not keep other processes waiting
        out.compile = compile_time.snapshot().since(compiled_before)
    return out


def current_for(manifest: dict, spec: Spec) -> bool:
    """Whether a golden was recorded for this version of the spec: its spec_sha256 is the hash of
    what a run reads (content_sha256, written since 0.3) or, for goldens recorded earlier, of the
    whole parsed document (sha256); so an edit of the description alone leaves it current."""
    return manifest.get("spec_sha256") in (spec.content_sha256, spec.sha256)


def _specs_dir(spec: Spec) -> Path:
    """The spec directory a spec was loaded from (its file, one level up per part of its id)."""
    file = Path(spec.file)
    return file.parents[len(spec.id.split("/")) - 1] if file.name else file


def _compare(out: Outcome, result: SpecResult, failed: list[str], store: GoldenStore, strict: bool) -> None:
    spec = out.spec
    out.messages = [f"expectation failed: {m}" for m in failed]
    out.notes += result.notes
    out.located += result.located
    try:
        golden = store.load(out.golden_platform, spec.id)
    except CorruptGolden as e:
        out.status, out.messages = CORRUPT, out.messages + [
            f"corrupt golden: {e}",
            f"if the spec is right, `lockstep regen {shlex.quote(spec.id)}` records a new golden in its place "
            f"(review the change before committing it)"]
        return
    if golden is None:
        out.status = FAILED if failed else MISSING
        return
    out.diffs = diff_tensors(golden.tensors, result.tensors)
    out.data_diff = diff_data(golden.data, result.data)
    recorded_for = str(golden.manifest.get("spec_sha256"))
    out.stale_golden = not current_for(golden.manifest, spec)
    if out.diffs or out.data_diff:
        out.status = MISMATCH
        locate = getattr(kinds.KINDS[spec.kind], "locate_golden", None)
        where = locate(spec, golden.tensors, result.tensors) if locate and out.diffs else None
        out.located += [where] if where else []
        recorded = golden.manifest.get("provenance", {}).get("bit_dependencies")
        out.messages.append(dependency_report(recorded, out.golden_platform))
    elif failed:
        out.status = FAILED
    elif out.stale_golden:
        out.status = STALE if strict else PASS
    if out.stale_golden:
        out.warnings.append(f"golden may be stale: it was recorded for another version of this spec (spec_sha256 "
                            f"{recorded_for[:12]}…, the spec is now {spec.content_sha256[:12]}…); review the spec's change "
                            f"and record it again with: lockstep regen {shlex.quote(spec.id)}"
                            + ("" if strict else " (check --strict fails on this)"))


# --------------------------------------------------------------------------- regeneration
NEW, CHANGED, UNCHANGED, REFUSED = "new", "changed", "unchanged", "refused"


@dataclass
class RegenOutcome:
    spec: Spec
    status: str
    golden_platform: str
    explanation: list[str] = field(default_factory=list)
    written: bool = False
    traceback: str = ""  # of a crash: shown with --debug (and by pytest)
    moved: object = None  # harness.moved.Moved of a CHANGED golden: what a reviewer reads first

    def report(self, debug: bool = False) -> str:
        lines = [f"{self.status:<9} {self.spec.id} ({self.golden_platform})" + ("  [written]" if self.written else "")]
        lines += ["    " + line for e in self.explanation for line in e.splitlines()]
        if self.traceback and debug:
            lines += ["    " + line for line in self.traceback.splitlines()]
        return "\n".join(lines)


def _topologies_checked(spec: Spec, ctx: RunContext) -> list[dict]:
    """One device, plus the (tp, ep) pairs the spec itself lists; `--world-size` adds more at check time."""
    pairs = [(1, 1)] + [tuple(t) for t in spec.inputs.get("topologies") or []]
    return [{"world_size": tp * ep, "tp": tp, "ep": ep} for tp, ep in pairs]


def provenance(ctx: RunContext, spec: Spec, golden_platform: str) -> dict:
    return {
        "lockstep_revision": lockstep_revision(),
        **({"dirty_paths": dirty} if (dirty := dirty_paths()) else {}),
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
            out.explanation = [f"the {attempt} run {crash.summary}"]
            out.traceback = crash.traceback
            return out
        if failed:
            out.explanation = [f"expectation failed: {m}" for m in failed]
            out.explanation += [loc.text() for loc in result.located] if result is not None else []
            return out
        runs.append(result)
    twice = diff_tensors(runs[0].tensors, runs[1].tensors)
    data_twice = diff_data(runs[0].data, runs[1].data)
    if twice or data_twice:
        out.explanation = ["two runs disagree, so there is no golden to record (D1 run-to-run):"]
        out.explanation += [d.describe() for d in twice] + ([data_twice] if data_twice else [])
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
        spec_edited = not current_for(old.manifest, spec)
        if not changes and not data_change and not spec_edited:
            out.status = UNCHANGED
            return out
        out.status = CHANGED
        out.moved = moved(old.tensors, new.tensors, changes, old.data, new.data)
        out.explanation = [d.describe() for d in changes] + ([f"data:\n{data_change}"] if data_change else [])
        if spec_edited and not changes and not data_change:
            out.explanation.append("same bits; the spec text changed, so the manifest's spec hash is updated")
    if write:
        try:
            store.write(platform, spec.id, new.tensors, new.data, spec.content_sha256, spec.kind,
                        provenance(ctx, spec, platform))
        except OSError as e:  # e.g. a folder where the golden file should be, or a read-only golden/
            out.status = REFUSED
            out.explanation.append(f"cannot write the golden: {e.strerror or e}: {e.filename or store.root}")
            return out
        out.written = True
    return out
