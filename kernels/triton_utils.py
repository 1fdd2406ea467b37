"""Shared helpers of the Triton kernels: when they are usable, and launch-size heuristics."""

from __future__ import annotations

import functools

import torch


@functools.cache
def triton_usable() -> bool:
    """Triton imports and a CUDA device is present (the ``available`` check of every Triton op)."""
    try:
        import triton  # noqa: F401
    except ImportError:
        return False
    return torch.cuda.is_available()


def on_cuda(device: str) -> bool:
    return device == "cuda" and triton_usable()


@functools.cache
def num_sms(device_index: int = 0) -> int:
    if torch.cuda.is_available():
        return torch.cuda.get_device_properties(device_index).multi_processor_count
    return 4   # the CPU interpreter: keep grids tiny


def next_pow2(n: int) -> int:
    return 1 << max(0, (n - 1).bit_length())


def dot_precision(dtype: torch.dtype) -> str:
    """fp32 operands: exact IEEE dots (the reference computes in fp32); else tensor-core defaults."""
    return "ieee" if dtype == torch.float32 else "tf32"


def element_offset(t: torch.Tensor, base: torch.Tensor) -> int:
    """t's address as an element offset from base's (same dtype, one device): a kernel given ``base``
    reaches ``t`` through it, so one launch serves two tensors with an integer select instead of a pointer
    select (measured as fast; it keeps the kernels' pointer arguments plain)."""
    delta = t.data_ptr() - base.data_ptr()
    assert t.dtype == base.dtype and t.device == base.device and delta % t.element_size() == 0
    return delta // t.element_size()
