"""Which column order do the compiled MXFP4 kernels' MMAs reduce in? (GPU only; a diagnostic of
the bits contract, not a timing.) For each candidate order of a K step, the dense bf16 grouped
kernel runs on the dequantized weights with both operands' columns in that order, at 16, 32, 64
and 128 rows a block, and is compared with the MXFP4 gate_up kernel (16-row blocks): the number of
outputs whose bits differ. The order kernels.moe `mma_order_columns` uses must give 0 at every
block size; after a Triton or GPU change, this finds the new one.

    python bench/mxfp4_order.py

Candidates: within each 16-column group (the identity and 4 permutations), and, for steps of 32
and 64 columns, MMA i taking the units (1, 2, 4 or 8 columns) whose index is i modulo the step's
MMAs. gpt-oss-20b's K = 2880, 8 experts x 512 columns, 256 tokens x 4, random codes, scales 119-123.
"""

import torch

from lockstep.kernels import moe
from lockstep.kernels.mxfp4 import dequantize

E, TOP_K, H, N, T = 8, 4, 2880, 512, 256


def interleave(width, unit):
    """A step of `width` columns as width / 16 MMAs: MMA i takes the units of `unit` columns whose
    index is i modulo width / 16, in order -> position -> column."""
    mmas = width // 16
    units = [list(range(u * unit, (u + 1) * unit)) for u in range(width // unit)]
    return [c for i in range(mmas) for j, u in enumerate(units) if j % mmas == i for c in u]


CANDIDATES = {"identity": list(range(16)),
              "16: slot pairs 0,1,4,5..": [0, 1, 4, 5, 8, 9, 12, 13, 2, 3, 6, 7, 10, 11, 14, 15],
              "16: slot pairs 0,1,8,9..": [0, 1, 8, 9, 2, 3, 10, 11, 4, 5, 12, 13, 6, 7, 14, 15],
              "16: pairs 0,2,1,3": [0, 1, 4, 5, 2, 3, 6, 7, 8, 9, 12, 13, 10, 11, 14, 15],
              "16: halves swapped": list(range(8, 16)) + list(range(8))}
for width in (32, 64):
    for unit in (1, 2, 4, 8):
        CANDIDATES[f"{width}: units of {unit}"] = interleave(width, unit)


def main():
    if not torch.cuda.is_available():
        raise SystemExit("bench/mxfp4_order.py: needs a GPU (the order is the compiled kernels')")
    g = torch.Generator(device="cuda").manual_seed(0)
    blocks = torch.randint(0, 256, (E, N, H // 32, 16), generator=g, dtype=torch.uint8, device="cuda")
    scales = torch.randint(119, 124, (E, N, H // 32), generator=g, dtype=torch.uint8, device="cuda")
    bias = torch.randn(E, N, generator=g, device="cuda").bfloat16()
    x = torch.randn(T, H, generator=g, device="cuda").bfloat16()
    ids = torch.argsort(torch.rand(T, E, generator=g, device="cuda"), dim=1)[:, :TOP_K].contiguous().reshape(-1)
    ref = moe.expert_gate_up_triton(x, TOP_K, moe.group_by_expert(ids, 0, E, 16), (blocks, scales), bias)
    dense = dequantize(blocks, scales, torch.bfloat16)                               # [E, N, H]
    engine = moe.mma_order_columns(((0, H),), H, "cpu")[0].tolist()[:moe.MXFP4_STEP]
    print(f"device {torch.cuda.get_device_name()}; outputs whose bits differ from the MXFP4 kernel's "
          f"(of {ref.numel()}), by rows a block:")
    for name, order in CANDIDATES.items():
        width = len(order)
        P = torch.tensor(order, device="cuda")
        w = dense.view(E, N, H // width, width)[..., P].reshape(E, N, H).contiguous()
        xp = x.view(T, H // width, width)[..., P].reshape(T, H).contiguous()
        counts = [(moe.expert_gate_up_triton(xp, TOP_K, moe.group_by_expert(ids, 0, E, bm), w, bias) != ref).sum().item()
                  for bm in moe.EXPERT_BLOCK_SIZES]
        mark = "  <- kernels.moe.mma_order_columns" if order == engine else ""
        print(f"  {name:26s} " + "  ".join(f"{bm:3d}: {c:6d}" for bm, c in zip(moe.EXPERT_BLOCK_SIZES, counts)) + mark,
              flush=True)


if __name__ == "__main__":
    main()
