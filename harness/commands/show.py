"""`lockstep show`: print goldens readably; `--textconv FILE`: one tensor file as text (what git's
diff driver runs); `lockstep diff-driver`: install that driver into the repository's .git/config.

A golden is found by its id under the golden folder (every platform folder holding it, or those of
one `--pair`); the spec file is not needed, so a golden whose spec is gone can still be read."""

from __future__ import annotations

import fnmatch
import json
import shlex
import subprocess
import sys
from pathlib import Path

from safetensors import SafetensorError
from safetensors.torch import load

from lockstep.harness.commands.exits import EXIT_OK
from lockstep.harness.errors import UsageError
from lockstep.harness.golden import CorruptGolden, GoldenStore
from lockstep.harness.goldenview import golden_text, tensor_json, tensors_text
from lockstep.harness.jsonout import emit, show_document, tool_document

DRIVER = "lockstep-golden"
ATTRIBUTES_LINE = f"*.safetensors diff={DRIVER}"


def _platform_matches(platform: str, pair: str | None) -> bool:
    """Whether a golden folder holds the goldens of `pair` ('fp32/torch'); `shared` holds every pair's."""
    if pair is None or platform == "shared":
        return True
    dtype, _, backend = pair.partition("/")
    suffix = f"-{dtype}" + ("-triton" if backend == "triton" else "")
    return platform.endswith(suffix)


def _chosen(store, patterns: list[str], pair: str | None) -> list[tuple[str, str]]:
    found = [(platform, i) for platform, ids in store.ids().items() for i in ids
             if _platform_matches(platform, pair)]
    out = []
    for pattern in patterns:
        hits = [(p, i) for p, i in found if fnmatch.fnmatchcase(i, pattern)]
        if not hits:
            raise UsageError(f"no golden matches {pattern!r} under {store.root}"
                             + (f" for --pair {pair}" if pair else "") + " (see `lockstep list`)")
        out += [h for h in hits if h not in out]
    return out


def cmd_show(args) -> int:
    if args.textconv is not None:
        return _textconv(args.textconv, args.bits)
    if not args.patterns:
        raise UsageError("give a spec id (or glob) whose golden to show, or --textconv FILE")
    store = GoldenStore(args.golden)
    docs, texts = [], []
    for platform, spec_id in _chosen(store, args.patterns, args.pair):
        try:
            golden = store.load(platform, spec_id)
        except CorruptGolden as e:
            raise UsageError(f"corrupt golden: {e}") from None
        where = str(store.paths(platform, spec_id)[0])
        texts.append(golden_text(golden, where, bits=args.bits, full=args.full))
        docs.append({"spec": spec_id, "platform": platform, "file": where, "manifest": {
            k: v for k, v in golden.manifest.items() if k not in ("data", "tensors")},
            "data": golden.data, "tensors": {n: tensor_json(t) for n, t in sorted(golden.tensors.items())}})
    (emit if args.json else print)(json.dumps(show_document(goldens=docs), indent=2) if args.json
                                   else "\n\n".join(texts))
    return EXIT_OK


def _textconv(path: Path, bits: bool) -> int:
    """One .safetensors file as text, with no manifest (git hands the driver a temporary copy)."""

    try:
        tensors = load(path.read_bytes())
    except OSError as e:
        raise UsageError(f"{path}: cannot be read ({e.strerror or e})") from None
    except (SafetensorError, ValueError, RuntimeError) as e:
        print(f"(not a readable safetensors file: {e})")      # still text for the diff, never a crash
        return EXIT_OK
    print("\n".join(tensors_text(tensors, bits=bits)))
    return EXIT_OK


# ------------------------------------------------------------------ the git diff driver
def driver_command() -> str:
    """What git runs on each side of a changed tensor file (the file's path appended)."""
    return f"{shlex.quote(sys.executable)} -m lockstep show --textconv"


def cmd_diff_driver(args) -> int:
    """Write (or with --uninstall remove) diff.lockstep-golden.textconv in the repository's own
    .git/config (never the global one), and say whether .gitattributes routes goldens to it."""
    repo = args.repo
    key = f"diff.{DRIVER}.textconv"
    cmd = ["git", "-C", str(repo), "config", "--local"]
    attributes = Path(repo) / ".gitattributes"
    if args.uninstall:
        done = subprocess.run(cmd + ["--unset", key], capture_output=True, text=True)
        action = "removed" if done.returncode == 0 else "absent"
        message = f"removed {key} from {repo}/.git/config" if action == "removed" else f"{key} was not set"
        routed = None
    else:
        done = subprocess.run(cmd + [key, driver_command()], capture_output=True, text=True)
        if done.returncode != 0:
            raise UsageError(f"git config in {repo} failed: {done.stderr.strip() or done.returncode} (is it a git "
                             "repository?)")
        action, message = "installed", f"set {key} = {driver_command()} in {repo}/.git/config"
        lines = attributes.read_text(encoding="utf-8").splitlines() if attributes.is_file() else []
        routed = any(line.split()[-1:] == [f"diff={DRIVER}"] for line in lines if line.strip())
        if not routed:
            message += f"\nadd this line to {attributes} (then commit it) so that git diff uses it:\n  {ATTRIBUTES_LINE}"
    if args.json:
        emit(json.dumps(tool_document("diff-driver", True, action=action, repo=str(repo), key=key,
                                      textconv=driver_command(), attributes_file=str(attributes),
                                      attributes_line=ATTRIBUTES_LINE, attributes_routed=routed), indent=2))
    else:
        print(message)
    return EXIT_OK
