"""`lockstep list` and `lockstep validate`: the specs, and their files checked without running."""

from __future__ import annotations

import sys

from lockstep.harness.commands.display import columns
from lockstep.harness.commands.exits import EXIT_OK, EXIT_USAGE
from lockstep.harness.commands.selection import load
from lockstep.harness.specfile import load_headers


def cmd_list(args) -> int:
    """Ids, kinds, tags and descriptions, read from each spec's header only (no torch import):
    `lockstep validate` checks the rest."""
    if args.target != "lockstep":             # applicability needs whole specs
        from lockstep.harness.targets.check import cmd_list_target   # loads torch: only for another target
        specs, errors = load(args)
        return cmd_list_target(args, specs) or (EXIT_USAGE if errors else EXIT_OK)
    specs, errors = load(args, loader=load_headers)
    if specs:
        rows = [[s.id, s.kind, ",".join(s.tags) or "-", s.description.splitlines()[0][:80]] for s in specs]
        print("\n".join(columns(rows)))
    for e in errors:
        print(f"error: {e}", file=sys.stderr)
    return EXIT_USAGE if errors else EXIT_OK


def cmd_validate(args) -> int:
    specs, errors = load(args)
    for e in errors:
        print(e)
    bad = len({e.file for e in errors})
    print(f"{len(specs)} spec(s) valid, {bad} invalid")
    return EXIT_USAGE if errors else EXIT_OK
