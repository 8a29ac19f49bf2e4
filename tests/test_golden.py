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

from lockstep.harness.golden import CorruptGolden, GoldenStore

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
    from lockstep.harness.golden import GoldenStore
    store = GoldenStore(sys.argv[1])
    print("ready", flush=True)
    i = 0
    while True:
        i += 1
        store.write("shared", "coins/a", {"v": torch.full((50000,), float(i))}, {"i": i}, "0" * 64, "coins", {})
""")


def test_killed_writer_never_leaves_a_golden_that_loads_wrong(tmp_path):
    """SIGTERM and SIGKILL at arbitrary moments: every load is a whole golden or a reported corruption.
    The writers are forked from one process that imported torch and the store (tests/forking.py)."""
    from tests.forking import Forker

    store = GoldenStore(tmp_path / "golden")
    loads = 0
    with Forker(["torch", "lockstep.harness.golden"]) as forker:
        for round_, sig in enumerate([signal.SIGTERM, signal.SIGKILL] * 4):
            # Start every round from a good golden, so a corruption can only come from this round's kill.
            store.write("shared", "coins/a", {"v": torch.full((50000,), 0.0)}, {"i": 0}, "0" * 64, "coins", {})
            out = tmp_path / f"writer-{round_}.out"
            proc = forker.start(WRITER, [tmp_path / "golden"], cwd=tmp_path, env=os.environ, stdout=out)
            deadline = time.monotonic() + 30
            while not (out.exists() and out.read_text().startswith("ready")):
                assert time.monotonic() < deadline, "the writer never got ready"
                time.sleep(0.002)
            time.sleep(0.05 + 0.037 * round_)
            proc.send_signal(sig)
            assert proc.wait(timeout=30) == -sig          # killed by the signal, not ended some other way
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
    from lockstep.harness.golden import GoldenStore
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


# ------------------------------------------------------------------ found by mutation testing
# Each test below pins a behaviour of harness/golden.py that mutmut showed no fast test held
# (docs/contributing.md).

def test_exists_sees_either_file_of_a_golden(tmp_path):
    store = GoldenStore(tmp_path)
    assert not store.exists("shared", "coins/a")
    write(store)
    assert store.exists("shared", "coins/a") and not store.exists("shared", "coins/b")
    assert not store.exists("cpu-fp32", "coins/a"), "another platform's folder"
    tpath, mpath = store.paths("shared", "coins/a")
    mpath.unlink()
    assert store.exists("shared", "coins/a"), "a tensor file alone is a (corrupt) golden, not a missing one"
    tpath.unlink()
    write(store)
    store.paths("shared", "coins/a")[0].unlink()
    assert store.exists("shared", "coins/a"), "a manifest alone too"


def test_the_manifest_is_reviewable_text_with_kind_and_provenance(tmp_path):
    """Two-space indented, keys sorted at every level, one trailing newline: a golden's diff in
    review shows only what changed. It names the kind and carries the provenance it was given."""
    store = GoldenStore(tmp_path)
    store.write("shared", "coins/a", TENSORS, {"z": 1, "a": {"y": 2, "b": 3}}, "f" * 64, "coins",
                {"versions": {"torch": "x"}, "created": "now"})
    text = store.paths("shared", "coins/a")[1].read_text()
    manifest = json.loads(text)
    assert text == json.dumps(manifest, indent=2, sort_keys=True) + "\n"
    assert text.startswith('{\n  "data": {\n    "a": {\n      "b": 3,'), text[:60]
    assert manifest["kind"] == "coins" and manifest["provenance"] == {"versions": {"torch": "x"}, "created": "now"}
    assert store.load("shared", "coins/a").manifest["kind"] == "coins"


def test_a_golden_with_no_tensors_round_trips(tmp_path):
    """Data-only results (a kind that stores tokens, counts) write an empty tensor file."""
    store = GoldenStore(tmp_path)
    write(store, tensors={}, data={"tokens": [3, 1]})
    g = store.load("shared", "coins/a")
    assert g.tensors == {} and g.data == {"tokens": [3, 1]} and g.manifest["tensors"] == {}


def test_json_roundtrip_gives_data_as_a_manifest_reads_back():
    """What a fresh run is compared in: JSON types (tuples are lists) and keys in the manifest's
    sorted order, so a report of fresh data reads like the golden's."""
    from lockstep.harness.golden import json_roundtrip

    out = json_roundtrip({"z": (1, 2), "a": {"y": 2.5, "b": None}})
    assert out == {"a": {"b": None, "y": 2.5}, "z": [1, 2]}
    assert list(out) == ["a", "z"] and list(out["a"]) == ["b", "y"]


