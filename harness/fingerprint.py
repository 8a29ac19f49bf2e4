"""The CPU reference's fingerprint: a digest of every torch op it runs on fixed work (DESIGN §2, D0).

    python3 -m lockstep.harness.fingerprint            # JSON on stdout: one digest per section
    qemu-x86_64 -cpu EPYC-Rome "$(command -v python3)" -m lockstep.harness.fingerprint

D0 says the CPU reference gives the same bits on every x86-64 CPU. This module is what the
cross-CPU test runs natively and under emulated CPUs of other vendors and instruction sets
(tests/test_cross_cpu.py): the same Python, torch and numpy binaries, other CPUID answers, so
every library's own dispatch (MKL, SLEEF, oneDNN, numpy's SIMD) takes the path it would take
on that CPU. Equal fingerprints there are the proof; a capability switch on one machine is not.

Sections (each small enough to run in about a minute under the emulator):
- `primitives`: every op of kernels.portable on fixed inputs, special values included;
- `forward`, `forward-bf16`: one forward of the shipped tiny target on the torch backend, under
  the fp32 and the bf16 dtype policies;
- `generate`: a seeded batch of two requests with a top-k/top-p filter;
- `speculative`: a seeded speculative round (chain, target-only verify) with the tiny draft.
A section's digest hashes the output bits of every aten op in the order they ran (recorded by a
TorchDispatchMode, so no op the engine calls can hide), and `ops` counts them per op name; when
two fingerprints differ, `first` (the first op whose output differs, with its index) says where.
"""

from __future__ import annotations

import hashlib
import json
import math
import sys
from collections import Counter
from pathlib import Path

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from lockstep.engine.eagle3 import load_draft
from lockstep.engine.generate import Request, generate as run
from lockstep.engine.model import GptOssModel
from lockstep.engine.sampling import SamplingParams
from lockstep.engine.speculative import SpecParams, speculative_generate
from lockstep.kernels import portable
from lockstep.kernels.rmsnorm import rms_norm_portable

ROOT = Path(__file__).resolve().parent.parent
TARGET = ROOT / "models" / "tiny-target"
DRAFT = ROOT / "models" / "tiny-eagle3"


class OpRecorder(TorchDispatchMode):
    """Records (op name, digest of the output bytes) of every aten op while active.

    The digest is MD5's, cut to 64 bits as the trail keeps it: it tells two CPUs' outputs apart,
    which no adversary chooses, so a cryptographic hash buys nothing here, and under qemu (every
    SIMD instruction of OpenSSL's SHA-256 emulated) SHA-256 cost ~5 s of each emulated CPU's
    fingerprint for its ~220 MB of outputs, MD5 (scalar) ~1 s."""

    @classmethod
    def _should_skip_dynamo(cls) -> bool:
        """No torch.compile runs under the recorder, so its hook need not be wrapped to keep
        Dynamo out: the wrapper's first call imports torch._dynamo (~11 s under qemu, tests/
        test_cross_cpu.py) and every later call pays its frames."""
        return False

    def __init__(self):
        super().__init__()
        self.ops: list[tuple[str, str]] = []
        self.nan_to_bf16 = 0        # casts of a NaN to bf16: their bits follow the CPU (see below)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        name, skip, special = _KINDS.get(func) or _kind(func)
        if special:
            name = self._special(name, args, out)
        if skip:
            return out              # no bits of its own: a view's are hashed where they are written
        h = hashlib.md5(usedforsecurity=False)
        for t in (out,) if type(out) is torch.Tensor else _tensors(out):
            if t.layout == torch.strided and t.is_cpu:
                h.update(_TAGS.get(t.dtype) or _tag(t.dtype))
                if t.numel():
                    h.update(_bytes(t))
        self.ops.append((name, h.hexdigest()[:16]))
        return out

    def _special(self, name: str, args, out) -> str:
        """An integer sum's name; a cast to bf16 counted when its source holds a NaN."""
        if name == "sum":
            if args and isinstance(args[0], torch.Tensor) and not args[0].is_floating_point():
                return "sum.integer"    # a count: exact in any order (a float sum stays "sum")
        elif isinstance(out, torch.Tensor) and out.dtype == torch.bfloat16:
            src = next((a for a in args[::-1] if isinstance(a, torch.Tensor) and a.is_floating_point()
                        and a.dtype != torch.bfloat16), None)
            if src is not None and bool(torch.isnan(src).any()):
                self.nan_to_bf16 += 1
        return name


