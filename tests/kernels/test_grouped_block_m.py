"""The grouped expert kernels' rows per block (kernels.moe expert_block_m): the block size follows
the launch's rows, so it must move no bit. Every size the policy can pick (EXPERT_BLOCK_SIZES;
MXFP4 up to MXFP4_MAX_BLOCK_M) gives the bits of EXPERT_BLOCK_M = 16 (the size every golden was
recorded with) for gate_up, the down partials and the down kernel with the SwiGLU fused in its
loads: bf16 dense and MXFP4 packed weights, the fast decode on and off. In Triton's interpreter
(the CPU) at small shapes; compiled on a GPU at the 20b shapes (H = I = 2880: gate_up's K tail,
down's 8 fixed chunks of 360 starting mid scale group), where BLOCK_M 16 and 32 run mma.sync and
64 and 128 run wgmma on an H200 (sm_90 TTGIR under Triton 3.9). Then the engine: experts_grouped
takes the policy's size, and a token alone has the bits it has inside a prefill-sized batch that
takes larger blocks (D2).

The interpreter's shapes, edge by edge (each launch's cost is its programs: blocks x K chunks x
N tiles, so rows and experts are kept to what the edges need; the every-size rows are built, not
drawn, and both tests assert the row counts their edges need):
- every block size: T 33, k 2 over E 4 with 33, 32, 0 and 1 rows an expert: expert 0 (every token)
  takes three 16-row and two 32-row blocks, the last one partial (several blocks an expert, ending
  mid-block), expert 1 whole 16- and 32-row blocks, expert 2 none (the blocks after an empty
  expert), expert 3 one row (a block of one row; the last expert, where `_packed` plants an edge
  scale); 64 one partial block an expert. H 160 = 128 + 32 (gate_up's K loop: a full step and a
  tail, down's N tiles: a full one and a partial one; MXFP4 needs H in 32-value blocks, so 160 is
  the least with a tail); I 96: down's 8 K chunks of 12 columns, starting and ending inside a
  32-value MXFP4 block (I = 64 would give 8-column chunks, none across a scale group);
- a token alone: E 3, k 2, a pool of 4 tokens (every expert pair), T 48 and 96 (32 and 64 rows
  an expert on average, some expert more: asserted), H 160 as above, I 64."""

import pytest
import torch

import lockstep.engine.experts as engine_experts
from lockstep.engine.experts import LocalExperts, experts_grouped
from lockstep.engine.linear import k_chunk_bounds
from lockstep.kernels import moe
from lockstep.kernels.moe import (EXPERT_BLOCK_M, EXPERT_BLOCK_SIZES, clamped_swiglu_triton, expert_block_m,
                         expert_down_partials_triton, expert_gate_up_triton, group_by_expert)
from tests.kernels.conftest import DEVICE
from tests.kernels.test_grouped_moe import ALPHA, LIMIT, SWIGLU, experts, same_bits, tokens

BF16 = torch.bfloat16


# Every size the kernels can run here: all of them compiled; in the interpreter those whose tile
# product [BLOCK_M, 128, 128] fits Triton's largest tensor (2^20 elements).
SIZES = [bm for bm in EXPERT_BLOCK_SIZES if DEVICE.type == "cuda" or bm * 128 * 128 <= 1 << 20]


@pytest.fixture
def follows(monkeypatch):
    """The policy as compiled (in the interpreter it keeps EXPERT_BLOCK_M)."""
    monkeypatch.setattr(moe, "EXPERT_BLOCK_FOLLOWS_ROWS", True)


# ------------------------------------------------------------------ the policy
def test_the_interpreter_keeps_16():
    assert moe.EXPERT_BLOCK_FOLLOWS_ROWS == (DEVICE.type == "cuda")
    if DEVICE.type == "cpu":
        assert expert_block_m(8192, 4, BF16) == EXPERT_BLOCK_M


def test_block_m_follows_the_rows_per_expert(follows):
    E = 32                                                              # gpt-oss-20b: 32 experts, top-4
    assert expert_block_m(1 * 4, E, BF16) == 16                         # decode, batch 1
    assert expert_block_m(32 * 4, E, BF16) == 16                        # decode, batch 32: 4 rows an expert
    assert expert_block_m(256 * 4, E, BF16) == 32
    assert expert_block_m(512 * 4, E, BF16) == 64
    assert expert_block_m(2048 * 4, E, BF16) == 128                     # prefill 2048: 256 rows an expert
    assert expert_block_m(10 ** 6, E, BF16) == 128
    assert expert_block_m(63, 1, BF16) == 32 and expert_block_m(64, 1, BF16) == 64   # the edges
    assert expert_block_m(0, E, BF16) == 16
    for rows in (1, 64, 8192, 10 ** 6):
        assert expert_block_m(rows, E, torch.float32) == EXPERT_BLOCK_M   # fp32: always 16
    for rows in range(0, 5000, 37):
        assert expert_block_m(rows, 4, BF16) in EXPERT_BLOCK_SIZES


