import json
import os
import stat

import pytest
import torch
from safetensors.torch import load_file, save_file

from lockstep.engine import checkpoint as ckpt
from lockstep.engine.checkpoint import CheckpointError, checkpoint_digest, load_checkpoint, make_checkpoint
from lockstep.engine.config import preset


def test_layout_and_index(tiny_ckpts):
    for fmt, d in tiny_ckpts.items():
        files = sorted(os.listdir(d))
        assert files == ["config.json", "model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors",
                         "model.safetensors.index.json"]
        index = json.loads((d / "model.safetensors.index.json").read_text())
        assert set(index["weight_map"].values()) == {files[1], files[2]}
        cfg = json.loads((d / "config.json").read_text())
        assert cfg["model_type"] == "gpt_oss" and cfg["architectures"] == ["GptOssForCausalLM"]
        assert ("quantization_config" in cfg) == (fmt == "mxfp4")
    t = load_file(tiny_ckpts["mxfp4"] / "model-00002-of-00002.safetensors")
    blocks = t["model.layers.3.mlp.experts.gate_up_proj_blocks"]
    assert blocks.dtype == torch.uint8 and blocks.shape == (4, 128, 3, 16)     # [E, 2I, H/32, 16]
    assert t["model.layers.3.mlp.experts.down_proj_scales"].shape == (4, 96, 2)   # [E, H, I/32]


def test_byte_identical_for_same_seed(tmp_path, tiny_ckpts):
    for fmt in ("bf16", "mxfp4"):
        again = make_checkpoint("tiny", 0, fmt, tmp_path / fmt)
        assert checkpoint_digest(again) == checkpoint_digest(tiny_ckpts[fmt])
    other = make_checkpoint("tiny", 1, "bf16", tmp_path / "seed1")
    a, b = checkpoint_digest(other), checkpoint_digest(tiny_ckpts["bf16"])
    assert a["config.json"] == b["config.json"] and a != b


def test_both_formats_load_to_identical_fp32_weights(tiny_ckpts):
    c1, w1 = load_checkpoint(tiny_ckpts["bf16"])
    c2, w2 = load_checkpoint(tiny_ckpts["mxfp4"])
    assert c1 == c2 and c2.is_mxfp4 and not c1.is_mxfp4
    assert set(w1) == set(w2) == set(ckpt.expected_tensors(c1, mxfp4_experts=False))
    for name in w1:
        assert w1[name].dtype == torch.float32 and w1[name].equal(w2[name]), name
    sinks = w1["model.layers.0.self_attn.sinks"]
    assert sinks.abs().min() > 0 and sinks.std() > 0.3
    assert w1["model.layers.0.mlp.router.bias"].std() > 0.1


def _rewrite(d, edit):
    """Load every shard of checkpoint d, let edit(name -> tensor dict, shard) change it, save back."""
    index_path = d / "model.safetensors.index.json"
    index = json.loads(index_path.read_text())
    for shard in sorted(set(index["weight_map"].values())):
        t = load_file(d / shard)
        edit(t, shard, index)
        save_file(t, str(d / shard), metadata={"format": "pt"})
    index_path.write_text(json.dumps(index))


@pytest.fixture
def fresh(tmp_path):
    return make_checkpoint("tiny", 3, "bf16", tmp_path / "c")


def test_missing_tensor(fresh):
    name = "model.layers.1.self_attn.sinks"

    def edit(t, shard, index):
        if name in t:
            del t[name]
            del index["weight_map"][name]
    _rewrite(fresh, edit)
    with pytest.raises(CheckpointError, match=r"missing tensors \['model\.layers\.1\.self_attn\.sinks'\]"):
        load_checkpoint(fresh)


def test_unexpected_tensor(fresh):
    def edit(t, shard, index):
        if shard.startswith("model-00001"):
            t["model.layers.0.self_attn.extra"] = torch.zeros(2)
            index["weight_map"]["model.layers.0.self_attn.extra"] = shard
    _rewrite(fresh, edit)
    with pytest.raises(CheckpointError, match=r"unexpected tensors \['model\.layers\.0\.self_attn\.extra'\]"):
        load_checkpoint(fresh)


def test_wrong_shape_and_dtype(fresh):
    name = "model.layers.0.self_attn.k_proj.weight"

    def edit(t, shard, index):
        if name in t:
            t[name] = t[name][:, :64].contiguous()
    _rewrite(fresh, edit)
    with pytest.raises(CheckpointError, match=rf"tensor {name}: shape \(64, 64\), but config.json implies \(64, 96\)"):
        load_checkpoint(fresh)


def test_wrong_dtype(fresh):
    name = "model.norm.weight"

    def edit(t, shard, index):
        if name in t:
            t[name] = t[name].to(torch.int32)
    _rewrite(fresh, edit)
    with pytest.raises(CheckpointError, match=rf"tensor {name}: dtype torch.int32"):
        load_checkpoint(fresh)


