"""An expectations file's every refusal in full (file, line, words), which file a run uses, the
failure signature, and the written file: each rule on a small file, no target run."""

import os
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml

from lockstep.harness.targets import expectfile
from lockstep.harness.targets.expectfile import ExpectationsError, find, load, same, signature, write

HEAD = "target: toy\nversions: '>=1'\n"


def _file(tmp_path, text, name="exp.yaml"):
    p = tmp_path / name
    p.write_text(text)
    return p


def _refusal(path, name="toy", version="1.0") -> str:
    with pytest.raises(ExpectationsError) as e:
        load(path, name, version)
    return str(e.value)


def test_an_empty_file_is_no_failure_for_its_target(tmp_path):
    p = _file(tmp_path, HEAD)
    assert load(p, "toy", "1.0") == {}
    assert load(_file(tmp_path, HEAD + "failures:\n", "null.yaml"), "toy", "1.0") == {}
    assert _refusal(_file(tmp_path, "", "empty.yaml")) == (
        f"{tmp_path / 'empty.yaml'}:1: is for None None, not toy 1.0 (widen its 'versions' range, or pass "
        "another --expectations)"), "an empty file names no target"


def test_what_is_not_a_mapping_or_cannot_be_read_is_refused_with_the_file(tmp_path):
    p = _file(tmp_path, "- a\n- b\n")
    assert _refusal(p) == f"{p}:1: expected a mapping with target, versions and failures"
    missing = tmp_path / "missing.yaml"
    assert _refusal(missing) == f"{missing}: no such expectations file"
    bad = _file(tmp_path, "target: toy\nversions: [\n", "bad.yaml")
    text = _refusal(bad)
    assert text.startswith(f"{bad}:3:1: ") and "invalid YAML" in text, text


def test_a_yaml_error_without_a_line_names_the_file_only(tmp_path, monkeypatch):
    from lockstep.harness.specfile import SpecError, SpecErrors

    def fail(text, name):
        raise SpecErrors([SpecError(name, 0, 0, "", "the message")])
    monkeypatch.setattr("lockstep.harness.specfile.parse_yaml", fail)
    p = _file(tmp_path, HEAD)
    assert _refusal(p) == f"{p}: the message"

    def fail_at(text, name):
        raise SpecErrors([SpecError(name, 4, 7, "a.b", "the message"), SpecError(name, 9, 1, "", "second")])
    monkeypatch.setattr("lockstep.harness.specfile.parse_yaml", fail_at)
    assert _refusal(p) == f"{p}:4:7: a.b: the message"


@pytest.mark.parametrize("body, line, words", [
    ("target: toy\nversions: '>=1'\nsurplus: 1\n", 3,
     "unknown key 'surplus' (known: target, versions, version, failures)"),
    ("target: toy\nversions: 1\n", 2, "versions must be a string, got int 1"),
    ("target: toy\nversion: true\n", 2, "version must be a string or a number or a number, got bool True"),
    ("target: toy\nversion: [1]\n", 2, "version must be a string or a number or a number, got list [1]"),
    (HEAD + "failures:\n  a/b:\n    observed: x\n    judgement: peer bug\n    why: [y]\n", 7,
     "failures.a/b.why must be a string or null, got list ['y']"),
    (HEAD + "failures:\n  a/b:\n    observed: x\n    judgement: 3\n", 6,
     "failures.a/b.judgement must be a string, got int 3"),
    (HEAD + "failures:\n  a/b:\n    observed: x\n    verdict: peer bug\n", 6,
     "unknown key 'verdict' (known: observed, judgement, why)"),
    (HEAD + "failures:\n  7: {observed: x, judgement: unjudged}\n", 4,
     "mapping key '7' is not a string (YAML reads it as !!int); quote it"),
    ("target: toy\nversions: '>=1'\ntarget: x\n", 3, "duplicate key 'target' (first defined on line 1)"),
])
def test_a_wrong_key_or_type_is_refused_in_full_at_its_line(tmp_path, body, line, words):
    p = _file(tmp_path, body)
    text = _refusal(p)
    assert text.startswith(f"{p}:{line}") and text.endswith(words), text


