"""`lockstep suite`: the installed suite's folder ($LOCKSTEP_SUITE when set)."""

from __future__ import annotations

import os

from lockstep.harness.commands.exits import EXIT_OK
from lockstep.harness.errors import UsageError
from lockstep.harness.jsonout import print_document, tool_document
from lockstep.harness.suite_paths import installed_root


def cmd_suite(args) -> int:
    root = installed_root()
    if os.environ.get("LOCKSTEP_SUITE") and not (root / "specs").is_dir():
        raise UsageError(f"LOCKSTEP_SUITE={os.environ['LOCKSTEP_SUITE']} holds no specs/ folder (set it to a folder "
                         "holding specs/ and golden/, or unset it to use the installed suite)")
    if root is None or not (root / "specs").is_dir():
        raise UsageError("no suite installed with this lockstep (install it from a clone: pip install -e CLONE, or "
                         "set LOCKSTEP_SUITE to a folder holding specs/ and golden/)")
    if args.json:
        print_document(tool_document("suite", True, root=str(root), specs=str(root / "specs"),
                                     golden=str(root / "golden"),
                                     models=str(root / "models") if (root / "models").is_dir() else None))
    else:
        print(root)
    return EXIT_OK