def test_mxfp4_block_m_is_capped(follows, monkeypatch):
    assert expert_block_m(8192, 32, BF16, mxfp4=True) == min(128, moe.MXFP4_MAX_BLOCK_M)
    monkeypatch.setattr(moe, "MXFP4_MAX_BLOCK_M", 32)
    assert expert_block_m(8192, 32, BF16, mxfp4=True) == 32 and expert_block_m(8192, 32, BF16) == 128
    monkeypatch.setattr(moe, "MXFP4_MAX_BLOCK_M", 16)
    assert expert_block_m(8192, 32, BF16, mxfp4=True) == 16


def test_the_kernels_refuse_a_block_size_outside_the_policys():
    x, ids = tokens(3, 32, 2, 2, torch.float32, seed=1)
    gu_w, gu_b, _ = experts(2, 32, 16, torch.float32, seed=2)
    for bm in (8, 256):
        with pytest.raises(ValueError, match="not group_by_expert"):
            expert_gate_up_triton(x, 2, group_by_expert(ids.reshape(-1), 0, 2, bm), gu_w, gu_b)


# ------------------------------------------------------------------ the kernels' bits at every size
def _launches(x, ids, weights, bounds, block_m, fast, fused, a=None):
    """([gate_up h, down partials of a = clamped_swiglu(h), (fused) down with the SwiGLU in its
    loads], a), grouped in blocks of block_m. `a` may be given: the 16-row launch's, which is
    this launch's too whenever h has the 16-row bits (compared first), so it is computed once."""
    gu_w, gu_b, dn_w = weights
    k, E = ids.shape[1], gu_b.shape[0]
    groups = group_by_expert(ids.reshape(-1), 0, E, block_m)
    assert groups[0].shape[0] == groups[1].shape[0] * block_m
    h = expert_gate_up_triton(x, k, groups, gu_w, gu_b, fast_decode=fast)
    if a is None:
        a = clamped_swiglu_triton(torch.nan_to_num(h), ALPHA, LIMIT)
    out = [h, expert_down_partials_triton(a, groups, dn_w, bounds, fast_decode=fast)]
    if fused:
        out.append(expert_down_partials_triton(torch.nan_to_num(h), groups, dn_w, bounds, SWIGLU, fast_decode=fast))
    return out, a


