"""Coin throughput: the Triton hash kernel (and the torch reference) against torch.rand.

Prints values per second of each and the time ratio ours / torch.rand of the same shape
(lower is better; 1.0 = as fast as torch.rand), measured in one process. On a GPU it uses CUDA
events; on the CPU (Triton interpreter) wall-clock time.

    python bench/coins.py                       # default shapes
    python bench/coins.py --rows 65536 --cols 65
    python bench/coins.py --suite                # `lockstep check 'coins/*'` wall time
"""

import argparse
import subprocess
import sys
import time

import torch

from _util import DEVICE, ON_GPU, device_line, timed
from lockstep.kernels.coins import murmur_hash32_torch, murmur_hash32_triton, verify_coins


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=None)
    ap.add_argument("--cols", type=int, default=65)
    ap.add_argument("--repeat", type=int, default=None)
    ap.add_argument("--suite", action="store_true", help="time `lockstep check coins/*` instead")
    args = ap.parse_args()
    if args.suite:
        t0 = time.perf_counter()
        rc = subprocess.run([sys.executable, "-m", "lockstep", "check", "coins/*"], capture_output=True).returncode
        print(f"lockstep check 'coins/*': exit {rc}, {time.perf_counter() - t0:.2f} s wall (process start included)")
        return
    device = DEVICE
    rows = args.rows or (1 << 20 if ON_GPU else 4096)
    repeat = args.repeat or (50 if ON_GPU else 3)
    seeds = torch.arange(rows, dtype=torch.int64, device=device) * 0x9E3779B1
    lens = torch.arange(rows, dtype=torch.int64, device=device) + 1000
    cols = torch.arange(args.cols, dtype=torch.int64, device=device)
    n = rows * args.cols
    t_rand = timed(lambda: torch.rand(rows, args.cols, device=device), repeat)
    print(f"{device_line()}, {rows} x {args.cols} = {n} values")
    print(f"{'what':<34} {'values/s':>12} {'ours / torch.rand':>18}")
    print(f"{'torch.rand (float32, baseline)':<34} {n / t_rand:12.3e} {1.0:18.3f}")
    for backend, murmur in (("triton", murmur_hash32_triton), ("torch", murmur_hash32_torch)):
        t_hash = timed(lambda: murmur(seeds, lens, cols), repeat)
        t_coin = timed(lambda: verify_coins(seeds, lens, args.cols - 1, murmur), repeat)
        print(f"{'murmur_hash32 ' + backend:<34} {n / t_hash:12.3e} {t_hash / t_rand:18.3f}")
        print(f"{'verify_coins ' + backend:<34} {n / t_coin:12.3e} {t_coin / t_rand:18.3f}")

if __name__ == "__main__":
    main()
