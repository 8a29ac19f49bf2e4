"""Lockstep's own `sampling` operation with params, alone as a target that declares the coin
contract: the sample_fused specs judged through it (their tokens, bitwise), on the device given.

    python3 scripts/check_sampler_target.py --device cuda     # on a GPU: the engine's fused sampler
"""

import sys

import lockstep.harness.commands.targets as commands
from lockstep.harness.cli import main
from lockstep.harness.target import RNG_COINS, Target
from lockstep.harness.targets import get

own = get("lockstep").ops["sampling"]
commands.get = lambda name: Target("lockstep-sampler", "1.0", ops={"sampling": own}, rng=RNG_COINS,
                                   description="Lockstep's sampling operation with params, alone")
sys.exit(main(["check", "--target", "lockstep-sampler", *sys.argv[1:], "kernels/sample-fused-*"]))