def _packed(E, N, K, seed):
    """MXFP4 (blocks, scales) on DEVICE: random codes, scales 2^-8 .. 2^2 (the fast decode's range),
    and edge scales planted (0, 1: subnormal values; 254: +-inf; 255: NaN): their programs decode
    exactly."""
    g = torch.Generator().manual_seed(seed)
    blocks = torch.randint(0, 256, (E, N, K // 32, 16), generator=g, dtype=torch.uint8)
    scales = torch.randint(119, 130, (E, N, K // 32), generator=g, dtype=torch.uint8)
    scales[0, :5, 0] = torch.tensor([0, 1, 254, 255, 0], dtype=torch.uint8)
    scales[-1, -1, -1] = 1
    return blocks.to(DEVICE), scales.to(DEVICE)


def _weights(kind, E, H, I, dtype, seed):
    """(gate_up_w, gate_up_b, down_w): dense in dtype, or MXFP4 packed (and the dtype's bias)."""
    if kind == "mxfp4":
        gu_b = torch.randn(E, 2 * I, generator=torch.Generator().manual_seed(seed)).to(dtype).to(DEVICE)
        return _packed(E, 2 * I, H, seed + 1), gu_b, _packed(E, H, I, seed + 2)
    return experts(E, H, I, dtype, seed, scale=3.0)


def _ids_with_rows(rows, k, seed):
    """ids [T, k], T = sum(rows) / k, giving expert e exactly rows[e] rows (each <= T), k distinct
    experts a token: the experts laid out in turn down the slot columns (a run of at most T never
    meets a token twice), then each token's slots and the tokens shuffled."""
    T = sum(rows) // k
    assert T * k == sum(rows) and max(rows) <= T
    flat = torch.repeat_interleave(torch.arange(len(rows)), torch.tensor(rows))
    ids = flat.reshape(k, T).t()
    g = torch.Generator().manual_seed(seed)
    ids = torch.stack([row[torch.randperm(k, generator=g)] for row in ids])[torch.randperm(T, generator=g)]
    assert torch.bincount(ids.reshape(-1), minlength=len(rows)).tolist() == list(rows)
    return ids.to(DEVICE)


def _check_every_size(kind, fast, dtype, T, k, E, H, I, seed, fused=True, rows=None):
    """rows: the rows of each expert (T x k of them), else ids drawn at random."""
    weights = _weights(kind, E, H, I, dtype, seed)
    x, ids = tokens(T, H, k, E, dtype, seed + 3)
    if rows is not None:
        ids = _ids_with_rows(rows, k, seed + 4)
    if kind == "mxfp4":
        x = x / 64                                                      # scale-127 values stay finite
    bounds = k_chunk_bounds(I)
    ref, a = _launches(x, ids, weights, bounds, EXPERT_BLOCK_M, fast, fused)
    assert torch.isfinite(ref[1]).any()
    for block_m in SIZES[1:]:
        if kind == "mxfp4" and block_m > moe.MXFP4_MAX_BLOCK_M:
            continue                                                    # the policy never picks it
        got, _ = _launches(x, ids, weights, bounds, block_m, fast, fused, a)
        for name, mine, sixteen in zip(("gate_up", "down", "down fused"), got, ref):
            assert same_bits(mine, sixteen), f"{kind} fast={fast} {dtype}: {name} at block_m {block_m} != block_m 16"


CASES = [("dense", True, BF16), ("dense", True, torch.float32), ("mxfp4", True, BF16), ("mxfp4", False, BF16),
         ("mxfp4", True, torch.float32)]


@pytest.mark.parametrize("kind, fast, dtype", CASES,
                         ids=[f"{k}-{'fast' if f else 'exact'}-{str(d)[6:]}" for k, f, d in CASES])
def test_every_block_size_gives_the_same_bits(kind, fast, dtype):
    """33 tokens x 2 slots over 4 experts of 33, 32, 0 and 1 rows (the module docstring says which
    edge each is for); I = 96: 12-column down chunks. In the interpreter; compiled, the test at the
    20b shapes below runs the same cases (float32 keeps 16 there), which keeps the GPU run's
    compiles few."""
    if DEVICE.type == "cuda":
        pytest.skip("compiled: test_every_block_size_gives_the_same_bits_at_20b_shapes")
    _check_every_size(kind, fast, dtype, T=33, k=2, E=4, H=160, I=96, seed=7, rows=(33, 32, 0, 1))


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="the compiled kernels at the 20b shapes need a GPU")
@pytest.mark.parametrize("kind, fast", [("dense", True), ("mxfp4", True), ("mxfp4", False)],
                         ids=["dense", "mxfp4-fast", "mxfp4-exact"])
def test_every_block_size_gives_the_same_bits_at_20b_shapes(kind, fast):
    """The engine's bf16 tiles at gpt-oss-20b's H = I = 2880, 600 tokens x 4 slots over 8 experts
    (300 rows an expert: whole and partial blocks at every size). Without the fused SwiGLU (off in
    the engine; the interpreter test has it), so the GPU run compiles fewer kernels."""
    _check_every_size(kind, fast, BF16, T=600, k=4, E=8, H=2880, I=2880, seed=17, fused=False)


# ------------------------------------------------------------------ the engine
@pytest.mark.parametrize("kind", ["dense", "mxfp4"])
def test_a_token_alone_has_its_bits_in_a_prefill_sized_batch(kind, follows, monkeypatch):
    """D2 through the policy: experts_grouped groups each launch in the policy's block size (a spy
    on its group_by_expert: 16 for a token alone, 32 and 64 for batches of 48 and 96 tokens, MXFP4
    capped at MXFP4_MAX_BLOCK_M), and each token alone has the bits it has at every position of
    those batches (bf16; 3 experts, top-2: 32 and 64 rows an expert on average; H = 160: gate_up's K
    loop takes a step of the interpreter's 128, and a tail). Each batch gives some expert more rows
    than its block holds (asserted): several policy-sized blocks an expert, 64-row ones included,
    which the every-size test above does not reach (at most one 64-row block an expert); for MXFP4
    the 96-token batch takes 32-row blocks, three for an expert of 65 or more rows."""
    E, H, I, k = 3, 160, 64, 2
    weights = _weights(kind, E, H, I, BF16, seed=41)
    pool, pool_ids = tokens(4, H, k, E, BF16, seed=42)                  # every expert pair, one twice
    pool = pool / 64
    assert len(set(map(tuple, pool_ids.sort(1).values.tolist()))) == 3
    bounds = k_chunk_bounds(I)
    seen = []
    real = engine_experts.group_by_expert

    def spy(flat_ids, lo, n_local, block_m):
        seen.append(block_m)
        return real(flat_ids, lo, n_local, block_m)

    monkeypatch.setattr(engine_experts, "group_by_expert", spy)
    held = LocalExperts(*weights, tuple(bounds), 0, E, ALPHA, LIMIT)
    run = lambda x, ids: experts_grouped(x, ids, held)  # noqa: E731
    alone = [run(pool[i:i + 1], pool_ids[i:i + 1]) for i in range(len(pool))]
    assert seen == [EXPERT_BLOCK_M] * len(pool)
    g = torch.Generator().manual_seed(43)
    for T, policy in ((48, 32), (96, 64)):
        seen.clear()
        pick = torch.randint(0, len(pool), (T,), generator=g)
        ids = pool_ids[pick.to(DEVICE)]
        parts = run(pool[pick.to(DEVICE)], ids)
        want = min(policy, moe.MXFP4_MAX_BLOCK_M) if kind == "mxfp4" else policy
        assert seen == [want] == [expert_block_m(T * k, E, BF16, kind == "mxfp4")], (kind, T, seen)
        assert want > EXPERT_BLOCK_M or moe.MXFP4_MAX_BLOCK_M == 16
        assert torch.bincount(ids.reshape(-1).cpu()).max() > policy     # several policy-sized blocks an expert
        for t in range(T):
            assert same_bits(parts[:, t * k:(t + 1) * k], alone[pick[t]]), (kind, T, t)
