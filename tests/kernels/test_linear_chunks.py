"""lockstep.kernels.matmul.linear_chunks_triton: every K chunk of a row-parallel layer in one launch.

Bitwise: each chunk equals linear_triton on the chunk's fresh copy (the per-chunk path it
replaced), the fused SwiGLU prologue equals the separate SwiGLU kernel, and a row's partials do
not depend on the batch around it. Values: close to linear_chunks_portable, the torch ops' partials. Tile table: never M."""

import pytest
import torch

from lockstep.engine.linear import k_chunk_bounds
from lockstep.kernels._common import INTERPRET
from lockstep.kernels.matmul import (DECODE_ROWS, GPU_MIN_PROGRAMS, PREFILL_ROWS, TILES, _gpu_tiles, bounds_div,
                            linear_chunks_portable, linear_chunks_triton, linear_triton, tiles)
from lockstep.kernels.moe import clamped_swiglu_portable, clamped_swiglu_triton
from tests.kernels.conftest import DEVICE

SWIGLU = (1.702, 7.0)
# K = 150: the 8 chunks are 18 or 19 wide and start off every multiple of 32 and of BLOCK_K;
# ODD has an empty chunk and one wider than BLOCK_K (128), so the k loop runs twice.
K = 150
BOUNDS = k_chunk_bounds(K)
ODD = [(0, 0), (3, 140), (140, 150), (0, 150)]


