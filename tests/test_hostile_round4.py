"""Hostile input, round four: bounded and located reads of every JSON/JSONL/YAML file a command
takes (harness/readers.py), write errors of a full or read-only disk, expectations files with
duplicate keys or wrong types, and plugin code that calls sys.exit, prints into --json or returns
what the interface does not allow. Each: its exit code and one located line, nothing written."""

import errno
import json
import os
import shutil
import sys

import pytest

from lockstep.harness import readers
from lockstep.harness.cli import main
from lockstep.harness.targets import expectfile
from tests.conftest import REPO


def run(capsys, *argv):
    code = main([str(a) for a in argv])
    out = capsys.readouterr()
    return code, out.out, out.err


def one_error(err: str) -> str:
    lines = [ln for ln in err.splitlines() if ln.startswith("lockstep:")]     # besides progress lines
    assert len(lines) == 1 and lines[0].startswith("lockstep: error: "), err
    assert "Traceback" not in err and "internal error" not in err
    return lines[0]


DEEP = "[" * 100_000 + "]" * 100_000


# ------------------------------------------------------------------ the bounded reader
def test_the_reader_refuses_what_is_not_a_regular_file(tmp_path):
    fifo = tmp_path / "f.jsonl"
    os.mkfifo(fifo)
    with pytest.raises(readers.ReadError, match=r"f.jsonl: a FIFO, not a regular trace file: refused"):
        readers.read_bytes(fifo, 100, "trace file")                 # never blocks waiting for a writer
    with pytest.raises(readers.ReadError, match=r"zero: a character device, not a regular"):
        readers.read_bytes("/dev/zero", 100)
    (tmp_path / "gone").symlink_to(tmp_path / "nowhere")
    with pytest.raises(readers.ReadError, match=r"gone: no such file \(a dangling symbolic link\)"):
        readers.read_bytes(tmp_path / "gone", 100)
    with pytest.raises(readers.ReadError, match="a folder"):
        readers.read_bytes(tmp_path, 100)


def test_the_reader_bounds_the_bytes_read_and_the_nesting(tmp_path):
    (tmp_path / "big").write_bytes(b"x" * 101)
    with pytest.raises(readers.TooLarge, match=r"larger than 100 bytes"):
        readers.read_bytes(tmp_path / "big", 100)
    with pytest.raises(readers.ReadError, match=r"^f:3: nested deeper than 64 levels: refused$"):
        readers.json_value(DEEP, "f:3")
    with pytest.raises(readers.ReadError, match=r"nested deeper than 64"):
        readers.json_value("[" * 65 + "]" * 65, "f")
    assert readers.json_value("[" * 64 + "]" * 64, "f") is not None


@pytest.mark.parametrize("make", ["deep", "dev-zero", "fifo"])
def test_record_replay_and_import_peer_refuse_hostile_files_located(tmp_path, monkeypatch, capsys, make):
    monkeypatch.chdir(REPO)
    path = tmp_path / "in.jsonl"
    if make == "deep":
        path.write_text(DEEP + "\n")
    elif make == "dev-zero":
        path.symlink_to("/dev/zero")
    else:
        os.mkfifo(path)
    words = {"deep": f"{path}:1: nested deeper than 64 levels",
             "dev-zero": f"{path}: a character device, not a regular", "fifo": f"{path}: a FIFO, not a regular"}[make]
    out_trace = tmp_path / "out.jsonl"
    for argv in (["record", out_trace, "--checkpoint", "models/tiny-target", "--requests", path],
                 ["replay", path],
                 ["import-peer", path, "--format", "vllm", "--checkpoint", "models/tiny-target",
                  "--out", out_trace]):
        code, out, err = run(capsys, *argv)
        assert code == 2 and words in one_error(err), (argv, err)
        assert not out_trace.exists()


def test_an_expectations_file_nested_5000_deep_is_located(tmp_path):
    p = tmp_path / "exp.yaml"
    p.write_text("target: toy\nversions: '>=1'\nfailures: " + "[" * 5000 + "]" * 5000 + "\n")
    with pytest.raises(expectfile.ExpectationsError, match=r"exp.yaml:3:\d+: nested deeper than 32 levels"):
        expectfile.load(p, "toy", "1.0")


@pytest.mark.parametrize("body,line,words", [
    ("target: toy\ntarget: other\nversions: '>=1'\n", 2, "duplicate key 'target' (first defined on line 1)"),
    ("target: toy\nversions: '>=1'\nfailures:\n  a/b: {observed: x, judgement: peer bug, why: y}\n"
     "  a/b: {observed: z, judgement: peer bug, why: y}\n", 5, "duplicate key 'a/b'"),
    ("target: toy\nversions: '>=1'\nfailures:\n  a/b:\n    observed: [1, 2]\n    judgement: peer bug\n"
     "    why: y\n", 5, "failures.a/b.observed must be a string, got list"),
    ("target: [toy]\nversions: '>=1'\n", 1, "target must be a string, got list"),
    ("target: toy\nversions: '>=1'\nfailurs: {}\n", 3, "unknown key 'failurs'"),
])
def test_expectations_refuse_duplicate_keys_and_wrong_types_with_their_line(tmp_path, body, line, words):
    p = tmp_path / "exp.yaml"
    p.write_text(body)
    with pytest.raises(expectfile.ExpectationsError) as e:
        expectfile.load(p, "toy", "1.0")
    assert str(e.value).startswith(f"{p}:{line}") and words in str(e.value), str(e.value)


