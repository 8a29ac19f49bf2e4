"""What a trace names its checkpoint and platform by, and the exact refusal when a replay runs on
another one (harness/replay/identity.py). The checkpoints are a few tensors written here."""

from __future__ import annotations

import hashlib
import json

import numpy
import pytest
import torch
import triton
from safetensors.torch import save_file

from lockstep.harness.replay.format import TraceError, canonical
from lockstep.harness.replay.identity import check_checkpoint, check_platform, checkpoint_identity, platform_identity

CONFIG = {"hidden_size": 4, "layers": [1, 2]}


def tensors() -> dict:
    return {"b.weight": torch.arange(6, dtype=torch.float32).reshape(2, 3),
            "a.bias": torch.tensor([1, -2], dtype=torch.int32),
            "c.empty": torch.zeros(0, 3, dtype=torch.bfloat16)}


def checkpoint(folder, ts=None, config=CONFIG, files=None):
    """A checkpoint folder: config.json and the tensors, one file or split as `files` says."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(config))
    ts = tensors() if ts is None else ts
    for name, keys in (files or {"model.safetensors": list(ts)}).items():
        save_file({k: ts[k] for k in keys}, str(folder / name))
    return folder


def digest(t: torch.Tensor) -> str:
    """The documented tensor digest: sha256 of the dtype and shape, then the raw bytes."""
    h = hashlib.sha256(f"{t.dtype}{list(t.shape)}".encode())
    h.update(t.contiguous().view(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b"")
    return h.hexdigest()


def test_the_identity_in_full(tmp_path):
    ident = checkpoint_identity(checkpoint(tmp_path / "c"))
    want_t = {k: digest(v) for k, v in sorted(tensors().items())}
    want_cfg = hashlib.sha256(canonical(CONFIG)).hexdigest()
    assert ident == {"config_sha256": want_cfg, "tensors": want_t,
                     "sha256": hashlib.sha256(canonical({"config": want_cfg, "tensors": want_t})).hexdigest()}
    assert list(ident["tensors"]) == ["a.bias", "b.weight", "c.empty"]
    assert want_t["b.weight"] == hashlib.sha256(b"torch.float32[2, 3]" + bytes(numpy.arange(6, dtype="<f4"))).hexdigest()
    assert want_t["c.empty"] == hashlib.sha256(b"torch.bfloat16[0, 3]").hexdigest()


def test_file_names_sharding_and_config_key_order_do_not_matter(tmp_path):
    one = checkpoint_identity(checkpoint(tmp_path / "one"))
    split = checkpoint(tmp_path / "split", config=dict(reversed(CONFIG.items())),
                       files={"z-00001.safetensors": ["b.weight"], "a-00002.safetensors": ["a.bias", "c.empty"]})
    (split / "notes.txt").write_text("not a weight file")
    assert checkpoint_identity(split) == one


def test_each_tensors_value_dtype_and_shape_count(tmp_path):
    base = checkpoint_identity(checkpoint(tmp_path / "base"))
    for i, edit in enumerate([lambda t: t["b.weight"].__setitem__((1, 2), 5.5),
                              lambda t: t.__setitem__("b.weight", t["b.weight"].reshape(3, 2)),
                              lambda t: t.__setitem__("a.bias", t["a.bias"].view(torch.float32)),
                              lambda t: t.__setitem__("c.empty", torch.zeros(3, 0, dtype=torch.bfloat16))]):
        ts = tensors()
        edit(ts)
        ident = checkpoint_identity(checkpoint(tmp_path / f"e{i}", ts))
        changed = [k for k in ident["tensors"] if ident["tensors"][k] != base["tensors"][k]]
        assert len(changed) == 1 and ident["sha256"] != base["sha256"], i
        assert ident["config_sha256"] == base["config_sha256"]


def test_an_unreadable_folder_is_refused(tmp_path):
    folder = tmp_path / "c"
    folder.mkdir()
    with pytest.raises(TraceError) as e:
        checkpoint_identity(folder)
    assert str(e.value) == (f"{folder}: cannot read config.json ([Errno 2] No such file or directory: "
                            f"'{folder / 'config.json'}')")
    (folder / "config.json").write_text("{not json")
    with pytest.raises(TraceError) as e:
        checkpoint_identity(str(folder))
    assert str(e.value).startswith(f"{folder}: cannot read config.json (Expecting property name")
    (folder / "config.json").write_text("{}")
    (folder / "model.bin").write_bytes(b"")
    with pytest.raises(TraceError) as e:
        checkpoint_identity(folder)
    assert str(e.value) == f"{folder}: no .safetensors files"


def test_the_same_checkpoint_passes_and_another_is_named(tmp_path):
    rec = checkpoint_identity(checkpoint(tmp_path / "rec"))
    check_checkpoint(rec, checkpoint(tmp_path / "same", files={"x.safetensors": ["a.bias"],
                                                               "y.safetensors": ["b.weight", "c.empty"]}))
    check_checkpoint({**rec, "tensors": {}, "config_sha256": "0"}, tmp_path / "same")   # the whole digest decides
    ts = tensors()
    ts["b.weight"][0, 0] = 9.0
    other = checkpoint(tmp_path / "other", ts)
    with pytest.raises(TraceError) as e:
        check_checkpoint(rec, other)
    assert str(e.value) == f"the trace was recorded on another checkpoint than {other}: 1 of 3 weight tensors differ, first b.weight"
    ts["a.bias"][1] = 0
    ts["extra"] = torch.ones(1)
    other = checkpoint(tmp_path / "other2", ts, config={"hidden_size": 5})
    with pytest.raises(TraceError) as e:
        check_checkpoint(rec, other, "draft")
    assert str(e.value) == (f"the trace was recorded on another draft than {other}: its config differs; "
                            f"3 of 4 weight tensors differ, first a.bias")


def test_a_config_only_change_and_a_bare_record(tmp_path):
    rec = checkpoint_identity(checkpoint(tmp_path / "rec"))
    other = checkpoint(tmp_path / "cfg", config={"hidden_size": 4})
    with pytest.raises(TraceError) as e:
        check_checkpoint(rec, other)
    assert str(e.value) == f"the trace was recorded on another checkpoint than {other}: its config differs; 0 of 3 weight tensors differ"
    with pytest.raises(TraceError) as e:
        check_checkpoint({}, other)
    assert str(e.value) == (f"the trace was recorded on another checkpoint than {other}: its config differs; "
                            f"3 of 3 weight tensors differ, first a.bias")


def test_platform_identity_on_the_cpu():
    assert platform_identity("fp32", "torch") == {"name": "cpu-fp32", "golden_platform": "cpu-fp32",
                                                  "bit_dependencies": {}}
    assert platform_identity("bf16", "triton", "cpu") == {
        "name": "cpu-bf16", "golden_platform": "cpu-bf16-triton",
        "bit_dependencies": {"triton": triton.__version__, "numpy": numpy.__version__}}


def test_platform_identity_names_the_device_asked_for_not_the_default(monkeypatch):
    """On a machine with CUDA, a replay on the CPU is still a CPU replay."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda *a: (9, 0))
    assert platform_identity("fp32", "torch", "cpu")["name"] == "cpu-fp32"