def test_a_long_wrong_value_is_cut_at_60_characters(tmp_path):
    p = _file(tmp_path, "target: toy\nversions: " + "[" + ", ".join(["1234567890"] * 9) + "]\n")
    assert _refusal(p) == f"{p}:2: versions must be a string, got list " + repr([1234567890] * 9)[:60]


@pytest.mark.parametrize("entry, line, words", [
    ("    judgement: peer bug\n    why: y\n", 4, "a/b: missing 'observed'"),
    ("    observed: ''\n    judgement: peer bug\n    why: y\n", 4, "a/b: missing 'observed'"),
    ("    observed: x\n    why: y\n", 4, "a/b: missing 'judgement'"),
    ("    observed: x\n    judgement: peer bug\n", 4, "a/b: missing 'why' (one line: why it fails)"),
    ("    observed: x\n    judgement: contract gap\n    why:\n", 4, "a/b: missing 'why' (one line: why it fails)"),
    ("    observed: x\n    judgement: bug\n    why: y\n", 6,
     "a/b: judgement 'bug' is not one of peer bug, contract gap, unjudged"),
])
def test_an_entry_missing_a_field_is_refused_at_its_spec_id(tmp_path, entry, line, words):
    p = _file(tmp_path, HEAD + "failures:\n  a/b:\n" + entry)
    assert _refusal(p) == f"{p}:{line}: {words}"


def test_an_entry_that_is_not_a_mapping_and_failures_that_are_not_one(tmp_path):
    p = _file(tmp_path, HEAD + "failures:\n  a/b: text\n")
    assert _refusal(p) == f"{p}:4: a/b: expected observed, judgement and why"
    p = _file(tmp_path, HEAD + "failures: [1]\n", "list.yaml")
    assert _refusal(p) == f"{p}:3: 'failures' must map spec ids to entries"


def test_an_unjudged_entry_needs_no_why_and_gets_an_empty_one(tmp_path):
    p = _file(tmp_path, HEAD + "failures:\n  a/b: {observed: x, judgement: unjudged}\n"
                               "  c/d: {observed: y, judgement: peer bug, why: z}\n")
    assert load(p, "toy", "1.0") == {"a/b": {"observed": "x", "judgement": "unjudged", "why": ""},
                                     "c/d": {"observed": "y", "judgement": "peer bug", "why": "z"}}


@pytest.mark.parametrize("head, line, words", [
    ("target: toy\nversions: 'one'\n", 2,
     "versions 'one' is not a PEP 440 specifier set (e.g. '>=0.3,<0.4')"),
    ("target: toy\nversion: 'x y'\nfailures: {}\n", 2, "Invalid specifier: '==x y'"),
    ("target: toy\nversion: '2.0'\nfailures: {}\n", 1,
     "is for toy 2.0, not toy 1.0 (widen its 'versions' range, or pass another --expectations)"),
    ("failures: {}\ntarget: toy\n", 1,
     "names no 'versions' (a PEP 440 range such as '>=0.3,<0.4') or 'version'"),
    ("failures: {}\ntarget: other\nversions: '>=1'\n", 2,
     "is for other >=1, not toy 1.0 (widen its 'versions' range, or pass another --expectations)"),
    ("failures: {}\ntarget: toy\nversions: '<1'\n", 2, "is for toy <1, not toy 1.0"),
])
def test_the_version_refusals_point_at_the_versions_or_the_target(tmp_path, head, line, words):
    p = _file(tmp_path, head)
    text = _refusal(p)
    assert text.startswith(f"{p}:{line}: {words}"), text


