"""`lockstep list` and `lockstep validate`: the specs, and their files checked without running."""

from __future__ import annotations

import json
import sys

from lockstep.harness.commands.display import columns
from lockstep.harness.commands.exits import EXIT_OK, EXIT_USAGE
from lockstep.harness.commands.selection import load
from lockstep.harness.jsonout import emit, list_document, validate_document
from lockstep.harness.specfile import load_headers


def cmd_list(args) -> int:
    """Ids, kinds, tags and descriptions, read from each spec's header only (no torch import):
    `lockstep validate` checks the rest."""
    if args.target != "lockstep":             # applicability needs whole specs
        from lockstep.harness.commands.targets import cmd_list_target   # loads torch: only for another target
        specs, errors = load(args)
        return cmd_list_target(args, specs) or (EXIT_USAGE if errors else EXIT_OK)
    specs, errors = load(args, loader=load_headers)
    if getattr(args, "json", False):
        emit(json.dumps(list_document(specs=[{"id": s.id, "kind": s.kind, "tags": list(s.tags), "description":
                                               s.description, "file": str(s.file)} for s in specs],
                                       spec_errors=[str(e) for e in errors]), indent=2))
        return EXIT_USAGE if errors else EXIT_OK
    if specs:
        rows = [[s.id, s.kind, ",".join(s.tags) or "-", s.description.splitlines()[0][:80]] for s in specs]
        print("\n".join(columns(rows)))
    for e in errors:
        print(f"error: {e}", file=sys.stderr)
    return EXIT_USAGE if errors else EXIT_OK


def cmd_validate(args) -> int:
    specs, errors = load(args)
    bad = len({e.file for e in errors})
    if getattr(args, "json", False):
        emit(json.dumps(validate_document(valid=[s.id for s in specs], invalid_files=bad,
                                           spec_errors=[str(e) for e in errors]), indent=2))
        return EXIT_USAGE if errors else EXIT_OK
    for e in errors:
        print(e)
    print(f"{len(specs)} spec(s) valid, {bad} invalid")
    return EXIT_USAGE if errors else EXIT_OK
