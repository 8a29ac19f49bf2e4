"""Triton's fp-fusion flag is stated at every kernel launch: the CUDA goldens' bits depend on it
(ptxas contracting a multiply and an add into one fma, or not) and Triton's default is changing."""

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _assigned_dicts(tree: ast.AST, source: str) -> dict:
    """name -> the source of each value assigned to it in the module (for `**name` arguments)."""
    out: dict = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign):
            for target in node.targets:
                if isinstance(target, ast.Name):
                    out.setdefault(target.id, []).append(ast.get_source_segment(source, node.value))
    return out


def test_every_kernel_launch_states_its_fp_fusion():
    """kernel[grid](...) in kernels/ (and in the benches that launch the engine's kernels with
    other tiles, whose bits must be the engine's): enable_fp_fusion is an argument, or a key of a
    `**` dict assigned in the same module."""
    unstated, launches = [], 0
    benches = [ROOT / "bench/expert_tiles.py", ROOT / "bench/linear_tiles.py"]
    for path in sorted((ROOT / "kernels").glob("*.py")) + benches:
        source = path.read_text()
        tree = ast.parse(source)
        dicts = _assigned_dicts(tree, source)
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Subscript):
                launches += 1
                named = {k.arg for k in node.keywords}
                spread = [k.value.id for k in node.keywords if k.arg is None and isinstance(k.value, ast.Name)]
                if "enable_fp_fusion" not in named and not any(
                        "enable_fp_fusion" in v for name in spread for v in dicts.get(name, [])):
                    unstated.append(f"{path.name}:{node.lineno}")
    assert launches >= 20, launches                  # the walk found the launches
    assert not unstated, f"launches that leave enable_fp_fusion to Triton's default: {unstated}"