def test_versions_wins_over_version_and_a_bad_versions_is_located_there(tmp_path):
    p = _file(tmp_path, "target: toy\nversion: '2.0'\nversions: '>=1,<2'\n")
    assert load(p, "toy", "1.5") == {}
    assert _refusal(p, version="2.0").endswith("is for toy >=1,<2, not toy 2.0 (widen its 'versions' range, "
                                                 "or pass another --expectations)")
    p = _file(tmp_path, "target: toy\nversion: '1.0'\n\nversions: '~~'\n", "v.yaml")
    assert _refusal(p).startswith(f"{p}:4: versions '~~'")


def test_a_version_that_is_not_pep_440_matches_only_an_exact_version(tmp_path):
    p = _file(tmp_path, "target: toy\nversion: 'main build'\n")
    assert load(p, "toy", "main build") == {}
    assert expectfile.applies({"target": "toy", "version": "main build"}, "toy", "main build")
    assert not expectfile.applies({"target": "toy", "versions": ">=1"}, "toy", "main build")
    assert not expectfile.applies({"target": "toy", "version": "1.0"}, "other", "1.0")
    assert expectfile.applies({"target": "toy", "version": 1.5}, "toy", "1.5"), "a number is a version"
    assert expectfile.applies({"target": "toy", "versions": ">=1", "version": None}, "toy", "1.0")
    assert expectfile.applies({"target": "toy", "versions": None, "version": "1.0"}, "toy", "1.0")
    assert expectfile.applies({"target": "toy", "versions": ">=1"}, "toy", "1.1rc1"), "pre-releases count"


def test_a_spec_id_that_is_not_a_string_is_refused_where_it_is(tmp_path):
    """YAML's reader refuses it first (above); the check of the value read stands behind it."""
    with pytest.raises(ExpectationsError) as e:
        expectfile._types(tmp_path / "x.yaml", {("failures", 7): (4, 3)}, {"failures": {7: {}}})
    assert str(e.value) == f"{tmp_path / 'x.yaml'}:4: a spec id is a string, got 7"
    expectfile._types(tmp_path / "x.yaml", {}, {"failures": {"a/b": "text"}})   # an entry's shape: load's


def test_the_line_of_a_key_is_the_nearest_one_found():
    marks = {("key", "failures"): (3, 1), ("failures", "a/b"): (4, 3), ("key", "failures", "a/b", "why"): (6, 5)}
    assert expectfile._line(marks, "failures", "a/b", "why") == 6
    assert expectfile._line(marks, "failures", "a/b", "judgement") == 4, "the entry when its key is not there"
    assert expectfile._line(marks, "failures", "c/d") == 3, "the section when the entry is not there"
    assert expectfile._line(marks, "target") == 1, "line 1 when nothing is found"
    assert expectfile._line({("x",): (5, 1)}, "x") == 5, "a value's mark when its key has none"


def test_which_file_a_run_uses(tmp_path, monkeypatch):
    own = tmp_path / "own.yaml"
    with pytest.raises(ExpectationsError) as e:
        find("toy", "1.0", own=str(own), explicit=tmp_path / "gone.yaml")
    assert str(e.value) == f"--expectations {tmp_path / 'gone.yaml'}: no such file"
    given = _file(tmp_path, HEAD, "given.yaml")
    assert find("toy", "1.0", own=str(own), explicit=given) == given, "an explicit file wins over the target's"
    assert find("toy", "1.0", own=str(own)) == own and isinstance(find("toy", "1.0", own=str(own)), type(own))
    shipped = tmp_path / "shipped"
    shipped.mkdir()
    monkeypatch.setattr(expectfile, "SHIPPED", shipped)
    assert find("toy", "1.0") is None
    _file(shipped, "target: toy\nversions: '~~'\n", "toy-a.yaml")              # a bad range is skipped
    _file(shipped, "target: toy\nversions: '>=2'\n", "toy-b.yaml")
    _file(shipped, "target: toy\nversions: '>=1'\n", "toy-c.yaml")
    _file(shipped, "target: toy\nversions: '>=0.5'\n", "toy-d.yaml")
    _file(shipped, "target: other\nversions: '>=0'\n", "other-0.yaml")
    assert find("toy", "1.0") == shipped / "toy-c.yaml", "the first applying file in name order"
    assert find("toy", "0.6") == shipped / "toy-d.yaml"
    assert find("toy", "0.1") is None
    _file(shipped, "target: toy\nversions: '>=9'\n", "toy-1.0.yaml")
    assert find("toy", "1.0") == shipped / "toy-1.0.yaml", "<name>-<version>.yaml first, whatever it says"


