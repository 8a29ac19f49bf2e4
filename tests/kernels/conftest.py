"""Kernel tests run in Triton's interpreter on a machine without CUDA (kernels/__init__.py)."""

from tests.engine.conftest import tiny_ckpts  # noqa: F401  (the tiny checkpoint fixture)
