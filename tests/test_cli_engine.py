"""`lockstep make-checkpoint` and `lockstep generate`."""

import hashlib
import json

from lockstep.harness.cli import main


def digest(d):
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(d.iterdir())}


def test_make_checkpoint_is_byte_identical_and_refuses_to_overwrite(tmp_path, capsys):
    assert main(["make-checkpoint", "--preset", "tiny", "--seed", "3", "--format", "mxfp4", str(tmp_path / "a")]) == 0
    assert main(["make-checkpoint", "--preset", "tiny", "--seed", "3", "--format", "mxfp4", str(tmp_path / "b")]) == 0
    assert digest(tmp_path / "a") == digest(tmp_path / "b")
    assert {"config.json", "model.safetensors.index.json"} <= set(digest(tmp_path / "a"))
    before = digest(tmp_path / "a")
    assert main(["make-checkpoint", "--preset", "tiny", "--seed", "4", str(tmp_path / "a")]) == 2
    assert "--overwrite" in capsys.readouterr().err and digest(tmp_path / "a") == before
    assert main(["make-checkpoint", "--preset", "nope", str(tmp_path / "c")]) == 2
    assert not (tmp_path / "c").exists()


def test_generate_json_matches_the_python_api(tmp_path, capsys):
    ck = tmp_path / "ck"
    assert main(["make-checkpoint", "--preset", "tiny", str(ck)]) == 0
    capsys.readouterr()
    argv = ["generate", "--checkpoint", str(ck), "--prompt-ids", "1,2,3,4", "--prompt-ids", "7,8",
            "--seed", "5", "--top-k", "20", "--max-new-tokens", "6", "--logprobs", "--json"]
    assert main(argv) == 0
    doc = json.loads(capsys.readouterr().out)
    out = doc["results"]
    assert [len(o["tokens"]) for o in out] == [6, 6] and all(len(o["logprobs_bits"]) == 6 for o in out)
    assert [o["seed"] for o in out] == [5, 5] and out[0]["sampling"]["top_k"] == 20
    assert doc["checkpoint_digest"].startswith("sha256:") and doc["platform"] == "cpu-fp32"
    assert main(argv) == 0
    assert json.loads(capsys.readouterr().out) == doc  # D1 through the CLI

    from lockstep.engine.generate import Request, generate
    from lockstep.engine.model import GptOssModel
    from lockstep.engine.sampling import SamplingParams

    res = generate(GptOssModel.from_checkpoint(ck), [Request([7, 8], SamplingParams(top_k=20, max_new_tokens=6), seed=5)])
    assert res[0].tokens == out[1]["tokens"]


def test_generate_bad_input_names_the_field(tmp_path, capsys):
    ck = tmp_path / "ck"
    main(["make-checkpoint", "--preset", "tiny", str(ck)])
    assert main(["generate", "--checkpoint", str(ck), "--prompt-ids", "1,99999"]) == 2
    assert "Request.prompt" in capsys.readouterr().err
    assert main(["generate", "--checkpoint", str(ck), "--prompt-ids", "1", "--seed", "1", "--temperature", "-1"]) == 2
    assert "temperature" in capsys.readouterr().err
    assert main(["generate", "--checkpoint", str(tmp_path / "missing"), "--prompt-ids", "1"]) == 2
    assert main(["generate", "--checkpoint", str(ck), "--prompt-ids", "1,x"]) == 2


def test_generate_refuses_silent_fallbacks_and_takes_a_seed_per_prompt(tmp_path, capsys):
    ck = tmp_path / "ck"
    main(["make-checkpoint", "--preset", "tiny", str(ck)])
    base = ["generate", "--checkpoint", str(ck), "--prompt-ids", "1,2,3", "--prompt-ids", "4,5", "--max-new-tokens", "4"]
    assert main(base + ["--temperature", "0.8"]) == 2                      # would be greedy: refused
    assert "--temperature without --seed" in capsys.readouterr().err
    assert main(base + ["--logprobs"]) == 0                                # printed, one line a token
    text = capsys.readouterr().out
    assert text.count("  step ") == 8 and "logprob -" in text and "(0x" in text
    assert main(base + ["--seed", "1,2,3"]) == 2                           # 3 seeds, 2 prompts
    capsys.readouterr()
    assert main(base + ["--seed", "11,12", "--json"]) == 0
    two = json.loads(capsys.readouterr().out)["results"]
    assert [r["seed"] for r in two] == [11, 12]
    assert main(["generate", "--checkpoint", str(ck), "--prompt-ids", "4,5", "--max-new-tokens", "4",
                 "--seed", "12", "--json"]) == 0
    one = json.loads(capsys.readouterr().out)["results"]                   # one prompt: the same shape, a list of one
    assert one == two[1:]
