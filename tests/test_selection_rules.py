"""Which specs a command runs (harness/commands/selection.py), each rule on a small spec folder with
a stand-in loader: every usage error's full text, which spec errors are reported, stale goldens,
the context and the summary lines. No spec is run."""

from __future__ import annotations

from argparse import Namespace
from pathlib import Path
from types import SimpleNamespace

import pytest

from lockstep.harness.commands import selection
from lockstep.harness.errors import UsageError
from lockstep.harness.specfile import SpecError


def _folder(tmp_path, *ids, extra=()):
    specs = tmp_path / "specs"
    specs.mkdir()
    for i in ids:
        (specs / i).parent.mkdir(parents=True, exist_ok=True)
        (specs / f"{i}.yaml").write_text("kind: coins\n")
    for name in extra:
        (specs / name).parent.mkdir(parents=True, exist_ok=True)
        (specs / name).write_text("x")
    return specs


def _args(specs, patterns=(), tag=(), golden=None, **more):
    return Namespace(specs=specs, patterns=list(patterns), tag=list(tag), golden=golden, checkpoint_path=[], **more)


def _loader(specs_by_id, errors=()):
    def load(folder):
        assert isinstance(folder, Path) and folder.name in ("specs", "empty"), "the loader reads --specs"
        return [SimpleNamespace(id=i, tags=tuple(tags)) for i, tags in specs_by_id.items()], list(errors)
    return load


def _usage(fn, *a, **k) -> str:
    with pytest.raises(UsageError) as e:
        fn(*a, **k)
    return str(e.value)


def test_the_folders_are_checked_first(tmp_path, monkeypatch):
    mapped = []
    monkeypatch.setattr(selection, "map_checkpoints", lambda pairs: mapped.append(pairs))
    missing = tmp_path / "nowhere"
    args = _args(missing)
    args.checkpoint_path = [("a.yaml", "/x")]
    assert _usage(selection.check_dirs, args) == (f"no spec directory at {missing} (run from the project root or "
                                                 "pass --specs)")
    assert mapped == [[("a.yaml", "/x")]], "the mappings are added before anything else"
    specs = _folder(tmp_path, "a")
    (tmp_path / "file").write_text("")
    assert _usage(selection.check_dirs, _args(specs, golden=tmp_path / "file")) == f"--golden {tmp_path / 'file'} is not a directory"
    selection.check_dirs(_args(specs, golden=tmp_path / "absent"))     # a golden folder still to be made: fine
    selection.check_dirs(_args(specs, golden=tmp_path))
    selection.check_dirs(Namespace(specs=specs))                       # no --golden, no mappings at all
    assert mapped[-1] == [], "no checkpoint_path: no mappings"
    assert _usage(selection.golden_exists, _args(specs, golden=tmp_path / "gone")) == (
        f"--golden {tmp_path / 'gone'}: no such folder (goldens are recorded there by `lockstep regen`; run from "
        "the project root or pass --golden)")
    selection.golden_exists(_args(specs, golden=tmp_path))


def test_a_pattern_must_name_a_spec_file(tmp_path):
    specs = _folder(tmp_path, "coins/a", "coins/b", "kernels/c")
    load = _loader({"coins/a": (), "coins/b": ("fast",), "kernels/c": ("fast",)})
    assert [s.id for s in selection.load(_args(specs, ["coins/*"]), load)[0]] == ["coins/a", "coins/b"]
    assert [s.id for s in selection.load(_args(specs, ["coins/a", "kernels/*"]), load)[0]] == ["coins/a", "kernels/c"]
    assert _usage(selection.load, _args(specs, ["coins/*", "coin/a"]), load) == \
        "no spec matches 'coin/a' (see `lockstep list`)", "every pattern must match, not just one"
    assert [s.id for s in selection.load(_args(specs, tag=["fast"]), load)[0]] == ["coins/b", "kernels/c"]
    chosen, errors = selection.load(_args(specs, ["gone/x"]), _loader({}), also_ids=["gone/x"])
    assert (chosen, errors) == ([], []), "a golden whose spec is gone is named, not an error"


def test_a_pattern_naming_files_that_are_not_specs_says_so(tmp_path):
    specs = _folder(tmp_path, "a/real", extra=["a/x.yml", "a/y.json", "a/z.yml", "a/w.txt", "b/x.yml"])
    load = _loader({"a/real": ()})
    assert _usage(selection.load, _args(specs, ["a/x"]), load) == (
        f"no spec matches 'a/x'; {specs / 'a/x.yml'} would match but spec files end in .yaml (see `lockstep list`)")
    assert _usage(selection.load, _args(specs, ["a/[wxyz]"]), load) == (
        f"no spec matches 'a/[wxyz]'; {specs / 'a/w.txt'}, {specs / 'a/x.yml'}, {specs / 'a/y.json'} … would match "
        "but spec files end in .yaml (see `lockstep list`)")
    assert _usage(selection.load, _args(specs, ["a/[xy]"]), load).count(".yml") + \
        _usage(selection.load, _args(specs, ["a/[xy]"]), load).count(".json") == 2
    assert "…" not in _usage(selection.load, _args(specs, ["a/[wxy]"]), load), "three are listed without a mark"
    (specs / "a" / "q.YAML").write_text("x")
    assert _usage(selection.load, _args(specs, ["a/q"]), load) == (
        f"no spec matches 'a/q'; {specs / 'a/q.YAML'} would match but spec files end in .yaml (see `lockstep list`)")
    (specs / "a" / "sub").mkdir()
    assert _usage(selection.load, _args(specs, ["a/sub"]), load) == "no spec matches 'a/sub' (see `lockstep list`)", \
        "a folder is not a file that would match"


