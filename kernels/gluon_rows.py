"""Gluon (Triton's layout-explicit dialect) FP8 block-scaled linear for a few rows: ``y = x @ (W8 · S).T``.

The Triton tile kernel (kernels/triton_linear.py) hands ``tl.dot`` a weight tile loaded in a coalesced
layout; the compiler then moves it through shared memory into the tensor cores' operand layout (a store,
a barrier and ldmatrix every K step). Here the layouts are ours to name, so the weight is loaded from HBM
straight into the registers of an ``mma.sync`` A operand and never touches shared memory:

* the accumulator is an Ampere-style MMA layout (``NVMMADistributedLayout`` v2, m16n8k16), its M the
  weight's output rows (16 per warp per repeat) and its N the activation rows (8 per repeat) — the swap
  that lets 1–8 rows fill an instruction whose smallest tile is 16 × 8;
* the weight tile is ``DotOperandLayout(0, k_width=KW)``: each thread holds KW consecutive K elements of a
  row, so with KW = 16 a thread loads 16 fp8 bytes at once (one ``ld.global.v4``), 4 threads cover a
  64-byte run of a row. The activation tile is the B operand in the same k_width — a K permutation that
  A and B share, so the dot product is unchanged;
* fp8 → bf16 is a bit move (``FP8_TO_BF16``): e4m3's sign, exponent and mantissa bits placed into a bf16
  (exponent bias 7 vs 127), then one packed bf16 multiply by 2^120 — exact for every e4m3 value, zeros
  and subnormals included, and cheaper than the cvt chain the compiler emits (e4m3x2 → f16x2, then one
  f16 → bf16 per element).

Math as the tile kernel's: fp32 accumulation, each 128-wide K block's product scaled by its one block
scale; split-K partials reduced in split order by the last split to arrive (no float atomics:
bit-identical run to run). ``RowsTile`` picks the launch; ``fp8_linear_rows`` is the entry point
``triton_linear.fp8_linear`` takes for 2..MAX_ROWS rows when Gluon is present (Triton ≥ 3.6, sm_80+).
"""

from __future__ import annotations

import functools
import os
from dataclasses import dataclass

import torch
import triton

try:                                           # Gluon: triton >= 3.5
    from triton.experimental import gluon
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.language.nvidia.ampere import mma_v2
    HAVE_GLUON = True
except ImportError:                            # pragma: no cover - older triton: the Triton tile kernel runs
    HAVE_GLUON = False

MAX_ROWS = 8

# Four e4m3 bytes of one register → two bf16x2 registers (elements 0..3 in order): each byte placed in the
# high byte of a 16-bit lane (prmt), its 7 exponent+mantissa bits shifted down by 4 into bf16's fields, its
# sign kept, then × 2^120 (0x7B80) to move the exponent from e4m3's bias 7 to bf16's 127.
FP8_TO_BF16 = """{
.reg .b32 a, b, t, c;
mov.b32 c, 0x7B807B80;
prmt.b32 a, $2, 0, 0x1404;
prmt.b32 b, $2, 0, 0x3424;
shr.b32 t, a, 4;
and.b32 t, t, 0x07F007F0;
and.b32 a, a, 0x80008000;
or.b32 a, a, t;
mul.rn.bf16x2 $0, a, c;
shr.b32 t, b, 4;
and.b32 t, t, 0x07F007F0;
and.b32 b, b, 0x80008000;
or.b32 b, b, t;
mul.rn.bf16x2 $1, b, c;
}"""
_FP8_TO_BF16 = gl.constexpr(FP8_TO_BF16) if HAVE_GLUON else None


@dataclass(frozen=True)
class RowsTile:
    """Launch of the rows kernel: BLOCK_N weight rows per program (16 × warps × repeats), SUB 128-wide K
    blocks loaded per step, K split over ``split`` programs; ``bits``: the bit-move fp8 → bf16 (else cvt)."""
    block_n: int
    sub: int
    split: int
    num_warps: int = 4
    bits: bool = True


