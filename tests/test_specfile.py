"""The spec loader: every bad input is a located error, never a traceback."""

import textwrap

import pytest
import yaml
from hypothesis import given, settings, strategies as st

from lockstep.harness.specfile import SpecErrors, check_spec_id, load_specs, parse_spec, select

GOOD = """\
kind: coins
description: a good spec
tags: [a, b]
inputs:
  seeds: [1, 2]
  positions: [3]
  columns: {arange: [0, 4]}
  outputs: [hash]
"""


def errors_of(text, spec_id="x/y"):
    with pytest.raises(SpecErrors) as e:
        parse_spec(textwrap.dedent(text), "specs/x/y.yaml", spec_id)
    return e.value.errors


def test_good_spec_loads():
    spec = parse_spec(GOOD, "specs/x/y.yaml", "x/y")
    assert spec.kind == "coins" and spec.tags == ("a", "b") and spec.inputs["seeds"] == [1, 2]
    assert spec.line_of("inputs", "seeds") == 5


def test_a_text_parsed_again_is_a_fresh_copy_of_the_first_parse():
    """The per-process cache of parsed YAML (specfile._PARSED): a second parse of the same text is
    a hit, equal to the first, and what a caller does to its copy reaches no other caller."""
    from lockstep.harness import specfile

    text = GOOD.replace("[1, 2]", "[1, 2, 7]")            # a text no other test parses
    first, marks = specfile._parse(text, "f")
    assert text in specfile._PARSED
    first["inputs"]["seeds"].append(99)
    first["inputs"]["columns"]["arange"] = None
    marks[("inputs",)] = (0, 0)
    again, again_marks = specfile._parse(text, "f")
    assert again["inputs"]["seeds"] == [1, 2, 7] and again["inputs"]["columns"] == {"arange": [0, 4]}
    assert again_marks[("inputs",)] == (5, 3)
    assert parse_spec(text, "f", "x/y").sha256 == parse_spec(text, "g", "x/y").sha256


def test_spec_hash_ignores_formatting_but_not_content():
    a = parse_spec(GOOD, "f", "x/y")
    b = parse_spec(GOOD.replace("[1, 2]", "[1,   2]  # comment"), "f", "x/y")
    c = parse_spec(GOOD.replace("[1, 2]", "[1, 5]"), "f", "x/y")
    assert a.sha256 == b.sha256 != c.sha256


def test_wrong_type_names_file_line_column_path_expected_and_found():
    (err,) = errors_of(GOOD.replace("seeds: [1, 2]", "seeds: [1, 'two']"))
    assert (err.file, err.line, err.column, err.path) == ("specs/x/y.yaml", 5, 14, "inputs.seeds[1]")
    assert "expected an integer" in err.message and "found str 'two'" in err.message
    assert str(err).startswith("specs/x/y.yaml:5:14: inputs.seeds[1]: expected")


def test_bool_is_not_an_int():
    (err,) = errors_of(GOOD.replace("positions: [3]", "positions: [yes]"))
    assert err.path == "inputs.positions[0]" and "found bool True" in err.message


def test_unknown_key_suggests_a_near_miss():
    (err,) = errors_of(GOOD.replace("  outputs:", "  colums: [1]\n  outputs:"))
    assert err.path == "inputs.colums" and "did you mean 'columns'" in err.message and err.line == 8


def test_unknown_top_level_key_and_kind():
    (err,) = errors_of(GOOD + "expcet: {}\n")
    assert "did you mean 'expect'" in err.message
    (err,) = errors_of(GOOD.replace("kind: coins", "kind: coin"))
    assert err.path == "kind" and "did you mean 'coins'" in err.message and err.line == 1


def test_missing_required_fields_are_all_reported():
    errs = errors_of("kind: coins\ninputs: {}\n")
    messages = " | ".join(e.message for e in errs)
    assert "missing required key 'description'" in messages and "missing required key 'outputs'" in messages


def test_cross_field_rules():
    errs = errors_of(GOOD.replace("  columns: {arange: [0, 4]}\n", ""))
    assert any("columns" in e.message for e in errs)
    errs = errors_of(GOOD.replace("positions: [3]", "positions: [3, 4, 5]"))
    assert any(e.path == "inputs.seeds" and "expected 1 or 3" in e.message for e in errs)


@pytest.mark.parametrize("text,fragment", [
    ("kind: coins\n  bad: indent\n", "invalid YAML"),
    ("kind: [coins\n", "invalid YAML"),
    ("kind: coins\nkind: coins\n", "duplicate key 'kind'"),
    ("", "expected a mapping"),
    ("- just\n- a list\n", "expected a mapping"),
    ("kind: coins\n\tdescription: tab\n", "invalid YAML"),
    ("!!python/object:os.system {}\n", "invalid YAML"),
])
def test_malformed_yaml_is_located(text, fragment):
    errs = errors_of(text)
    assert any(fragment in e.message for e in errs)
    assert all(e.file == "specs/x/y.yaml" for e in errs)


def test_unsafe_tags_are_refused_not_executed(tmp_path):
    marker = tmp_path / "pwned"
    errs = errors_of(f"kind: !!python/object/apply:os.system ['touch {marker}']\ndescription: x\n")
    assert not marker.exists() and "invalid YAML" in errs[0].message


@pytest.mark.parametrize("spec_id", ["../etc/passwd", "a/../../b", "/abs", "a//b", "a/.hidden", "", "a b"])
def test_spec_ids_that_could_escape_are_rejected(spec_id):
    with pytest.raises(ValueError, match="invalid spec id"):
        check_spec_id(spec_id)


def test_one_bad_spec_does_not_hide_the_others(tmp_path):
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "good.yaml").write_text(GOOD)
    (tmp_path / "a" / "bad.yaml").write_text("kind: [\n")
    (tmp_path / "a" / "worse.yaml").write_text(GOOD.replace("[1, 2]", "nope"))
    specs, errors = load_specs(tmp_path)
    assert [s.id for s in specs] == ["a/good"]
    assert sorted({e.file.rsplit("/", 1)[-1] for e in errors}) == ["bad.yaml", "worse.yaml"]


def test_select_by_glob_and_tag():
    a = parse_spec(GOOD, "f", "coins/a")
    b = parse_spec(GOOD.replace("[a, b]", "[c]"), "f", "other/b")
    assert select([a, b], ["coins/*"]) == [a]
    assert select([a, b], [], ["c"]) == [b]
    assert select([a, b]) == [a, b]


yaml_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=12)


@settings(max_examples=150, deadline=None)
@given(doc=st.dictionaries(st.sampled_from(["kind", "description", "tags", "inputs", "expect", "extra"]),
                           yaml_values, max_size=6),
       inputs=st.dictionaries(st.sampled_from(["seeds", "positions", "columns", "keys", "outputs",
                                               "draft_token_num", "backends", "other"]), yaml_values, max_size=6))
def test_arbitrary_documents_give_located_errors_only(doc, inputs):
    if "inputs" in doc:
        doc["inputs"] = inputs
    doc.setdefault("kind", "coins")
    text = yaml.safe_dump(doc)
    try:
        parse_spec(text, "f.yaml", "x/y")
    except SpecErrors as e:
        assert e.errors and all(err.file == "f.yaml" and err.message for err in e.errors)


@settings(max_examples=150, deadline=None)
@given(st.text(max_size=200))
def test_arbitrary_text_gives_located_errors_only(text):
    try:
        parse_spec(text, "f.yaml", "x/y")
    except SpecErrors as e:
        assert e.errors
