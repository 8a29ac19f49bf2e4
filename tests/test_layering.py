"""Layering: the packages import downward only, kernels <- engine <- harness, and no
module imports itself back through others. Every import counts, the ones inside functions too
(a function-level import is how a cycle hides)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
FLOORS = {"kernels": 0, "engine": 1, "harness": 2}     # a package may import its floor and the ones below


def module_name(path: Path) -> str:
    """kernels/moe.py -> lockstep.kernels.moe: the folders are installed under `lockstep`."""
    parts = ["lockstep"] + list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports_of(source: str, me: str, is_package: bool, known: set[str]) -> set[str]:
    """The project modules that module `me` (its source text) imports, wherever the import
    statement is, resolved to the modules that exist: `from lockstep.engine.linear import
    tree_sum` -> lockstep.engine.linear, `from lockstep.engine import mxfp4` -> lockstep.engine.mxfp4."""
    package = me if is_package else me.rpartition(".")[0]
    out = set()
    for node in ast.walk(ast.parse(source, me)):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = package.split(".")[:len(package.split(".")) - (node.level - 1)]
                base = ".".join(up + ([base] if base else []))
            names = [f"{base}.{a.name}" for a in node.names] + [base]
        else:
            continue
        for name in names:
            while name and name not in known:
                name = name.rpartition(".")[0]
            if name and name != me:
                out.add(name)
    return out


def graph() -> dict[str, set[str]]:
    files = [p for pkg in FLOORS for p in (ROOT / pkg).rglob("*.py")]
    known = {module_name(p) for p in files}
    return {module_name(p): imports_of(p.read_text(encoding="utf-8"), module_name(p), p.name == "__init__.py", known)
            for p in files}


def floor(module: str) -> int:
    return FLOORS[module.split(".")[1]]


def test_no_import_goes_up_a_floor():
    upward = sorted(f"{m} imports {d}" for m, deps in graph().items() for d in deps if floor(d) > floor(m))
    assert not upward, "kernels <- engine <- harness: " + "; ".join(upward)


def cycles(g: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan's algorithm), but
    ignoring a package's __init__ importing its own submodules' names (that is re-exporting)."""
    index, low, stack, on, out, counter = {}, {}, [], set(), [], [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in sorted(g.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(g):
        if v not in index:
            visit(v)
    return out


def test_no_import_cycle():
    g = graph()
    for m in g:                       # a package __init__ may name its submodules; they may import it
        if m.count(".") == 1:
            g[m] = {d for d in g[m] if not d.startswith(m + ".")}
    found = cycles(g)
    assert not found, "import cycles: " + "; ".join(" <-> ".join(c) for c in found)


@pytest.mark.parametrize("bad, why", [
    ("from lockstep.engine.model import GptOssModel\n", "lockstep.kernels.planted imports lockstep.engine.model"),
    ("def f():\n    from lockstep.harness import runner\n", "lockstep.kernels.planted imports lockstep.harness.runner"),
])
def test_the_checks_catch_an_upward_import(bad, why):
    """Planted: the same walk over a kernels module that imports upward (at module level, or
    hidden in a function) reports it."""
    known = set(graph()) | {"lockstep.kernels.planted"}
    deps = imports_of(bad, "lockstep.kernels.planted", False, known)
    assert any(floor(d) > floor("lockstep.kernels.planted") and why.endswith(d) for d in deps), deps


def test_the_cycle_finder_finds_a_hidden_cycle():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


# The harness's rooms (a top-level module or a folder), bottom floor first. A room imports only
# rooms on floors below its own; the ground floor (every room not named here: errors, limits, the
# target interface target.py, ...) imports only the ground floor, where the file-level cycle check
# applies. A loop between folders therefore fails here even when no single file imports itself back.
HARNESS_FLOORS = [
    {"replay"},                       # traces: record, replay, deltas (no spec, no target registry)
    {"kinds"},                        # one run path per spec kind, through the target interface
    {"specfile", "pairs"},            # spec files (validated by their kind), dtype/backend pairs
    {"golden"},                       # the golden store (manifests name their spec)
    {"targets"},                      # adapters, their registry, the judges for other engines
    {"runner"},                       # one spec on Lockstep's engine against its golden
    {"workers"},                      # check -j / regen -j: rows in worker processes
    {"judges"},                       # the check pipeline's judge, chosen by the target
    {"commands", "pytest_suite"},     # every subcommand; the pytest suite's collection
    {"cli", "pytest_plugin", "__init__"},
]


def room(module: str) -> str | None:
    """lockstep.harness.kinds.coins -> kinds; lockstep.harness.golden -> golden; None outside harness."""
    parts = module.split(".")
    if parts[1] != "harness":
        return None
    return parts[2] if len(parts) > 2 else "__init__"


def room_floor(name: str) -> int:
    return next((i + 1 for i, rooms in enumerate(HARNESS_FLOORS) if name in rooms), 0)


def upward_room_imports(g: dict[str, set[str]]) -> list[str]:
    out = []
    for m, deps in g.items():
        a = room(m)
        for d in deps:
            b = room(d)
            if a is None or b is None or a == b:
                continue
            if room_floor(b) > room_floor(a) or (room_floor(b) == room_floor(a) and room_floor(a) > 0):
                out.append(f"{m} ({a}, floor {room_floor(a)}) imports {d} ({b}, floor {room_floor(b)})")
    return sorted(out)


def test_harness_rooms_import_downward_only():
    found = upward_room_imports(graph())
    assert not found, "harness floors (tests/test_layering.py HARNESS_FLOORS): " + "; ".join(found)


def test_the_room_check_catches_a_loop_between_folders():
    """Planted: the judge room importing the commands (the old loop) and a ground module importing
    a kind are both reported, though neither file imports itself back."""
    g = {"lockstep.harness.targets.judge": {"lockstep.harness.commands.selection"},
         "lockstep.harness.limits": {"lockstep.harness.kinds.coins"},
         "lockstep.harness.kinds.coins": {"lockstep.harness.target"}}
    assert upward_room_imports(g) == [
        "lockstep.harness.limits (limits, floor 0) imports lockstep.harness.kinds.coins (kinds, floor 2)",
        "lockstep.harness.targets.judge (targets, floor 5) imports lockstep.harness.commands.selection (commands, floor 9)"]


# The one place that says which harness modules may import inside functions: those `lockstep
# --help`, `list`, `validate` and `suite` load, which must not load torch (so each command's body
# imports what it needs when it runs), and the optional packages a peer adapter loads only when it
# is used. Everywhere else an import sits at the top of its module.
TORCH_FREE = {
    "cli", "commands/__init__", "commands/exits", "commands/options", "commands/replay", "commands/display",
    "commands/listing", "commands/selection", "commands/suite", "errors", "jsonout", "limits", "readers",
    "replay/__init__", "replay/format", "suite_paths", "version", "schema", "specfile", "pytest_plugin",
    "__init__",
}
OPTIONAL = ("triton", "transformers", "sglang", "vllm")   # peers, or triton after the interpreter choice


def lazy_imports(source: str, where: str) -> list[str]:
    """The function-level imports of a module, but those of optional packages."""
    out = []
    for fn in ast.walk(ast.parse(source, where)):
        if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
            for node in ast.walk(fn):
                if isinstance(node, (ast.Import, ast.ImportFrom)):
                    name = node.module if isinstance(node, ast.ImportFrom) else node.names[0].name
                    if (name or "").split(".")[0] not in OPTIONAL:
                        out.append(f"{where}:{node.lineno}: {name}")
    return sorted(set(out))


def test_imports_sit_at_the_top_but_where_a_command_must_stay_torch_free():
    found = []
    for p in sorted((ROOT / "harness").rglob("*.py")):
        rel = p.relative_to(ROOT / "harness").with_suffix("").as_posix()
        if rel not in TORCH_FREE:
            found += lazy_imports(p.read_text(encoding="utf-8"), f"harness/{rel}.py")
    assert not found, "imports inside functions outside TORCH_FREE (tests/test_layering.py): " + "; ".join(found)


def test_the_lazy_import_check_catches_one():
    assert lazy_imports("def f():\n    from lockstep.engine import model\n    import triton\n", "x.py") == \
        ["x.py:2: lockstep.engine"]


BARE = {"kernels", "engine", "harness"}


def bare_imports(source: str, where: str) -> list[str]:
    """Imports that name one of our folders without the `lockstep.` namespace: installed, such a
    name is nobody's (or, for `kernels`, Hugging Face's package)."""
    out = []
    for node in ast.walk(ast.parse(source, where)):
        names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
            [node.module or ""] if isinstance(node, ast.ImportFrom) and not node.level else []
        out += [f"{where}:{node.lineno}: {n}" for n in names if n.split(".")[0] in BARE]
    return out


def test_every_import_of_ours_is_under_the_lockstep_namespace():
    folders = ["harness", "engine", "kernels", "lockstep", "tests", "bench", "scripts", "docs"]
    found = [hit for d in folders for p in sorted((ROOT / d).rglob("*.py"))
             for hit in bare_imports(p.read_text(encoding="utf-8"), str(p.relative_to(ROOT)))]
    assert not found, "bare imports: " + "; ".join(found)


def test_the_bare_import_check_catches_one():
    assert bare_imports("import kernels.moe as moe\nfrom lockstep.engine import model\n", "x.py") == \
        ["x.py:1: kernels.moe"]
    assert bare_imports("def f():\n    from harness.cli import main\n", "x.py") == ["x.py:2: harness.cli"]
