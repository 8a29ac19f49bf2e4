"""bench/speculative.py on the tiny shape, on the CPU: it must run, pass its own check (greedy
speculative decoding = greedy generate) and print every figure for a bf16 and an MXFP4 target, the
end-to-end one at full acceptance included (no timing is asserted)."""

import os
import subprocess
import sys

from tests.conftest import REPO


def test_speculative_bench_runs_on_tiny_cpu():
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": ""}
    proc = subprocess.run([sys.executable, "bench/speculative.py", "--tiny", "--batches", "1,2"], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=600)
    out = proc.stdout
    assert proc.returncode == 0, out + proc.stderr
    assert "check: greedy speculative_generate = greedy generate" in out and ": ok" in out, out
    heads = [line for line in out.splitlines() if line.startswith("speculative round, ")]
    assert ["bf16 experts" in heads[0], "mxfp4 experts" in heads[1], len(heads)] == [True, True, 2], heads
    assert out.count("check: greedy speculative_generate = greedy generate") == 2, out
    rows = [line.split() for line in out.splitlines() if line.split()[:1] in (["1"], ["2"])]
    assert [r[0] for r in rows] == ["1", "2", "1", "2"], out
    for r in rows:
        assert r[1].endswith("ms") and r[4].endswith("ms") and "derived:" in r, r
    e2e = [line for line in out.splitlines() if line.startswith("end to end")]
    assert len(e2e) == 2 and all("outputs equal: ok" in line for line in e2e), out
    # the draft proposes the plain run's own tokens: every draft of every round but the last is accepted
    assert all("mean accept length 4.00" in line or "mean accept length 3." in line for line in e2e), e2e
    memory = [line for line in out.splitlines() if line.startswith("memory, ")]
    assert [m.split(":")[0] for m in memory] == 2 * ["memory, target build (random weights made and handed over)",
                                                     "memory, draft build (the target held)",
                                                     "memory, the rounds and end to end (caches, graphs, activations on top)"]
    assert all("(weights and buffers); device n/a (cpu); host peak RSS" in m and "x; target <= 1.15x" in m
               for m in memory), memory


def test_proposing_draft_is_accepted_and_changes_nothing_else():
    """bench.speculative.proposing: a head made to propose the target's own tokens gives full
    acceptance on the tiny shape, and the outputs stay those of plain generate."""
    import torch

    sys.path.insert(0, str(REPO / "bench"))
    import e2e
    import speculative as bench
    from lockstep.engine.config import preset
    from lockstep.engine.generate import generate
    from lockstep.engine.request import Request, SamplingParams
    import lockstep.engine.speculative as sm

    config, dev = preset("tiny"), torch.device("cpu")
    floats, packed = e2e.random_weights(config, dev)
    target = e2e.engine_model(config, {**floats, **e2e.dense_experts(packed)}, "torch", dev, "bf16")
    prompt = torch.randint(0, config.vocab_size, (12,), generator=torch.Generator().manual_seed(3)).tolist()
    with torch.inference_mode():
        plain = generate(target, [Request(prompt, SamplingParams(greedy=True, max_new_tokens=9))])[0]
        draft = bench.proposing(bench.random_draft(target, dev, dtype="bf16", must=plain.tokens),
                                torch.tensor([prompt + plain.tokens]))
        got = sm.speculative_generate(target, draft, [Request(prompt, SamplingParams(greedy=True, max_new_tokens=9))],
                                      sm.SpecParams(num_steps=3, topk=1, draft_token_num=4, verify="greedy"))[0]
    assert got.tokens == plain.tokens and got.logprob_bytes == plain.logprobs.numpy().tobytes()
    assert got.accept_lengths[:-1] == [4] * (len(got.accept_lengths) - 1), got.accept_lengths
