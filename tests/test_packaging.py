"""Lockstep installed into someone else's environment: one import namespace (`lockstep.*`), a
release whose version agrees everywhere it is written, and a wheel that holds every module.

The scratch venvs see this environment's packages (--system-site-packages: torch, triton,
transformers and Hugging Face's `kernels`, which the test extra brings) and add only what the
test installs; nothing is installed into the shared environment.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

tomllib = pytest.importorskip("tomllib", reason="Python 3.11+")

ROOT = Path(__file__).resolve().parent.parent
FOLDERS = ("harness", "engine", "kernels")


def pyproject() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())


def run(cmd, cwd, env=None, timeout=600) -> subprocess.CompletedProcess:
    """`cmd` with this environment less PYTHONPATH (which would put a checkout before the venv's install)."""
    env = {k: v for k, v in (os.environ if env is None else env).items() if k != "PYTHONPATH"}
    return subprocess.run([str(c) for c in cmd], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)


# --------------------------------------------------------------------------- the release
def test_the_version_agrees_in_pyproject_changelog_ci_example_and_the_command():
    version = pyproject()["project"]["version"]
    head = re.search(r"^## (\d+\.\d+\.\d+)\b", (ROOT / "CHANGELOG.md").read_text(), re.M)
    assert head and head.group(1) == version, f"CHANGELOG's newest release {head and head.group(1)} != {version}"
    pin = re.search(r"LOCKSTEP_REF:\s*(\S+)", (ROOT / "docs/ci-example/workflow.yml").read_text())
    assert pin and pin.group(1) == f"v{version}", f"the ci-example pins {pin and pin.group(1)}, not v{version}"
    out = run([sys.executable, "-m", "lockstep", "--version"], cwd=ROOT)
    assert out.returncode == 0 and out.stdout.split()[1].split("+")[0] == version, out.stdout + out.stderr


def test_the_ci_example_names_no_package_that_nobody_owns_on_pypi():
    """Lockstep is not on PyPI: an engine's package that depended on `lockstep-harness` by name
    would fail to install, or install whatever someone uploads under that name."""
    example = tomllib.loads((ROOT / "docs/ci-example/myengine/pyproject.toml").read_text())
    ours = pyproject()["project"]["name"]
    assert not [d for d in example["project"].get("dependencies", []) if d.split()[0].startswith(ours)]
    workflow = (ROOT / "docs/ci-example/workflow.yml").read_text()
    assert f"pip install {ours}" not in workflow and 'pip install -e "$RUNNER_TEMP/lockstep"' in workflow


# --------------------------------------------------------------------------- the namespace
def test_no_golden_records_a_module_path():
    """Renaming modules moves no golden: none records where its code lives (if one ever does, it
    needs a mapping from the old names, not a re-record)."""
    pattern = re.compile(r"\b(?:lockstep\.)?(?:kernels|engine|harness)\.[a-z_]+\.[a-z_]+")
    found = [str(p.relative_to(ROOT)) for p in sorted((ROOT / "golden").rglob("*.json"))
             if pattern.search(p.read_text(encoding="utf-8"))]
    assert not found, found


def test_from_a_checkouts_root_the_bare_names_are_other_peoples():
    """Run from the repository's root (on sys.path as the script's folder), `kernels` is Hugging
    Face's package and transformers' gpt-oss imports; Lockstep's own modules still work."""
    pytest.importorskip("kernels", reason="Hugging Face's kernels (the test extra, through transformers)")
    probe = ("import kernels, importlib.util as u\n"
             "print(kernels.__file__)\n"
             "from transformers import GptOssForCausalLM\n"
             "import lockstep.kernels.coins as c\n"
             "print(c.__file__)\n")
    out = run([sys.executable, "-c", probe], cwd=ROOT)
    assert out.returncode == 0, out.stderr
    hf, ours = out.stdout.split()
    assert "site-packages" in hf and not hf.startswith(str(ROOT)), hf
    assert ours == str(ROOT / "kernels" / "coins.py")


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("wheel")
    built = run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", out, ROOT],
                cwd=out)
    assert built.returncode == 0, built.stderr
    (path,) = out.glob("*.whl")
    return path


def test_the_wheel_holds_every_module_under_lockstep_and_nothing_bare(wheel):
    names = set(zipfile.ZipFile(wheel).namelist())
    top = {n.split("/")[0] for n in names if not n.split("/")[0].endswith(".dist-info")}
    assert top == {"lockstep"}, top
    expected = {f"lockstep/{p.relative_to(ROOT).as_posix()}" for d in FOLDERS for p in (ROOT / d).rglob("*.py")
                if "__pycache__" not in p.parts}
    expected |= {f"lockstep/harness/targets/expectations/{p.name}"
                 for p in (ROOT / "harness/targets/expectations").glob("*.yaml")}
    assert not expected - names, sorted(expected - names)
    entry = next(n for n in names if n.endswith("entry_points.txt"))
    points = zipfile.ZipFile(wheel).read(entry).decode()
    assert "lockstep = lockstep.harness.cli:main" in points and "lockstep = lockstep.harness.pytest_plugin" in points