@pytest.mark.parametrize("a, b, equal", [
    ("bits: 3 of 8 elements differ — max abs 0.5", "bits: 3 of 8 elements differ — max abs 0.25", True),
    ("max rel 1.5e-3 at request 2", "max rel 2.25E+01 at request 2", True),
    ("got nan, want inf", "got 1.0, want -2.", True),
    ("value .5 here", "value 7. here", True),
    ("request 2 step 3", "request 2 step 4", False),
    ("token 12 at 3", "token 13 at 3", False),
    ("id 1e5", "id 2e5", True),
    ("cause — tail one", "cause — another — tail", True),
    ("a  cause ", "a  cause", True),
    ("nanny and info", "nanny and infos", False),
])
def test_a_failure_is_matched_by_its_cause_with_floats_masked(a, b, equal):
    assert same(a, b) is equal, (signature(a), signature(b))


def test_the_signature_keeps_integers_and_masks_each_float_form():
    assert signature("x 1.5 y -2. z +.25 w 3e-7 v 4E+2 u nan t inf s 12 — tail 9.5") == "x … y … z … w … v … u … t … s 12"
    assert signature(42) == "42"


def _outcome(sid, status="fail", message="m"):
    return SimpleNamespace(spec=SimpleNamespace(id=sid), status=status, message=message)


def test_the_written_file_merges_keeps_judgements_and_counts_the_unjudged(tmp_path):
    previous = {"kept/judged": {"observed": "old", "judgement": "peer bug", "why": "w"},
                "kept/open": {"observed": "old", "judgement": "unjudged", "why": ""},
                "kept/open2": {"observed": "old", "judgement": "unjudged", "why": ""},
                "same/cause": {"observed": "bits — 0.5", "judgement": "contract gap", "why": "c"},
                "same/open": {"observed": "bits — 0.5", "judgement": "unjudged", "why": ""},
                "changed/cause": {"observed": "bits at 3", "judgement": "peer bug", "why": "p"},
                "now/passes": {"observed": "x", "judgement": "peer bug", "why": "p"}}
    outcomes = [_outcome("now/passes", status="pass"), _outcome("same/cause", message="bits — 0.75"),
                _outcome("same/open", message="bits — 1.5"), _outcome("changed/cause", message="bits at 4"),
                _outcome("new/one", message="new")]
    path = tmp_path / "deep" / "er" / "toy.yaml"
    assert write(path, "toy", "1.0", None, outcomes, previous) == 5, "2 kept and 3 new or changed unjudged"
    text = path.read_text()
    assert text.startswith("# Specs that fail on this target, written by `lockstep expectations` from observed "
                           "results.\n# Review each `unjudged` entry: judge it `peer bug` or `contract gap` and "
                           "say why in one line.\ntarget: toy\nversions: ==1.0\nfailures:\n  kept/judged:\n")
    doc = yaml.safe_load(text)
    assert list(doc) == ["target", "versions", "failures"]
    assert doc["failures"] == {
        "kept/judged": {"observed": "old", "judgement": "peer bug", "why": "w"},
        "kept/open": {"observed": "old", "judgement": "unjudged", "why": ""},
        "kept/open2": {"observed": "old", "judgement": "unjudged", "why": ""},
        "same/cause": {"observed": "bits — 0.75", "judgement": "contract gap", "why": "c"},
        "same/open": {"observed": "bits — 1.5", "judgement": "unjudged", "why": ""},
        "changed/cause": {"observed": "bits at 4", "judgement": "unjudged", "why": ""},
        "new/one": {"observed": "new", "judgement": "unjudged", "why": ""}}
    assert list(doc["failures"]) == ["kept/judged", "kept/open", "kept/open2", "same/cause", "same/open", "changed/cause",
                                     "new/one"]
    assert load(path, "toy", "1.0") == doc["failures"], "the written file reads back"
    assert sorted(p.name for p in path.parent.iterdir()) == ["toy.yaml"], "no temporary file left"
    assert write(path, "toy", "1.0", ">=1,<2", [], {}) == 0
    assert yaml.safe_load(path.read_text()) == {"target": "toy", "versions": ">=1,<2", "failures": {}}