# The hook runs ~40,000 times a fingerprint, each step paid ten times over under qemu (tests/
# test_cross_cpu.py): what can be worked out once per overload or dtype is kept here.
_UNINITIALISED = {"empty", "new_empty", "empty_like", "empty_strided", "set_"}
_CASTS = ("_to_copy", "to", "copy_")
_KINDS: dict = {}
_TAGS: dict = {}


def _kind(func) -> tuple[str, bool, bool]:
    """(op name, whether it has no bits of its own, whether `_special` looks at it)."""
    name = str(func.overloadpacket.__name__)
    kind = _KINDS[func] = (name, name in _UNINITIALISED or _is_view(func), name == "sum" or name in _CASTS)
    return kind


def _tag(dtype) -> bytes:
    tag = _TAGS[dtype] = str(dtype).encode()
    return tag


def _bytes(t: torch.Tensor):
    """The tensor's elements in row-major order, as a buffer of raw bytes (a dense tensor's own
    memory, read in place; any other layout copied into a dense one first)."""
    flat = t.detach()
    if not flat.is_contiguous() or flat.is_conj() or flat.is_neg():
        flat = torch.empty(t.numel(), dtype=t.dtype).copy_(flat.reshape(-1))
    if flat.dtype in _NUMPY:
        return flat.numpy()                         # C-contiguous: its bytes are the elements in order
    return flat.reshape(-1).view(torch.uint8).numpy()


_NUMPY = {torch.float64, torch.float32, torch.float16, torch.int64, torch.int32, torch.int16,
          torch.int8, torch.uint8, torch.bool}


def _is_view(func) -> bool:
    """An op whose outputs alias an input without writing it (select, view, transpose, ...)."""
    returns = func._schema.returns
    return bool(returns) and all(r.alias_info is not None and not r.alias_info.is_write for r in returns)


def _tensors(out):
    if isinstance(out, torch.Tensor):
        yield out
    elif isinstance(out, (tuple, list)):
        for o in out:
            yield from _tensors(o)


def _section(fn) -> dict:
    rec = OpRecorder()
    with rec:
        fn()
    chain = hashlib.sha256()
    for name, h in rec.ops:
        chain.update(f"{name}:{h};".encode())
    return {"digest": chain.hexdigest(), "ops": dict(sorted(Counter(n for n, _ in rec.ops).items())),
            "nan_to_bf16": rec.nan_to_bf16,
            "trail": [f"{n}:{h}" for n, h in rec.ops]}


def _primitive_inputs() -> torch.Tensor:
    """float64 inputs: special values, subnormals, powers of two and their neighbours, and a
    fixed pseudo-random spread over every exponent (integer draws: the same on every CPU)."""
    special = [0.0, -0.0, math.inf, -math.inf, math.nan, 5e-324, -5e-324, 2.2250738585072014e-308,
               1.7976931348623157e308, 1.0, -1.0, 0.5, 2.0, 3.0, 1e-45, 1.401298464324817e-45,
               1.1754943508222875e-38, 3.4028234663852886e38, 0.1, -0.1, 709.78, -745.1, 88.7, -103.9]
    g = torch.Generator().manual_seed(2026)
    bits = torch.randint(0, 2 ** 62, (1536,), generator=g, dtype=torch.int64)
    spread = (bits ^ (torch.randint(0, 2, (1536,), generator=g, dtype=torch.int64) << 63)).view(torch.float64)
    moderate = torch.rand(1536, generator=g, dtype=torch.float64) * 64.0 - 32.0
    return torch.cat([torch.tensor(special, dtype=torch.float64), spread, moderate])


