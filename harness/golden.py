"""The golden store: `golden/<platform>/<spec id>.safetensors` plus a JSON manifest beside it.

The safetensors file holds the result's tensors. The manifest (`<spec id>.json`) holds the
result's non-tensor data and the provenance a reviewer reads in a diff: spec hash, lockstep
revision, versions, device, dtype policy, topologies, creation time, and each tensor's dtype,
shape and sha256, plus the sha256 of the whole tensor file. Loading checks all of them, so a
truncated or edited golden is reported as corrupt, never compared as if it were good.

Writes are atomic: each file is written to a temporary file in its folder, flushed to disk and
renamed over the old one; SIGINT and SIGTERM are deferred from before the first temporary file
is created until both are renamed. A kill -9 between the renames leaves a new tensor file beside
the old manifest, which the sha256 check reports as corrupt rather than accepting; a kill -9
before them leaves a `*.tmp-lockstep` file, which `stale_temps` finds (check --strict fails on
it, regen removes it). New files get the mode the umask gives (0644 under
the usual 022), like any file the user writes. `writer_lock` lets one writer at a time record
goldens in a golden folder (an advisory lock on the folder itself: no lock file is left behind).

A manifest names its spec and platform; a golden whose manifest names another one (a file copied
or renamed by hand) is corrupt, never compared as if it were this spec's.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import signal
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors import SafetensorError
from safetensors.torch import load as st_load, save as st_save

from lockstep.harness.digest import sha256, standard, tensor_sha256  # noqa: F401 - also harness.golden's
from lockstep.harness.specfile import check_spec_id

FORMAT = 1
TENSORS_SUFFIX = ".safetensors"
MANIFEST_SUFFIX = ".json"
TEMP_SUFFIX = ".tmp-lockstep"  # a write in progress (or, after a kill -9, its debris)


class CorruptGolden(Exception):
    """A golden that is unreadable, disagrees with its own manifest, or names another spec."""


class GoldenLocked(Exception):
    """Another process is recording goldens in the same golden folder."""


@dataclass
class Golden:
    tensors: dict[str, torch.Tensor]
    data: dict
    manifest: dict


def tensor_entry(t: torch.Tensor) -> dict:
    return {"dtype": str(t.dtype).removeprefix("torch."), "shape": list(t.shape), "sha256": tensor_sha256(t)}


def json_roundtrip(data):
    """Data as it will read back from a manifest: what a fresh run is compared in."""
    return json.loads(json.dumps(data, sort_keys=True))


class GoldenStore:
    def __init__(self, root: Path):
        self.root = Path(root)

    # ------------------------------------------------------------------ paths
    def paths(self, platform: str, spec_id: str) -> tuple[Path, Path]:
        check_spec_id(spec_id)
        check_spec_id(platform)
        base = (self.root / platform / spec_id).resolve()
        root = self.root.resolve()
        if root not in base.parents:
            raise ValueError(f"spec id {spec_id!r} would leave the golden directory {self.root}")
        return base.with_name(base.name + TENSORS_SUFFIX), base.with_name(base.name + MANIFEST_SUFFIX)

    def exists(self, platform: str, spec_id: str) -> bool:
        return any(p.exists() for p in self.paths(platform, spec_id))

    def ids(self) -> dict[str, list[str]]:
        """{platform: [spec id, ...]} of every golden on disk (by manifest or tensor file)."""
        out: dict[str, list[str]] = {}
        if not self.root.is_dir():
            return out
        for pdir in sorted(p for p in self.root.iterdir() if p.is_dir()):
            ids = set()
            for f in pdir.rglob("*"):
                for suffix in (MANIFEST_SUFFIX, TENSORS_SUFFIX):
                    if f.is_file() and f.name.endswith(suffix):
                        ids.add(f.relative_to(pdir).as_posix()[: -len(suffix)])
            out[pdir.name] = sorted(ids)
        return out

    # ------------------------------------------------------------------ read
    def other_triton(self, platform: str, spec_id: str, here: str) -> str | None:
        """Why the golden is not comparable here, or None: a Triton folder's golden (`*-triton`:
        the interpreter on a CPU, the compiled kernels on a GPU) whose provenance names another
        Triton than `here` (this machine's version). Triton releases differ in what a kernel
        computes and in what the interpreter accepts, so such a golden can neither pass nor
        honestly fail. A manifest that cannot be read is left to `load` to report."""
        if not platform.endswith("-triton"):
            return None
        try:
            manifest = json.loads(_read_bytes(self.paths(platform, spec_id)[1]).decode("utf-8"))
        except (CorruptGolden, OSError, ValueError, UnicodeDecodeError, RecursionError):
            return None
        try:
            recorded = manifest["provenance"]["bit_dependencies"]["triton"]
        except (KeyError, TypeError):
            recorded = None
        if not isinstance(recorded, str) or not recorded:      # fail closed: no version, no comparison
            return (f"not comparable: the golden names no Triton version (provenance.bit_dependencies.triton is "
                    f"{'missing' if recorded is None else 'not a string: ' + repr(recorded)[:40]}), and a Triton "
                    f"golden's bits depend on it; record it again with `lockstep regen {spec_id}`")
        if recorded == here:
            return None
        return (f"not comparable: the golden was recorded under triton {recorded}, this machine has triton "
                f"{here}; check under triton {recorded} (the goldens' version, see pyproject.toml), or "
                f"record goldens for {here} in another --golden folder")

    def load(self, platform: str, spec_id: str) -> Golden | None:
        """The golden, None when there is none, CorruptGolden when it cannot be trusted."""
        tpath, mpath = self.paths(platform, spec_id)
        if not _exists(tpath) and not _exists(mpath):
            return None
        if not _exists(mpath):
            raise CorruptGolden(f"{tpath} has no manifest {mpath.name} beside it")
        if not _exists(tpath):
            raise CorruptGolden(f"{mpath} has no tensor file {tpath.name} beside it")
        try:
            manifest = json.loads(_read_bytes(mpath).decode("utf-8"))
        except (ValueError, UnicodeDecodeError) as e:
            raise CorruptGolden(f"{mpath}: manifest is not valid JSON ({e})") from None
        if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
            raise CorruptGolden(f"{mpath}: not a lockstep golden manifest of format {FORMAT}")
        for key, want in (("spec", spec_id), ("platform", platform)):
            if manifest.get(key) != want:
                raise CorruptGolden(f"{mpath}: the manifest names {key} {manifest.get(key)!r}, not {want!r} "
                                    "(copied or renamed from another golden?)")
        blob = _read_bytes(tpath)
        if sha256(blob) != manifest.get("tensors_file_sha256"):
            raise CorruptGolden(f"{tpath}: sha256 {sha256(blob)[:16]}… does not match the manifest's "
                                f"{str(manifest.get('tensors_file_sha256'))[:16]}… (truncated or edited)")
        try:
            tensors = st_load(blob)
        except (SafetensorError, ValueError, RuntimeError) as e:
            raise CorruptGolden(f"{tpath}: unreadable safetensors ({e})") from None
        listed = manifest.get("tensors", {})
        if not isinstance(listed, dict) or not isinstance(manifest.get("data", {}), dict):
            raise CorruptGolden(f"{mpath}: 'tensors' and 'data' must be JSON objects")
        if sorted(listed) != sorted(tensors):
            raise CorruptGolden(f"{tpath}: holds tensors {sorted(tensors)}, manifest lists {sorted(listed)}")
        for name, t in tensors.items():
            if tensor_entry(t) != listed[name]:
                raise CorruptGolden(f"{tpath}: tensor {name!r} disagrees with its manifest entry")
        return Golden(tensors=tensors, data=manifest.get("data", {}), manifest=manifest)

    # ------------------------------------------------------------------ write
    def write(self, platform: str, spec_id: str, tensors: dict[str, torch.Tensor], data: dict,
              spec_sha256: str, kind: str, provenance: dict) -> None:
        tpath, mpath = self.paths(platform, spec_id)
        tensors = {k: standard(v) for k, v in sorted(tensors.items())}
        blob = st_save(tensors) if tensors else st_save({})
        manifest = {
            "format": FORMAT,
            "spec": spec_id,
            "kind": kind,
            "platform": platform,
            "spec_sha256": spec_sha256,
            "tensors_file_sha256": sha256(blob),
            "tensors": {k: tensor_entry(v) for k, v in tensors.items()},
            "data": json_roundtrip(data),
            "provenance": provenance,
        }
        text = json.dumps(manifest, indent=2, sort_keys=True) + "\n"
        tpath.parent.mkdir(parents=True, exist_ok=True)
        temps = []
        # Signals are deferred from before the first temporary file exists until the last is
        # renamed or removed: a SIGINT or SIGTERM anywhere in the write leaves no debris.
        with _signals_held():
            try:
                temps.append(_write_temp(tpath, blob))
                temps.append(_write_temp(mpath, text.encode()))
                os.replace(temps[0], tpath)
                os.replace(temps[1], mpath)
            finally:
                for tmp in temps:  # only left over when something failed
                    with contextlib.suppress(OSError):
                        os.unlink(tmp)
        _fsync_dir(tpath.parent)

    # ------------------------------------------------------------------ debris of a kill -9
    def stale_temps(self) -> list[Path]:
        """Temporary files of writes that never finished (only a kill -9 leaves one: other signals
        are deferred until the write is done); `check --strict` fails on them, `regen` removes them."""
        if not self.root.is_dir():
            return []
        return sorted(p for p in self.root.rglob("*" + TEMP_SUFFIX) if p.is_file() and not p.is_symlink())

    def remove_stale_temps(self) -> list[Path]:
        """Remove stale temporary files; call it only under the exclusive writer_lock (no write in flight)."""
        removed = []
        for p in self.stale_temps():
            with contextlib.suppress(FileNotFoundError):
                p.unlink()
                removed.append(p)
        return removed

    # ------------------------------------------------------------------ one writer at a time
    @contextlib.contextmanager
    def writer_lock(self, shared: bool = False):
        """Hold the golden folder for writing: exclusive for `lockstep regen`, shared for the pytest
        plugin's workers (which record disjoint specs). GoldenLocked, at once, when another process
        holds it in a conflicting mode; released when the block ends or the process dies."""
        self.root.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.root, os.O_RDONLY)
        try:
            try:
                fcntl.flock(fd, (fcntl.LOCK_SH if shared else fcntl.LOCK_EX) | fcntl.LOCK_NB)
            except OSError as e:
                if e.errno not in (errno.EWOULDBLOCK, errno.EACCES):
                    raise
                raise GoldenLocked(f"another process is recording goldens in {self.root} (a `lockstep regen` or "
                                   "`pytest --lockstep-regen`); wait for it to finish, then run this again") from None
            yield
        finally:
            os.close(fd)


def _exists(path: Path) -> bool:
    """Whether something is at `path` (a broken link or a folder counts: it is then corrupt, not absent)."""
    return path.exists() or path.is_symlink()


def _read_bytes(path: Path) -> bytes:
    if not path.is_file():
        raise CorruptGolden(f"{path}: not a regular file")
    try:
        return path.read_bytes()
    except OSError as e:
        raise CorruptGolden(f"{path}: cannot be read ({e.strerror or e})") from None


def new_file_mode() -> int:
    """The mode `open()` would give a new file: 0666 less the process umask."""
    return 0o666 & ~current_umask()


def current_umask() -> int:
    """The process umask, read from /proc where possible (setting it to read it back is racy)."""
    with contextlib.suppress(OSError, ValueError):
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def _write_temp(final: Path, payload: bytes) -> str:
    fd, tmp = tempfile.mkstemp(dir=final.parent, prefix=final.name + ".", suffix=TEMP_SUFFIX)
    try:
        os.fchmod(fd, new_file_mode())  # mkstemp makes 0600; a golden is an ordinary, reviewable file
        with os.fdopen(fd, "wb") as f:
            f.write(payload)
            f.flush()
            os.fsync(f.fileno())
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    return tmp


def _fsync_dir(d: Path) -> None:
    with contextlib.suppress(OSError):
        fd = os.open(d, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


@contextlib.contextmanager
def _signals_held():
    """Defer SIGINT and SIGTERM to the end of the block. A handler, not a signal mask: the kernel
    may hand a process-directed signal to any thread that does not block it (torch's worker
    threads do not), and its default action would end the process between the two renames."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    caught: list[int] = []
    old = {s: signal.signal(s, lambda signum, frame: caught.append(signum)) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for s, handler in old.items():
            signal.signal(s, handler if handler is not None else signal.SIG_DFL)
        for s in caught:
            signal.raise_signal(s)
