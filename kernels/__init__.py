"""Kernels: one op registry (``ops``), PyTorch references, optional Triton implementations."""

from kernels import reference  # noqa: F401  (registers the reference ops)
from kernels.registry import ops

__all__ = ["ops"]
