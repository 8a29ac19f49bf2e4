"""The target interface's old home, kept so that adapters written against 0.2.0 still import:
the interface is lockstep.harness.target, and adapters import it as `lockstep.harness.targets`."""

from lockstep.harness.target import *  # noqa: F401,F403
from lockstep.harness.target import (BITWISE, CALIBRATED, CHI_SQUARE, CPU, CUDA, INTERPRETER,  # noqa: F401
                                     PROPERTIES, RNG_COINS, RNG_MODELS, TOLERANCE)
