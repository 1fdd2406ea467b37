"""Triton RMSNorm (plain and fused with the residual add) and rotary embedding.

Both reproduce the reference's rounding points: the residual sum and each rope product are rounded to
the activation dtype exactly where PyTorch's elementwise ops round, so the results are bit-identical
to ``kernels.reference`` up to the rsqrt/mean summation order of the norm.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels import reference
from kernels.registry import ops
from kernels.triton_utils import next_pow2, on_cuda


@triton.jit
def _rms_norm_kernel(x_ptr, res_ptr, w_ptr, out_ptr, sum_ptr, D, stride_x, stride_r, eps,
                     HAS_RES: tl.constexpr, BLOCK_D: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK_D)
    mask = cols < D
    x = tl.load(x_ptr + row * stride_x + cols, mask=mask, other=0.0)
    if HAS_RES:
        x = (x + tl.load(res_ptr + row * stride_r + cols, mask=mask, other=0.0)).to(x.dtype)
        tl.store(sum_ptr + row * D + cols, x, mask=mask)
    xf = x.to(tl.float32)
    rstd = 1.0 / tl.sqrt(tl.sum(xf * xf, axis=0) / D + eps)
    normed = (xf * rstd).to(x.dtype)
    w = tl.load(w_ptr + cols, mask=mask, other=0.0)
    y = w.to(tl.float32) * normed.to(tl.float32)
    tl.store(out_ptr + row * D + cols, y.to(out_ptr.dtype.element_ty), mask=mask)


def _rows(t: torch.Tensor) -> torch.Tensor:
    """[..., D] → a 2-D view [R, D] with unit column stride (copies only when it must)."""
    t2 = t.reshape(-1, t.shape[-1])
    return t2 if t2.stride(-1) == 1 else t2.contiguous()


def _launch_norm(x: torch.Tensor, residual: torch.Tensor | None, weight: torch.Tensor,
                 eps: float) -> tuple[torch.Tensor, torch.Tensor | None]:
    D = x.shape[-1]
    x2 = _rows(x)
    r2 = _rows(residual) if residual is not None else x2
    out = torch.empty(x2.shape, dtype=torch.promote_types(weight.dtype, x.dtype), device=x.device)
    s = torch.empty(x2.shape, dtype=x.dtype, device=x.device) if residual is not None else out
    if x2.shape[0]:
        _rms_norm_kernel[(x2.shape[0],)](x2, r2, weight, out, s, D, x2.stride(0), r2.stride(0), eps,
                                         HAS_RES=residual is not None, BLOCK_D=next_pow2(D), num_warps=4)
    shape = x.shape
    return out.view(shape), (s.view(shape) if residual is not None else None)


@ops.register("rms_norm", backend="triton", available=on_cuda)
def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """x: [..., D] (last dim contiguous; rows may be strided), weight: [D] → [..., D] as the reference."""
    return _launch_norm(x, None, weight, eps)[0]


@ops.register("add_rms_norm", backend="triton", available=on_cuda)
def add_rms_norm(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor,
                 eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """x, residual: [..., D] same dtype → (rms_norm(x + residual), x + residual), one read of each."""
    assert x.dtype == residual.dtype and x.shape == residual.shape
    out, s = _launch_norm(x, residual, weight, eps)
    return out, s


@triton.jit
def _rope_kernel(x_ptr, cos_ptr, sin_ptr, out_ptr, M, stride_xn, stride_xm, stride_cn,
                 HALF: tl.constexpr, INTERLEAVED: tl.constexpr, BLOCK_M: tl.constexpr):
    n = tl.program_id(0)
    mb = tl.program_id(1)
    m = mb * BLOCK_M + tl.arange(0, BLOCK_M)[:, None]                         # [BM, 1]
    i = tl.arange(0, HALF)[None, :]                                           # [1, HALF]
    mask = (m < M) & (i < HALF)
    base = x_ptr + n * stride_xn + m * stride_xm
    if INTERLEAVED:
        a = tl.load(base + 2 * i, mask=mask, other=0.0)
        b = tl.load(base + 2 * i + 1, mask=mask, other=0.0)
    else:
        a = tl.load(base + i, mask=mask, other=0.0)
        b = tl.load(base + i + HALF, mask=mask, other=0.0)
    c = tl.load(cos_ptr + n * stride_cn + i)
    s = tl.load(sin_ptr + n * stride_cn + i)
    dt = out_ptr.dtype.element_ty
    # round every product and sum to the output dtype where PyTorch's elementwise ops do
    ac, bs = (a.to(tl.float32) * c.to(tl.float32)).to(dt), (b.to(tl.float32) * s.to(tl.float32)).to(dt)
    bc, as_ = (b.to(tl.float32) * c.to(tl.float32)).to(dt), (a.to(tl.float32) * s.to(tl.float32)).to(dt)
    out = out_ptr + (n * M + m) * (2 * HALF)
    tl.store(out + i, (ac.to(tl.float32) - bs.to(tl.float32)).to(dt), mask=mask)
    tl.store(out + HALF + i, (bc.to(tl.float32) + as_.to(tl.float32)).to(dt), mask=mask)


@ops.register("rope", backend="triton", available=on_cuda)
def rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, interleaved: bool) -> torch.Tensor:
    """x: [N, ..., d] (last dim contiguous), cos/sin: [N, 1.., d/2] (one angle row per leading index)
    → [N, ..., d] laid out as the reference's ``cat([a', b'])``. Other broadcasts use the reference."""
    d = x.shape[-1]
    N = x.shape[0]
    per_row = (cos.dim() == x.dim() and cos.shape[0] == N and all(s == 1 for s in cos.shape[1:-1])
               and cos.shape[-1] == d // 2 and sin.shape == cos.shape)
    dt = torch.promote_types(x.dtype, cos.dtype)
    if not per_row or N == 0 or x.stride(-1) != 1 or d % 2 or (d // 2) & (d // 2 - 1) or x.dim() < 2:
        return reference.rope(x, cos, sin, interleaved)
    x3 = x.reshape(N, -1, d) if x.dim() > 2 else x.unsqueeze(1)
    if x3.stride(-1) != 1:
        x3 = x3.contiguous()
    M = x3.shape[1]
    c2, s2 = cos.reshape(N, d // 2).contiguous(), sin.reshape(N, d // 2).contiguous()
    out = torch.empty(x.shape, dtype=dt, device=x.device)
    BLOCK_M = min(next_pow2(M), 16)
    if N:
        _rope_kernel[(N, triton.cdiv(M, BLOCK_M))](x3, c2, s2, out, M, x3.stride(0), x3.stride(1), c2.stride(0),
                                                   HALF=d // 2, INTERLEAVED=interleaved, BLOCK_M=BLOCK_M,
                                                   num_warps=2)
    return out