def test_stale_temps_are_regular_files_only_and_removal_reports_what_it_removed(tmp_path, monkeypatch):
    store = GoldenStore(tmp_path)
    write(store)
    folder = tmp_path / "shared/coins"
    debris = folder / "a.json.123.tmp-lockstep"
    debris.write_text("{")
    (folder / "b.tmp-lockstep").mkdir()                                     # not a file
    (folder / "c.tmp-lockstep").symlink_to(tmp_path / "shared/coins/a.json")   # a link: never followed
    assert store.stale_temps() == [debris]
    assert store.remove_stale_temps() == [debris] and not debris.exists()
    assert (folder / "a.json").exists() and (folder / "b.tmp-lockstep").is_dir()
    gone = folder / "gone.tmp-lockstep"                                      # removed by another process meanwhile
    monkeypatch.setattr(GoldenStore, "stale_temps", lambda self: [gone])
    assert store.remove_stale_temps() == []


def test_new_goldens_get_exactly_0666_less_the_umask(tmp_path):
    from lockstep.harness.golden import new_file_mode
    import stat

    old = os.umask(0)
    try:
        assert new_file_mode() == 0o666, "no execute bit, whatever the umask"
        write(GoldenStore(tmp_path))
    finally:
        os.umask(old)
    for f in (tmp_path / "shared/coins").iterdir():
        assert stat.S_IMODE(f.stat().st_mode) == 0o666, f


def test_the_umask_is_read_without_setting_it(monkeypatch):
    """Setting the umask to read it back races with other threads creating files: on Linux it is
    read from /proc/self/status."""
    from lockstep.harness.golden import current_umask

    expected = os.umask(0o023)
    os.umask(expected)
    if not os.path.exists("/proc/self/status"):
        pytest.skip("no /proc here: the os.umask fallback is the only way")

    def no_umask(mask):
        raise AssertionError("current_umask set the umask to read it")

    monkeypatch.setattr(os, "umask", no_umask)
    assert current_umask() == expected


def test_the_umask_fallback_reads_it_and_puts_it_back(monkeypatch):
    """Where /proc cannot be read, the umask is read by setting it and restoring it at once."""
    from pathlib import Path

    from lockstep.harness.golden import current_umask

    def unreadable(self, *args, **kwargs):
        raise OSError("no /proc here")

    old = os.umask(0o037)
    try:
        monkeypatch.setattr(Path, "read_text", unreadable)
        assert current_umask() == 0o037
        assert os.umask(0o037) == 0o037, "the umask was left changed"
    finally:
        os.umask(old)


def test_temporary_files_are_written_beside_the_golden_under_the_temp_suffix(tmp_path, monkeypatch):
    """Beside it (the rename is atomic only within one filesystem, and stale_temps looks for
    debris only under the golden folder), named <file>.<random>.tmp-lockstep."""
    store = GoldenStore(tmp_path)
    renamed = []
    real_replace = os.replace
    monkeypatch.setattr(os, "replace", lambda src, dst: (renamed.append((src, dst)), real_replace(src, dst)))
    write(store)
    tpath, mpath = store.paths("shared", "coins/a")
    assert [dst for _, dst in renamed] == [tpath, mpath]
    for path, dst in renamed:
        src = os.path.basename(path)
        assert os.path.dirname(path) == str(tpath.parent), path
        assert src.startswith(dst.name + ".") and src.endswith(".tmp-lockstep") and len(src) > len(dst.name) + 14, src