def test_only_the_errors_of_the_files_named_are_reported(tmp_path):
    specs = _folder(tmp_path, "a/one", "a/two", "b/three")
    bad = [SpecError(str(specs / "a/two.yaml"), 1, 1, "", "bad"), SpecError(str(specs / "b/three.yaml"), 1, 1, "", "bad"),
           SpecError("/elsewhere/x.yaml", 0, 0, "", "outside")]
    load = _loader({"a/one": ()}, bad)
    assert selection.load(_args(specs), load)[1] == bad, "no pattern: every error"
    assert [e.file for e in selection.load(_args(specs, ["a/*"]), load)[1]] == [str(specs / "a/two.yaml"),
                                                                              "/elsewhere/x.yaml"], \
        "a file outside the folder is always reported"
    assert selection.load(_args(specs, ["b/three"]), load) == ([], bad[1:]), "an error alone is a selection"


def test_a_pattern_naming_an_unreadable_spec_file_reports_its_error(tmp_path):
    specs = _folder(tmp_path, "a/one")
    (specs / "a" / "dangling.yaml").symlink_to(tmp_path / "missing.yaml")
    target = tmp_path / "outside"
    target.mkdir()
    (specs / "linked").symlink_to(target)
    errors = [SpecError(str(specs / "a" / "dangling.yaml"), 0, 0, "", "a broken symbolic link"),
              SpecError(str(specs / "linked"), 0, 0, "", "a linked folder"),
              SpecError("/elsewhere/x.yaml", 0, 0, "", "outside")]
    load = _loader({"a/one": ()}, errors)
    assert selection.load(_args(specs, ["a/dangling"]), load) == ([], [errors[0], errors[2]])
    assert selection.load(_args(specs, ["linked/x"]), load)[1][0] is errors[1], "a spec under a linked folder"
    assert selection.load(_args(specs, ["linked/*"]), load)[1][0] is errors[1]
    assert _usage(selection.load, _args(specs, ["a/gone"]), load) == "no spec matches 'a/gone' (see `lockstep list`)"
    plain = [SpecError(str(specs / "a" / "one.yaml"), 3, 1, "", "a plain file's error")]
    assert _usage(selection.load, _args(specs, ["a/on"]), _loader({}, plain)).startswith("no spec matches 'a/on'"), \
        "a regular file's error does not stand for a pattern that names nothing"
    (specs / "a" / "x.yml").write_text("kind: coins\n")
    stray = [SpecError(str(specs / "a" / "x.yml"), 0, 0, "", "spec files end in .yaml")]
    assert _usage(selection.load, _args(specs, ["a/x"]), _loader({}, stray)) == (
        f"no spec matches 'a/x'; {specs / 'a/x.yml'} would match but spec files end in .yaml (see `lockstep list`)"), \
        "a regular .yml file's error: the hint, not its error alone"
    (tmp_path / "loose.yaml").symlink_to(tmp_path / "nothing")
    ahead = [stray[0], SpecError(str(tmp_path / "loose.yaml"), 0, 0, "", "outside the folder"), errors[0]]
    assert selection.load(_args(specs, ["a/dangling"]), _loader({}, ahead))[1] == ahead[1:], \
        "each error is looked at, past a regular file's and past one outside the folder"


def test_selecting_nothing_is_a_usage_error_that_says_why(tmp_path):
    specs = _folder(tmp_path, "a/one")
    load = _loader({"a/one": ()})
    assert _usage(selection.load, _args(specs, tag=["slow"]), load) == "no spec carries tag(s) ['slow']"
    assert _usage(selection.load, _args(specs, ["a/*"], tag=["slow", "x"]), load) == \
        "no spec matching the patterns carries tag(s) ['slow', 'x']"
    empty = tmp_path / "empty"
    empty.mkdir()
    assert _usage(selection.load, _args(empty), _loader({})) == f"no specs under {empty}"
    assert selection.load(_args(empty, ["gone/*"]), _loader({}), also_ids=["gone/x", "kept/y"]) == ([], [])