@pytest.fixture(scope="module")
def venv(tmp_path_factory, wheel) -> Path:
    """A scratch venv over this environment's packages, with Lockstep installed from its wheel."""
    where = tmp_path_factory.mktemp("venv")
    assert run([sys.executable, "-m", "venv", "--system-site-packages", where], cwd=where).returncode == 0
    py = where / "bin" / "python"
    done = run([py, "-m", "pip", "install", "-q", "--no-deps", "--force-reinstall", wheel], cwd=where)
    assert done.returncode == 0, done.stderr
    return py


def test_installed_beside_hf_kernels_both_import_and_lockstep_runs(venv, tmp_path):
    """The wheel's Lockstep next to Hugging Face's `kernels` and the newest transformers, run from
    an unrelated folder: each name is its owner's, and a spec of the shipped suite passes."""
    pytest.importorskip("kernels", reason="Hugging Face's kernels (the test extra, through transformers)")
    probe = ("import kernels, lockstep, lockstep.kernels.coins\n"
             "from transformers import GptOssForCausalLM\n"
             "import importlib.util as u\n"
             "print(kernels.__file__); print(lockstep.kernels.coins.__file__)\n"
             "print([n for n in ('engine', 'harness') if u.find_spec(n)])\n")
    out = run([venv, "-c", probe], cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    hf, ours, bare = out.stdout.splitlines()
    venv_root = str(venv.parent.parent)
    assert hf.endswith("kernels/__init__.py") and not hf.startswith(str(ROOT)), hf
    assert ours.startswith(venv_root) and ours.endswith("lockstep/kernels/coins.py"), ours
    assert bare == "[]", bare
    env = {**os.environ, "CI": ""}
    checked = run([venv.parent / "lockstep", "check", "--suite", ROOT, "coins/known-answers", "--json"], cwd=tmp_path,
                  env=env)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert json.loads(checked.stdout)["exit_code"] == 0


OPENAPI = "openapi: 3.1.0\ninfo: {title: pets, version: '1'}\npaths: {}\n"


@pytest.mark.slow
@pytest.mark.parametrize("version", ["8.0.0", "9.2.0"])   # the oldest pytest pyproject allows, and the newest
def test_the_plugin_under_the_oldest_and_newest_pytest(version, tmp_path_factory, wheel):
    """Under each pytest: a project with its own specs/api.yaml runs green with no warning, and a
    project that opts in collects and passes a Lockstep spec."""
    where = tmp_path_factory.mktemp(f"pytest-{version}")
    assert run([sys.executable, "-m", "venv", "--system-site-packages", where / "v"], cwd=where).returncode == 0
    py = where / "v" / "bin" / "python"
    done = run([py, "-m", "pip", "install", "-q", "--no-deps", f"pytest=={version}", wheel], cwd=where)
    assert done.returncode == 0, done.stderr
    other = where / "other"
    (other / "specs").mkdir(parents=True)
    (other / "specs" / "api.yaml").write_text(OPENAPI)
    (other / "test_x.py").write_text("def test_x():\n    pass\n")
    env = {**os.environ, "CI": "", "PYTEST_ADDOPTS": "", "PYTEST_DISABLE_PLUGIN_AUTOLOAD": ""}
    out = run([py, "-m", "pytest", "-p", "no:cacheprovider", "-W", "error", "-p", "no:xdist", "-p", "no:benchmark"],
              cwd=other, env=env)
    assert out.returncode == 0 and f"pytest-{version}" in out.stdout and "1 passed" in out.stdout, out.stdout
    assert "warning" not in out.stdout.lower(), out.stdout
    ours = where / "ours"
    (ours / "specs" / "coins").mkdir(parents=True)
    (ours / "specs" / "coins" / "known-answers.yaml").write_bytes((ROOT / "specs/coins/known-answers.yaml").read_bytes())
    (ours / "golden" / "shared" / "coins").mkdir(parents=True)
    for f in (ROOT / "golden/shared/coins").glob("known-answers.*"):
        (ours / "golden" / "shared" / "coins" / f.name).write_bytes(f.read_bytes())
    (ours / "pytest.ini").write_text("[pytest]\nlockstep_specs = specs\n")
    out = run([py, "-m", "pytest", "-p", "no:cacheprovider", "-p", "no:xdist", "-p", "no:benchmark"], cwd=ours, env=env)
    assert out.returncode == 0 and "1 passed" in out.stdout, out.stdout + out.stderr


def test_the_ci_example_installs_from_what_the_repository_provides(venv, tmp_path):
    """The example engine's package installs beside the wheel's Lockstep with nothing from an index
    (it names no dependency Lockstep does not provide), and its target registers."""
    example = tmp_path / "myengine"
    import shutil
    shutil.copytree(ROOT / "docs/ci-example/myengine", example)
    built = run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w", tmp_path / "w",
                 example], cwd=tmp_path)
    assert built.returncode == 0, built.stderr
    (whl,) = (tmp_path / "w").glob("myengine-*.whl")
    done = run([venv, "-m", "pip", "install", "-q", "--no-index", whl], cwd=tmp_path)     # resolves its deps
    assert done.returncode == 0, done.stderr
    listed = run([venv.parent / "lockstep", "list", "--suite", ROOT, "--target", "myengine", "coins/*"], cwd=tmp_path)
    assert listed.returncode == 0 and "# myengine-1.0.0" in listed.stdout, listed.stdout + listed.stderr
