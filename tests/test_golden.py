"""The golden store: round trips, corruption detection, atomic writes."""

import json
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest
import torch

from harness.golden import CorruptGolden, GoldenStore

TENSORS = {"coins": torch.tensor([[0.25, -0.0], [1.5, 2.0]]), "ids": torch.arange(5),
           "bf": torch.tensor([1.0, 3.0]).bfloat16(), "f8": torch.tensor([0.5, -2.0]).to(torch.float8_e4m3fn)}


def write(store, tensors=TENSORS, data=None, spec_id="coins/a"):
    store.write("shared", spec_id, tensors, data or {"tokens": [1, 2]}, "f" * 64, "coins", {"created": "now"})


def test_round_trip_is_bitwise(tmp_path):
    store = GoldenStore(tmp_path)
    write(store)
    g = store.load("shared", "coins/a")
    assert g.data == {"tokens": [1, 2]}
    for name, t in TENSORS.items():
        assert g.tensors[name].dtype == t.dtype and torch.equal(g.tensors[name].view(torch.uint8), t.view(torch.uint8))
    assert g.manifest["tensors"]["coins"]["shape"] == [2, 2]
    assert store.ids() == {"shared": ["coins/a"]}


def test_same_content_gives_same_bytes(tmp_path):
    a, b = GoldenStore(tmp_path / "a"), GoldenStore(tmp_path / "b")
    write(a)
    write(b)
    for suffix in (".safetensors", ".json"):
        assert (tmp_path / "a/shared/coins" / f"a{suffix}").read_bytes() == (tmp_path / "b/shared/coins" / f"a{suffix}").read_bytes()


def test_missing_golden_is_none(tmp_path):
    assert GoldenStore(tmp_path).load("shared", "coins/none") is None


@pytest.mark.parametrize("damage", ["truncate", "flip", "bad_header", "no_manifest", "no_tensors", "bad_json",
                                    "manifest_sha"])
def test_damaged_goldens_are_reported_and_left_alone(tmp_path, damage):
    store = GoldenStore(tmp_path)
    write(store)
    tpath, mpath = store.paths("shared", "coins/a")
    blob = tpath.read_bytes()
    if damage == "truncate":
        tpath.write_bytes(blob[: len(blob) // 2])
    elif damage == "flip":
        tpath.write_bytes(blob[:-1] + bytes([blob[-1] ^ 1]))
    elif damage == "bad_header":
        tpath.write_bytes(b"\xff" * 8 + blob[8:])
    elif damage == "no_manifest":
        mpath.unlink()
    elif damage == "no_tensors":
        tpath.unlink()
    elif damage == "bad_json":
        mpath.write_text("{not json")
    elif damage == "manifest_sha":
        m = json.loads(mpath.read_text())
        m["tensors"]["ids"]["sha256"] = "0" * 64
        mpath.write_text(json.dumps(m))
    before = {p: p.read_bytes() for p in (tpath, mpath) if p.exists()}
    with pytest.raises(CorruptGolden):
        store.load("shared", "coins/a")
    assert before == {p: p.read_bytes() for p in (tpath, mpath) if p.exists()}


def test_ids_cannot_escape_the_golden_directory(tmp_path):
    store = GoldenStore(tmp_path / "golden")
    for bad in ("../x", "a/../../x", "/etc/passwd"):
        with pytest.raises(ValueError):
            store.paths("shared", bad)
    with pytest.raises(ValueError):
        store.paths("../up", "coins/a")


def test_failed_write_keeps_the_old_golden_and_leaves_no_temp_files(tmp_path, monkeypatch):
    store = GoldenStore(tmp_path)
    write(store)
    before = {p.name: p.read_bytes() for p in (tmp_path / "shared/coins").iterdir()}
    real_replace = os.replace

    def failing_replace(src, dst):
        raise OSError("disk full")

    monkeypatch.setattr(os, "replace", failing_replace)
    with pytest.raises(OSError):
        write(store, {"coins": torch.zeros(3)})
    monkeypatch.setattr(os, "replace", real_replace)
    assert {p.name: p.read_bytes() for p in (tmp_path / "shared/coins").iterdir()} == before


WRITER = textwrap.dedent("""
    import sys, torch
    from harness.golden import GoldenStore
    store = GoldenStore(sys.argv[1])
    print("ready", flush=True)
    i = 0
    while True:
        i += 1
        store.write("shared", "coins/a", {"v": torch.full((50000,), float(i))}, {"i": i}, "0" * 64, "coins", {})
""")


def test_killed_writer_never_leaves_a_golden_that_loads_wrong(tmp_path):
    """SIGTERM and SIGKILL at arbitrary moments: every load is a whole golden or a reported corruption."""
    store = GoldenStore(tmp_path)
    loads = 0
    for round_, sig in enumerate([signal.SIGTERM, signal.SIGKILL] * 4):
        # Start every round from a good golden, so a corruption can only come from this round's kill.
        store.write("shared", "coins/a", {"v": torch.full((50000,), 0.0)}, {"i": 0}, "0" * 64, "coins", {})
        proc = subprocess.Popen([sys.executable, "-c", WRITER, str(tmp_path)], stdout=subprocess.PIPE)
        assert proc.stdout.readline().strip() == b"ready"
        time.sleep(0.05 + 0.037 * round_)
        proc.send_signal(sig)
        proc.wait(timeout=30)
        try:
            g = store.load("shared", "coins/a")
        except CorruptGolden:
            assert sig == signal.SIGKILL  # only an uncatchable kill between the two renames may do this
            continue
        i = g.data["i"]
        assert torch.equal(g.tensors["v"], torch.full((50000,), float(i)))
        loads += 1
    assert loads >= 4


SIGTERM_TO_A_THREAD = textwrap.dedent("""
    import os, signal, sys, threading, time, torch
    from harness.golden import GoldenStore
    store = GoldenStore(sys.argv[1])
    store.write("shared", "coins/a", {"v": torch.zeros(8)}, {"i": 0}, "0" * 64, "coins", {})
    other = threading.Thread(target=threading.Event().wait, daemon=True)   # blocks no signal,
    other.start()                                                          # like torch's workers
    real_replace, calls = os.replace, []
    def replace(src, dst):
        real_replace(src, dst)
        calls.append(dst)
        if len(calls) == 1:                      # between the tensors' rename and the manifest's
            signal.pthread_kill(other.ident, signal.SIGTERM)
            time.sleep(0.3)
    os.replace = replace
    store.write("shared", "coins/a", {"v": torch.ones(8)}, {"i": 1}, "0" * 64, "coins", {})
    print("not stopped", flush=True)
""")


def test_sigterm_delivered_to_another_thread_waits_for_both_renames(tmp_path):
    """The kernel may hand a kill to any thread; one that does not block it (every torch worker)
    must not end the process between the two renames. The deferred SIGTERM still ends it after."""
    proc = subprocess.run([sys.executable, "-c", SIGTERM_TO_A_THREAD, str(tmp_path)], capture_output=True,
                          timeout=60)
    assert proc.returncode == -signal.SIGTERM, proc.stderr.decode()[-2000:]
    assert b"not stopped" not in proc.stdout
    g = GoldenStore(tmp_path).load("shared", "coins/a")      # whole, new golden: not CorruptGolden
    assert g.data["i"] == 1 and torch.equal(g.tensors["v"], torch.ones(8))
