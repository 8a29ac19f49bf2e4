"""Fuzzing `lockstep` with hostile spec documents and command lines (issue 14).

Whatever it is given, the command answers with an exit code in {0, 1, 2, 3}, prints no traceback,
and leaves golden/ byte for byte as it was. The documents are built from each kind's own field
names with hostile values (NaN, infinities, int64 overflows, huge sizes, wrong types, paths out
of the project, deep nesting, aliases); the command lines from the commands, options and values
a user could mistype. Example counts are kept modest: the whole file runs in about a minute on
the 2-core CI machine.
"""

import copy
import io
import os
import shutil
from contextlib import redirect_stderr, redirect_stdout

import pytest
import yaml
from hypothesis import HealthCheck, given, settings, strategies as st

from lockstep.harness import kinds
from lockstep.harness.cli import main
from lockstep.harness.schema import Map
from tests.conftest import REPO, golden_bytes

EXIT_CODES = {0, 1, 2, 3}
SPECS = ("known-answers", "gumbel-endpoints")          # the cheapest coin specs, one shared, one per platform
FUZZ = settings(max_examples=int(os.environ.get("LOCKSTEP_FUZZ_EXAMPLES", 60)), deadline=None,
                derandomize="LOCKSTEP_FUZZ_EXAMPLES" not in os.environ,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
RUNNABLE = ("coins", "verify", "kernel", "layer_ids")  # kinds whose valid small specs run in well under a second


@pytest.fixture(scope="module")
def fuzz_project(tmp_path_factory):
    """specs/ with two real coin specs and their goldens, copied from the repository."""
    root = tmp_path_factory.mktemp("fuzz")
    (root / "specs" / "coins").mkdir(parents=True)
    (root / "specs" / "fuzz").mkdir()
    for name in SPECS:
        shutil.copy(REPO / "specs" / "coins" / f"{name}.yaml", root / "specs" / "coins")
    for platform, name in (("shared", "known-answers"), ("cpu-fp32", "gumbel-endpoints")):
        (root / "golden" / platform / "coins").mkdir(parents=True, exist_ok=True)
        for suffix in (".json", ".safetensors"):
            shutil.copy(REPO / "golden" / platform / "coins" / f"{name}{suffix}", root / "golden" / platform / "coins")
    return root


def invoke(project, argv) -> tuple[int, str]:
    """`lockstep ARGV` in this process, on the fuzz project (options given later in ARGV win)."""
    out, err = io.StringIO(), io.StringIO()
    with redirect_stdout(out), redirect_stderr(err):
        code = main([*argv[:1], "--specs", str(project / "specs"), "--golden", str(project / "golden"), *argv[1:]])
    return code, out.getvalue() + err.getvalue()


def assert_handled(project, argv, before):
    code, text = invoke(project, argv)
    assert code in EXIT_CODES, (argv, code, text[-2000:])
    assert "Traceback" not in text, (argv, text[-4000:])
    assert golden_bytes(project) == before, argv
    return code


# --------------------------------------------------------------------------- spec documents
def fields(schema) -> list[str]:
    return sorted(schema.fields) if isinstance(schema, Map) else []


scalars = st.one_of(
    st.none(), st.booleans(), st.integers(-3, 9),
    st.sampled_from([2**63, 2**64, -(2**63) - 1, 10**12, 2**22 + 1, 1 << 20]),
    st.sampled_from([float("nan"), float("inf"), float("-inf"), -1.0e-5, 0.5, 1e308, 0.0]),
    st.sampled_from(["", " ", "tiny", "hash", "coins", "gumbel", "matmul", "attention", "greedy", "sglang",
                     "../../etc", "/etc/passwd", "models/tiny-target", "x" * 300]),
)
values = st.recursive(
    scalars,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(
        st.sampled_from(["arange", "hashed", "count", "seed", "below", "preset", "path", "prompt", "M", "K", "N",
                         "values", "final", "parents", "tokens", "x"]), inner, max_size=3),
    max_leaves=8)


@st.composite
def documents(draw):
    kind = draw(st.sampled_from(sorted(kinds.KINDS) + ["nope", ""]))
    module = kinds.KINDS.get(kind)
    doc = {"kind": kind, "description": draw(st.sampled_from(["fuzz", "", 3]))}
    if draw(st.booleans()):
        doc["tags"] = draw(st.lists(st.sampled_from(["a", "", "fuzz"]), max_size=2))
    for section, schema in (("inputs", getattr(module, "INPUTS", None)), ("expect", getattr(module, "EXPECT", None))):
        keys = fields(schema) + ["typo"]
        doc[section] = draw(st.dictionaries(st.sampled_from(keys), values, max_size=len(keys)))
    return kind, yaml.safe_dump(doc, allow_unicode=True)


# Valid small specs of every kind; a mutation puts a hostile value at one of their paths (or drops
# it), so that many documents pass validation and go on to run.
TEMPLATES = {
    "coins": {"inputs": {"seeds": [1, 2], "positions": {"arange": [0, 2]}, "columns": [0, 3], "draft_token_num": 3,
                         "outputs": ["hash", "coins", "gumbel"]},
              "expect": {"coins_in_unit_interval": True, "gumbel_finite": True, "equal_rows": [[0, 0]]}},
    "verify": {"inputs": {"mode": "target-only", "tree": {"parents": [-1, 0, 0], "tokens": [1, 0, 2]},
                          "probs": [[0.5, 0.25, 0.25]], "coins": {"values": [0.1, 0.2, 0.3], "final": 0.5}},
               "expect": {"accepted": [0, 1], "next_token": 0}},
    "kernel": {"inputs": {"kernel": "matmul", "shape": {"M": 2, "K": 3, "N": 2}, "seed": 1, "scale": 1.0},
               "expect": {"finite": True, "tolerance": 1.0e-5, "batch_invariant": True}},
    "layer_ids": {"inputs": {"target": "gpt-oss-120b", "ids": [24, 30, 36], "convention": "sglang"},
                  "expect": {"boundaries": [24, 30, 36], "aux_width": 8640}},
    "generate": {"inputs": {"checkpoint": {"preset": "tiny"}, "requests": [{"prompt": [1, 2], "seed": 3,
                                                                            "sampling": {"max_new_tokens": 2}}]},
                 "expect": {"last_tokens": ["any"]}},
    "distribution": {"inputs": {"checkpoint": {"preset": "tiny-vocab8"}, "draft": {"seed": 0, "convention": "boundary"},
                                "speculative": {"num_steps": 1}, "prompt": [1], "seeds": {"arange": [0, 10]},
                                "tokens": 1},
                     "expect": {"alpha": 0.001, "acceptance": {"min": 0.0, "max": 1.0}}},
}


def paths(node, prefix=()):
    yield prefix
    items = node.items() if isinstance(node, dict) else enumerate(node) if isinstance(node, list) else ()
    for key, child in items:
        yield from paths(child, prefix + (key,))


@st.composite
def mutated(draw):
    kind = draw(st.sampled_from(sorted(TEMPLATES)))
    doc = {"kind": kind, "description": "fuzz", **copy.deepcopy(TEMPLATES[kind])}
    for _ in range(draw(st.sampled_from([0, 0, 1, 1, 2]))):   # a third of the documents stay valid and run
        where = draw(st.sampled_from([p for p in paths(doc) if len(p) >= 2]))
        parent = doc
        for key in where[:-1]:
            parent = parent[key]
        if draw(st.booleans()):
            parent[where[-1]] = draw(values)
        elif isinstance(parent, dict):
            del parent[where[-1]]
    return kind, yaml.safe_dump(doc, allow_unicode=True)


hostile_texts = st.sampled_from([
    "kind: coins\ninputs: " + "[" * 3000,
    "".join("  " * i + "k:\n" for i in range(60)),
    "a: &a [x, x, x, x, x, x, x, x]\n" + "".join(f"{c}: &{c} [{', '.join([f'*{p}'] * 8)}]\n"
                                                for p, c in zip("abcdefghij", "bcdefghijk")),
    "kind: &k [*k]\n", "kind: coins\ninputs: {seeds: {arange: [0, 5, 0]}}\n", "\x00\x01", "- a\n- b\n", "",
    "kind: coins\nx: " + "9" * 500 + "\n", "kind: !!python/object/apply:os.system ['true']\n",
]) | st.text(max_size=80)


@FUZZ
@given(doc=documents() | mutated(), text=hostile_texts, run_it=st.booleans())
def test_hostile_spec_documents(fuzz_project, doc, text, run_it):
    kind, document = doc
    target = fuzz_project / "specs" / "fuzz" / "x.yaml"
    raw = fuzz_project / "specs" / "fuzz" / "raw.yaml"
    before = golden_bytes(fuzz_project)
    try:
        target.write_text(document, encoding="utf-8")
        raw.write_text(text, encoding="utf-8", errors="surrogateescape")
        assert_handled(fuzz_project, ["list"], before)
        valid = assert_handled(fuzz_project, ["validate", "fuzz/x"], before) == 0
        assert_handled(fuzz_project, ["validate", "fuzz/raw"], before)
        if run_it and valid and kind in RUNNABLE and "forward" not in document:
            assert_handled(fuzz_project, ["check", "fuzz/x", "--device", "cpu"], before)
            assert_handled(fuzz_project, ["regen", "fuzz/x", "--dry-run", "--device", "cpu"], before)
    finally:
        target.unlink(missing_ok=True)
        raw.unlink(missing_ok=True)


# --------------------------------------------------------------------------- command lines
COMMANDS = ["list", "validate", "check", "diff", "regen", "bogus", "--help", "", "-x"]
TOKENS = st.one_of(
    st.sampled_from(["coins/*", "coins/known-answers", "*", "nope/*", "", "[", "**", "../x", "fuzz/*",
                     "--tag", "--json", "--strict", "--debug", "--dry-run", "--allow-ci", "--world-size", "--device",
                     "--dtype", "--backend", "--specs", "--golden", "--no-such", "-h", "cpu", "cuda", "bf16", "fp32",
                     "triton", "torch", "1,2", "1,,2", "0", "-1", "3", "8", "known-answer", "gumbel", "nowhere",
                     "specs/coins/known-answers.yaml"]),
    st.text(alphabet="01234,- ab*/", max_size=6),
)


@FUZZ
@given(command=st.sampled_from(COMMANDS), rest=st.lists(TOKENS, max_size=5))
def test_hostile_command_lines(fuzz_project, monkeypatch_module, command, rest):
    argv = [command, *rest]
    if command == "regen" and "--dry-run" not in argv:
        argv.append("--dry-run")                   # a real regen writes goldens: fuzz what it would do
    assert_handled(fuzz_project, argv, golden_bytes(fuzz_project))


@pytest.fixture(scope="module")
def monkeypatch_module(fuzz_project):
    """In the fuzz project (so that relative paths such as `--specs ''` stay inside it), without CI=true
    (which would refuse regen before the fuzz reaches it)."""
    with pytest.MonkeyPatch.context() as mp:
        mp.delenv("CI", raising=False)
        mp.chdir(fuzz_project)
        yield mp


# --------------------------------------------------------------------------- numbers of generate and make-checkpoint (issue 29)
FEW = settings(FUZZ, max_examples=int(os.environ.get("LOCKSTEP_FUZZ_EXAMPLES", 12)))
HOSTILE_INTS = st.one_of(st.integers(-3, 600), st.sampled_from([2**63 - 1, 2**63, 2**64 - 1, 2**64, -(2**63) - 1,
                                                                 10**30, -(10**30)]))
HOSTILE_BOUNDS = st.sampled_from(["nan", "-1", "0", "inf", "1e-9", "x", "", "1e400"])


def invoke_plain(argv) -> tuple[int, str]:
    out, err = io.StringIO(), io.StringIO()
    with redirect_stdout(out), redirect_stderr(err):
        code = main(argv)
    return code, out.getvalue() + err.getvalue()


@FEW
@given(ids=st.lists(HOSTILE_INTS, min_size=1, max_size=3), seed=st.none() | HOSTILE_INTS,
       new=st.integers(-2, 3), bound=st.none() | HOSTILE_BOUNDS)
def test_hostile_generate_numbers(ids, seed, new, bound):
    argv = ["generate", "--checkpoint", str(REPO / "models/tiny-target"), "--device", "cpu",
            "--prompt-ids", ",".join(map(str, ids)), "--max-new-tokens", str(new)]
    argv += ["--seed", str(seed)] if seed is not None else []
    argv += ["--max-seconds", bound] if bound is not None else []
    code, text = invoke_plain(argv)
    assert code in (0, 2) and "Traceback" not in text and "internal error" not in text, (argv, text[-2000:])
    if code == 2:
        assert text.count("\n") <= 12 and "error" in text, text          # one named error (argparse adds its usage)


@FEW
@given(preset=st.sampled_from(["tiny", "tiny-vocab8", "gpt-oss-20b", "gpt-oss-120b", "nope", ""]),
       seed=HOSTILE_INTS, fmt=st.sampled_from(["bf16", "mxfp4"]), bound=st.none() | HOSTILE_BOUNDS)
def test_hostile_make_checkpoint_numbers(tmp_path_factory, preset, seed, fmt, bound):
    out = tmp_path_factory.mktemp("ckpt") / "out"
    argv = ["make-checkpoint", "--preset", preset, "--seed", str(seed), "--format", fmt, str(out)]
    argv += ["--max-gb", bound] if bound is not None else []
    code, text = invoke_plain(argv)
    assert code in (0, 2) and "Traceback" not in text and "internal error" not in text, (argv, text[-2000:])
    assert (code == 0) == out.is_dir(), (argv, text)                      # refused: nothing written
