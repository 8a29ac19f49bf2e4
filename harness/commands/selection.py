"""Which specs a command runs, and under which (dtype, backend) pairs: the selection every spec
command shares (list, validate, check, diff, regen, report, expectations): `load`, `plan`,
`context`, `stale_goldens`.

A pattern must name a spec file; a selection of nothing is a usage error, never a pass."""

from __future__ import annotations

import fnmatch
from pathlib import Path

from lockstep.harness.errors import UsageError
from lockstep.harness.specfile import load_specs, select, spec_files, spec_id_for
from lockstep.harness.suite_paths import map_checkpoints


def check_dirs(args) -> None:
    map_checkpoints(getattr(args, "checkpoint_path", []))
    if not args.specs.is_dir():
        raise UsageError(f"no spec directory at {args.specs} (run from the project root or pass --specs)")
    golden = getattr(args, "golden", None)
    if golden is not None and golden.exists() and not golden.is_dir():
        raise UsageError(f"--golden {golden} is not a directory")


def golden_exists(args) -> None:
    """Commands that compare with goldens need the folder: a mistyped --golden would otherwise report
    every spec MISSING, a result that looks vacuous rather than wrong."""
    if not args.golden.exists():
        raise UsageError(f"--golden {args.golden}: no such folder (goldens are recorded there by `lockstep regen`; "
                         "run from the project root or pass --golden)")


def load(args, loader=load_specs, also_ids=()) -> tuple[list, list]:
    """The selected specs and the spec errors to report. A pattern must name a spec file (or one of
    `also_ids`: goldens whose spec is gone); a selection of nothing is a usage error, never a pass."""
    check_dirs(args)
    specs, errors = loader(args.specs)
    chosen = select(specs, args.patterns, args.tag)
    all_ids = [spec_id_for(f, args.specs) for f in spec_files(args.specs)] + list(also_ids)
    for pattern in args.patterns:
        if not any(fnmatch.fnmatchcase(i, pattern) for i in all_ids) and not _names_unreadable(errors, pattern, args):
            raise UsageError(f"no spec matches {pattern!r}{_not_spec_files(args.specs, pattern)} (see `lockstep list`)")
    if args.patterns:  # report the errors of the files the patterns name, not of every file
        errors = [e for e in errors if _matches(e.file, args) or any(_names_unreadable([e], p, args)
                                                                     for p in args.patterns)]
    goldens_named = [i for i in also_ids if any(fnmatch.fnmatchcase(i, p) for p in args.patterns)]
    if not chosen and not errors and not goldens_named:
        raise UsageError(_nothing_selected(args))
    return chosen, errors


def _not_spec_files(specs: Path, pattern: str) -> str:
    """Files the pattern would name but that are not spec files (`x.yml`, `x.json`): said, since
    "no spec matches" alone reads as a typo in the pattern."""
    near = sorted(str(f) for f in specs.rglob("*") if f.is_file() and f.suffix != ".yaml" and
                  fnmatch.fnmatchcase(f.relative_to(specs).with_suffix("").as_posix(), pattern))
    if not near:
        return ""
    return f"; {', '.join(near[:3])}{' …' if len(near) > 3 else ''} would match but spec files end in .yaml"


def _names_unreadable(errors, pattern: str, args) -> bool:
    """Whether the pattern names a spec file that cannot be read (a dangling link) or a linked folder
    the walk skips: their own errors say more than "no spec matches"."""
    for e in errors:
        p = Path(e.file)
        if not (p.is_symlink() or (p.exists() and not p.is_file())):    # `x.yml` has its own hint
            continue
        try:
            sid = spec_id_for(p, args.specs)
        except ValueError:
            continue
        if fnmatch.fnmatchcase(sid, pattern) or fnmatch.fnmatchcase(sid + "/x", pattern.split("/")[0] + "/x"):
            return True
    return False


def _matches(file: str, args) -> bool:
    try:
        spec_id = spec_id_for(Path(file), args.specs)
    except ValueError:
        return True
    return any(fnmatch.fnmatchcase(spec_id, p) for p in args.patterns)


def _nothing_selected(args) -> str:
    if args.tag:
        return f"no spec{' matching the patterns' if args.patterns else ''} carries tag(s) {args.tag}"
    return f"no specs under {args.specs}"


def context(args):
    # pairs, platform and result load torch: imported here so that `list` and `validate` never do
    from lockstep.harness.platform import detect
    from lockstep.harness.result import RunContext

    try:
        return RunContext(platform=detect(args.device, args.dtype or "fp32"), backend=args.backend or "torch",
                          world_sizes=tuple(args.world_size))
    except ValueError as e:
        raise UsageError(str(e)) from None


def plan(args, specs, ctx, regen: bool = False) -> list[tuple]:
    """[(spec, RunContext, golden folder)]: each spec under each (dtype, backend) pair it runs here
    (harness/pairs.py: the pairs with goldens here, all it supports for regen; the options narrow)."""
    from lockstep.harness import pairs              # loads torch: see context()
    device = ctx.platform.device
    chosen = pairs.chosen(device, args.golden, args.dtype, args.backend, regen=regen)
    rows = pairs.plan(specs, chosen, device, ctx.world_sizes, explicit=bool(args.dtype and args.backend))
    if specs and not rows:
        raise UsageError(f"no selected spec runs under {pairs.describe(chosen)} on {device} (Triton's interpreter "
                         f"runs the engine specs tagged {pairs.INTERPRETER_TAG!r}; give both --dtype and --backend "
                         "to run any spec under one pair)")
    return rows


def ran_on(rows) -> str:
    """'cpu-fp32 (torch backend)', or for several pairs 'cpu-fp32 (torch), cpu-bf16 (torch), …'."""
    seen = list(dict.fromkeys((c.platform.name, c.backend) for _, c, _ in rows))
    if len(seen) == 1:
        return f"{seen[0][0]} ({seen[0][1]} backend)"
    return ", ".join(f"{name} ({backend})" for name, backend in seen)


def golden_ids(store) -> list[str]:
    return [i for found in store.ids().values() for i in found]


def stale_goldens(args, store) -> list[str]:
    """Goldens whose spec file no longer exists, as 'platform/spec id', within the patterns given
    (a tag selects nothing here: a golden without a spec has no tags)."""
    ids = {spec_id_for(f, args.specs) for f in spec_files(args.specs)}
    stale = [(platform, i) for platform, found in store.ids().items() for i in found if i not in ids]
    if args.patterns:
        stale = [(p, i) for p, i in stale if any(fnmatch.fnmatchcase(i, pat) for pat in args.patterns)]
    elif args.tag:
        stale = []
    return [f"{platform}/{i}" for platform, i in stale]


def golden_folders(golden: Path, platforms) -> str:
    """'golden/shared (2), golden/cpu-fp32 (1)': the folders a run read or wrote, with counts."""
    counts: dict[str, int] = {}
    for p in platforms:
        counts[p] = counts.get(p, 0) + 1
    return ", ".join(f"{golden / p} ({n})" for p, n in counts.items()) or "none"