def here(golden="cpu-fp32-triton", **deps):
    return {"name": "cpu-fp32", "golden_platform": golden, "bit_dependencies": deps}


def test_another_platform_name_is_refused():
    with pytest.raises(TraceError) as e:
        check_platform({"name": "cuda-sm90-fp32"}, here())
    assert str(e.value) == ("the trace was recorded on platform cuda-sm90-fp32, this replay runs on cpu-fp32: "
                            "bits are comparable only on one platform")
    with pytest.raises(TraceError) as e:
        check_platform({}, here())
    assert str(e.value).startswith("the trace was recorded on platform None, this replay runs on cpu-fp32:")


def test_another_backend_skips_the_dependencies_the_same_one_checks_them():
    rec = {"name": "cpu-fp32", "golden_platform": "cpu-fp32-triton", "bit_dependencies": {"triton": "3.6.0"}}
    check_platform(rec, here("cpu-fp32", triton="3.9.0"))                  # another backend: its verdicts tell
    check_platform(rec, here(triton="3.6.0"))
    check_platform({"name": "cpu-fp32", "golden_platform": "cpu-fp32"}, here("cpu-fp32"))
    with pytest.raises(TraceError) as e:
        check_platform(rec, here(triton="3.9.0"))
    assert str(e.value) == "the trace's platform cpu-fp32-triton depended on triton 3.6.0; this machine has 3.9.0"
    with pytest.raises(TraceError) as e:
        check_platform({**rec, "bit_dependencies": {"triton": "3.6.0", "numpy": "2.0"}}, here(triton="3.6.0", numpy="2.1"))
    assert str(e.value) == "the trace's platform cpu-fp32-triton depended on numpy 2.0; this machine has 2.1"
    with pytest.raises(TraceError) as e:
        check_platform(rec, here(triton="3.6.0", numpy="2.1"))
    assert str(e.value) == "the trace's platform cpu-fp32-triton depended on numpy (none); this machine has 2.1"
    with pytest.raises(TraceError) as e:
        check_platform({k: v for k, v in rec.items() if k != "bit_dependencies"}, here(triton="3.6.0"))
    assert str(e.value) == "the trace's platform cpu-fp32-triton depended on triton (none); this machine has 3.6.0"
    with pytest.raises(TraceError) as e:
        check_platform(rec, here())
    assert str(e.value) == "the trace's platform cpu-fp32-triton depended on triton 3.6.0; this machine has (none)"
