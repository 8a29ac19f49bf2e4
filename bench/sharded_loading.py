"""One rank's memory when it loads its share of a checkpoint (engine.rank_weights), at TP 1 / 2 / 4
and EP 2 / 4, as ratios to TP 1.

Each topology's rank 0 is built in a fresh process (`load_rank`, GptOssModel on --device, then
`as_rank`; no process group is needed to hold the weights): its peak host memory is the process's
peak RSS (VmHWM) above its RSS after the imports once every weight has been read (safetensors maps
the file: a weight taken as stored is resident only once used), its device memory torch's peak allocation (CUDA only),
and `held` is engine.rank_weights.held_bytes, what memory_problem counts. The target: a ratio of
about 1/N plus the replicated share (norms, router, the biases; under EP also attention, the
embedding and lm_head, which every EP group holds whole).

    python3 bench/sharded_loading.py                         # 20b width (MXFP4), 2 layers, bf16 policy
    python3 bench/sharded_loading.py --layers 4 --dtype fp32
    python3 bench/sharded_loading.py --checkpoint DIR        # any checkpoint, e.g. `lockstep make-checkpoint`'s
    python3 bench/sharded_loading.py --device cuda           # device memory too

Without --checkpoint the script writes a gpt-oss-20b-width checkpoint cut to --layers layers into a
temporary folder, in the layout `lockstep make-checkpoint --format mxfp4` writes, with
bench/e2e.py's random weights (make-checkpoint's portable normals take ~2.5 s a million values on a
small CPU: hours at this width; the values do not change what a rank holds). --before adds the old
path at TP 2 (every rank read the whole checkpoint, decoded MXFP4 to fp32, then sharded).
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

TOPOLOGIES = [(1, 1), (2, 1), (4, 1), (1, 2), (1, 4)]
GIB = 1 << 30


def write_checkpoint(out: Path, layers: int) -> Path:
    """A 20b-width MXFP4 checkpoint of `layers` layers (random weights), in two shards."""
    sys.path.insert(0, str(ROOT / "bench"))
    from e2e import random_weights
    from safetensors.torch import save_file

    from lockstep.engine.checkpoint import INDEX_FILE, write_folder_atomically
    from lockstep.engine.config import MXFP4_QUANTIZATION_CONFIG, preset
    full = preset("gpt-oss-20b")
    config = full.replace(num_hidden_layers=layers, layer_types=full.layer_types[:layers],
                          quantization_config=dict(MXFP4_QUANTIZATION_CONFIG))
    floats, packed = random_weights(config, "cpu")
    tensors = {**floats, **packed}
    names = sorted(tensors)
    halves = [names[: len(names) // 2], names[len(names) // 2:]]
    files = [f"model-0000{i + 1}-of-00002.safetensors" for i in range(2)]

    def write(tmp: Path) -> None:
        for part, fname in zip(halves, files):
            save_file({n: tensors[n] for n in part}, str(tmp / fname), metadata={"format": "pt"})
        index = {"metadata": {}, "weight_map": {n: files[i] for i, part in enumerate(halves) for n in part}}
        (tmp / INDEX_FILE).write_text(json.dumps(index, indent=2, sort_keys=True) + "\n")
        (tmp / "config.json").write_text(json.dumps(config.to_hf_dict(), indent=2, sort_keys=True) + "\n")

    return write_folder_atomically(out, write)


def _rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * resource.getpagesize()


def _peak_rss() -> int:
    """This process's peak RSS (VmHWM: its own address space's; ru_maxrss keeps the parent's peak
    across fork and exec)."""
    with open("/proc/self/status") as f:
        line = next(ln for ln in f if ln.startswith("VmHWM:"))
    return int(line.split()[1]) * 1024


def measure_rank(ckpt: str, tp: int, ep: int, dtype: str, device: str, before: bool) -> dict:
    """In this (fresh) process: build rank 0 of tp x ep -> its memory figures."""
    import types

    import torch

    from lockstep.engine import parallel
    from lockstep.engine.distributed import Topology
    from lockstep.engine.model import GptOssModel
    from lockstep.engine.rank_weights import held_bytes, load_rank
    topology = Topology(tp, ep)
    ctx = types.SimpleNamespace(topology=topology, rank=0, tp=tp, ep=ep, tp_rank=0, ep_rank=0,
                                device=torch.device(device))
    base = _rss()
    if before:                                   # the old path: the whole checkpoint, then shard
        from lockstep.engine.checkpoint import load_checkpoint
        config, weights = load_checkpoint(ckpt)
        model = parallel.shard(GptOssModel(config, weights, dtype=dtype), ctx)
    else:
        config, weights = load_rank(ckpt, topology, 0, windows=device == "cpu")
        model = parallel.as_rank(GptOssModel(config, weights, device=device, dtype=dtype), ctx)
    del weights
    for t in _held_tensors(model):          # every page read once: a weight still mapped from the file
        t.view(torch.uint8).max()           # (read lazily by safetensors) counts once it is used
    peak_host = _peak_rss() - base
    dev = torch.cuda.max_memory_allocated() if device == "cuda" else None
    assert model.comm is not None
    return {"host": peak_host, "device": dev,
            "held": held_bytes(ckpt, topology, 0, dtype, windows=device == "cpu")}


def _held_tensors(model):
    yield from (model.embed, model.lm_head, model.norm)
    for b in model.blocks:
        yield from (b.attn.qkv_w, b.attn.qkv_b, b.attn.o_w, b.attn.o_b, b.attn.norm, b.attn.sinks)
        for w in (b.mlp.held.gate_up_w, b.mlp.held.down_w):
            yield from ((w.blocks, w.scales) if hasattr(w, "blocks") else (w,))
        yield from (b.mlp.held.gate_up_b, b.mlp.down_b, b.mlp.norm, b.mlp.router_w, b.mlp.router_b)


def _child(args) -> dict:
    cmd = [sys.executable, __file__, "--child", args.checkpoint, str(args.tp), str(args.ep), args.dtype,
           args.device, "1" if args.before_child else "0"]
    out = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT)
    if out.returncode:
        lines = out.stderr.strip().splitlines() or ["(no output)"]
        return {"error": lines[-1][:150]}
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        ckpt, tp, ep, dtype, device, before = sys.argv[2:8]
        print(json.dumps(measure_rank(ckpt, int(tp), int(ep), dtype, device, before == "1")))
        return
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--checkpoint", help="a checkpoint folder (default: write a 20b-width one)")
    ap.add_argument("--layers", type=int, default=2, help="layers of the written checkpoint (default 2)")
    ap.add_argument("--dtype", choices=["bf16", "fp32"], default="bf16", help="dtype policy (default bf16)")
    ap.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    ap.add_argument("--before", action="store_true", help="also the old whole-checkpoint path at TP 2")
    args = ap.parse_args()
    tmp = None
    if args.checkpoint is None:
        tmp = tempfile.TemporaryDirectory(prefix="lockstep-sharded-")
        args.checkpoint = str(write_checkpoint(Path(tmp.name) / "ckpt", args.layers))
    disk = sum(f.stat().st_size for f in Path(args.checkpoint).glob("*.safetensors"))
    print(f"checkpoint {args.checkpoint}: {disk / GIB:.2f} GiB on disk; policy {args.dtype}, device {args.device}")
    print(f"{'topology':<14}{'host peak GiB':>14}{'ratio':>8}{'held GiB':>10}{'ratio':>8}{'device GiB':>12}")
    rows, first = [(tp, ep, False) for tp, ep in TOPOLOGIES] + ([(2, 1, True)] if args.before else []), None
    for tp, ep, before in rows:
        args.tp, args.ep, args.before_child = tp, ep, before
        r = _child(args)
        name = f"tp={tp} ep={ep}" + (" old" if before else "")
        if "error" in r:
            print(f"{name:<14}n/a ({r['error']})")
            continue
        first = first or r
        dev = f"{r['device'] / GIB:.2f}" if r["device"] is not None else "-"
        print(f"{name:<14}{r['host'] / GIB:>14.2f}{r['host'] / first['host']:>8.3f}{r['held'] / GIB:>10.2f}"
              f"{r['held'] / first['held']:>8.3f}{dev:>12}")
    if tmp is not None:
        tmp.cleanup()


if __name__ == "__main__":
    main()
