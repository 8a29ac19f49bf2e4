"""`lockstep doctor`: the IEEE oracle on this CPU, which primitives of the reference are not IEEE here."""

from __future__ import annotations

import torch

from lockstep.harness import oracle
from lockstep.harness.commands.exits import EXIT_MISMATCH, EXIT_OK
from lockstep.harness.platform import cpu_description


def cmd_doctor(args) -> int:
    """Run the IEEE oracle on this CPU: which primitives of the reference are not IEEE here."""
    print(f"cpu: {cpu_description()}; torch {torch.__version__} (capability "
          f"{torch.backends.cpu.get_cpu_capability()})")
    findings = oracle.check_all(args.inputs)
    wrong = [f for f in findings if not f.ok]
    for f in wrong:
        print(f"NOT IEEE  {f.op}: {f.wrong} of {f.checked} results differ {f.example}")
    for dtype in (torch.float32, torch.float64):        # what the reference avoids, for the record
        f = oracle.check_torch_sqrt(args.inputs, dtype)
        print(f"info      {f.op}: {f.wrong} of {f.checked} results are not correctly rounded here")
    print(f"{len(findings) - len(wrong)} of {len(findings)} primitive checks are IEEE on this CPU "
          f"({args.inputs} inputs each)")
    return EXIT_OK if not wrong else EXIT_MISMATCH