def test_the_context_hands_the_device_and_dtype_to_detect(monkeypatch):
    from lockstep.harness import platform
    seen = []

    def detect(device, dtype):
        seen.append((device, dtype))
        if device == "tpu":
            raise ValueError("no such device: tpu")
        return SimpleNamespace(name=f"{device}-{dtype}")
    monkeypatch.setattr(platform, "detect", detect)
    ctx = selection.context(Namespace(device="meta", dtype=None, backend="triton", world_size=[3]))
    assert (seen, ctx.platform.name, ctx.backend, ctx.world_sizes) == ([("meta", "fp32")], "meta-fp32", "triton", (3,))
    assert _usage(selection.context, Namespace(device="tpu", dtype="bf16", backend=None, world_size=[])) == \
        "no such device: tpu"


def test_the_context_takes_the_options_and_refuses_a_bad_one():
    ctx = selection.context(Namespace(device="cpu", dtype=None, backend=None, world_size=[]))
    assert (ctx.platform.name, ctx.backend, ctx.world_sizes) == ("cpu-fp32", "torch", ())
    ctx = selection.context(Namespace(device="cpu", dtype="bf16", backend="triton", world_size=[2, 4]))
    assert (ctx.platform.name, ctx.backend, ctx.world_sizes) == ("cpu-bf16", "triton", (2, 4))
    with pytest.raises(UsageError):
        selection.context(Namespace(device="cpu", dtype="fp8", backend=None, world_size=[]))


def test_a_selection_no_pair_runs_is_a_usage_error(tmp_path, monkeypatch):
    from lockstep.harness import pairs
    seen = {}

    def chosen(device, golden, dtype, backend, regen=False):
        seen["chosen"] = (device, golden, dtype, backend, regen)
        return ["the pairs"]

    def plan(specs, pairs_, device, world_sizes, explicit=False):
        seen["plan"] = (pairs_, device, world_sizes, explicit)
        return [] if specs in (["none"], []) else ["row"]
    monkeypatch.setattr(pairs, "chosen", chosen)
    monkeypatch.setattr(pairs, "plan", plan)
    monkeypatch.setattr(pairs, "describe", lambda c: f"described {c}")
    ctx = SimpleNamespace(platform=SimpleNamespace(device="cpu"), world_sizes=(2,))
    args = Namespace(golden=tmp_path, dtype="bf16", backend=None)
    assert selection.plan(args, ["spec"], ctx, regen=True) == ["row"]
    assert seen == {"chosen": ("cpu", tmp_path, "bf16", None, True), "plan": (["the pairs"], "cpu", (2,), False)}
    assert selection.plan(Namespace(golden=tmp_path, dtype="bf16", backend="torch"), [], ctx) == []
    assert seen["plan"][3] is True and seen["chosen"] == ("cpu", tmp_path, "bf16", "torch", False), \
        "both options given: explicit; regen off"
    assert _usage(selection.plan, args, ["none"], ctx) == (
        "no selected spec runs under described ['the pairs'] on cpu (Triton's interpreter runs the engine specs "
        f"tagged {pairs.INTERPRETER_TAG!r}; give both --dtype and --backend to run any spec under one pair)")


def test_the_summary_lines():
    row = lambda name, backend: (None, SimpleNamespace(platform=SimpleNamespace(name=name), backend=backend), None)
    assert selection.ran_on([row("cpu-fp32", "torch"), row("cpu-fp32", "torch")]) == "cpu-fp32 (torch backend)"
    assert selection.ran_on([row("cpu-fp32", "torch"), row("cpu-bf16", "torch"), row("cpu-fp32", "torch"),
                             row("cpu-fp32", "triton")]) == "cpu-fp32 (torch), cpu-bf16 (torch), cpu-fp32 (triton)"
    store = SimpleNamespace(ids=lambda: {"cpu-fp32": ["a", "b"], "shared": ["c"]})
    assert selection.golden_ids(store) == ["a", "b", "c"]
    assert selection.golden_folders(Path("golden"), ["shared", "cpu-fp32", "shared"]) == \
        "golden/shared (2), golden/cpu-fp32 (1)"
    assert selection.golden_folders(Path("golden"), []) == "none"


def test_stale_goldens_are_those_without_a_spec_file_within_the_patterns(tmp_path):
    specs = _folder(tmp_path, "a/one", "b/two")
    store = SimpleNamespace(ids=lambda: {"cpu-fp32": ["a/one", "a/gone", "b/gone"], "shared": ["b/two", "c/old"]})
    assert selection.stale_goldens(_args(specs), store) == ["cpu-fp32/a/gone", "cpu-fp32/b/gone", "shared/c/old"]
    assert selection.stale_goldens(_args(specs, ["a/*", "c/*"]), store) == ["cpu-fp32/a/gone", "shared/c/old"]
    assert selection.stale_goldens(_args(specs, tag=["fast"]), store) == [], "a tag selects no stale golden"
    assert selection.stale_goldens(_args(specs, ["b/*"], tag=["fast"]), store) == ["cpu-fp32/b/gone"], \
        "patterns decide, whatever the tag"
