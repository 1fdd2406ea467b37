"""Shared helpers of the Triton kernels: when they are usable, and launch-size heuristics."""

from __future__ import annotations

import functools
import os

import torch
import triton
import triton.language as tl


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


HOPPER_SMEM = 232448           # shared memory a Hopper block may opt into (bytes)


def smem_per_block(device_index: int = 0) -> int:
    """Shared memory a block may opt into (bytes); Hopper's in the CPU interpreter."""
    if torch.cuda.is_available():
        return getattr(torch.cuda.get_device_properties(device_index), "shared_memory_per_block_optin", 49152)
    return HOPPER_SMEM


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


def weight_group(w: torch.Tensor, scale_inv: torch.Tensor | None, more: tuple, block_n: int) -> tuple[int, ...]:
    """A launch's weights stacked along N without a copy: ``w`` then ``more``'s one or two FP8 (weight, scales) of
    the same K and dtype, each reached at an element offset from ``w`` / ``scale_inv`` (``element_offset``) →
    (N, N_a, N_ab, w_b_off, s_b_off, w_c_off, s_c_off): outputs from N_a on are the second weight's, from N_ab on
    the third's. Every weight but the last must fill whole ``block_n`` tiles (a tile lies in one weight)."""
    assert len(more) <= 2
    bounds, offsets = [w.shape[0]], []
    for w_i, s_i in more:
        assert w_i.shape[1] == w.shape[1] and w_i.dtype == w.dtype and bounds[-1] % block_n == 0
        offsets += [element_offset(w_i, w), element_offset(s_i, scale_inv)]
        bounds.append(bounds[-1] + w_i.shape[0])
    N = bounds[-1]
    return (N, bounds[0], bounds[1] if len(more) == 2 else N, *(offsets + [0, 0, 0, 0])[:4])


@functools.cache
def pdl_mode() -> str:
    """Programmatic dependent launch (Hopper on): a kernel may start while the one before it in the stream
    finishes, and waits (``pdl_wait``) before touching anything that kernel wrote. ``GLMSERVE_PDL``: ``1``
    (default) for every kernel but the tensor-core tile kernels of several rows, ``all`` for those too
    (measured slower at 8 rows on H200: bench/results/decode_slice_pdl.md), ``0`` off. Off on other devices
    and in the CPU interpreter."""
    mode = os.environ.get("GLMSERVE_PDL", "1")
    if mode not in ("0", "1", "all"):
        raise ValueError(f"GLMSERVE_PDL must be 0, 1 or all, not {mode!r}")
    if mode == "0" or not triton_usable() or torch.cuda.get_device_capability()[0] < 9:
        return "0"
    return mode


def pdl_launch(tile: bool = False) -> dict:
    """Launch keywords of a kernel that calls ``pdl_wait(PDL)``: its constexpr and the launch attribute
    (``tile``: a tensor-core tile kernel of several rows, under PDL only with ``GLMSERVE_PDL=all``)."""
    on = pdl_mode() == "all" if tile else pdl_mode() != "0"
    return {"PDL": on, "launch_pdl": on}


@triton.jit
def pdl_wait(PDL: tl.constexpr):
    """Under PDL: wait until the previous kernel of the stream has finished and its writes are visible,
    then let the next kernel launch (its programs take free SM slots and start on their own weights).
    Every kernel launched with ``pdl_launch()`` calls this once, in every program, before it reads an
    activation or writes anything: reads before it may only touch weights. Waiting before releasing the
    next kernel keeps at most two kernels resident, and makes completion transitive (a kernel that has
    returned from its wait had all earlier kernels finish)."""
    if PDL:
        tl.extra.cuda.gdc_wait()
        tl.extra.cuda.gdc_launch_dependents()
