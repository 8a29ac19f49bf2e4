"""The documents an adopter reads: README.md (the map, opening with the two commands CI runs),
the reference in docs/ true to `lockstep --help`, docs/DESIGN.md numbered as the specs cite it, and
`lockstep --version` (installed, or from a bare clone)."""

import pathlib

from lockstep.harness import cli

ROOT = pathlib.Path(__file__).resolve().parents[1]
# The reference pages README.md points at; the command-line reference is docs/cli.md and docs/replay.md.
REFERENCE = [ROOT / "docs" / name for name in ("cli.md", "replay.md", "specs.md", "targets.md", "goldens.md",
                                               "engine.md")]


def test_version(capsys):
    from lockstep.harness.version import version
    assert cli.main(["--version"]) == 0
    assert capsys.readouterr().out.strip() == f"lockstep {version()} (lockstep-harness)"


def test_every_design_citation_resolves_in_docs_design():
    """Each "DESIGN §N" in the specs, the README and the code names a section of docs/DESIGN.md,
    and each determinism property "D0" … "D4" it cites is defined there."""
    import re

    design = (ROOT / "docs" / "DESIGN.md").read_text()
    sections = set(re.findall(r"^## (\d+)\. ", design, re.M))
    assert sections == {str(i) for i in range(1, 11)}
    cited, properties = set(), set()
    files = [ROOT / "README.md", *REFERENCE, *(ROOT / "specs").rglob("*.yaml"), *(ROOT / "harness").rglob("*.py")]
    for f in files:
        text = f.read_text(encoding="utf-8")
        cited |= {(m, f.name) for m in re.findall(r"DESIGN §(\d+)", text)}
        properties |= set(re.findall(r"DESIGN (D\d)", text))
    assert cited and {n for n, _ in cited} <= sections, sorted(n for n, f in cited if n not in sections)
    for p in properties:
        assert re.search(rf"\*\*{p}, ", design), p


def test_the_readme_is_a_map_that_opens_with_the_two_commands():
    """README.md is short, opens with the suite and test commands (CI's .ci/run runs the test
    command exactly as README gives it), and links every reference page."""
    import re

    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert len(readme.splitlines()) <= 300
    commands = re.findall(r"```sh\n(.*?)\n```", readme, re.S)[:2]
    assert commands[0].endswith("python3 -m lockstep check") and commands[1].endswith("python3 -m pytest -n 2")
    assert readme.index(commands[1]) < readme.index("## Layout")
    assert commands[1] in (ROOT / ".ci" / "run").read_text()
    for page in REFERENCE:
        assert page.exists() and f"(docs/{page.name})" in readme, page.name


def test_the_cli_reference_is_true_to_help():
    """Every subcommand of `lockstep --help` is in the reference as `lockstep NAME`, and every option
    it takes is named there; every `lockstep NAME` the reference shows is a real subcommand."""
    import re

    docs = "".join((ROOT / "docs" / n).read_text(encoding="utf-8") for n in ("cli.md", "replay.md"))
    sub = next(a for a in cli.build_parser()._actions if a.dest == "command")
    missing = [f"lockstep {name}" for name in sub.choices if f"lockstep {name}" not in docs]
    missing += [f"{name} {o}" for name, p in sub.choices.items() for a in p._actions for o in a.option_strings
                if o.startswith("--") and o not in ("--help", "--debug") and o not in docs]
    assert not missing, missing
    shown = set(re.findall(r"^lockstep ([a-z][a-z-]*)", docs, re.M))
    assert shown and shown <= set(sub.choices), shown - set(sub.choices)