def test_a_long_or_unicode_observation_is_written_as_is(tmp_path):
    message = "é " + "word " * 40
    path = tmp_path / "toy.yaml"
    write(path, "toy", "1.0", None, [_outcome("a/b", message=message)], {})
    assert "é" in path.read_text(encoding="utf-8"), "allow_unicode: written, not escaped"
    assert 95 <= max(len(line) for line in path.read_text().splitlines()) <= 105, "wrapped at 100, not 80"
    assert yaml.safe_load(path.read_text())["failures"]["a/b"]["observed"] == message


def test_a_failed_write_leaves_the_old_file_and_no_temporary(tmp_path, monkeypatch):
    path = tmp_path / "toy.yaml"
    path.write_text("old")
    seen = []

    def refuse(src, dst):
        seen.append((Path(src), Path(src).read_text(encoding="utf-8"), dst))
        raise OSError("disk full")
    monkeypatch.setattr(os, "replace", refuse)
    with pytest.raises(OSError, match="disk full"):
        write(path, "toy", "1.0", None, [_outcome("a/b")], {})
    assert path.read_text() == "old"
    assert [p.name for p in tmp_path.iterdir()] == ["toy.yaml"]
    (tmp, text, dst), = seen
    assert tmp.parent == tmp_path and tmp.name.startswith(".toy.yaml.") and tmp.name.endswith(".tmp"), tmp
    assert dst == path and "a/b:" in text, "the temporary file beside the file, written in full, then renamed"


def test_each_outcome_is_compared_with_its_expectation():
    want = {"observed": "bits at 3 — max 0.5", "judgement": "peer bug", "why": "w"}
    fail = _outcome("a/b", message="bits at 3 — max 0.75")
    assert expectfile.verdict(fail, want) is None, "the same cause, floats masked"
    assert expectfile.verdict(fail, None) == "NEW FAILURE a/b: bits at 3 — max 0.75"
    moved = _outcome("a/b", message="bits at 4")
    assert expectfile.verdict(moved, want) == "FAILS DIFFERENTLY a/b: bits at 4\n    expected: bits at 3 — max 0.5"
    assert expectfile.verdict(_outcome("a/b", status="pass"), want) == \
        "EXPECTED FAILURE now passes: a/b (remove it from the expectations)"
    assert expectfile.verdict(_outcome("a/b", status="n/a", message="no op 'hash'"), want) == \
        "EXPECTED FAILURE is now n/a (no op 'hash'): a/b (remove it from the expectations)"
    assert expectfile.verdict(_outcome("a/b", status="pass"), None) is None
    assert expectfile.verdict(_outcome("a/b", status="n/a"), None) is None


def test_the_differences_of_a_run_and_the_expectations_it_did_not_run():
    expected = {"a/b": {"observed": "x"}, "c/d": {"observed": "y"}, "e/f": {"observed": "z"}}
    outcomes = [_outcome("a/b", message="x"), _outcome("c/d", status="pass"), _outcome("g/h", message="new")]
    assert expectfile.compare(outcomes, expected) == [
        "EXPECTED FAILURE now passes: c/d (remove it from the expectations)", "NEW FAILURE g/h: new"]
    assert expectfile.compare([_outcome("a/b", message="x")], expected) == []
    assert expectfile.unrun(outcomes, expected) == ["e/f"]
    assert expectfile.unrun([], {"z/z": {}, "a/a": {}}) == ["a/a", "z/z"], "sorted"
