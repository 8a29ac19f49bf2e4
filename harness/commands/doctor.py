"""`lockstep doctor`: the IEEE oracle on this CPU, which primitives of the reference are not IEEE here."""

from __future__ import annotations

import torch

from lockstep.harness import oracle
from lockstep.harness.commands.exits import EXIT_MISMATCH, EXIT_OK
from lockstep.harness.jsonout import print_document, tool_document
from lockstep.harness.platform import cpu_description


def cmd_doctor(args) -> int:
    """Run the IEEE oracle on this CPU: which primitives of the reference are not IEEE here."""
    cpu, capability = cpu_description(), torch.backends.cpu.get_cpu_capability()
    if not args.json:                               # first, before the checks take their seconds
        print(f"cpu: {cpu}; torch {torch.__version__} (capability {capability})")
    findings = oracle.check_all(args.inputs)
    wrong = [f for f in findings if not f.ok]
    info = [oracle.check_torch_sqrt(args.inputs, dtype) for dtype in (torch.float32, torch.float64)]
    if args.json:                                   # what the reference avoids (info) is for the record
        print_document(tool_document(
            "doctor", not wrong, cpu=cpu, torch=torch.__version__, capability=capability, inputs=args.inputs,
            checks=[{"op": f.op, "checked": f.checked, "wrong": f.wrong, "ieee": f.ok, "example": f.example}
                    for f in findings],
            info=[{"op": f.op, "checked": f.checked, "not_correctly_rounded": f.wrong} for f in info]))
        return EXIT_OK if not wrong else EXIT_MISMATCH
    for f in wrong:
        print(f"NOT IEEE  {f.op}: {f.wrong} of {f.checked} results differ {f.example}")
    for f in info:
        print(f"info      {f.op}: {f.wrong} of {f.checked} results are not correctly rounded here")
    print(f"{len(findings) - len(wrong)} of {len(findings)} primitive checks are IEEE on this CPU "
          f"({args.inputs} inputs each)")
    return EXIT_OK if not wrong else EXIT_MISMATCH