def test_a_write_that_fails_inside_a_temporary_file_removes_it_and_raises_its_error(tmp_path, monkeypatch):
    store = GoldenStore(tmp_path)

    def full(fd):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "fsync", full)
    with pytest.raises(OSError, match="No space left"):
        write(store)
    assert list((tmp_path / "shared/coins").iterdir()) == [], "no temporary file and no golden left"


@pytest.mark.parametrize("damage, says", [
    ("truncate", r"coins/a\.safetensors: sha256 [0-9a-f]{16}… does not match the manifest's [0-9a-f]{16}… "
                 r"\(truncated or edited\)$"),
    ("no_manifest", r"coins/a\.safetensors has no manifest a\.json beside it$"),
    ("no_tensors", r"coins/a\.json has no tensor file a\.safetensors beside it$"),
    ("bad_json", r"coins/a\.json: manifest is not valid JSON \(Expecting"),
    ("format_2", r"coins/a\.json: not a lockstep golden manifest of format 1$"),
    ("a_list", r"coins/a\.json: not a lockstep golden manifest of format 1$"),
    ("other_spec", r"coins/a\.json: the manifest names spec 'coins/b', not 'coins/a' "
                   r"\(copied or renamed from another golden\?\)$"),
    ("not_safetensors", r"coins/a\.safetensors: unreadable safetensors \(.+\)$"),
    ("no_tensor_list", r"coins/a\.safetensors: holds tensors \['bf', 'coins', 'f8', 'ids'\], manifest lists \[\]$"),
    ("tensors_a_list", r"coins/a\.json: 'tensors' and 'data' must be JSON objects$"),
    ("data_a_list", r"coins/a\.json: 'tensors' and 'data' must be JSON objects$"),
    ("entry_sha", r"coins/a\.safetensors: tensor 'ids' disagrees with its manifest entry$"),
])
def test_a_damaged_golden_says_what_is_wrong_with_which_file(tmp_path, damage, says):
    """The CorruptGolden message a user acts on: the file, and what about it is wrong."""
    import re

    store = GoldenStore(tmp_path)
    write(store)
    tpath, mpath = store.paths("shared", "coins/a")
    manifest = json.loads(mpath.read_text())
    if damage == "truncate":
        tpath.write_bytes(tpath.read_bytes()[:40])
    elif damage == "no_manifest":
        mpath.unlink()
    elif damage == "no_tensors":
        tpath.unlink()
    elif damage == "bad_json":
        mpath.write_text("{not json")
    elif damage == "format_2":
        mpath.write_text(json.dumps(manifest | {"format": 2}))
    elif damage == "a_list":
        mpath.write_text(json.dumps([manifest]))
    elif damage == "other_spec":
        mpath.write_text(json.dumps(manifest | {"spec": "coins/b"}))
    elif damage == "not_safetensors":                   # its digest recorded: only the format is wrong
        from lockstep.harness.golden import sha256
        tpath.write_bytes(b"\x08" + b"\0" * 7 + b"not json")
        mpath.write_text(json.dumps(manifest | {"tensors_file_sha256": sha256(tpath.read_bytes())}))
    elif damage == "no_tensor_list":
        mpath.write_text(json.dumps({k: v for k, v in manifest.items() if k != "tensors"}))
    elif damage == "tensors_a_list":
        mpath.write_text(json.dumps(manifest | {"tensors": []}))
    elif damage == "data_a_list":
        mpath.write_text(json.dumps(manifest | {"data": []}))
    elif damage == "entry_sha":
        manifest["tensors"]["ids"]["sha256"] = "0" * 64
        mpath.write_text(json.dumps(manifest))
    with pytest.raises(CorruptGolden) as e:
        store.load("shared", "coins/a")
    assert re.search(says, str(e.value)), str(e.value)
    if damage == "truncate":
        digest = json.loads(mpath.read_text())["tensors_file_sha256"]
        assert f"the manifest's {digest[:16]}…" in str(e.value), "the recorded digest, cut to 16 characters"


