"""The ops table: every op the gpt-oss forward needs, one implementation chosen once.

    ops = ops_for("triton", device)          # the backend NAME is read here, and only here
    y = ops.linear(x, w, b)                  # the model and its blocks call the table's entries

GptOssModel.from_checkpoint(path, backend=...) maps its backend name to one of these tables when
the model is built; no engine function takes a backend name after that. Three implementations:

    TORCH      the portable reference (DESIGN §2): single IEEE operations and fixed trees
               (kernels/portable.py), the same bits on every CPU; the goldens' reference
    TRITON     kernels/: the same contracts compiled on a GPU or in Triton's interpreter on the
               CPU; it also ends each sublayer in one kernel (`fused`)
    FAST_CUDA  cuBLAS matmuls through F.linear, torch's own softmax and top-k, the Triton
    FAST_CPU   kernels elsewhere on a GPU (torch's references on the CPU): no invariance promise;
               bench/e2e.py uses it to measure what determinism costs, no golden is recorded with it

Each table also holds its sampler (engine/sampling.py): the torch path for TORCH and on the CPU,
kernels.sampling's fused launches for TRITON and FAST on a GPU (the same bits as the torch path;
in the interpreter the fused kernel is a kernel spec's subject at small vocabularies, not the
engine's path).

The dtype policy (fp32 or bf16) is the model's: every op reads its inputs' dtypes and takes an
explicit out_dtype where it rounds (engine/model.py's docstring).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Callable

import torch

from lockstep.engine.experts import experts_grouped, experts_one_device, experts_per_expert, experts_per_row
from lockstep.engine.sampling import FUSED_SAMPLER, TORCH_SAMPLER, Sampler
from lockstep.kernels import portable
from lockstep.kernels.attention import attention_portable, attention_triton
from lockstep.kernels.matmul import linear_chunks_portable, linear_chunks_triton, linear_fast, linear_portable, linear_triton
from lockstep.kernels.moe_router import router_top_k_fast, router_top_k_portable, router_top_k_triton
from lockstep.kernels.residual import moe_residual_triton, row_parallel_residual_triton
from lockstep.kernels.rmsnorm import rms_norm_fast, rms_norm_portable, rms_norm_triton
from lockstep.kernels.rope import rope_qkv_cache_triton

BACKENDS = ("torch", "triton", "fast")


@dataclass(frozen=True)
class FusedEnds:
    """Kernels that end a sublayer in one launch: the same operations and bits as the ops they
    replace (tests/engine/test_dtype_policy.py), in a tenth of the launches."""
    rope_qkv_cache: Callable         # (qkv [T, (Hq + 2 Hkv) D], cos, sin, k_cache, v_cache, slots, positions, Hq) -> q
    row_parallel_residual: Callable  # (x [T, H], parts [8, T, H] fp32, bias [H]) -> x + tree(parts) + bias
    moe_residual: Callable           # (x, parts [8, T k, H], down_b [E, H], routing [T, k], ids [T, k]) -> x + moe


@dataclass(frozen=True)
class Ops:
    """One implementation of each op (module docstring). Shapes: T tokens, H hidden, E experts."""
    name: str
    linear: Callable            # (x [M, K], w [N, K], b [N] | None, out_dtype=None) -> [M, N]
    chunk_partials: Callable | None   # (x [M, K'], w [N, K'], bounds) -> [C, M, N] fp32, no bias (row-parallel
    #                                   layers, engine/linear.py); None: those layers are one GEMM (fast only)
    rms_norm: Callable          # (x [T, H], w [H] fp32, eps, out_dtype) -> [T, H]
    route: Callable             # (router_logits [T, E] fp32, k) -> (routing [T, k] fp32, top_ids [T, k])
    attention: Callable         # (q, k_cache, v_cache, slots, positions, sinks, window, scale) -> [T, Hq, D]
    experts: Callable           # engine/experts.py's contract -> down partials [C, T * k, H] fp32
    fused: FusedEnds | None     # the sublayer ends in one kernel each, or None: op by op
    sampler: Sampler            # the batched sampling steps (engine/sampling.py)
    sharded_experts: Callable | None = None   # what a sharded model (engine/parallel.py) runs as `experts`
    #                                           on a share of the experts; None: `experts` itself


def _stacked_partials(x, weight, bounds) -> torch.Tensor:
    return torch.stack(linear_chunks_portable(x, weight, bounds))


def _route_triton(router_logits: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The top k and kernels.portable.softmax over them in one kernel (float64 exp, the fixed tree,
    IEEE division: the same bits as the torch reference's ~20 launches); for k > 16 the kernel
    gives the ids and the portable softmax runs in torch."""
    if k <= 16:
        return router_top_k_triton(router_logits, k, portable_softmax=True)
    ids = router_top_k_triton(router_logits, k)[1]                         # [T, k], same ranking rule
    return portable.softmax(router_logits.gather(-1, ids), dim=-1), ids


def _rms_norm_triton(x, weight, eps, out_dtype):
    return rms_norm_triton(x, weight, eps, out_dtype=out_dtype)          # reads x's dtype, rounds once


_FUSED = FusedEnds(rope_qkv_cache=rope_qkv_cache_triton, row_parallel_residual=row_parallel_residual_triton,
                   moe_residual=moe_residual_triton)

# experts_per_row needs every expert; a rank's share of them takes the loop that skips the others.
TORCH = Ops(name="torch", linear=linear_portable, chunk_partials=_stacked_partials, rms_norm=rms_norm_portable,
            route=router_top_k_portable, attention=attention_portable, experts=experts_per_row, fused=None,
            sampler=TORCH_SAMPLER, sharded_experts=experts_per_expert)

# One device holds every expert: experts_one_device skips zero fills; a rank's share keeps them.
TRITON = Ops(name="triton", linear=linear_triton, chunk_partials=linear_chunks_triton, rms_norm=_rms_norm_triton,
             route=_route_triton, attention=attention_triton, experts=experts_one_device, fused=_FUSED,
             sampler=FUSED_SAMPLER, sharded_experts=experts_grouped)

TRITON_CPU = replace(TRITON, sampler=TORCH_SAMPLER)      # the interpreter samples on the torch path

FAST_CUDA = Ops(name="fast", linear=linear_fast, chunk_partials=None, rms_norm=_rms_norm_triton, route=router_top_k_fast,
                attention=attention_triton, experts=experts_one_device, fused=_FUSED, sampler=FUSED_SAMPLER,
                sharded_experts=experts_grouped)

FAST_CPU = Ops(name="fast", linear=linear_fast, chunk_partials=None, rms_norm=rms_norm_fast, route=router_top_k_fast,
               attention=attention_portable, experts=experts_per_row, fused=None, sampler=TORCH_SAMPLER)


def ops_for(backend: str, device: str | torch.device = "cpu") -> Ops:
    """The ops table of backend name `backend` ("torch", "triton" or "fast") on `device`."""
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")
    on_gpu = torch.device(device).type == "cuda"
    if backend == "torch":
        return TORCH
    if backend == "triton":
        return TRITON if on_gpu else TRITON_CPU
    return FAST_CUDA if on_gpu else FAST_CPU
