"""The arguments the kernels do not specialize (`do_not_specialize`: token and row counts, windows,
index pointers) change no bit: each kernel against its twin compiled as Triton specializes by
default (every int 1 a constant, every int and pointer divisible by 16 noted), on the same
launches, at counts of 1, of multiples of 16 and neither, from aligned and misaligned slices.
GPU only (`gpu`): the interpreter specializes nothing, so there the twins are the same program."""

from __future__ import annotations

import pytest
import torch
import triton

from lockstep.kernels import attention, coins, matmul, moe, residual, rope, sampling
from tests.kernels.conftest import DEVICE

pytestmark = pytest.mark.gpu

# (module, kernel) of every kernel with a do_not_specialize list
UNSPECIALIZED = [(attention, "_attention_kernel"), (attention, "_attention_split_kernel"),
                 (attention, "_attention_merge_kernel"), (matmul, "_linear_kernel"),
                 (matmul, "_linear_chunks_kernel"), (moe, "_grouped_gate_up_kernel"),
                 (moe, "_grouped_down_kernel"), (moe, "_group_kernel"), (residual, "_row_parallel_residual_kernel"),
                 (residual, "_moe_residual_kernel"), (coins, "_murmur_kernel"), (rope, "_rope_qkv_cache_kernel"),
                 (sampling, "_gumbel_argmax_kernel"), (sampling, "_draws_kernel")]


def _bytes(out) -> list[torch.Tensor]:
    outs = out if isinstance(out, (tuple, list)) else (out,)
    return [t.contiguous().view(torch.uint8).cpu() for t in outs]


def same_as_specialized(monkeypatch, run):
    """run() with the kernels as shipped, then with each replaced by its fully specialized twin:
    asserts the same bytes."""
    shipped = _bytes(run())
    with monkeypatch.context() as m:
        for module, name in UNSPECIALIZED:
            m.setattr(module, name, triton.jit(getattr(module, name).fn))
        twin = _bytes(run())
    assert len(shipped) == len(twin) and all(a.equal(b) for a, b in zip(shipped, twin))


def _randn(*shape, dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=g).to(dtype).to(DEVICE)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("M", [1, 5, 16, 300])
def test_linear_rows(monkeypatch, dtype, M):
    x = _randn(M + 1, 96, dtype=dtype, seed=M)[1:]               # a misaligned start as well as M
    w, b = _randn(80, 96, dtype=dtype, seed=1), _randn(80, dtype=dtype, seed=2)
    bounds = [(0, 40), (40, 96)]
    same_as_specialized(monkeypatch, lambda: (matmul.linear_triton(x, w, b), matmul.linear_triton(x[:, :95], w[:, :95]),
                                              matmul.linear_chunks_triton(x.contiguous(), w, bounds)))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("T, Hkv, window", [(1, 1, 0), (3, 2, 5), (16, 2, 128), (20, 1, 0)])
def test_attention_tokens_heads_windows(monkeypatch, dtype, T, Hkv, window):
    Hq, D, S = 4 * Hkv, 64, 256
    q = _randn(T, Hq, D, dtype=dtype, seed=T)
    kc, vc = _randn(2, Hkv, S, D, dtype=dtype, seed=3), _randn(2, Hkv, S, D, dtype=dtype, seed=4)
    g = torch.Generator().manual_seed(T)
    pos = torch.randint(0, S, (T + 1,), generator=g).to(DEVICE)[1:]          # a misaligned pointer
    slots = torch.randint(0, 2, (T + 1,), generator=g).to(DEVICE)[1:]
    sinks = _randn(Hq, seed=5)

    def run():
        one = attention.attention_triton(q, kc, vc, slots, pos, sinks, window, D ** -0.5)
        split = attention.attention_triton(q, kc, vc, slots, pos, sinks, window, D ** -0.5, _split=64,
                                           _two_phase=True)
        return one, split
    same_as_specialized(monkeypatch, run)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("T", [1, 3, 8, 40])
def test_grouped_experts_rows(monkeypatch, dtype, T):
    E, H, I, k = 4, 64, 48, 2
    x = _randn(T, H, dtype=dtype, seed=T)
    g = torch.Generator().manual_seed(T)
    ids = torch.stack([torch.randperm(E, generator=g)[:k] for _ in range(T)]).to(DEVICE)
    gu_w, gu_b = _randn(E, 2 * I, H, dtype=dtype, seed=6) / 8, _randn(E, 2 * I, dtype=dtype, seed=7)
    dn_w = _randn(E, H, I, dtype=dtype, seed=8) / 7
    bounds = [(0, 24), (24, 48)]

    def run():
        flat = torch.cat([ids.new_zeros(1), ids.reshape(-1)])[1:]                  # misaligned ids
        groups = moe.group_by_expert(flat, 0, E)
        h = moe.expert_gate_up_triton(x, k, groups, gu_w, gu_b)
        return groups[0], groups[1], h, moe.expert_down_partials_triton(h, groups, dn_w, bounds, (1.702, 7.0))
    same_as_specialized(monkeypatch, run)


@pytest.mark.parametrize("T", [1, 5, 16])
def test_residuals_rope_and_hashes(monkeypatch, T):
    H, k, E, Hq, Hkv, D, S = 64, 2, 4, 4, 1, 32, 64
    x = _randn(T, H, dtype=torch.bfloat16, seed=T)
    g = torch.Generator().manual_seed(T)
    ids = torch.stack([torch.randperm(E, generator=g)[:k] for _ in range(T)]).to(DEVICE)
    qkv = _randn(T, (Hq + 2 * Hkv) * D, dtype=torch.bfloat16, seed=9)
    cos, sin = _randn(T, D // 2, seed=10), _randn(T, D // 2, seed=11)
    pos = torch.randperm(S, generator=g)[:T + 1].to(DEVICE)[1:]     # distinct: two writes to one cache row race
    seeds = torch.randint(0, 2 ** 62, (T + 1,), generator=g).to(DEVICE)[1:]
    cols = torch.arange(17, device=DEVICE)
    logp = torch.log_softmax(_randn(T, 300, seed=12), -1)

    def run():
        kc = torch.zeros((1, Hkv, S, D), dtype=torch.bfloat16, device=DEVICE)
        vc = torch.zeros_like(kc)
        q = rope.rope_qkv_cache_triton(qkv, cos, sin, kc, vc, torch.zeros_like(pos), pos, Hq)
        temps = torch.ones(T, dtype=torch.float64, device=DEVICE)
        modes = torch.full((T,), sampling.SEEDED, dtype=torch.int32, device=DEVICE)
        return (residual.row_parallel_residual_triton(x, _randn(8, T, H, seed=13), _randn(H, seed=14)),
                residual.moe_residual_triton(x, _randn(8, T * k, H, seed=15), _randn(E, H, seed=16),
                                             _randn(T, k, seed=17), ids),
                q, kc, vc, coins.murmur_hash32_triton(seeds, pos, cols), sampling.gumbel_argmax_triton(logp, seeds, pos),
                *sampling.sample_fused_triton(logp, modes, temps, seeds, pos, torch.zeros_like(pos)))
    same_as_specialized(monkeypatch, run)
