"""What a trace was recorded on, and the refusal when a replay is not on the same thing.

A checkpoint is named by the sha256 of its config (canonical JSON) and of every weight tensor's
raw bytes (dtype and shape included), read straight from its safetensors files: two folders are
the same checkpoint exactly when these agree, whatever the files are called or how they are sharded.
A platform is harness.platform's key plus what its bits depend on besides Lockstep's code.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import torch
from safetensors import safe_open

from lockstep.harness.platform import bit_dependencies, detect
from lockstep.harness.replay.format import TraceError, canonical


def checkpoint_identity(folder: str | Path) -> dict:
    """{"config_sha256", "tensors": {name: sha256}, "sha256": over both} of a checkpoint folder."""

    folder = Path(folder)
    try:
        config = json.loads((folder / "config.json").read_text())
    except (OSError, ValueError) as e:
        raise TraceError(f"{folder}: cannot read config.json ({e})") from None
    tensors = {}
    files = sorted(folder.glob("*.safetensors"))
    if not files:
        raise TraceError(f"{folder}: no .safetensors files")
    for file in files:
        with safe_open(str(file), framework="pt") as f:
            for name in f.keys():
                t = f.get_tensor(name).contiguous()
                h = hashlib.sha256(f"{t.dtype}{list(t.shape)}".encode())
                h.update(t.reshape(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b"")
                tensors[name] = h.hexdigest()
    cfg = hashlib.sha256(canonical(config)).hexdigest()
    whole = hashlib.sha256(canonical({"config": cfg, "tensors": tensors})).hexdigest()
    return {"config_sha256": cfg, "tensors": dict(sorted(tensors.items())), "sha256": whole}


def check_checkpoint(recorded: dict, folder: str | Path, what: str = "checkpoint") -> None:
    """TraceError unless `folder` is the checkpoint `recorded` (a checkpoint_identity) names."""
    here = checkpoint_identity(folder)
    if here["sha256"] == recorded.get("sha256"):
        return
    rec_t = recorded.get("tensors", {})
    differ = sorted(n for n in set(rec_t) | set(here["tensors"]) if rec_t.get(n) != here["tensors"].get(n))
    cfg = "" if here["config_sha256"] == recorded.get("config_sha256") else "its config differs; "
    first = f", first {differ[0]}" if differ else ""
    raise TraceError(f"the trace was recorded on another {what} than {folder}: {cfg}{len(differ)} of "
                     f"{len(set(rec_t) | set(here['tensors']))} weight tensors differ{first}")


def platform_identity(dtype: str, backend: str, device: str = "cpu") -> dict:
    """The platform (device kind + dtype policy), the golden folder of (platform, backend) and
    what that folder's bits depend on here (harness.platform)."""

    name = detect(device, dtype).name
    golden = name + ("-triton" if backend == "triton" else "")
    return {"name": name, "golden_platform": golden, "bit_dependencies": bit_dependencies(golden)}


def check_platform(recorded: dict, here: dict) -> None:
    """TraceError unless this replay runs on the recorded platform (another backend of it is
    fine: the verdicts say whether its bits agree); on the same golden platform, every recorded
    bit dependency must match this machine's."""
    if recorded.get("name") != here["name"]:
        raise TraceError(f"the trace was recorded on platform {recorded.get('name')}, this replay runs on "
                         f"{here['name']}: bits are comparable only on one platform")
    if recorded.get("golden_platform") != here["golden_platform"]:
        return
    rec, now = recorded.get("bit_dependencies", {}), here["bit_dependencies"]
    differ = sorted(k for k in set(rec) | set(now) if rec.get(k) != now.get(k))
    if differ:
        k = differ[0]
        raise TraceError(f"the trace's platform {here['golden_platform']} depended on {k} "
                         f"{rec.get(k, '(none)')}; this machine has {now.get(k, '(none)')}")
