"""A golden's tensors and data as text a reviewer reads (`lockstep show`, the git diff driver).

Every value is printed so that two different bit patterns never print the same: integers as
they are, floats as the shortest decimal that reads back to the same float of the tensor's dtype
(so -0.0 stays -0.0), a NaN always with its bits, and every float with its bits on request.
Tensors named `<name>_<i>` are grouped into a block per request `i`; a request's tokens and
logprobs of one length print as one line a step, so a diff shows which step moved.
"""

from __future__ import annotations

import json
import re
from collections import defaultdict

import numpy
import torch

from lockstep.harness.digest import tensor_sha256

MAX_SHOWN = 65536          # elements printed one by one; a larger tensor prints a digest per row
PER_LINE = 8               # values a line, for tensors that are not a request's steps
_SUFFIX = re.compile(r"^(.*)_(\d+)$")
_BITS_VIEW = {torch.float32: torch.int32, torch.float64: torch.int64, torch.bfloat16: torch.int16,
              torch.float16: torch.int16}


def _float_text(x: numpy.floating) -> str:
    """numpy's shortest round-trip decimal of the float32 or float64 value (bf16 and fp16 are
    widened to float32 first: exact, so still one text per value)."""
    return str(x)


def values_text(t: torch.Tensor, bits: bool = False) -> list[str]:
    """Each element of `t` (flattened) as text (module docstring)."""
    flat = t.detach().cpu().contiguous().reshape(-1)
    if not t.dtype.is_floating_point:
        return [str(v) for v in flat.tolist()]
    view = flat.view(_BITS_VIEW[t.dtype]).tolist() if t.dtype in _BITS_VIEW else None
    width = t.element_size() * 2
    if t.dtype in (torch.float32, torch.float64):
        nums = flat.numpy()
    else:
        nums = flat.to(torch.float32).numpy()
    out = []
    for i, x in enumerate(nums):
        text = _float_text(x)
        if view is not None and (bits or numpy.isnan(x)):
            text += f" (0x{view[i] & ((1 << (width * 4)) - 1):0{width}x})"
        out.append(text)
    return out


def _rows(t: torch.Tensor) -> list[torch.Tensor]:
    return [t.reshape(-1)] if t.dim() <= 1 else list(t.reshape(-1, t.shape[-1]))


def tensor_lines(name: str, t: torch.Tensor, bits: bool = False, full: bool = False) -> list[str]:
    """`name dtype [shape] sha256…`, then the values: PER_LINE a line, each row of a 2-D or higher
    tensor (its leading dimensions flattened) starting a line with its index."""
    head = f"{name}: {str(t.dtype).removeprefix('torch.')} {list(t.shape)} sha256 {tensor_sha256(t)[:16]}"
    lines = [head]
    if t.numel() > MAX_SHOWN and not full:
        lines.append(f"  ({t.numel()} elements: one digest a row; --full prints every value)")
        for r, row in enumerate(_rows(t)):
            lines.append(f"  [{r}] sha256 {tensor_sha256(row.clone())[:16]}")
        return lines
    for r, row in enumerate(_rows(t)):
        texts = values_text(row, bits)
        for start in range(0, max(len(texts), 1), PER_LINE):
            where = f"[{r}][{start}]" if t.dim() > 1 else f"[{start}]"
            lines.append(f"  {where} " + " ".join(texts[start:start + PER_LINE]))
    return lines


def _steps_lines(tokens: torch.Tensor, logprobs: torch.Tensor, bits: bool) -> list[str]:
    """A request's tokens and logprobs, one step a line."""
    lines = [f"steps: {tokens.numel()} (tokens sha256 {tensor_sha256(tokens)[:16]}, logprobs "
             f"{str(logprobs.dtype).removeprefix('torch.')} sha256 {tensor_sha256(logprobs)[:16]})"]
    for k, (tok, lp) in enumerate(zip(values_text(tokens), values_text(logprobs, bits))):
        lines.append(f"  step {k}: token {tok}  logprob {lp}")
    return lines


def group(tensors: dict[str, torch.Tensor]) -> tuple[dict[int, dict], dict]:
    """({request index: {base name: tensor}}, {name: tensor} of the rest)."""
    per_request: dict[int, dict] = defaultdict(dict)
    rest = {}
    for name, t in sorted(tensors.items()):
        m = _SUFFIX.match(name)
        if m:
            per_request[int(m.group(2))][m.group(1)] = t
        else:
            rest[name] = t
    return dict(sorted(per_request.items())), rest


def tensors_text(tensors: dict[str, torch.Tensor], bits: bool = False, full: bool = False) -> list[str]:
    per_request, rest = group(tensors)
    lines = []
    for i, block in per_request.items():
        lines.append(f"request {i}:")
        block = dict(block)
        toks, lps = block.get("tokens"), block.get("logprobs")
        if toks is not None and lps is not None and toks.dim() == lps.dim() == 1 and toks.numel() == lps.numel():
            lines += ["  " + line for line in _steps_lines(block.pop("tokens"), block.pop("logprobs"), bits)]
        for base, t in block.items():
            lines += ["  " + line for line in tensor_lines(f"{base}_{i}", t, bits, full)]
    if rest:
        lines.append("tensors:")
        for name, t in rest.items():
            lines += ["  " + line for line in tensor_lines(name, t, bits, full)]
    return lines


def data_lines(data: dict) -> list[str]:
    """The manifest's data, one key a line (a list of lists: one item a line), in sorted order."""
    lines = []
    for key in sorted(data):
        value = data[key]
        if isinstance(value, list) and value and all(isinstance(v, list) for v in value):
            lines.append(f"  {key}:")
            lines += [f"    [{i}] {json.dumps(v)}" for i, v in enumerate(value)]
        else:
            lines.append(f"  {key}: {json.dumps(value, sort_keys=True)}")
    return lines


def golden_text(golden, where: str, bits: bool = False, full: bool = False) -> str:
    """A loaded golden (harness.golden.Golden): its provenance line, its data, its tensors."""
    m = golden.manifest
    prov = m.get("provenance", {}) if isinstance(m.get("provenance"), dict) else {}
    lines = [f"{m.get('spec')} on {m.get('platform')} ({where})",
             f"  kind {m.get('kind')}; recorded {prov.get('created', '?')} at {prov.get('lockstep_revision', '?')} "
             f"on {prov.get('device', '?')} ({prov.get('dtype_policy', '?')}/{prov.get('backend', '?')}); "
             f"spec_sha256 {str(m.get('spec_sha256'))[:16]}"]
    if golden.data:
        lines += ["data:"] + data_lines(golden.data)
    lines += tensors_text(golden.tensors, bits, full)
    return "\n".join(lines)


def tensor_json(t: torch.Tensor) -> dict:
    out = {"dtype": str(t.dtype).removeprefix("torch."), "shape": list(t.shape), "sha256": tensor_sha256(t)}
    if t.numel() <= MAX_SHOWN:
        out["values"] = values_text(t)
        if t.dtype in _BITS_VIEW:
            width = t.element_size() * 2
            out["bits"] = [f"{b & ((1 << (width * 4)) - 1):0{width}x}"
                           for b in t.detach().cpu().contiguous().reshape(-1).view(_BITS_VIEW[t.dtype]).tolist()]
    return out
