"""One set of flags: every subcommand's options are in its synopsis in docs/cli.md, every command
takes --debug after its name, usage errors have one prefix, and old spellings still work (with a
warning) while the new names carry one meaning each."""

import argparse
import re

import pytest

from lockstep.harness import cli
from tests.conftest import REPO

GROUPS = ("SELECT", "RUN", "TARGET")


def subcommands():
    return next(a for a in cli.build_parser()._actions if a.dest == "command").choices


def synopses() -> dict[str, str]:
    """docs/cli.md's synopsis block: each command's lines, with the group tokens expanded."""
    block = (REPO / "docs/cli.md").read_text(encoding="utf-8").split("```text\n", 1)[1].split("```", 1)[0]
    groups = {g: re.search(rf"^{g}\s*= (.*)$", block, re.M).group(1) for g in GROUPS}
    out, cur = {}, None
    for line in block.splitlines():
        m = re.match(r"lockstep ([a-z][a-z-]*)", line)
        if m:
            cur = m.group(1)
        elif not line.startswith(" "):
            cur = None
        if cur:
            out[cur] = out.get(cur, "") + line + "\n"
    for name, text in out.items():
        for g in GROUPS:
            text = text.replace(f"[{g}]", groups[g])
        out[name] = text
    return out


def options(p) -> list[tuple[str, ...]]:
    return [tuple(a.option_strings) for a in p._actions if a.option_strings and a.help != argparse.SUPPRESS
            and a.dest not in ("help", "debug")]


def test_every_option_of_every_subcommand_is_in_its_synopsis():
    syn = synopses()
    missing = []
    for name, p in subcommands().items():
        if name not in syn:
            missing.append(f"lockstep {name}: no synopsis")
            continue
        for strings in options(p):
            if not any(re.search(rf"(?<![\w-]){re.escape(o)}(?![\w-])", syn[name]) for o in strings):
                missing.append(f"{name} {strings[-1]}")
    assert not missing, missing


def test_the_synopsis_names_no_option_a_command_lacks():
    syn = synopses()
    for name, p in subcommands().items():
        have = {o for a in p._actions for o in a.option_strings}
        named = set(re.findall(r"(?<![\w-])(--[a-z][a-z0-9-]*)", syn.get(name, "")))
        assert named <= have | {"--help"}, (name, named - have)


@pytest.mark.parametrize("name", sorted(subcommands()))
def test_every_command_takes_debug_after_its_name(name):
    p = subcommands()[name]
    assert any("--debug" in a.option_strings for a in p._actions), name


def run(capsys, *argv):
    code = cli.main(list(argv))
    out = capsys.readouterr()
    return code, out.out, out.err


@pytest.mark.parametrize("argv", [["record", "--bogus"], ["check", "--jobs", "0"], ["nosuch"], ["show", "--pair", "x"]])
def test_usage_errors_have_one_prefix_and_no_usage_dump(capsys, argv):
    code, out, err = run(capsys, *argv)
    assert code == 2 and err.startswith("lockstep: error: ") and "usage:" not in err and len(err.splitlines()) == 1


def test_old_spellings_warn_and_still_work(tmp_path, capsys):
    code, out, err = run(capsys, "make-checkpoint", "--preset", "tiny", "--seed", "3", str(tmp_path / "a"))
    assert code == 0 and "--seed is deprecated, use --ckpt-seed" in err
    assert run(capsys, "make-checkpoint", "--preset", "tiny", "--ckpt-seed", "3", str(tmp_path / "b"))[0] == 0
    a, b = sorted((tmp_path / "a").iterdir()), sorted((tmp_path / "b").iterdir())
    assert [f.read_bytes() for f in a] == [f.read_bytes() for f in b]            # the same weights' seed
    args = cli.build_parser().parse_args(["record", "o", "--preset", "tiny", "--topk", "3"])
    assert args.topk == 3
    assert cli.build_parser().parse_args(["promote", "t", "x/y", "--requests", "0,2"]).requests == [0, 2]
    assert cli.build_parser().parse_args(["promote", "t", "x/y", "--request-indices", "1"]).requests == [1]
