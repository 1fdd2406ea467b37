"""Triton MLA weight absorption from the FP8 kv_b weight, for few rows (a graph step's).

``mla_absorb`` / ``mla_expand`` apply W_UK / W_UV for few rows straight from the FP8 kv_b weight (no
dequantized copy): one row on the FMA units, several rows on the tensor cores with each weight tile read
once for all of them (eight rows: 15.6 → 5.2 µs absorb, 13.5 → 6.2 expand, a layer; the expand from four rows).
``mla_absorb_rope`` ropes q's rope dims in the absorb's launch (its first column block's programs): a launch less a
layer (session 27).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from glmkernels import reference
from glmkernels.registry import ops
from glmkernels.triton_norm import rope_rows
from glmkernels.triton_utils import dot_precision, next_pow2, on_cuda, pdl_launch, pdl_wait

ABSORB_MAX_ROWS = 64       # a graph step's rows (scheduler.shapes.GRAPH_BUCKETS); prefill chunks dequantize


def absorb_tile(rkv: int) -> tuple[int, int, int]:
    """(BLOCK_D, BLOCK_C, warps) measured best on H200 at 1 and 8 rows (bench/tune_attention.py): 64 × 128 on
    2 warps, 5.7 → 4.4 µs at one row, 21.2 → 15.8 at eight (64 columns when the latent is not a multiple of
    128)."""
    return 64, 128 if rkv % 128 == 0 else 64, 2


def expand_tile(N: int) -> tuple[int, int, int]:
    """(BLOCK_V, BLOCK_C, warps): one row 16 × 256 on 2 warps (4.5 → 3.4 µs), more rows 64 × 128 on 4."""
    return (16, 256, 2) if N == 1 else (64, 128, 4)


@triton.jit
def _absorb_kernel(q_ptr, w_ptr, s_ptr, out_ptr, cos_ptr, sin_ptr, qr_ptr, stride_qn, stride_qh, DN, RKV,
                   rows_per_head, num_sb_c, BLOCK_D: tl.constexpr, BLOCK_C: tl.constexpr, HALF: tl.constexpr,
                   INTERLEAVED: tl.constexpr, PDL: tl.constexpr):
    """q_lat[n, h, c-block] = Σ_d q[n, h, d] · W8[h·rows_per_head + d, c] · S[row // 128, c // 128]: the
    reduction runs down W's rows, so each row's scale multiplies its q element (BLOCK_C ≤ 128 columns
    share one scale column); products are kept per lane and reduced once. HALF > 0: the c-block 0 programs
    also rope the head's 2·HALF dims after DN into ``qr_ptr`` [N, nh, 2·HALF] (``rope``)."""
    n = tl.program_id(0)
    h = tl.program_id(1)
    c = tl.program_id(2) * BLOCK_C + tl.arange(0, BLOCK_C)
    s_col = s_ptr + (tl.program_id(2) * BLOCK_C) // 128
    d = tl.arange(0, BLOCK_D)                  # the first step's weight tile and scales before the wait
    dm = d < DN
    row = h * rows_per_head + d
    w = tl.load(w_ptr + row[:, None] * RKV + c[None, :], mask=dm[:, None], other=0.0,
                eviction_policy="evict_first")
    s = tl.load(s_col + (row // 128) * num_sb_c, mask=dm, other=0.0)
    pdl_wait(PDL)
    if HALF > 0 and tl.program_id(2) == 0:
        one = tl.zeros((1, 1), dtype=tl.int32)
        rope_rows(q_ptr + n * stride_qn + h * stride_qh + DN + one, cos_ptr + n * HALF + one, sin_ptr + n * HALF + one,
                  qr_ptr + (n * tl.num_programs(1) + h) * 2 * HALF + one, one == 0, HALF, INTERLEAVED)
    q = tl.load(q_ptr + n * stride_qn + h * stride_qh + d, mask=dm, other=0.0).to(tl.float32)
    acc = w.to(tl.float32) * (q * s)[:, None]
    for d0 in range(BLOCK_D, DN, BLOCK_D):
        d = d0 + tl.arange(0, BLOCK_D)
        dm = d < DN
        row = h * rows_per_head + d
        q = tl.load(q_ptr + n * stride_qn + h * stride_qh + d, mask=dm, other=0.0).to(tl.float32)
        qs = q * tl.load(s_col + (row // 128) * num_sb_c, mask=dm, other=0.0)
        w = tl.load(w_ptr + row[:, None] * RKV + c[None, :], mask=dm[:, None], other=0.0,
                    eviction_policy="evict_first")
        acc += w.to(tl.float32) * qs[:, None]
    tl.store(out_ptr + (n * tl.num_programs(1) + h) * RKV + c, tl.sum(acc, axis=0).to(out_ptr.dtype.element_ty))


@triton.jit
def _expand_kernel(o_ptr, w_ptr, s_ptr, out_ptr, DN, DV, RKV, rows_per_head, num_sb_c,
                   BLOCK_V: tl.constexpr, BLOCK_C: tl.constexpr, PDL: tl.constexpr):
    """o[n, h, v-block] = Σ_c o_lat[n, h, c] · W8[h·rows_per_head + DN + v, c] · S[row // 128, c // 128]; a
    v-block of ≤ 64 rows starting at a multiple of 64 lies in one scale row."""
    n = tl.program_id(0)
    h = tl.program_id(1)
    v = tl.program_id(2) * BLOCK_V + tl.arange(0, BLOCK_V)
    row0 = h * rows_per_head + DN + tl.program_id(2) * BLOCK_V
    w_rows = w_ptr + (row0 + tl.arange(0, BLOCK_V))[:, None] * RKV
    s_row = s_ptr + (row0 // 128) * num_sb_c
    c = tl.arange(0, BLOCK_C)                  # the first step's weight tile and scales before the wait
    w = tl.load(w_rows + c[None, :], eviction_policy="evict_first")
    s = tl.load(s_row + c // 128)
    pdl_wait(PDL)
    x = tl.load(o_ptr + (n * tl.num_programs(1) + h) * RKV + c).to(tl.float32)
    acc = w.to(tl.float32) * (x * s)[None, :]
    for c0 in range(BLOCK_C, RKV, BLOCK_C):
        c = c0 + tl.arange(0, BLOCK_C)
        x = tl.load(o_ptr + (n * tl.num_programs(1) + h) * RKV + c).to(tl.float32)
        xs = x * tl.load(s_row + c // 128)
        w = tl.load(w_rows + c[None, :], eviction_policy="evict_first")
        acc += w.to(tl.float32) * xs[None, :]
    tl.store(out_ptr + (n * tl.num_programs(1) + h) * DV + v, tl.sum(acc, axis=1).to(out_ptr.dtype.element_ty))


@triton.jit
def _absorb_rows_kernel(q_ptr, w_ptr, s_ptr, out_ptr, cos_ptr, sin_ptr, qr_ptr, N, stride_qn, stride_qh, DN, RKV,
                        rows_per_head, num_sb_c, BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr, HALF: tl.constexpr,
                        INTERLEAVED: tl.constexpr, PREC: tl.constexpr, PDL: tl.constexpr):
    """Several rows: q_lat[:, h, c-block] of every row from one read of the weight tile — a
    [rows, 64] × [64, BLOCK_C] dot a step, times the step's one block scale (a head's rows start at a
    multiple of 64, so 64 of them lie in one 128-row scale block; BLOCK_C ≤ 128 columns in one column).
    HALF > 0: the c-block 0 programs also rope their head's 2·HALF dims after DN of every row, as ``_absorb_kernel``."""
    h = tl.program_id(0)
    c = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)
    s_col = s_ptr + (tl.program_id(1) * BLOCK_C) // 128
    n = tl.arange(0, BLOCK_R)
    acc = tl.zeros((BLOCK_R, BLOCK_C), dtype=tl.float32)
    pdl_wait(PDL)
    if HALF > 0 and tl.program_id(1) == 0:
        r = n[:, None]
        rope_rows(q_ptr + r * stride_qn + h * stride_qh + DN, cos_ptr + r * HALF, sin_ptr + r * HALF,
                  qr_ptr + (r * tl.num_programs(0) + h) * 2 * HALF, r < N, HALF, INTERLEAVED)
    for d0 in range(0, DN, 64):
        d = d0 + tl.arange(0, 64)
        row = h * rows_per_head + d
        w = tl.load(w_ptr + row[:, None] * RKV + c[None, :], mask=(d < DN)[:, None], other=0.0,
                    eviction_policy="evict_first")
        q = tl.load(q_ptr + n[:, None] * stride_qn + h * stride_qh + d[None, :],
                    mask=(n < N)[:, None] & (d < DN)[None, :], other=0.0)
        scale = tl.load(s_col + ((h * rows_per_head + d0) // 128) * num_sb_c)
        acc += tl.dot(q, w.to(q.dtype), input_precision=PREC) * scale
    out = out_ptr + (n[:, None] * tl.num_programs(0) + h) * RKV + c[None, :]
    tl.store(out, acc.to(out_ptr.dtype.element_ty), mask=(n < N)[:, None])


@triton.jit
def _expand_rows_kernel(o_ptr, w_ptr, s_ptr, out_ptr, N, DN, DV, RKV, rows_per_head, num_sb_c,
                        BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr, PREC: tl.constexpr, PDL: tl.constexpr):
    """Several rows: o[:, h, v-block of 64] of every row from one read of the weight tile — W-tile · o_latᵀ
    ([64, BLOCK_C] × [BLOCK_C, rows]: the weight as the dot's first operand, wgmma on sm_90), times the
    step's one block scale."""
    h = tl.program_id(0)
    row0 = h * rows_per_head + DN + tl.program_id(1) * 64
    w_rows = w_ptr + (row0 + tl.arange(0, 64))[:, None] * RKV
    s_row = s_ptr + (row0 // 128) * num_sb_c
    n = tl.arange(0, BLOCK_R)
    o_rows = o_ptr + (n[None, :] * tl.num_programs(0) + h) * RKV
    acc = tl.zeros((64, BLOCK_R), dtype=tl.float32)
    pdl_wait(PDL)
    for c0 in range(0, RKV, BLOCK_C):
        c = c0 + tl.arange(0, BLOCK_C)
        w = tl.load(w_rows + c[None, :], eviction_policy="evict_first")
        ot = tl.load(o_rows + c[:, None], mask=(n < N)[None, :], other=0.0)
        acc += tl.dot(w.to(ot.dtype), ot, input_precision=PREC) * tl.load(s_row + c0 // 128)
    v = tl.program_id(1) * 64 + tl.arange(0, 64)
    out = out_ptr + (n[None, :] * tl.num_programs(0) + h) * DV + v[:, None]
    tl.store(out, acc.to(out_ptr.dtype.element_ty), mask=(n < N)[None, :])


def _absorbable(kv_b, N: int) -> bool:
    return kv_b.weight_scale_inv is not None and 0 < N <= ABSORB_MAX_ROWS and kv_b.weight.is_contiguous()


@ops.register("mla_absorb", backend="triton", available=on_cuda)
def mla_absorb(q_nope: torch.Tensor, kv_b) -> torch.Tensor:
    """As ``reference.mla_absorb``; few rows read the FP8 weight directly (no dequantized copy)."""
    N = q_nope.shape[0]
    rkv = kv_b.in_features
    if not _absorbable(kv_b, N) or q_nope.stride(-1) != 1 or rkv % 64:
        return reference.mla_absorb(q_nope, kv_b)
    if N > 1 and _rows_aligned(kv_b, q_nope.shape[1], q_nope.shape[2]):
        return _absorb_rows(q_nope, kv_b, *ABSORB_ROWS_TILE)
    return _absorb(q_nope, kv_b, *absorb_tile(rkv))


@ops.register("mla_absorb_rope", backend="triton", available=on_cuda)
def mla_absorb_rope(q: torch.Tensor, kv_b, dn: int, cos: torch.Tensor, sin: torch.Tensor, interleaved: bool
                    ) -> tuple[torch.Tensor, torch.Tensor]:
    """As ``reference.mla_absorb_rope``; where the absorb runs on its few-row kernels, the rope of q's rope dims
    rides in the same launch (its first column block's programs) instead of a launch of its own."""
    N, nh, D = q.shape
    rkv, half = kv_b.in_features, cos.shape[-1]
    if (not _absorbable(kv_b, N) or q.stride(-1) != 1 or rkv % 64 or D != dn + 2 * half or half & (half - 1)
            or cos.shape != (N, half) or sin.shape != cos.shape or cos.dtype != q.dtype or sin.dtype != q.dtype):
        return mla_absorb(q[..., :dn], kv_b), ops.rope(q[..., dn:], cos.view(N, 1, half), sin.view(N, 1, half),
                                                        interleaved)
    rope = (cos.contiguous(), sin.contiguous(), torch.empty(N, nh, 2 * half, dtype=q.dtype, device=q.device),
            interleaved)
    q_nope = q[..., :dn]
    if N > 1 and _rows_aligned(kv_b, nh, dn):
        return _absorb_rows(q_nope, kv_b, *ABSORB_ROWS_TILE, rope=rope), rope[2]
    return _absorb(q_nope, kv_b, *absorb_tile(rkv), rope=rope), rope[2]


# (BLOCK_C, warps) of the several-row absorb / expand, measured best on H200 (64 heads, 192 / 256 rows each,
# latent 512; bench/tune_attention.py --rows 2 4 8, bench/results/session8/): absorb 5.2 µs at 2, 4 and 8 rows
# where the per-row kernel takes 5.3 / 8.9 / 15.6; expand 6.0–6.2 µs where the per-row one takes 4.6 / 7.8 /
# 13.5 — so two and three rows keep the per-row expand
ABSORB_ROWS_TILE = (64, 2)
EXPAND_ROWS_TILE = (128, 4)
EXPAND_ROWS_FROM = 4


def _rows_aligned(kv_b, nh: int, dn: int) -> bool:
    """The several-row kernels' layout: each head's rows and its W_UV rows start at multiples of 64, the
    latent a multiple of 128."""
    return (kv_b.out_features // nh) % 64 == 0 and dn % 64 == 0 and kv_b.in_features % 128 == 0


def _rope_args(rope: tuple | None, out: torch.Tensor) -> tuple[tuple, dict]:
    """The absorb kernels' rope arguments: (cos, sin, q_rope out) pointers and (HALF, INTERLEAVED); HALF 0 when
    ``rope`` (cos, sin, out, interleaved) is None (the pointers then unused)."""
    if rope is None:
        return (out, out, out), {"HALF": 0, "INTERLEAVED": False}
    cos, sin, q_rope, interleaved = rope
    return (cos, sin, q_rope), {"HALF": cos.shape[-1], "INTERLEAVED": interleaved}


def _absorb_rows(q_nope: torch.Tensor, kv_b, block_c: int, warps: int, rope: tuple | None = None) -> torch.Tensor:
    N, nh, dn = q_nope.shape
    rkv = kv_b.in_features
    assert 128 % block_c == 0 and rkv % block_c == 0
    out = torch.empty(N, nh, rkv, dtype=q_nope.dtype, device=q_nope.device)
    rope_ptrs, rope_kw = _rope_args(rope, out)
    _absorb_rows_kernel[(nh, rkv // block_c)](q_nope, kv_b.weight, kv_b.weight_scale_inv, out, *rope_ptrs, N,
                                              q_nope.stride(0), q_nope.stride(1), dn, rkv, kv_b.out_features // nh,
                                              kv_b.weight_scale_inv.shape[1], BLOCK_R=max(16, next_pow2(N)),
                                              BLOCK_C=block_c, PREC=dot_precision(q_nope.dtype), num_warps=warps,
                                              **rope_kw, **pdl_launch())
    return out


def _absorb(q_nope: torch.Tensor, kv_b, block_d: int, block_c: int, warps: int, rope: tuple | None = None
            ) -> torch.Tensor:
    N, nh, dn = q_nope.shape
    rkv = kv_b.in_features
    assert rkv % block_c == 0 and 128 % block_c == 0
    out = torch.empty(N, nh, rkv, dtype=q_nope.dtype, device=q_nope.device)
    rope_ptrs, rope_kw = _rope_args(rope, out)
    _absorb_kernel[(N, nh, rkv // block_c)](q_nope, kv_b.weight, kv_b.weight_scale_inv, out, *rope_ptrs,
                                            q_nope.stride(0), q_nope.stride(1), dn, rkv, kv_b.out_features // nh,
                                            kv_b.weight_scale_inv.shape[1], BLOCK_D=block_d, BLOCK_C=block_c,
                                            num_warps=warps, **rope_kw, **pdl_launch())
    return out


@ops.register("mla_expand", backend="triton", available=on_cuda)
def mla_expand(o_lat: torch.Tensor, kv_b, dn: int) -> torch.Tensor:
    """As ``reference.mla_expand``; few rows read the FP8 weight directly (no dequantized copy)."""
    N, nh, rkv = o_lat.shape
    rows = kv_b.out_features // nh
    dv = rows - dn
    tile = expand_tile(N)
    if not _absorbable(kv_b, N) or dn % 64 or rows % 64 or dv % 64 or rkv % tile[1] or not o_lat.is_contiguous():
        return reference.mla_expand(o_lat, kv_b, dn)
    if N >= EXPAND_ROWS_FROM and _rows_aligned(kv_b, nh, dn):
        return _expand_rows(o_lat, kv_b, dn, *EXPAND_ROWS_TILE)
    return _expand(o_lat, kv_b, dn, *tile)


def _expand_rows(o_lat: torch.Tensor, kv_b, dn: int, block_c: int, warps: int) -> torch.Tensor:
    N, nh, rkv = o_lat.shape
    dv = kv_b.out_features // nh - dn
    assert 128 % block_c == 0 and rkv % block_c == 0
    out = torch.empty(N, nh, dv, dtype=o_lat.dtype, device=o_lat.device)
    _expand_rows_kernel[(nh, dv // 64)](o_lat, kv_b.weight, kv_b.weight_scale_inv, out, N, dn, dv, rkv,
                                        kv_b.out_features // nh, kv_b.weight_scale_inv.shape[1],
                                        BLOCK_R=max(16, next_pow2(N)), BLOCK_C=block_c,
                                        PREC=dot_precision(o_lat.dtype), num_warps=warps, **pdl_launch())
    return out


def _expand(o_lat: torch.Tensor, kv_b, dn: int, block_v: int, block_c: int, warps: int) -> torch.Tensor:
    N, nh, rkv = o_lat.shape
    rows = kv_b.out_features // nh
    dv = rows - dn
    assert dv % block_v == 0 and 64 % block_v == 0 and rkv % block_c == 0 and block_c % 128 == 0
    out = torch.empty(N, nh, dv, dtype=o_lat.dtype, device=o_lat.device)
    _expand_kernel[(N, nh, dv // block_v)](o_lat, kv_b.weight, kv_b.weight_scale_inv, out, dn, dv, rkv, rows,
                                           kv_b.weight_scale_inv.shape[1], BLOCK_V=block_v, BLOCK_C=block_c,
                                           num_warps=warps, **pdl_launch())
    return out