if HAVE_GLUON:
    @gluon.jit
    def _to_bf16(w, BITS: gl.constexpr):
        if BITS:
            return gl.inline_asm_elementwise(_FP8_TO_BF16, "=r,=r,r", [w], dtype=gl.bfloat16, is_pure=True,
                                             pack=4)
        else:
            return w.to(gl.bfloat16)

    @gluon.jit
    def _rows_kernel(x_ptr, w_ptr, s_ptr, out_ptr, part_ptr, count_ptr, M, N, K, stride_xm, num_sb_k,
                     kb_per_split, BLOCK_N: gl.constexpr, BLOCK_M: gl.constexpr, SUB: gl.constexpr,
                     KW: gl.constexpr, WARPS: gl.constexpr, SPLIT: gl.constexpr, BITS: gl.constexpr,
                     EVEN_K: gl.constexpr):
        mma: gl.constexpr = gl.NVMMADistributedLayout(version=[2, 0], warps_per_cta=[WARPS, 1],
                                                      instr_shape=[16, 8])
        wl: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=mma, k_width=KW)
        xl: gl.constexpr = gl.DotOperandLayout(operand_index=1, parent=mma, k_width=KW)
        pid_n = gl.program_id(0)
        pid_k = gl.program_id(1)
        rn = pid_n * BLOCK_N + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(1, wl))
        kw = gl.arange(0, 128, layout=gl.SliceLayout(0, wl))
        kx = gl.arange(0, 128, layout=gl.SliceLayout(1, xl))
        rm = gl.arange(0, BLOCK_M, layout=gl.SliceLayout(0, xl))
        w_rows = w_ptr + rn[:, None] * K
        x_rows = x_ptr + rm[None, :] * stride_xm
        s_row = s_ptr + (pid_n * BLOCK_N) // 128 * num_sb_k
        acc = gl.zeros([BLOCK_N, BLOCK_M], gl.float32, layout=mma)
        kb0 = pid_k * kb_per_split
        kb_end = gl.minimum(kb0 + kb_per_split, num_sb_k)
        for kb in range(kb0, kb_end, SUB):
            for j in gl.static_range(SUB):     # SUB scale blocks a step, each its own product and scale
                k = (kb + j) * 128
                w_mask = (rn[:, None] < N) & (kb + j < kb_end)
                x_mask = (rm[None, :] < M) & (kb + j < kb_end)
                if not EVEN_K:
                    w_mask = w_mask & (k + kw[None, :] < K)
                    x_mask = x_mask & (k + kx[:, None] < K)
                w = gl.load(w_rows + (k + kw)[None, :], mask=w_mask, other=0.0, eviction_policy="evict_first")
                x = gl.load(x_rows + (k + kx)[:, None], mask=x_mask, other=0.0)
                part = mma_v2(_to_bf16(w, BITS), x, gl.zeros([BLOCK_N, BLOCK_M], gl.float32, layout=mma))
                acc += part * gl.load(s_row + kb + j, mask=kb + j < kb_end, other=0.0)
        on = pid_n * BLOCK_N + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(1, mma))
        om = gl.arange(0, BLOCK_M, layout=gl.SliceLayout(0, mma))
        mask = (om[None, :] < M) & (on[:, None] < N)
        offs = om[None, :] * N + on[:, None]
        if SPLIT:                              # as triton_linear._reduce_splits, in this layout
            gl.store(part_ptr + pid_k * M * N + offs, acc, mask=mask)
            gl.thread_barrier()
            if gl.atomic_add(count_ptr + pid_n, 1, sem="acq_rel") == gl.num_programs(1) - 1:
                total = gl.zeros([BLOCK_N, BLOCK_M], gl.float32, layout=mma)
                for s in range(gl.num_programs(1)):
                    total += gl.load(part_ptr + s * M * N + offs, mask=mask, other=0.0, cache_modifier=".cg")
                gl.store(out_ptr + offs, total.to(out_ptr.dtype.element_ty), mask=mask)
                gl.store(count_ptr + pid_n, 0)
        else:
            gl.store(out_ptr + offs, acc.to(out_ptr.dtype.element_ty), mask=mask)


@functools.cache
def enabled() -> bool:
    """``GLMSERVE_GLUON``: ``1`` (default) takes the Gluon kernels where they apply, ``0`` keeps the Triton tile
    kernels (A/B runs of the benchmarks)."""
    mode = os.environ.get("GLMSERVE_GLUON", "1")
    if mode not in ("0", "1"):
        raise ValueError(f"GLMSERVE_GLUON must be 0 or 1, not {mode!r}")
    return mode == "1" and HAVE_GLUON


def usable(x2: torch.Tensor, N: int) -> bool:
    """The rows kernel applies: Gluon on, x2 [M, K] bf16 with 2..MAX_ROWS rows on an sm_80+ GPU, and at least
    1024 outputs (below that the Triton tile kernel measured as fast or faster: bench/results/session9/)."""
    return (enabled() and x2.is_cuda and x2.dtype == torch.bfloat16 and 2 <= x2.shape[0] <= MAX_ROWS
            and N >= 1024 and torch.cuda.get_device_capability(x2.device)[0] >= 8)


def rows_tile(M: int, N: int, K: int, sms: int) -> RowsTile:
    """The launch measured best on H200 over the GLM-5.2 decode shapes at 2–8 rows (``bench/rows_gemm.py``,
    bench/results/session9/rows_gemm_call2.md): 128 weight rows on 8 warps for long rows or many outputs
    (o_proj, dense down, q_b), else 64 on 4; four 128-wide K blocks a step; split-K to ~4 programs per SM,
    each ≥ one step."""
    block_n, warps = (128, 8) if K >= 8192 or N >= 16384 else (64, 4)
    split = max(1, min(triton.cdiv(4 * sms, triton.cdiv(N, block_n)), triton.cdiv(K, 128) // 4))
    return RowsTile(block_n, 4, split, warps)


def fp8_linear_rows(x2: torch.Tensor, w8: torch.Tensor, scale_inv: torch.Tensor, out: torch.Tensor,
                    tile: RowsTile, counters: torch.Tensor) -> None:
    """out [M, N] (bf16) = x2 [M, K] (bf16, rows contiguous) @ (w8 [N, K] e4m3 · scale_inv).T."""
    M, K = x2.shape
    N = w8.shape[0]
    assert tile.block_n % (16 * tile.num_warps) == 0 and 128 % tile.block_n == 0 and x2.stride(1) == 1
    kbs = triton.cdiv(K, 128)
    per_split = triton.cdiv(triton.cdiv(kbs, tile.split), tile.sub) * tile.sub
    split = triton.cdiv(kbs, per_split)
    grid = (triton.cdiv(N, tile.block_n), split)
    if split > 1:
        part = torch.empty(split, M, N, dtype=torch.float32, device=x2.device)
        assert grid[0] <= counters.numel()
    else:
        part = counters = out
    _rows_kernel[grid](x2, w8, scale_inv, out, part, counters, M, N, K, x2.stride(0), kbs, per_split,
                       BLOCK_N=tile.block_n, BLOCK_M=max(8, triton.next_power_of_2(M)), SUB=tile.sub, KW=16,
                       WARPS=tile.num_warps, SPLIT=split > 1, BITS=tile.bits, EVEN_K=K % 128 == 0,
                       num_warps=tile.num_warps)
