"""Triton kernels of the sampler: the top-k selection's keys in one launch (the reference's eight elementwise
launches cost ~30 µs of a 1-row step's sampling on GLM's vocabulary: ``bench/results/session63``)."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from glmkernels.registry import ops
from glmkernels.triton_utils import on_cuda

_BLOCK = 2048


@triton.jit
def _value_id_keys_kernel(x_ptr, out_ptr, V, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    col = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    live = col < V
    x = tl.load(x_ptr + row * V + col, mask=live, other=0.0)
    bits = tl.where(x == 0.0, 0.0, x).to(tl.int32, bitcast=True)       # -0 as +0
    bits = tl.where(bits < 0, bits ^ 0x7FFFFFFF, bits)                  # monotonic in the value
    key = bits.to(tl.int64) * 4294967296 + (V - 1 - col).to(tl.int64)   # ties: the lower id ranks higher
    tl.store(out_ptr + row * V + col, key, mask=live)


@ops.register("value_id_keys", backend="triton", available=on_cuda)
def value_id_keys(x: torch.Tensor) -> torch.Tensor:
    """As ``reference.value_id_keys`` (x: [S, V] fp32 → [S, V] int64), in one launch."""
    x = x.contiguous()
    S, V = x.shape
    out = torch.empty(S, V, dtype=torch.int64, device=x.device)
    if S and V:
        _value_id_keys_kernel[(S, triton.cdiv(V, _BLOCK))](x, out, V, BLOCK=_BLOCK)
    return out
