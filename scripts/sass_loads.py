"""Count the global loads of the compiled chunk kernels, without a GPU: compile for sm_90 with
Triton's bundled ptxas, disassemble with its nvdisasm, and count each kind of load instruction
(`LDGSTS.E.BYPASS.128`: a 16-byte asynchronous copy, pipelined; `LDG.E.U16`: one bf16 value).

    python3 scripts/sass_loads.py

For the grouped down kernel (kernels/moe.py) at the engine's bf16 tiles and the linear-chunks
kernel (kernels/matmul.py) at its bf16 tiles, each without and with the chunk-end hints the
launches pass (kernels.matmul.bounds_div: 8 for 20b's 360-column chunks, 32 for o_proj's 512).
Integer arguments and pointers get the divisibility-by-16 a launch gives them on a GPU.
"""

import os
import re
import subprocess
import sys
import tempfile
from collections import Counter
from pathlib import Path

os.environ["TRITON_INTERPRET"] = "0"              # compile, even on a machine without CUDA
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import triton  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler import ASTSource  # noqa: E402

from lockstep.kernels import matmul, moe  # noqa: E402


def loads(fn, signature, constexprs, divisible, warps, stages):
    """Compile fn for sm_90 -> Counter of its global load instructions."""
    names = list(fn.arg_names)
    sig = dict(signature, **{k: "constexpr" for k in constexprs})
    src = ASTSource(fn=fn, signature=sig, constexprs={(names.index(k),): v for k, v in constexprs.items()},
                    attrs={(names.index(n),): [["tt.divisibility", 16]] for n in divisible})
    kernel = triton.compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": warps, "num_stages": stages})
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(kernel.asm["cubin"])
        f.flush()
        nvdisasm = Path(triton.__file__).parent / "backends/nvidia/bin/nvdisasm"
        sass = subprocess.run([str(nvdisasm), "-c", f.name], capture_output=True, text=True, check=True).stdout
    return Counter(m.group(1) for m in re.finditer(r"\*/\s+(?:@!?P\d\s+)?(LDG\S*)", sass))


def main():
    down_sig = {"a_ptr": "*bf16", "rows_ptr": "*i64", "bexp_ptr": "*i64", "w_ptr": "*bf16", "s_ptr": "*bf16",
                "bounds_ptr": "*i64", "y_ptr": "*fp32", "R": "i32", "N": "i32", "K": "i32", "A_STRIDE": "i32",
                "C": "i32", "alpha": "fp32", "limit": "fp32"}
    down_div = ("a_ptr", "rows_ptr", "bexp_ptr", "w_ptr", "s_ptr", "bounds_ptr", "y_ptr", "N", "K", "A_STRIDE")
    for block_m in (16, 32, 128):
        bn, bk, warps, stages = moe.EXPERT_GPU_TILES["down", block_m]
        for div in (1, 8):
            const = {"SWIGLU": False, "MXFP4": False, "USE_DOT": True, "PORTABLE": False, "CHUNK_LOOP": False,
                     "BLOCK_M": block_m, "BLOCK_N": bn, "BLOCK_K": bk, "LO_DIV": div, "HI_DIV": div,
                     "FAST_DECODE": True}
            print(f"grouped down, block_m {block_m}, tile {(bn, bk, warps, stages)}, chunk ends hinted {div}: "
                  f"{dict(loads(moe._grouped_down_kernel, down_sig, const, down_div, warps, stages))}", flush=True)
    chunk_sig = {"x_ptr": "*bf16", "w_ptr": "*bf16", "bounds_ptr": "*i64", "y_ptr": "*fp32", "M": "i32", "N": "i32",
                 "K": "i32", "X_STRIDE": "i32", "alpha": "fp32", "limit": "fp32"}
    chunk_div = ("x_ptr", "w_ptr", "bounds_ptr", "y_ptr", "N", "K", "X_STRIDE")
    for M in (1, 32, 2048):
        bm, bn, bk, warps, stages = matmul._gpu_tiles(2880, 4096, matmul.torch.bfloat16, M, chunks=8)
        for div in (1, 32):
            const = {"SWIGLU": False, "USE_DOT": True, "PORTABLE": False, "BLOCK_M": bm, "BLOCK_N": bn,
                     "BLOCK_K": bk, "DIV": div}
            print(f"linear chunks, {M} rows, tile {(bm, bn, bk, warps, stages)}, chunk ends hinted {div}: "
                  f"{dict(loads(matmul._linear_chunks_kernel, chunk_sig, const, chunk_div, warps, stages))}",
                  flush=True)


if __name__ == "__main__":
    main()