def test_an_unreadable_golden_names_the_os_error(tmp_path, monkeypatch):
    from pathlib import Path

    store = GoldenStore(tmp_path)
    write(store)

    def denied(self):
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(Path, "read_bytes", denied)
    with pytest.raises(CorruptGolden, match=r"coins/a\.json: cannot be read \(Permission denied\)$"):
        store.load("shared", "coins/a")


def test_each_tensor_s_manifest_entry_is_its_dtype_shape_and_digest(tmp_path):
    import re

    store = GoldenStore(tmp_path)
    write(store)
    entries = store.load("shared", "coins/a").manifest["tensors"]
    assert {name: (e["dtype"], e["shape"]) for name, e in entries.items()} == {
        "coins": ("float32", [2, 2]), "ids": ("int64", [5]), "bf": ("bfloat16", [2]), "f8": ("float8_e4m3fn", [2])}
    assert all(set(e) == {"dtype", "shape", "sha256"} and re.fullmatch("[0-9a-f]{64}", e["sha256"])
               for e in entries.values()), entries


def test_a_manifest_without_data_loads_as_empty_data(tmp_path):
    store = GoldenStore(tmp_path)
    write(store)
    mpath = store.paths("shared", "coins/a")[1]
    mpath.write_text(json.dumps({k: v for k, v in json.loads(mpath.read_text()).items() if k != "data"}))
    assert store.load("shared", "coins/a").data == {}


def test_a_malformed_proc_umask_line_falls_back_to_reading_the_umask(monkeypatch):
    from pathlib import Path

    from lockstep.harness.golden import current_umask

    monkeypatch.setattr(Path, "read_text", lambda self, *a, **k: "Name:\tpython3\nUmask:\tnot octal\n")
    old = os.umask(0o026)
    try:
        assert current_umask() == 0o026
    finally:
        os.umask(old)


def test_a_golden_folder_linked_out_of_the_golden_directory_is_refused(tmp_path):
    """Spec ids cannot spell an escape (check_spec_id); a symlinked folder can, and is refused."""
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "golden").mkdir()
    (tmp_path / "golden" / "shared").symlink_to(tmp_path / "elsewhere")
    store = GoldenStore(tmp_path / "golden")
    with pytest.raises(ValueError, match=r"^spec id 'coins/a' would leave the golden directory .*golden$"):
        store.paths("shared", "coins/a")


def test_a_filesystem_that_cannot_fsync_folders_still_records_goldens(tmp_path, monkeypatch):
    """Some filesystems refuse fsync on a directory (EINVAL): the files themselves were synced."""
    import errno
    import stat

    real_fsync = os.fsync

    def files_only(fd):
        if stat.S_ISDIR(os.fstat(fd).st_mode):
            raise OSError(errno.EINVAL, "Invalid argument")
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", files_only)
    store = GoldenStore(tmp_path)
    write(store)
    assert store.load("shared", "coins/a").data == {"tokens": [1, 2]}


def test_a_failed_cleanup_never_hides_the_write_s_own_error(tmp_path, monkeypatch):
    def full(fd):
        raise OSError(28, "No space left on device")

    def gone(path):
        raise FileNotFoundError(2, "No such file or directory")

    monkeypatch.setattr(os, "fsync", full)
    monkeypatch.setattr(os, "unlink", gone)
    with pytest.raises(OSError, match="No space left"):
        write(GoldenStore(tmp_path))
