"""docs/ci-example, run as a downstream repository would: an outside target package (myengine)
built in a temporary directory and registered through the `lockstep.targets` entry point, the
workflow's two gate steps run from that repository (outside Lockstep's clone) through the CLI and
pytest with JUnit, a seeded-sampling spec and a speculative spec applicable, a planted bug in each
caught, and the package's expectations (a version range) surviving a version bump within it.

The package goes on PYTHONPATH with a dist-info folder written here (METADATA and
entry_points.txt, what `pip install` would write): nothing is installed into the shared
environment, where other sessions enumerate the registered targets.
"""

import os
import re
import shutil
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "docs" / "ci-example"
SEEDED, SPECULATIVE = "generate/custom-stop-ids", "speculative/synthetic-plain"
REFUSAL, EXPECTED = "layer_ids/error-above-l", "layer_ids/120b-long-context-boundary"
SPECS = [SEEDED, SPECULATIVE, REFUSAL, EXPECTED]

# Planted bugs, edits of the package's source: the seeded sampler uses the request's seed + 1 (not
# the coin contract's stream), and the speculative decoder reports accepted drafts without the
# bonus token (accept length - 1, the other engines' convention).
SAMPLING_BUG = ("seed=r.seed, params=SamplingParams(", "seed=None if r.seed is None else r.seed + 1, params=SamplingParams(")
SPECULATIVE_BUG = ("    return speculative_generate(model, draft, [_engine_request(r) for r in requests], params)",
                   "    results = speculative_generate(model, draft, [_engine_request(r) for r in requests], params)\n"
                   "    for r in results:\n"
                   "        r.accept_lengths = [a - 1 for a in r.accept_lengths]\n"
                   "    return results")


def install(site: Path, version: str, edits=()) -> None:
    """myengine at `version` into `site`: its package (with `edits` applied) and a dist-info."""
    shutil.rmtree(site, ignore_errors=True)
    shutil.copytree(EXAMPLE / "myengine" / "myengine", site / "myengine")
    init = site / "myengine" / "__init__.py"
    text = init.read_text()
    for old, new in edits:
        assert old in text, f"the planted edit no longer applies: {old!r}"
        text = text.replace(old, new)
    init.write_text(text)
    dist = site / f"myengine-{version}.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text(f"Metadata-Version: 2.1\nName: myengine\nVersion: {version}\n")
    ep = re.search(r'\[project\.entry-points\."lockstep\.targets"\]\n(.+)', (EXAMPLE / "myengine" / "pyproject.toml")
                   .read_text()).group(1)
    (dist / "entry_points.txt").write_text(f"[lockstep.targets]\n{ep.replace(chr(34), '')}\n")  # TOML -> ini


def workflow_step(step_id: str) -> str:
    """The `run` line of a gate step of the workflow, with `lockstep` and `python` as here."""
    steps = yaml.safe_load((EXAMPLE / "workflow.yml").read_text())["jobs"]["conformance"]["steps"]
    run = next(s["run"] for s in steps if s.get("id") == step_id).strip()
    run = re.sub(r"(?<![\w-])python -m ", f"{sys.executable} -m ", run)
    return re.sub(r"(?<![\w-])lockstep (?=\w)", f"{sys.executable} -m lockstep ", run)


@pytest.fixture
def repo(tmp_path):
    """The engine's repository: its pytest.ini, tests/ and the folders its ini names for the team's
    own specs and goldens (empty here), nothing of Lockstep."""
    repo = tmp_path / "repo"
    for folder in ("tests", "lockstep/specs", "lockstep/golden"):
        (repo / folder).mkdir(parents=True)
    shutil.copy(EXAMPLE / "pytest.ini", repo / "pytest.ini")
    return repo


def run(repo: Path, site: Path, command: str, **env) -> subprocess.CompletedProcess:
    environ = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_", "LOCKSTEP_"))}
    environ |= {"PYTHONPATH": f"{ROOT}{os.pathsep}{site}", "CI": "true", **env}
    return subprocess.run(command, shell=True, cwd=repo, env=environ, capture_output=True, text=True, timeout=600)


def test_the_ci_example_gates_an_outside_engine(repo, tmp_path):
    site = tmp_path / "site"
    cli = workflow_step("cli") + " " + " ".join(SPECS)
    selected = " or ".join(s.split("/")[1] for s in SPECS)

    # clean: the seeded and the speculative spec pass, the refusal (myengine's own exception type)
    # counts as clean and names the facts, the one recorded failure is expected: exit 0. Run at a
    # version bumped within the expectations' range ('>=1.0,<2'), so this run also shows the
    # expectations surviving the bump (the planted runs below are at 1.0.0, where the pytest run
    # xfails the same recorded failure)
    install(site, "1.3.0.dev4+g1a2b3c")
    r = run(repo, site, cli)
    assert r.returncode == 0, r.stdout + r.stderr
    assert re.search(r"4 spec\(s\) on myengine-1\.3\.0\.dev4\+g1a2b3c: 3 pass, 1 fail \(1 expected\), 0 n/a .*; "
                     r"matches its expectations", r.stdout), r.stdout
    for spec in SPECS[:3]:
        assert re.search(rf"^pass +{re.escape(spec)} ", r.stdout, re.M), r.stdout

    # a planted bug in each of the seeded sampler and the speculative decoder: both caught, by the CLI ...
    install(site, "1.0.0", [SAMPLING_BUG, SPECULATIVE_BUG])
    r = run(repo, site, cli)
    assert r.returncode == 1, r.stdout + r.stderr
    assert f"NEW FAILURE {SEEDED}: agreement: sampler at request 0 step 0 — " in r.stdout, r.stdout   # the cause first
    assert f"NEW FAILURE {SPECULATIVE}: tensor 'accept_lengths_0'" in r.stdout, r.stdout

    # ... and by pytest, one JUnit testcase per spec with the failure's text
    r = run(repo, site, workflow_step("pytest"), PYTEST_ADDOPTS=f"-k '{selected}'")
    assert r.returncode == 1, r.stdout[-3000:] + r.stderr[-3000:]
    cases = {c.get("name"): c for c in ET.parse(repo / "lockstep-junit.xml").getroot().iter("testcase")}
    assert set(cases) == set(SPECS), sorted(cases)
    for spec, text in ((SEEDED, "agreement: sampler at request 0 step 0"), (SPECULATIVE, "tensor 'accept_lengths_0' differs")):
        failure = cases[spec].find("failure")
        assert failure is not None and "NEW FAILURE" in failure.text and text in failure.text, spec
    assert cases[REFUSAL].find("failure") is None and cases[REFUSAL].find("skipped") is None
    assert "peer bug" in cases[EXPECTED].find("skipped").get("message")          # xfailed as recorded

    # the expectations (versions '>=1.0,<2') survived a bump within their range (the clean run
    # above), not beyond it
    quick = workflow_step("cli") + f" {REFUSAL} {EXPECTED}"
    install(site, "2.0.0")
    r = run(repo, site, quick)
    assert r.returncode == 2, r.stdout + r.stderr
    assert "lockstep-expectations.yaml:4: is for myengine >=1.0,<2, not myengine 2.0.0" in r.stderr, r.stderr
