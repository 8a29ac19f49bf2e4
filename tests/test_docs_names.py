"""Every code name a reference page shows in backticks exists, so a renamed function cannot leave a
stale page: a dotted name `lockstep.engine.sampling.sample` imports (its module, then each
attribute), a path `engine/sampling.py` is a file, and `engine/sampling.py: sample` names a
top-level definition of that file. The import name is the one convention: a backticked
`engine.x.y` without `lockstep.` is refused. docs/history/ is a diary, not a reference: not read."""

from __future__ import annotations

import ast
import fnmatch
import importlib
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("engine", "kernels", "harness")
CODE = re.compile(r"`([^`\n]+)`")
DOTTED = re.compile(r"^(lockstep\.)?(engine|kernels|harness)\.[A-Za-z_][\w.*]*")
PATH = re.compile(r"^((?:engine|kernels|harness|bench|scripts|tests)/[\w/]*\.py)(?::\s*([A-Za-z_]\w*))?")


def pages() -> list[Path]:
    """The reference pages: README.md and docs/*.md (not docs/history/)."""
    return [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def mentions(text: str) -> list[str]:
    return [m.group(1).strip() for m in CODE.finditer(text)]


def resolve_dotted(name: str) -> str | None:
    """None if `name` (lockstep.pkg.module[.attr ...], `*` globs an attribute) exists, else why not."""
    parts = name.split(".")
    module, i = None, len(parts)
    while i > 1:
        try:
            module = importlib.import_module(".".join(parts[:i]))
            break
        except ModuleNotFoundError as e:
            if not ".".join(parts[:i]).startswith(e.name or "\0"):
                return f"importing {'.'.join(parts[:i])} failed: {e}"
            i -= 1
    if module is None:
        return "no such module"
    obj = module
    for attr in parts[i:]:
        if "*" in attr:
            if not fnmatch.filter(dir(obj), attr):
                return f"nothing matches {attr} in {obj.__name__}"
            return None
        if not hasattr(obj, attr):
            return f"{getattr(obj, '__name__', obj)!s} has no {attr}"
        obj = getattr(obj, attr)
    return None


def top_level_names(path: Path) -> set[str]:
    names = set()
    for node in ast.parse(path.read_text(encoding="utf-8")).body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, ast.Assign):
            names |= {t.id for t in node.targets if isinstance(t, ast.Name)}
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names.add(node.target.id)
        elif isinstance(node, ast.ImportFrom):
            names |= {a.asname or a.name for a in node.names}
    return names


def stale_names(text: str) -> list[str]:
    """What in `text` (a page) names code that is not there, or a dotted name without `lockstep.`."""
    out = []
    for code in mentions(text):
        m = DOTTED.match(code)
        if m:
            name = m.group(0).rstrip(".")
            if re.search(r"\.x_\w*\*?$", name):     # a mutmut mutant's name (docs/contributing.md), not code
                continue
            if not m.group(1):
                out.append(f"`{code}`: write the import name, `lockstep.{name}`")
                continue
            why = resolve_dotted(name)
            if why:
                out.append(f"`{code}`: {why}")
            continue
        m = PATH.match(code)
        if m:
            path = ROOT / m.group(1)
            if not path.is_file():
                out.append(f"`{code}`: no file {m.group(1)}")
            elif m.group(2) and m.group(2) not in top_level_names(path):
                out.append(f"`{code}`: {m.group(1)} defines no {m.group(2)}")
    return out


def test_every_code_name_on_a_reference_page_exists():
    stale = [f"{page.relative_to(ROOT)}: {s}" for page in pages() for s in stale_names(page.read_text(encoding="utf-8"))]
    assert not stale, "\n".join(stale)


def test_a_renamed_function_is_caught():
    """The check is not blind: a name that is gone, a file that is gone, a definition a file lacks
    and the bare `engine.` spelling are each reported; real names are not."""
    page = ("`lockstep.engine.sampling.sample` `lockstep.kernels.moe.router_top_k_portable` `engine/sampling.py` "
            "`engine/sampling.py: sample` `lockstep.kernels.residual.*_residual_triton` "
            "`lockstep.engine.linear.linear` `engine/attention.py` `engine/linear.py: linear` "
            "`engine.sampling.sample` `lockstep.engine.no_such_module.f`")
    stale = stale_names(page)
    assert [s.split("`")[1] for s in stale] == [
        "lockstep.engine.linear.linear", "engine/attention.py", "engine/linear.py: linear",
        "engine.sampling.sample", "lockstep.engine.no_such_module.f"], stale