def bits(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().view(torch.int16 if t.element_size() == 2 else torch.int32)


def make(M, N, dtype, seed, x_per_k=1, scale=1.0):
    g = torch.Generator().manual_seed(seed)
    x = (torch.randn(M, x_per_k * K, generator=g) * scale).to(dtype)
    w = (torch.randn(N, K, generator=g) / K ** 0.5).to(dtype)
    return x.to(DEVICE), w.to(DEVICE)


@pytest.mark.parametrize("bounds", [BOUNDS, ODD], ids=["k_chunk_bounds", "odd"])
def test_each_chunk_is_linear_triton_on_its_copy(bounds):
    """fp32: parts[c] has the bits of linear_triton(x[:, lo:hi] copied, W[:, lo:hi] copied)."""
    x, w = make(5, 130, torch.float32, seed=1)
    parts = linear_chunks_triton(x, w, bounds)
    assert parts.shape == (len(bounds), 5, 130) and parts.dtype == torch.float32
    for c, (lo, hi) in enumerate(bounds):
        ref = linear_triton(x[:, lo:hi].clone(), w[:, lo:hi].clone())
        assert bits(parts[c]).equal(bits(ref)), (lo, hi)
    torch.testing.assert_close(parts.cpu(), torch.stack(linear_chunks_portable(x.cpu(), w.cpu(), bounds)), rtol=0, atol=2e-5)


def test_every_partial_is_stored_by_the_kernel(request):
    """The partials are allocated unfilled (torch.empty): poisoned with NaN there, every element
    of every chunk (the empty one, M and N tails) still comes back as the kernel's value."""
    x, w = make(5, 130, torch.float32, seed=3)
    clean = linear_chunks_triton(x, w, ODD)
    request.getfixturevalue("nan_empty")                              # from here on
    poisoned = linear_chunks_triton(x, w, ODD)
    assert not poisoned.isnan().any() and bits(poisoned).equal(bits(clean))


def test_swiglu_prologue_is_linear_triton_on_the_swiglu_of_its_copy():
    """fp32, with the prologue: the per-chunk path was copy, clamped_swiglu_triton, linear_triton."""
    x, w = make(4, 70, torch.float32, seed=2, x_per_k=2, scale=4.0)      # scale 4: the clamps act
    parts = linear_chunks_triton(x, w, BOUNDS, SWIGLU)
    for c, (lo, hi) in enumerate(BOUNDS):
        a = clamped_swiglu_triton(x[:, 2 * lo:2 * hi].clone(), *SWIGLU)
        assert bits(parts[c]).equal(bits(linear_triton(a, w[:, lo:hi].clone()))), c
    swiglu = lambda t: clamped_swiglu_portable(t, *SWIGLU)  # noqa: E731
    ref = linear_chunks_portable(x.cpu(), w.cpu(), BOUNDS, prologue=swiglu, x_per_k=2)
    torch.testing.assert_close(parts.cpu(), torch.stack(ref), rtol=0, atol=1e-4)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_fused_swiglu_equals_the_separate_kernel(dtype):
    """The prologue computes the SwiGLU in the load, rounded to x's dtype as the separate kernel's
    store rounds it: the partials are bitwise those of swiglu-then-chunks."""
    x, w = make(6, 40, dtype, seed=3, x_per_k=2, scale=4.0)
    fused = linear_chunks_triton(x, w, ODD, SWIGLU)
    separate = linear_chunks_triton(clamped_swiglu_triton(x, *SWIGLU), w, ODD)
    assert bits(fused).equal(bits(separate))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_rows_do_not_depend_on_the_batch(dtype):
    """A row alone == the same row in batches of 2, 3, 17, 64 and (compiled) 300 at every position,
    bitwise, for linear_triton and linear_chunks_triton (with and without the prologue): on a GPU
    the alone row takes the decode tile, 17 and 64 the middle one, 300 the prefill tile. Every row
    of a batch is drawn from a pool whose rows were computed alone, so each batch checks all its
    positions."""
    pool, w = make(10, 60, dtype, seed=4, x_per_k=2, scale=3.0)
    bounds = [(0, 37), (37, 150)]
    calls = {
        "linear": lambda x: linear_triton(x[:, :K].contiguous(), w),
        "chunks": lambda x: linear_chunks_triton(x[:, :K].contiguous(), w, bounds),
        "chunks+swiglu": lambda x: linear_chunks_triton(x, w, bounds, SWIGLU),
    }
    g = torch.Generator().manual_seed(5)
    for name, f in calls.items():
        alone = [f(pool[i:i + 1]) for i in range(len(pool))]
        for M in (2, 3, 17, 64) + (() if INTERPRET else (PREFILL_ROWS + 44,)):   # the interpreter: one tile set
            pick = torch.randint(0, len(pool), (M,), generator=g)
            pick[0], pick[-1] = 0, 1                                   # the first and last places
            out = f(pool[pick.to(DEVICE)])
            for m in range(M):
                got = out[m:m + 1] if name == "linear" else out[:, m:m + 1]
                assert bits(got).equal(bits(alone[pick[m]])), (name, M, m)


def test_tiles_follow_the_rows_on_a_gpu_only():
    """The interpreter has one tile set; compiled, 16-bit launches take a decode tile up to
    DECODE_ROWS rows and a prefill tile from PREFILL_ROWS, fp32 always the same 64 rows (the bits
    are the same for each: test_rows_do_not_depend_on_the_batch compares them)."""
    for M in (1, DECODE_ROWS, DECODE_ROWS + 1, PREFILL_ROWS):
        assert tiles(2880, 2880, torch.float32, M) == (TILES if INTERPRET else _gpu_tiles(2880, 2880, torch.float32, M))
    for dtype in (torch.float32, torch.bfloat16):
        small, wide = _gpu_tiles(2880, 2880, dtype, 32), _gpu_tiles(64 * GPU_MIN_PROGRAMS, 2880, dtype, 32)
        assert small[1] == 32 and wide[1] == 64                      # a mid-size batch fills the GPU
        assert small[0] == wide[0] == 64 and small[2] == wide[2]
        assert _gpu_tiles(2880, 512, dtype, 32, chunks=8)[1] == 64     # a program per chunk counts
    assert {_gpu_tiles(2880, 2880, torch.float32, M) for M in (1, 32, 4096)} == {(64, 32, 64, 4, 3)}
    bf16 = [_gpu_tiles(2880, 2880, torch.bfloat16, M)[0] for M in (1, DECODE_ROWS, DECODE_ROWS + 1,
                                                                    PREFILL_ROWS - 1, PREFILL_ROWS)]
    assert bf16 == [16, 16, 64, 64, 128]


def test_empty_inputs():
    x, w = make(3, 5, torch.float32, seed=6)
    assert linear_chunks_triton(x[:0], w, BOUNDS).shape == (8, 0, 5)
    assert linear_chunks_triton(x, w, []).shape == (0, 3, 5)
    assert linear_chunks_triton(x, w, [(7, 7)]).abs().sum() == 0


@pytest.mark.parametrize("args, match", [
    (lambda x, w: (x, w, [(0, K + 1)]), "0 <= lo <= hi"),
    (lambda x, w: (x, w, [(5, 4)]), "0 <= lo <= hi"),
    (lambda x, w: (x, w, [(-1, 4)]), "0 <= lo <= hi"),
    (lambda x, w: (x, w, [(0.0, 4)]), "pair of ints"),
    (lambda x, w: (x, w, [(0, 4, 5)]), "pairs of ints"),
    (lambda x, w: (x, w.to(torch.bfloat16), BOUNDS), "must match"),
    (lambda x, w: (x.to(torch.int32), w, BOUNDS), "float32"),
    (lambda x, w: (x[:, :-1], w, BOUNDS), "do not fit"),
    (lambda x, w: (x, w, BOUNDS, SWIGLU), "do not fit"),           # the prologue needs 2K columns
    (lambda x, w: (x[0], w, BOUNDS), "2-D"),
])
def test_bad_input_is_refused(args, match):
    x, w = make(3, 5, torch.float32, seed=7)
    with pytest.raises(ValueError, match=match):
        linear_chunks_triton(*args(x, w))


def test_bounds_div_is_the_largest_power_of_two_dividing_every_end():
    """The compiled chunk kernels' alignment hint (tl.multiple_of on both ends of a chunk): a wrong,
    too large one would let a vector load straddle a chunk's end, so it must divide every end."""
    assert bounds_div(k_chunk_bounds(2880)) == 8                      # 20b's 8 chunks of 360
    assert bounds_div(k_chunk_bounds(4096)) == 32                     # o_proj's chunks of 512 (capped at 32)
    assert bounds_div([(0, 13)]) == 1 and bounds_div([(0, 40), (40, 96)]) == 8 and bounds_div([]) == 32
    for bounds in (BOUNDS, k_chunk_bounds(96), k_chunk_bounds(2881), [(6, 18), (18, 30)]):
        d = bounds_div(bounds)
        assert all(end % d == 0 for chunk in bounds for end in chunk)
        assert d == 32 or any(end % (2 * d) for chunk in bounds for end in chunk)
