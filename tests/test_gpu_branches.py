"""The `gpu` group: branches only a compiled run on a CUDA GPU reaches, that no CPU test does
(docs/contributing.md, "GPU-only branches", lists every one and where it is pinned). Each test
here is marked `gpu`; without a CUDA GPU tests/conftest.py skips the group, saying so. The device
run is `python3 -m pytest -m gpu -q -p no:randomly` (and `python3 -m lockstep check --device cuda`)."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from tests.conftest import REPO

pytestmark = pytest.mark.gpu


def test_compiled_kernels_and_their_dot_paths_match_the_cuda_goldens(monkeypatch, capsys):
    """kernels/*: `if not INTERPRET` / USE_DOT / PTX_E2M1 / _gpu_tiles / the MXFP4 dense path are
    what compiled kernels run; their bits are pinned by the cuda-* goldens of the kernel specs."""
    from lockstep.harness.cli import main

    monkeypatch.chdir(REPO)
    code = main(["check", "--device", "cuda", "kernels/*", "mxfp4/*", "primitives/*", "coins/*"])
    out = capsys.readouterr().out
    assert code == 0, out[-4000:]


def test_host_to_pins_and_copies_without_changing_values():
    """engine/sampling.py host_to: the pinned, non-blocking copy is CUDA's only."""
    from lockstep.engine.sampling import host_to

    got = host_to(torch.device("cuda"), [[1.5, -0.0], [2.0, 3.0]], torch.float64)
    assert got.device.type == "cuda"
    torch.cuda.synchronize()
    assert torch.equal(got.cpu().view(torch.int64),
                       torch.tensor([[1.5, -0.0], [2.0, 3.0]], dtype=torch.float64).view(torch.int64))


def test_inverse_cdf_of_a_cuda_row_is_the_cpu_rows_draw():
    """engine/speculative.py inverse_cdf moves a CUDA row to the CPU before drawing (the mutants
    that drop the move are refused only here)."""
    from lockstep.engine.speculative import inverse_cdf

    w = torch.tensor([0.0, 0.25, 0.5, 0.25], dtype=torch.float64)
    for coin in (0.0, 0.2, 0.5, 0.75, 0.9999):
        assert inverse_cdf(w.cuda(), coin) == inverse_cdf(w, coin), coin


def test_bit_dependencies_of_a_cuda_golden_name_the_gpu_stack():
    """harness/platform.py: a cuda-* golden records the GPU, torch, CUDA, driver and Triton."""
    from lockstep.harness.platform import bit_dependencies

    deps = bit_dependencies("cuda-sm90-bf16")
    assert set(deps) == {"gpu", "torch", "cuda", "driver", "triton"} and deps["driver"] != "unknown", deps
    assert bit_dependencies("cuda-sm90-fp32-triton") == deps


def test_fused_sampling_is_the_cuda_path():
    """engine/ops.py's sampler entry, kernels/sampling.py RECIP: a model of the triton backend on a
    GPU samples with the fused kernel (reciprocal temperature) and gives the torch sampler's
    tokens and logprob bits; the torch backend keeps the torch path."""
    from lockstep.engine.model import GptOssModel
    from lockstep.engine.request import Request, SamplingParams
    from lockstep.engine.generate import generate
    from lockstep.engine.sampling import FUSED_SAMPLER, TORCH_SAMPLER

    fused = GptOssModel.from_checkpoint(REPO / "models/tiny-target", device="cuda", backend="triton")
    plain = GptOssModel.from_checkpoint(REPO / "models/tiny-target", device="cuda", backend="torch")
    assert fused.ops.sampler is FUSED_SAMPLER and plain.ops.sampler is TORCH_SAMPLER
    reqs = [Request(prompt=[5 + i, 9, 40 + i], params=SamplingParams(temperature=0.7 + 0.2 * i, top_k=20 * i,
                                                                  max_new_tokens=12), seed=3 + i)
            for i in range(3)]
    a = generate(fused, reqs)
    fused.use_ops(replace(fused.ops, sampler=TORCH_SAMPLER))
    b = generate(fused, reqs)
    for x, y in zip(a, b):
        assert x.tokens == y.tokens and torch.equal(x.logprobs.view(torch.int32), y.logprobs.view(torch.int32))


def test_running_ahead_on_the_gpu_is_the_plain_loops_bits():
    """engine/generate.py on a GPU: decoding ahead (each step launched from the last one's ids on
    the device, read back through a pinned copy and an event) gives the plain loop's tokens and
    logprob bits (captured states turn running ahead off), a request stopping mid-batch included."""
    from lockstep.engine.generate import generate
    from lockstep.engine.model import GptOssModel
    from lockstep.engine.request import Request, SamplingParams

    model = GptOssModel.from_checkpoint(REPO / "models/tiny-target", device="cuda", backend="triton", dtype="bf16")
    prompt = [5, 9, 40, 77, 301]
    free = generate(model, [Request(prompt, SamplingParams(temperature=0.8, max_new_tokens=8), seed=5)])[0]
    j = next((j for j in range(1, 8) if free.tokens.index(free.tokens[j]) == j), None)
    assert j is not None, free.tokens
    stops = (free.tokens[j],)
    reqs = [Request(prompt, SamplingParams(temperature=0.8, max_new_tokens=8, stop_token_ids=stops), seed=5),
            Request([7, 8, 9], SamplingParams(temperature=1.0, max_new_tokens=9, stop_token_ids=()), seed=6),
            Request([11, 12], SamplingParams(greedy=True, max_new_tokens=6, stop_token_ids=()))]
    ahead, plain = generate(model, reqs), generate(model, reqs, capture=[0])
    assert ahead[0].finish_reason == "stop" and len(ahead[0].tokens) == j + 1
    for x, y in zip(ahead, plain):
        assert (x.tokens, x.finish_reason) == (y.tokens, y.finish_reason)
        assert torch.equal(x.logprobs.view(torch.int32), y.logprobs.view(torch.int32))


def test_round_graphs_are_kept_per_target_and_shape_and_reset():
    """engine/graphs.py round_graphs / decode_steps: on a GPU the last ones are reused (zeroed)
    for the same draft and shape, rebuilt for another shape."""
    from lockstep.engine.eagle3 import load_draft
    from lockstep.engine.graphs import decode_steps, round_graphs
    from lockstep.engine.model import GptOssModel

    target = GptOssModel.from_checkpoint(REPO / "models/tiny-target", device="cuda")
    draft = load_draft(REPO / "models/tiny-eagle3", target, convention="sglang")
    first = round_graphs(target, draft, 2, 2, 64, 8)
    first.cache.k_all.fill_(1.0)
    again = round_graphs(target, draft, 2, 2, 64, 8)
    assert again is first and not again.cache.k_all.any()
    assert round_graphs(target, draft, 3, 2, 64, 8) is not first
    d1 = decode_steps(target, 2, 64)
    assert decode_steps(target, 2, 64) is d1 and decode_steps(target, 4, 64) is not d1


def test_launch_under_cuda_places_rank_r_on_gpu_r_mod_g():
    """engine/launch.py under CUDA: a rank is bound to its GPU (set_device) before its group starts."""
    from lockstep.engine.launch import launch
    from tests.parallel import rank_fns

    gpus = torch.cuda.device_count()
    res = launch(rank_fns.placement, 2, device="cuda", timeout_s=300)
    want = "nccl" if gpus >= 2 else "gloo-host"
    assert [r[1] for r in res] == [want, want]
    assert [r[0] for r in res] == [f"cuda:{r % gpus}" for r in range(2)]


@pytest.mark.parametrize("preset, fmt", [("tiny", "mxfp4"), ("tiny", "bf16"), ("small", "mxfp4")])
def test_a_synthetic_checkpoint_made_on_the_gpu_is_the_cpus_bytes(tmp_path, preset, fmt):
    """engine/checkpoint.py synthetic_weights(device="cuda"), kernels/portable.py normal and
    kernels/mxfp4.py quantize on CUDA: the draws come from the CPU generator and every operation
    is portable or exact, so `make-checkpoint --device cuda` writes the CPU's files byte for byte."""
    from lockstep.engine.checkpoint import checkpoint_digest, make_checkpoint

    cpu = make_checkpoint(preset, 3, fmt, tmp_path / "cpu")
    gpu = make_checkpoint(preset, 3, fmt, tmp_path / "gpu", device="cuda")
    assert checkpoint_digest(gpu) == checkpoint_digest(cpu)
