"""A golden is current for its spec when it was recorded for what a run reads: a description-only
edit leaves it current; any other edit makes it stale; goldens recorded under the old whole-document
hash are still accepted unchanged."""

import json

from lockstep.harness.cli import main
from lockstep.harness.specfile import parse_spec
from tests.conftest import COINS, REPO, golden_bytes


def run(capsys, *argv):
    code = main(list(argv))
    out = capsys.readouterr()
    return code, out.out + out.err


def test_content_hash_ignores_the_description_only():
    a = parse_spec(COINS, "f", "x/y")
    b = parse_spec(COINS.replace("a coins spec", "a coins spec, typo fixed"), "f", "x/y")
    c = parse_spec(COINS.replace("[1, 2]", "[1, 5]"), "f", "x/y")
    d = parse_spec(COINS + "tags: [t]\n", "f", "x/y")
    assert a.content_sha256 == b.content_sha256 and a.sha256 != b.sha256
    assert len({a.content_sha256, c.content_sha256, d.content_sha256}) == 3


def test_new_goldens_store_the_content_hash_and_survive_a_description_edit(project, capsys):
    spec = project / "specs/coins/known-answers.yaml"
    manifest = json.loads((project / "golden/shared/coins/known-answers.json").read_text())
    assert manifest["spec_sha256"] == parse_spec(spec.read_text(), str(spec), "coins/known-answers").content_sha256
    spec.write_text(spec.read_text().replace("The known answers", "The known-good answers"))
    code, out = run(capsys, "check", "--strict", "coins/known-answers")
    assert code == 0 and "stale" not in out
    spec.write_text(spec.read_text().replace("[1, 7, 1]", "[1, 7, 2]"))      # what the run reads: stale
    code, out = run(capsys, "check", "--strict", "coins/known-answers")
    assert code == 1 and "golden may be stale" in out


def test_goldens_recorded_under_the_whole_document_hash_are_still_current(project, capsys):
    """The shipped goldens store the hash of the whole document: accepted as they are, and regen
    leaves them byte for byte."""
    mpath = project / "golden/shared/coins/known-answers.json"
    spec = parse_spec((project / "specs/coins/known-answers.yaml").read_text(), "f", "coins/known-answers")
    manifest = json.loads(mpath.read_text())
    manifest["spec_sha256"] = spec.sha256
    mpath.write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n")
    before = golden_bytes(project)
    assert run(capsys, "check", "--strict", "coins/known-answers")[0] == 0
    code, out = run(capsys, "regen", "coins/known-answers")
    assert code == 0 and "unchanged" in out and golden_bytes(project) == before


def test_every_shipped_golden_is_current_under_the_new_rule():
    """The rule accepts each repository golden recorded under the old rule exactly as the old one
    did (no golden file changes), and each recorded under the new one (its hash: what a run reads)."""
    from lockstep.harness.runner import current_for
    from tests.repo_specs import repo_specs

    specs = repo_specs()
    for mpath in (REPO / "golden").rglob("*.json"):
        m = json.loads(mpath.read_text())
        spec = specs.get(m["spec"])
        if spec is None:
            continue
        if m["spec_sha256"] == spec.content_sha256:
            assert current_for(m, spec), mpath
        else:
            assert current_for(m, spec) == (m["spec_sha256"] == spec.sha256), mpath
