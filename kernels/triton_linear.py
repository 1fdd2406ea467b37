"""Triton FP8 block-scaled linear: ``y = x @ (W8 · S).T`` with the weight dequantized tile by tile.

One kernel serves decode and prefill; the launcher picks the tile shape:

* decode (≤ 64 rows): a 16-row tile (rows masked), 128-wide K steps and split-K over the reduction so a
  576-row projection still spreads over every SM. Each program reads its weight tile once; the fp32
  partial sums are reduced by a tiny ``sum`` (deterministic, no atomics).
* mid-size (65..PREFILL_ROWS rows): the same kernel with 64×128 tiles, no split — a W8A16 "dequant-tile
  GEMM": fp8 tiles are widened to the activation dtype in registers and multiplied on the tensor cores.
* prefill (> PREFILL_ROWS rows): one Triton pass dequantizes the weight to the activation dtype, then
  cuBLAS runs the bf16 GEMM (measured faster than the tile GEMM above on H200 at 4096 rows; the weight
  pass is ≤ 1/20 of the GEMM there). Activations are never quantized (no W8A8), so all paths stay
  close to the reference, which dequantizes the whole weight too.

Scales apply per 128×128 block: each K step covers exactly one scale column and BLOCK_N divides 128, so a
tile's partial product is scaled by one scalar: ``acc += dot(x, w8.T) * S[n//128, k//128]``. Partial edge
blocks (576 = 4·128 + 64 rows, K not a multiple of 128) are masked loads.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from kernels import reference
from kernels.registry import ops
from kernels.triton_utils import dot_precision, num_sms, on_cuda

DECODE_ROWS = 64
PREFILL_ROWS = 256


@triton.jit
def _fp8_linear_kernel(x_ptr, w_ptr, s_ptr, out_ptr, M, N, K, stride_xm, stride_om, stride_split,
                       num_sb_k, k_blocks_per_split,
                       BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                       PREC: tl.constexpr):
    pid_n = tl.program_id(0)
    pid_m = tl.program_id(1)
    pid_k = tl.program_id(2)
    rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    rk = tl.arange(0, BLOCK_K)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    s_row = (pid_n * BLOCK_N) // 128
    kb0 = pid_k * k_blocks_per_split
    for kb in range(kb0, tl.minimum(kb0 + k_blocks_per_split, num_sb_k)):
        k = kb * BLOCK_K + rk
        x = tl.load(x_ptr + rm[:, None] * stride_xm + k[None, :],
                    mask=(rm[:, None] < M) & (k[None, :] < K), other=0.0)
        w = tl.load(w_ptr + rn[:, None] * K + k[None, :], mask=(rn[:, None] < N) & (k[None, :] < K), other=0.0)
        part = tl.dot(x, tl.trans(w.to(x.dtype)), input_precision=PREC)
        acc += part * tl.load(s_ptr + s_row * num_sb_k + kb)
    out = out_ptr + pid_k * stride_split + rm[:, None] * stride_om + rn[None, :]
    tl.store(out, acc.to(out_ptr.dtype.element_ty), mask=(rm[:, None] < M) & (rn[None, :] < N))


def _decode_config(M: int, N: int, k_blocks: int) -> tuple[int, int]:
    """(BLOCK_N, split): enough programs to cover the SMs twice over, each K slice ≥ 2 blocks."""
    block_n = 64 if N >= 64 * 2 * num_sms() else 32 if N >= 4096 else 16
    n_prog = triton.cdiv(N, block_n)
    split = max(1, min(triton.cdiv(2 * num_sms(), n_prog), k_blocks // 2))
    return block_n, split


def fp8_linear(x: torch.Tensor, w8: torch.Tensor, scale_inv: torch.Tensor) -> torch.Tensor:
    """x: [..., K] (bf16/fp16/fp32), w8: [N, K] float8_e4m3fn contiguous, scale_inv: [⌈N/128⌉, ⌈K/128⌉]
    fp32 → [..., N] in x's dtype. No host sync; graph-capturable."""
    K = x.shape[-1]
    N = w8.shape[0]
    x2 = x.reshape(-1, K)
    if x2.stride(-1) != 1:
        x2 = x2.contiguous()
    M = x2.shape[0]
    k_blocks = triton.cdiv(K, 128)
    assert w8.is_contiguous() and scale_inv.shape == (triton.cdiv(N, 128), k_blocks)
    scale_inv = scale_inv.contiguous()
    prec = dot_precision(x.dtype)
    if M <= DECODE_ROWS:
        block_m, (block_n, split) = 16, _decode_config(M, N, k_blocks)
    else:
        block_m, block_n, split = 64, 128, 1
    per_split = triton.cdiv(k_blocks, split)
    split = triton.cdiv(k_blocks, per_split)
    if split == 1:
        out = torch.empty(M, N, dtype=x.dtype, device=x.device)
    else:
        out = torch.empty(split, M, N, dtype=torch.float32, device=x.device)
    grid = (triton.cdiv(N, block_n), triton.cdiv(M, block_m), split)
    if M:
        _fp8_linear_kernel[grid](x2, w8, scale_inv, out, M, N, K, x2.stride(0), N, M * N, k_blocks, per_split,
                                 BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=128, PREC=prec,
                                 num_warps=4, num_stages=3 if M <= DECODE_ROWS else 2)
    if split > 1:
        out = out.sum(0).to(x.dtype)
    return out.view(*x.shape[:-1], N)