# ------------------------------------------------------------------ writes
def test_make_checkpoint_into_a_full_disk_is_exit_2_with_the_path(tmp_path, monkeypatch, capsys):
    from lockstep.harness.commands import make_checkpoint as command

    class SafetensorError(Exception):
        pass

    def full(*a, **k):
        raise SafetensorError('Error while serializing: IoError(Os { code: 28, kind: StorageFull, '
                              'message: "No space left on device" })')
    monkeypatch.setattr(command, "make_checkpoint", full)
    code, out, err = run(capsys, "make-checkpoint", "--preset", "tiny", tmp_path / "ck")
    assert code == 2 and one_error(err) == f"lockstep: error: cannot write {tmp_path / 'ck'}: No space left on device"
    assert not (tmp_path / "ck").exists()


@pytest.mark.parametrize("code_,words", [(errno.ENOSPC, "No space left on device"), (errno.EROFS, "Read-only")])
def test_a_write_the_file_system_refuses_is_exit_2_with_the_path(monkeypatch, capsys, tmp_path, code_, words):
    from lockstep.harness.commands import make_checkpoint as command

    def refuse(*a, **k):
        raise OSError(code_, os.strerror(code_), str(tmp_path / "out" / "x.safetensors"))
    monkeypatch.setattr(command, "checkpoint_size", refuse)     # outside make-checkpoint's own handler
    code, out, err = run(capsys, "make-checkpoint", "--preset", "tiny", tmp_path / "ck")
    assert code == 2 and one_error(err).startswith(f"lockstep: error: cannot write {tmp_path / 'out' / 'x.safetensors'}: ")
    assert words in err


# ------------------------------------------------------------------ plugin code
ADAPTER = '''
import sys

import torch

from lockstep.harness.targets import Op, Target
from lockstep.kernels.coins import murmur_hash32_torch


def exits():
    sys.exit(0)


def noisy_hash(seeds, positions, columns):
    print("hello from the plugin")
    return murmur_hash32_torch(seeds, positions, columns)


def noisy():
    print("loading the noisy plugin")
    return Target("noisy", "1.0", ops={"hash": Op(noisy_hash)})


def text():
    return Target("text", "1.0", ops={"hash": Op(lambda s, p, c: "not a tensor")})


def shape():
    return Target("shape", "1.0", ops={"hash": Op(lambda s, p, c: torch.zeros(1, dtype=torch.int64))})
'''


@pytest.fixture
def plugins(project, monkeypatch):
    dist = project / "round4_targets-1.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: round4_targets\nVersion: 1.0\n")
    (dist / "entry_points.txt").write_text("[lockstep.targets]\nexits = round4_adapter:exits\n"
                                           "noisy = round4_adapter:noisy\ntext = round4_adapter:text\n"
                                           "shape = round4_adapter:shape\n")
    (project / "round4_adapter.py").write_text(ADAPTER)
    monkeypatch.syspath_prepend(str(project))
    monkeypatch.delitem(sys.modules, "round4_adapter", raising=False)
    return project


def test_a_factory_calling_sys_exit_0_is_not_success(plugins, capsys):
    code, out, err = run(capsys, "check", "--target", "exits", "coins/known-answers")
    assert code != 0 and "called sys.exit(0)" in err and "round4_adapter.py:" in err, err


def test_plugin_prints_stay_out_of_the_json_document(plugins, capsys):
    code, out, err = run(capsys, "check", "--json", "--target", "noisy", "coins/known-answers")
    doc = json.loads(out)                                   # stdout is the document alone
    assert doc["specs"][0]["status"] == "pass" and code == doc["exit_code"] == 0
    assert "loading the noisy plugin" in err and "hello from the plugin" in err


@pytest.mark.parametrize("name,words", [
    ("text", "target 'text': its hash operation returned str; the interface (harness/target.py) says a "
             "[1, 1] int64 tensor"),
    ("shape", "target 'shape': its hash operation returned Tensor [1] int64"),
])
def test_what_a_target_returns_is_checked_with_its_name(plugins, capsys, name, words):
    code, out, err = run(capsys, "check", "--target", name, "coins/known-answers")
    assert code == 1 and words in out + err and "IndexError" not in out + err, out + err


@pytest.mark.parametrize("pattern,words", [
    ("linked/*", "specs/linked: a symbolic link to a folder: the specs under it are not loaded"),
    ("real/gone", "specs/real/gone.yaml: a broken symbolic link: it cannot be read as a spec"),
])
def test_a_pattern_naming_only_an_unreadable_spec_says_why(tmp_path, monkeypatch, capsys, pattern, words):
    (tmp_path / "specs" / "real").mkdir(parents=True)
    (tmp_path / "elsewhere").mkdir()
    shutil.copy(REPO / "specs" / "coins" / "known-answers.yaml", tmp_path / "elsewhere")
    (tmp_path / "specs" / "linked").symlink_to(tmp_path / "elsewhere")
    (tmp_path / "specs" / "real" / "gone.yaml").symlink_to(tmp_path / "nowhere.yaml")
    monkeypatch.chdir(tmp_path)
    code, out, err = run(capsys, "validate", pattern)
    assert code == 2 and words in out and "no spec matches" not in err, (out, err)