def primitives() -> None:
    x64 = _primitive_inputs()
    x32 = x64.to(torch.float32)
    pos64, pos32 = x64.abs(), x32.abs()
    for x in (x32, x64):
        portable.sqrt(x.abs())
        portable.exp(x.clamp(-700, 700))
        portable.log(x.abs())
        portable.sigmoid(x.clamp(-700, 700))
        portable.sincos64(x.to(torch.float64).clamp(-1e6, 1e6))
    fin32 = torch.nan_to_num(x32, nan=0.0, posinf=1.0, neginf=-1.0).clamp(-1e4, 1e4)
    portable.tree_sum(fin32[:7 * 400].reshape(-1, 7)[:, :5])
    portable.prefix_sum(fin32[:130])
    portable.running_sum(fin32[:130])
    portable.softmax(fin32[:29 * 100].reshape(-1, 29))
    portable.log_softmax(fin32[:29 * 100].reshape(-1, 29))
    rms_norm_portable(fin32[:29 * 100].reshape(-1, 29), fin32[:29], 1e-5)
    portable.matmul_nt(fin32[:6 * 29].reshape(6, 29), fin32[29:29 + 5 * 29].reshape(5, 29))
    portable.normal((4, 333), torch.Generator().manual_seed(7))
    # torch's float32 -> bf16 cast writes 0xFFFF for a NaN in its AVX-512 body and 0x7FC0 in its
    # scalar code: a NaN's bf16 bits follow the CPU. The reference never casts a NaN to bf16
    # (`nan_to_bf16` counts it; tests/test_primitive_oracle.py holds it at 0), so the digest
    # takes the cast on every other value.
    x32[~torch.isnan(x32)].to(torch.bfloat16).to(torch.float32)
    torch.mul(pos32, pos32), torch.div(x64, pos64), torch.add(x32, 1.0)


def _target(dtype: str = "fp32"):
    return GptOssModel.from_checkpoint(TARGET, backend="torch", device="cpu", dtype=dtype)


def forward(dtype: str = "fp32") -> None:
    model = _target(dtype)
    tokens = torch.tensor([1, 5, 9, 2, 7, 3, 11, 4], dtype=torch.int64)
    cache = model.new_cache(1, 16)
    model.forward(tokens, torch.arange(len(tokens)), torch.zeros(len(tokens), dtype=torch.int64), cache)


def generate() -> None:
    model = _target()
    params = SamplingParams(temperature=0.8, top_k=20, top_p=0.9, max_new_tokens=3)
    run(model, [Request([1, 2, 3, 4], params, seed=11), Request([9, 8, 7], params, seed=12)])


def speculative() -> None:
    model = _target()
    draft = load_draft(DRAFT, model, convention="sglang")
    params = SamplingParams(temperature=1.0, max_new_tokens=3)
    speculative_generate(model, draft, [Request([1, 2, 3, 4, 5], params, seed=5)],
                         SpecParams(num_steps=2, topk=1, draft_token_num=3))


SECTIONS = {"primitives": primitives, "forward": forward, "forward-bf16": lambda: forward("bf16"),
            "generate": generate, "speculative": speculative}


def fingerprint(sections=tuple(SECTIONS)) -> dict:
    torch.set_num_threads(1)
    out = {"torch": torch.__version__, "sections": {}}
    for name in sections:
        out["sections"][name] = _section(SECTIONS[name])
    return out


def ops_called(fp: dict) -> set[str]:
    """Every computing aten op a fingerprint saw (views and uninitialised allocations excepted)."""
    return {name for s in fp["sections"].values() for name in s["ops"]}


def first_difference(a: dict, b: dict) -> str | None:
    """'forward: op 123 (div) differs' for the first differing op of the first differing section."""
    for name, sa in a["sections"].items():
        sb = b["sections"].get(name)
        if sb is None:
            return f"{name}: missing on one side"
        if sa["digest"] == sb["digest"]:
            continue
        for i, (x, y) in enumerate(zip(sa["trail"], sb["trail"])):
            if x != y:
                return f"{name}: op {i} ({x.split(':')[0]} vs {y.split(':')[0]}) is the first whose output differs"
        return f"{name}: {len(sa['trail'])} vs {len(sb['trail'])} ops"
    return None


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    sections = argv or list(SECTIONS)
    unknown = [s for s in sections if s not in SECTIONS]
    if unknown:
        print(f"lockstep.harness.fingerprint: unknown section(s) {unknown}; choose from {list(SECTIONS)}", file=sys.stderr)
        return 2
    json.dump(fingerprint(sections), sys.stdout)
    print()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