@triton.jit
def _fp8_dequant_kernel(w_ptr, s_ptr, out_ptr, R, C, num_sb_r, num_sb_c, BLOCK_R: tl.constexpr,
                        BLOCK_C: tl.constexpr):
    b = tl.program_id(2)                       # leading (stacked) index
    r = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
    c = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)
    mask = (r[:, None] < R) & (c[None, :] < C)
    off = b.to(tl.int64) * R * C + r[:, None] * C + c[None, :]
    w = tl.load(w_ptr + off, mask=mask, other=0.0).to(tl.float32)
    s = tl.load(s_ptr + b * num_sb_r * num_sb_c + (tl.program_id(0) * BLOCK_R) // 128 * num_sb_c
                + (tl.program_id(1) * BLOCK_C) // 128)
    tl.store(out_ptr + off, (w * s).to(out_ptr.dtype.element_ty), mask=mask)


@ops.register("fp8_dequant", backend="triton", available=on_cuda)
def fp8_dequant(w8: torch.Tensor, scale_inv: torch.Tensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """w8: [..., R, C] e4m3 contiguous, scale_inv: [..., ⌈R/128⌉, ⌈C/128⌉] fp32 → [..., R, C] in ``dtype``;
    one pass (the product in fp32, then rounded, as the reference)."""
    if not w8.is_contiguous():
        return reference.fp8_dequant(w8, scale_inv, dtype)
    R, C = w8.shape[-2:]
    lead = w8.numel() // max(1, R * C)
    out = torch.empty(w8.shape, dtype=dtype, device=w8.device)
    sb_r, sb_c = triton.cdiv(R, 128), triton.cdiv(C, 128)
    if out.numel():
        _fp8_dequant_kernel[(triton.cdiv(R, 64), triton.cdiv(C, 128), lead)](
            w8, scale_inv.contiguous(), out, R, C, sb_r, sb_c, BLOCK_R=64, BLOCK_C=128, num_warps=4)
    return out


@ops.register("linear", backend="triton", available=on_cuda)
def linear(x: torch.Tensor, weight: torch.Tensor, scale_inv: torch.Tensor | None = None) -> torch.Tensor:
    """As ``reference.linear``: FP8 weights (with block scales) run the Triton kernel; others F.linear."""
    if scale_inv is None:
        return F.linear(x, weight)
    if weight.dim() != 2 or not weight.is_contiguous():
        return reference.linear(x, weight, scale_inv)
    if x.numel() > PREFILL_ROWS * x.shape[-1] and x.is_cuda:
        return F.linear(x, fp8_dequant(weight, scale_inv, x.dtype))
    return fp8_linear(x, weight, scale_inv)
