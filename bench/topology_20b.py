"""The 20b shape (random weights, MXFP4 experts) at TP 2, EP 2 and TP 2 x EP 2 against one device:
the bits compared and the weight memory per rank (engine.rank_weights.held_bytes: each rank loads
only its slices, MXFP4 packed). On a GPU the ranks share it (gloo over host copies) unless there is
a GPU per rank (NCCL).

    python3 bench/topology_20b.py                                        # on the GPU: 24 layers, triton, bf16
    python3 bench/topology_20b.py --device cpu --layers 1 --shape tiny-parallel --backend torch --dtype fp32
                                                                          # a CPU smoke test at a small shape

The checkpoint is written to a temporary folder (bench/sharded_loading.py's writer: random MXFP4
codes, ~12 GiB at 24 layers). Exit code 1 when a topology's bits differ from one device's.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

TOPOLOGIES = [(2, 1), (1, 2), (2, 2)]
GIB = 1 << 30


def _bits(results) -> list:
    return [(tuple(r.tokens), r.logprobs.cpu().numpy().tobytes()) for r in results]


def main() -> int:
    import torch

    from lockstep.engine.checkpoint import make_checkpoint
    from lockstep.engine.distributed import Topology
    from lockstep.engine.request import Request
    from lockstep.engine.model import GptOssModel
    from lockstep.engine.parallel import generate_at, transport
    from lockstep.engine.rank_weights import held_bytes
    from lockstep.engine.request import SamplingParams
    from sharded_loading import write_checkpoint

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    ap.add_argument("--shape", default="20b", help="20b (random MXFP4 weights) or an engine preset (make_checkpoint)")
    ap.add_argument("--layers", type=int, default=24, help="layers of the 20b shape (default 24)")
    ap.add_argument("--backend", default="triton")
    ap.add_argument("--dtype", default="bf16")
    ap.add_argument("--tokens", type=int, default=8, help="new tokens per request (default 8)")
    args = ap.parse_args()
    tmp = tempfile.TemporaryDirectory(prefix="lockstep-topology-20b-")
    ckpt = (write_checkpoint(Path(tmp.name) / "ckpt", args.layers) if args.shape == "20b"
            else make_checkpoint(args.shape, 0, "mxfp4", Path(tmp.name) / "ckpt"))
    params = SamplingParams(greedy=True, max_new_tokens=args.tokens)
    requests = [Request(prompt=[(7 * i + 3 * j) % 500 + 1 for j in range(12 + 5 * i)], params=params) for i in range(3)]
    t0 = time.perf_counter()
    model = GptOssModel.from_checkpoint(ckpt, backend=args.backend, device=args.device, dtype=args.dtype)
    from lockstep.engine.generate import generate
    want = _bits(generate(model, requests))
    peak = torch.cuda.max_memory_allocated() / GIB if args.device == "cuda" else float("nan")
    print(f"one device: {time.perf_counter() - t0:.1f} s, {held_bytes(ckpt, Topology(1, 1), 0, args.dtype, args.backend == 'torch') / GIB:.2f} GiB "
          f"of weights, peak allocated {peak:.2f} GiB")
    del model
    if args.device == "cuda":
        torch.cuda.empty_cache()
    bad = 0
    for tp, ep in TOPOLOGIES:
        topo = Topology(tp, ep)
        per_rank = [held_bytes(ckpt, topo, r, args.dtype, args.backend == "torch") / GIB for r in range(topo.world_size)]
        t0 = time.perf_counter()
        try:
            got = _bits(generate_at(ckpt, tp, ep, requests, backend=args.backend, device=args.device,
                                    dtype=args.dtype, timeout_s=1800))
            verdict = "same bits as one device" if got == want else "DIFFERENT bits"
            bad += got != want
        except Exception as e:  # noqa: BLE001 - report and go on to the next topology
            verdict, bad = f"failed: {type(e).__name__}: {str(e).splitlines()[0][:200]}", bad + 1
        print(f"tp={tp} ep={ep} over {transport(topo, args.device)}: {verdict}, {time.perf_counter() - t0:.1f} s, "
              f"weights per rank {', '.join(f'{b:.2f}' for b in per_rank)} GiB")
    tmp.cleanup()
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
