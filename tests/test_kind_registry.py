"""A new spec kind is one module and one registry line (DESIGN §1). tests/example_kind.py is the
whole kind; the one line below registers it (for the test's duration). It then validates, records
its golden, and runs through the one `check` command: on Lockstep's engine against the golden bit
for bit, and with `--target` on another implementation (pass, fail, n/a)."""

from __future__ import annotations

import pytest

from lockstep.harness import cli, kinds
from lockstep.harness.target import Op, Target
from tests import example_kind

SPEC = """kind: one-hash
description: the seeded hash of one key
inputs:
  key: [42, 7, 3]
expect:
  hash: {answer}
"""


@pytest.fixture
def project(tmp_path, monkeypatch):
    monkeypatch.setitem(kinds.KINDS, example_kind.NAME, example_kind)      # the registry line
    (tmp_path / "specs" / "one-hash").mkdir(parents=True)
    (tmp_path / "specs" / "one-hash" / "known.yaml").write_text(SPEC.format(answer=966665676))
    (tmp_path / "golden").mkdir()
    monkeypatch.chdir(tmp_path)
    return tmp_path


def _target(monkeypatch, target):
    monkeypatch.setattr("lockstep.harness.commands.targets.get", lambda name: target)


def _hash_target(halved: bool = False) -> Target:
    from lockstep.kernels.coins import murmur_hash32_torch

    def hash_(seed, pos, col):
        return murmur_hash32_torch(seed, pos, col) // (2 if halved else 1)
    return Target("toy", "1.0", ops={"hash": Op(hash_)})


def test_the_example_kind_runs_on_lockstep_s_engine_against_its_golden(project, capsys):
    assert cli.main(["validate"]) == 0
    assert cli.main(["check", "one-hash/known", "--device", "cpu"]) == 3          # no golden yet: MISSING
    assert cli.main(["regen", "one-hash/known", "--device", "cpu", "--allow-ci"]) == 0
    assert (project / "golden" / "shared" / "one-hash" / "known.json").is_file()
    capsys.readouterr()
    assert cli.main(["check", "one-hash/known", "--device", "cpu"]) == 0
    assert "pass      one-hash/known" in capsys.readouterr().out
    (project / "specs" / "one-hash" / "known.yaml").write_text(SPEC.format(answer=966665677))
    assert cli.main(["check", "one-hash/known", "--device", "cpu"]) == 1          # the kind's own check
    assert "hash 966665676, the spec expects 966665677" in capsys.readouterr().out


def test_the_example_kind_runs_on_another_target(project, monkeypatch, capsys):
    assert cli.main(["regen", "one-hash/known", "--device", "cpu", "--allow-ci"]) == 0
    argv = ["check", "one-hash/known", "--device", "cpu", "--target", "toy"]
    _target(monkeypatch, _hash_target())
    capsys.readouterr()
    assert cli.main(argv) == 0
    assert "1 spec(s) on toy-1.0: 1 pass" in capsys.readouterr().out
    _target(monkeypatch, _hash_target(halved=True))
    assert cli.main(argv) == 1
    out = capsys.readouterr().out
    assert "NEW FAILURE one-hash/known: hash 483332838, the spec expects 966665676" in out
    _target(monkeypatch, Target("bare", "1.0"))
    assert cli.main(argv) == 0
    assert "n/a     one-hash/known" in capsys.readouterr().out
