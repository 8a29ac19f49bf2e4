"""Lockstep kernels: Triton kernels, each with a plain-torch reference beside it.

Every kernel must run compiled on a GPU and in Triton's interpreter on the CPU. Triton
reads TRITON_INTERPRET when a kernel is decorated, so on a machine without CUDA we turn
the interpreter on here, before any kernel module is imported. Set TRITON_INTERPRET
yourself to override this choice.
"""

import os

import torch

# Here, not in the entry points: @triton.jit reads it as each kernel is decorated, and engine/kernels
# are imported as a library (bench/, users' scripts, spawned ranks) with no CLI or conftest before them.
if "TRITON_INTERPRET" not in os.environ and not torch.cuda.is_available():
    os.environ["TRITON_INTERPRET"] = "1"

# The kernel modules export each kernel (`*_triton`) beside its bit-exact torch reference
# (`*_portable`: the torch ops table runs it and the kernel specs compare against it; docs/engine.md
# lists them); the caller picks one (engine/ops.py, once, for the engine): no backend names down here.