def test_config_says_mxfp4_but_tensors_are_not(fresh):
    cfg = json.loads((fresh / "config.json").read_text())
    cfg["quantization_config"] = {"quant_method": "mxfp4"}
    (fresh / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(CheckpointError, match="config.json says MXFP4 experts"):
        load_checkpoint(fresh)


def test_config_shape_disagreement(fresh):
    cfg = json.loads((fresh / "config.json").read_text())
    cfg["intermediate_size"] = 32
    (fresh / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(CheckpointError, match=r"tensor model\.layers\.0\.mlp\.experts\.gate_up_proj: shape"):
        load_checkpoint(fresh)


def test_index_names_a_missing_shard(fresh):
    os.remove(fresh / "model-00002-of-00002.safetensors")
    with pytest.raises(CheckpointError, match="model-00002-of-00002.safetensors, which does not exist"):
        load_checkpoint(fresh)


def test_single_file_checkpoint(fresh):
    _, before = load_checkpoint(fresh)
    merged = {}
    for shard in ("model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"):
        merged.update(load_file(fresh / shard))
        os.remove(fresh / shard)
    os.remove(fresh / "model.safetensors.index.json")
    save_file(merged, str(fresh / "model.safetensors"))
    _, after = load_checkpoint(fresh)
    assert all(before[n].equal(after[n]) for n in before)


def test_refuses_non_empty_dir_and_overwrites_when_told(tmp_path):
    out = tmp_path / "c"
    out.mkdir()
    (out / "keep.txt").write_text("x")
    with pytest.raises(FileExistsError):
        make_checkpoint("tiny", 0, "bf16", out)
    assert os.listdir(out) == ["keep.txt"]
    make_checkpoint("tiny", 0, "bf16", out, overwrite=True)
    assert "keep.txt" not in os.listdir(out)
    empty = tmp_path / "empty"
    empty.mkdir()
    make_checkpoint("tiny", 0, "bf16", empty)                 # an existing empty dir is fine


def test_failure_leaves_nothing_behind(tmp_path, monkeypatch):
    calls = []

    def failing_save(tensors, path, metadata=None):
        calls.append(path)
        if len(calls) == 2:
            raise OSError("disk full")
        return save_file(tensors, path, metadata=metadata)
    monkeypatch.setattr(ckpt, "save_file", failing_save)
    with pytest.raises(OSError, match="disk full"):
        make_checkpoint("tiny", 0, "bf16", tmp_path / "c")
    assert os.listdir(tmp_path) == []


def test_bad_format_name(tmp_path):
    with pytest.raises(ValueError, match="fmt"):
        make_checkpoint("tiny", 0, "fp8", tmp_path / "c")


def test_small_preset_loads(tmp_path):
    d = make_checkpoint("small", 5, "mxfp4", tmp_path / "s", num_shards=3)
    config, w = load_checkpoint(d)
    assert config == preset("small").replace(quantization_config={"quant_method": "mxfp4"})
    assert w["model.layers.5.mlp.experts.down_proj"].shape == (8, 96, 160)


@pytest.mark.parametrize("damage,fragment", [
    ("truncate", "model-00001-of-00002.safetensors: not a readable safetensors file"),
    ("empty", "model-00002-of-00002.safetensors: not a readable safetensors file"),
    ("config_list", "config.json: expected a JSON object, found a list"),
    ("config_garbage", "config.json: cannot be read as JSON"),
    ("index_list", "model.safetensors.index.json: expected a JSON object, found a list"),
])
def test_unreadable_files_are_named(fresh, damage, fragment):
    if damage == "truncate":
        shard = fresh / "model-00001-of-00002.safetensors"
        shard.write_bytes(shard.read_bytes()[:1000])
    elif damage == "empty":
        (fresh / "model-00002-of-00002.safetensors").write_bytes(b"")
    elif damage == "config_list":
        (fresh / "config.json").write_text("[1, 2]")
    elif damage == "config_garbage":
        (fresh / "config.json").write_text("{not json")
    else:
        (fresh / "model.safetensors.index.json").write_text("[]")
    with pytest.raises(CheckpointError) as e:
        load_checkpoint(fresh)
    assert str(fresh) in str(e.value) and fragment in str(e.value)


def test_a_dtype_other_than_the_config_implies_is_refused(fresh):
    name = "model.layers.0.self_attn.q_proj.weight"

    def edit(t, shard, index):
        if name in t:
            t[name] = t[name].to(torch.float16)
    _rewrite(fresh, edit)
    with pytest.raises(CheckpointError, match=rf"model-0000\d-of-00002.safetensors: tensor {name}: dtype "
                                              r"torch.float16, expected torch.bfloat16 \(config.json's torch_dtype"):
        load_checkpoint(fresh)
    cfg = json.loads((fresh / "config.json").read_text())
    cfg["torch_dtype"] = "float16"                            # now the config says fp16 and bf16 tensors are wrong
    (fresh / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(CheckpointError, match=r"dtype torch.bfloat16, expected torch.float16"):
        load_checkpoint(fresh)


def test_files_get_the_modes_the_umask_gives(tmp_path):
    old = os.umask(0o027)
    try:
        d = make_checkpoint("tiny", 0, "bf16", tmp_path / "c")
    finally:
        os.umask(old)
    assert stat.S_IMODE(d.stat().st_mode) == 0o750
    assert {stat.S_IMODE(f.stat().st_mode) for f in d.iterdir()} == {0o640}
