"""Triton RMSNorm (plain and fused with the residual add), rotary embedding, and a step's start (the token
embeddings and the rope angles in one launch).

Both reproduce the reference's rounding points: the residual sum and each rope product are rounded to
the activation dtype exactly where PyTorch's elementwise ops round, so the results are bit-identical
to ``kernels.reference`` up to the rsqrt/mean summation order of the norm.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from glmkernels import reference
from glmkernels.registry import ops
from glmkernels.triton_utils import next_pow2, on_cuda, pdl_launch, pdl_wait


@triton.jit
def _rms_norm_kernel(x_ptr, res_ptr, w_ptr, out_ptr, sum_ptr, D, stride_x, stride_r, eps,
                     HAS_RES: tl.constexpr, BLOCK_D: tl.constexpr, PDL: tl.constexpr):
    pdl_wait(PDL)
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
                                         HAS_RES=residual is not None, BLOCK_D=next_pow2(D), num_warps=4,
                                         **pdl_launch())
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
def rope_pair(a, b, c, s, dt: tl.constexpr):
    """One rotation (a·c − b·s, b·c + a·s), every product and sum rounded to ``dt`` where PyTorch's elementwise
    ops round (``reference.rope``)."""
    a, b, c, s = a.to(tl.float32), b.to(tl.float32), c.to(tl.float32), s.to(tl.float32)
    ac, bs, bc, as_ = (a * c).to(dt), (b * s).to(dt), (b * c).to(dt), (a * s).to(dt)
    return (ac.to(tl.float32) - bs.to(tl.float32)).to(dt), (bc.to(tl.float32) + as_.to(tl.float32)).to(dt)


@triton.jit
def rope_rows(x_rows, c_rows, s_rows, out_rows, mask, HALF: tl.constexpr, INTERLEAVED: tl.constexpr):
    """Rotate rows of 2·HALF values: x_rows / c_rows / s_rows / out_rows are [R, 1] pointers to each row's first
    value, its angles' cos and sin (HALF each) and its output; stored de-interleaved as ``reference.rope``."""
    i = tl.arange(0, HALF)[None, :]
    ia = 2 * i if INTERLEAVED else i
    ib = ia + (1 if INTERLEAVED else HALF)
    lo, hi = rope_pair(tl.load(x_rows + ia, mask=mask, other=0.0), tl.load(x_rows + ib, mask=mask, other=0.0),
                       tl.load(c_rows + i, mask=mask, other=0.0), tl.load(s_rows + i, mask=mask, other=0.0),
                       out_rows.dtype.element_ty)
    tl.store(out_rows + i, lo, mask=mask)
    tl.store(out_rows + HALF + i, hi, mask=mask)


@triton.jit
def _rope_kernel(x_ptr, cos_ptr, sin_ptr, out_ptr, M, stride_xn, stride_xm, stride_cn,
                 HALF: tl.constexpr, TAIL: tl.constexpr, INTERLEAVED: tl.constexpr, BLOCK_M: tl.constexpr,
                 PDL: tl.constexpr):
    pdl_wait(PDL)
    n = tl.program_id(0)
    mb = tl.program_id(1)
    m = mb * BLOCK_M + tl.arange(0, BLOCK_M)[:, None]                         # [BM, 1]
    base = x_ptr + n * stride_xn + m * stride_xm
    out = out_ptr + (n * M + m) * (2 * HALF + TAIL)
    zero = tl.zeros_like(m)                                                   # the row's angles, for each m
    rope_rows(base, cos_ptr + n * stride_cn + zero, sin_ptr + n * stride_cn + zero, out, m < M, HALF, INTERLEAVED)
    if TAIL > 0:                               # the dims past the rotated ones, copied
        t = 2 * HALF + tl.arange(0, TAIL)[None, :]
        tl.store(out + t, tl.load(base + t, mask=m < M, other=0.0).to(out_ptr.dtype.element_ty), mask=m < M)


@ops.register("rope", backend="triton", available=on_cuda)
def rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, interleaved: bool) -> torch.Tensor:
    """x: [N, ..., D] (last dim contiguous), cos/sin: [N, 1.., d/2] (one angle row per leading index, d ≤ D)
    → [N, ..., D]: the first d dims laid out as the reference's ``cat([a', b'])``, the rest copied. Other
    broadcasts use the reference."""
    D, half = x.shape[-1], cos.shape[-1]
    N = x.shape[0]
    per_row = (cos.dim() == x.dim() and cos.shape[0] == N and all(s == 1 for s in cos.shape[1:-1])
               and sin.shape == cos.shape)
    dt = torch.promote_types(x.dtype, cos.dtype)
    tail = D - 2 * half
    if not per_row or N == 0 or x.stride(-1) != 1 or half & (half - 1) or tail < 0 or tail & (tail - 1) \
            or x.dim() < 2:
        return reference.rope(x, cos, sin, interleaved)
    x3 = x.reshape(N, -1, D) if x.dim() > 2 else x.unsqueeze(1)
    if x3.stride(-1) != 1:
        x3 = x3.contiguous()
    M = x3.shape[1]
    c2, s2 = cos.reshape(N, half).contiguous(), sin.reshape(N, half).contiguous()
    out = torch.empty(x.shape, dtype=dt, device=x.device)
    BLOCK_M = min(next_pow2(M), 16)
    if N:
        _rope_kernel[(N, triton.cdiv(M, BLOCK_M))](x3, c2, s2, out, M, x3.stride(0), x3.stride(1), c2.stride(0),
                                                   HALF=half, TAIL=tail, INTERLEAVED=interleaved, BLOCK_M=BLOCK_M,
                                                   num_warps=2, **pdl_launch())
    return out


@triton.jit
def _norm_rope_store_row(n, x_ptr, w_ptr, b_ptr, cos_ptr, sin_ptr, cache_ptr, slot_ptr, D, n_norm, rope_at, stride_x,
                         stride_c, num_slots, eps, LAYER: tl.constexpr, HALF: tl.constexpr, ROPE: tl.constexpr,
                         INTERLEAVED: tl.constexpr, AT_SLOT: tl.constexpr, BLOCK_D: tl.constexpr,
                         FP8: tl.constexpr, GROUP: tl.constexpr, ROPE_OFF: tl.constexpr):
    """Row n: the norm's statistics over [0, n_norm), every column normalized where it must be and rounded
    where the reference rounds (the norm's output, each rope product and sum), the roped pairs gathered from
    x directly (de-interleaved on store, as ``rope``), the row stored at its slot (``AT_SLOT``; else row n).
    ``FP8``: the cache holds packed rows (bytes, ``reference.kv_fp8_pack`` of the first n_norm columns): 1 — MLA's,
    the rope key after them (from n_norm) to byte ``ROPE_OFF`` in x's dtype; 2 — the indexer's, the whole row
    (n_norm = D, its roped columns among them) packed."""
    cols = tl.arange(0, BLOCK_D)
    x = tl.load(x_ptr + n * stride_x + cols, mask=cols < D, other=0.0)
    dt = x.dtype
    xf = tl.where(cols < n_norm, x.to(tl.float32), 0.0)
    if LAYER:
        mean = tl.sum(xf, axis=0) / n_norm
        xc = tl.where(cols < n_norm, xf - mean, 0.0)
        rstd = 1.0 / tl.sqrt(tl.sum(xc * xc, axis=0) / n_norm + eps)
    else:
        mean = 0.0
        rstd = 1.0 / tl.sqrt(tl.sum(xf * xf, axis=0) / n_norm + eps)
    if AT_SLOT:
        slot = tl.load(slot_ptr + n)
        slot = tl.where(slot < 0, slot + num_slots, slot).to(tl.int64)
    else:
        slot = n.to(tl.int64)
    out = cache_ptr + slot * stride_c
    y = _normed(x, cols, n_norm, mean, rstd, w_ptr, b_ptr, LAYER)
    if FP8 == 2:                         # the roped columns in place (gathered per column), then the row packed
        if ROPE:
            j = cols - rope_at
            in_rope = (j >= 0) & (j < 2 * HALF)
            i = tl.where(in_rope, j % HALF, 0)
            ia = rope_at + (2 * i if INTERLEAVED else i)
            ib = ia + (1 if INTERLEAVED else HALF)
            a = _normed(tl.load(x_ptr + n * stride_x + ia), ia, n_norm, mean, rstd, w_ptr, b_ptr, LAYER)
            b = _normed(tl.load(x_ptr + n * stride_x + ib), ib, n_norm, mean, rstd, w_ptr, b_ptr, LAYER)
            lo, hi = rope_pair(a, b, tl.load(cos_ptr + n * HALF + i), tl.load(sin_ptr + n * HALF + i), dt)
            y = tl.where(in_rope, tl.where(j < HALF, lo, hi), y)
        _store_fp8_latent(out, y, n_norm, BLOCK_D, GROUP)
    else:
        if FP8 == 1:
            _store_fp8_latent(out, y, n_norm, BLOCK_D, GROUP)
            rope_out = (out + ROPE_OFF).to(tl.pointer_type(dt))
        else:
            in_rope = (cols >= rope_at) & (cols < rope_at + 2 * HALF) if ROPE else cols < 0
            tl.store(out + cols, y.to(cache_ptr.dtype.element_ty), mask=(cols < D) & ~in_rope)
            rope_out = out + rope_at
        if ROPE:
            i = tl.arange(0, HALF)
            ia = rope_at + (2 * i if INTERLEAVED else i)
            ib = ia + (1 if INTERLEAVED else HALF)
            a = _normed(tl.load(x_ptr + n * stride_x + ia), ia, n_norm, mean, rstd, w_ptr, b_ptr, LAYER)
            b = _normed(tl.load(x_ptr + n * stride_x + ib), ib, n_norm, mean, rstd, w_ptr, b_ptr, LAYER)
            lo, hi = rope_pair(a, b, tl.load(cos_ptr + n * HALF + i), tl.load(sin_ptr + n * HALF + i), dt)
            tl.store(rope_out + i, lo.to(rope_out.dtype.element_ty))
            tl.store(rope_out + HALF + i, hi.to(rope_out.dtype.element_ty))


@triton.jit
def _e4m3_grid(v):
    """fp32 v (|v| ≤ 448) rounded to the nearest e4m3 value, ties to even, still fp32 — so the cast after it is
    exact (the interpreter's cast loses a rounding's carry: 125.9 → 64): normal values keep 3 mantissa bits
    (integer rounding of the bits, a carry into the exponent included), below 2^-6 multiples of 2^-9 (e4m3's
    subnormals; adding and taking away 1.5 · 2^14 rounds the magnitude there)."""
    bits = v.to(tl.int32, bitcast=True)
    normal = ((bits + 0x7FFFF + ((bits >> 20) & 1)) & -0x100000).to(tl.float32, bitcast=True)
    small = (tl.abs(v) + 24576.0) - 24576.0
    return tl.where(tl.abs(v) < 0.015625, tl.where(bits < 0, -small, small), normal)     # a sign kept at zero too


@triton.jit
def _store_fp8_latent(out, y, n_latent, BLOCK_D: tl.constexpr, GROUP: tl.constexpr):
    """Row y [BLOCK_D]'s first ``n_latent`` columns as e4m3 at byte pointer ``out``, each GROUP of them over its
    power-of-two scale (stored as fp32 after them): ``reference.kv_fp8_scale``'s integer steps on amax's bits."""
    NG: tl.constexpr = BLOCK_D // GROUP
    cols = tl.arange(0, BLOCK_D)
    m = cols < n_latent
    yf = tl.reshape(tl.where(m, y.to(tl.float32), 0.0), (NG, GROUP))
    bits = tl.max(tl.abs(yf), axis=1).to(tl.int32, bitcast=True)
    e = tl.maximum((bits >> 23) - 135 + ((bits & 0x7FFFFF) > 0x600000).to(tl.int32), -126)
    inv = ((127 - e) << 23).to(tl.float32, bitcast=True)
    q = tl.reshape(yf * inv[:, None], (BLOCK_D,))                                  # |q| ≤ 448, exact
    tl.store(out.to(tl.pointer_type(tl.float8e4nv)) + cols, _e4m3_grid(q).to(tl.float8e4nv), mask=m)
    g = tl.arange(0, NG)
    tl.store((out + n_latent).to(tl.pointer_type(tl.float32)) + g, ((e + 127) << 23).to(tl.float32, bitcast=True),
             mask=g * GROUP < n_latent)


@triton.jit
def _norm_rope_store_kernel(cos_ptr, sin_ptr, slot_ptr,
                            x_ptr, w_ptr, b_ptr, cache_ptr, D, n_norm, rope_at, stride_x, stride_c, num_slots, eps,
                            x2_ptr, w2_ptr, b2_ptr, cache2_ptr, D2, n_norm2, rope_at2, stride_x2, stride_c2,
                            num_slots2, eps2,
                            x3_ptr, w3_ptr, b3_ptr, cache3_ptr, D3, n_norm3, rope_at3, stride_x3, stride_c3,
                            num_slots3, eps3, HALF: tl.constexpr,
                            LAYER: tl.constexpr, ROPE: tl.constexpr, INTERLEAVED: tl.constexpr,
                            AT_SLOT: tl.constexpr, BLOCK_D: tl.constexpr,
                            LAYER2: tl.constexpr, ROPE2: tl.constexpr, INTERLEAVED2: tl.constexpr,
                            AT_SLOT2: tl.constexpr, BLOCK_D2: tl.constexpr,
                            LAYER3: tl.constexpr, ROPE3: tl.constexpr, INTERLEAVED3: tl.constexpr,
                            AT_SLOT3: tl.constexpr, BLOCK_D3: tl.constexpr, PDL: tl.constexpr,
                            FP8: tl.constexpr, GROUP: tl.constexpr, ROPE_OFF: tl.constexpr,
                            FP82: tl.constexpr, GROUP2: tl.constexpr, ROPE_OFF2: tl.constexpr,
                            FP83: tl.constexpr, GROUP3: tl.constexpr, ROPE_OFF3: tl.constexpr):
    """Program (n, j) caches row n of row set j (a grid of (N, sets): the first, ``also``'s in order)."""
    pdl_wait(PDL)
    n = tl.program_id(0)
    if tl.program_id(1) == 0:
        _norm_rope_store_row(n, x_ptr, w_ptr, b_ptr, cos_ptr, sin_ptr, cache_ptr, slot_ptr, D, n_norm, rope_at,
                             stride_x, stride_c, num_slots, eps, LAYER, HALF, ROPE, INTERLEAVED, AT_SLOT, BLOCK_D,
                             FP8, GROUP, ROPE_OFF)
    elif tl.program_id(1) == 1:
        _norm_rope_store_row(n, x2_ptr, w2_ptr, b2_ptr, cos_ptr, sin_ptr, cache2_ptr, slot_ptr, D2, n_norm2,
                             rope_at2, stride_x2, stride_c2, num_slots2, eps2, LAYER2, HALF, ROPE2, INTERLEAVED2,
                             AT_SLOT2, BLOCK_D2, FP82, GROUP2, ROPE_OFF2)
    else:
        _norm_rope_store_row(n, x3_ptr, w3_ptr, b3_ptr, cos_ptr, sin_ptr, cache3_ptr, slot_ptr, D3, n_norm3,
                             rope_at3, stride_x3, stride_c3, num_slots3, eps3, LAYER3, HALF, ROPE3, INTERLEAVED3,
                             AT_SLOT3, BLOCK_D3, FP83, GROUP3, ROPE_OFF3)


@triton.jit
def _normed(x, cols, n_norm, mean, rstd, w_ptr, b_ptr, LAYER: tl.constexpr):
    """x's columns ``cols`` normalized (those below n_norm; the others as they are), in x's dtype: RMSNorm
    rounds the normalized value, then the weight product (as ``reference.rms_norm``); LayerNorm rounds once."""
    dt = x.dtype
    m = cols < n_norm
    w = tl.load(w_ptr + cols, mask=m, other=1.0).to(tl.float32)
    if LAYER:
        y = ((x.to(tl.float32) - mean) * rstd * w + tl.load(b_ptr + cols, mask=m, other=0.0).to(tl.float32)).to(dt)
    else:
        y = (w * (x.to(tl.float32) * rstd).to(dt).to(tl.float32)).to(dt)
    return tl.where(m, y, x)


@ops.register("norm_rope_store", backend="triton", available=on_cuda)
def norm_rope_store(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, eps: float, n_norm: int,
                    cos: torch.Tensor, sin: torch.Tensor, rope_at: int, interleaved: bool, cache: torch.Tensor,
                    slots: torch.Tensor, also: tuple[reference.CacheRows, ...] = ()) -> None:
    """As ``reference.norm_rope_store``, one launch (norm, rope, cast and scatter) for every row set (programs
    (n, j): MLA's key rows, the indexer's, q_a's RMSNorm in one launch)."""
    sets = [reference.CacheRows(x, weight, bias, eps, n_norm, rope_at, interleaved, cache), *also]
    half = cos.shape[-1]
    if (len(sets) > 3 or half & (half - 1) or cos.dtype != x.dtype
            or not all(_storable(r) and r.x.shape[0] == x.shape[0] for r in sets)):
        return reference.norm_rope_store(x, weight, bias, eps, n_norm, cos, sin, rope_at, interleaved, cache, slots,
                                         also)
    args, consts = zip(*(_row_set_args(r) for r in sets + sets[:1] * (3 - len(sets))))   # unused sets: the first
    if x.shape[0]:
        _norm_rope_store_kernel[(x.shape[0], len(sets))](
            cos.contiguous(), sin.contiguous(), slots, *args[0], *args[1], *args[2], HALF=half,
            **{f"{k}{j or ''}": v for j, c in zip((0, 2, 3), consts) for k, v in c.items()}, num_warps=4,
            **pdl_launch())


def _storable(r: reference.CacheRows) -> bool:
    return (r.x.dim() == 2 and r.x.stride(-1) == 1 and r.cache.stride(-1) == 1 and r.weight.dtype == r.x.dtype
            and (r.bias is None or r.bias.dtype == r.x.dtype) and (r.at_slots or r.cache.dtype == r.x.dtype)
            and (r.cache.dtype != torch.uint8 or r.at_slots and _fp8_mode(r) > 0))


def _fp8_mode(r: reference.CacheRows) -> int:
    """A row set's packing (``_norm_rope_store_row``'s FP8): 0 none, 1 MLA's (rope key after the packed latent),
    2 the whole row packed (the indexer's), -1 a uint8 cache the kernel cannot fill."""
    if r.cache.dtype != torch.uint8:
        return 0
    if r.n_norm == r.x.shape[1]:
        return 2
    return 1 if r.rope_at == r.n_norm else -1


def _fp8_args(r: reference.CacheRows) -> dict:
    """A row set's packing constexprs."""
    mode = _fp8_mode(r)
    if mode <= 0:
        return {"FP8": 0, "GROUP": 1, "ROPE_OFF": 0}
    group, rope_at, _ = reference.kv_fp8_layout(r.n_norm, r.x.shape[1] - r.n_norm, r.x.dtype)
    return {"FP8": mode, "GROUP": group, "ROPE_OFF": rope_at}


def _row_set_args(r: reference.CacheRows) -> tuple[tuple, dict]:
    """A row set's runtime arguments to ``_norm_rope_store_kernel`` and its constexprs."""
    return ((r.x, r.weight, r.weight if r.bias is None else r.bias, r.cache, r.x.shape[1], r.n_norm, r.rope_at or 0,
             r.x.stride(0), r.cache.stride(0), r.cache.shape[0], r.eps),
            {"LAYER": r.bias is not None, "ROPE": r.rope_at is not None, "INTERLEAVED": r.interleaved,
             "AT_SLOT": r.at_slots, "BLOCK_D": next_pow2(r.x.shape[1]), **_fp8_args(r)})


@triton.jit
def _embed_rope_kernel(ids_ptr, table_ptr, pos_ptr, freq_ptr, x_ptr, cos_ptr, sin_ptr, H, HALF,
                       BLOCK_H: tl.constexpr, BLOCK_F: tl.constexpr, PDL: tl.constexpr):
    pdl_wait(PDL)
    n = tl.program_id(0)
    hb = tl.program_id(1)
    h = hb * BLOCK_H + tl.arange(0, BLOCK_H)
    row = tl.load(ids_ptr + n).to(tl.int64) * H
    tl.store(x_ptr + n.to(tl.int64) * H + h, tl.load(table_ptr + row + h, mask=h < H), mask=h < H)
    if hb == 0:                                # the row's angles: its position times each frequency, in fp32
        f = tl.arange(0, BLOCK_F)
        ang = tl.load(pos_ptr + n).to(tl.float32) * tl.load(freq_ptr + f, mask=f < HALF, other=0.0)
        dt = cos_ptr.dtype.element_ty
        tl.store(cos_ptr + n * HALF + f, tl.cos(ang).to(dt), mask=f < HALF)
        tl.store(sin_ptr + n * HALF + f, tl.sin(ang).to(dt), mask=f < HALF)


@ops.register("embed_rope", backend="triton", available=on_cuda)
def embed_rope(ids: torch.Tensor, table: torch.Tensor, positions: torch.Tensor, inv_freq: torch.Tensor
               ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The reference's ``embed_rope`` in one launch (were an index_select, a product, cos, sin and two casts: six
    launches outside the step's PDL chain). ids / positions: [N] integers; table [V, H] rows contiguous."""
    N, H, half = ids.shape[0], table.shape[1], inv_freq.shape[0]
    if table.stride(1) != 1 or table.stride(0) != H or positions.dtype.is_floating_point:
        return reference.embed_rope(ids, table, positions, inv_freq)
    x = torch.empty(N, H, dtype=table.dtype, device=table.device)
    cos = torch.empty(N, half, dtype=table.dtype, device=table.device)
    sin = torch.empty(N, half, dtype=table.dtype, device=table.device)
    block_h = min(next_pow2(H), 1024)
    if N:
        _embed_rope_kernel[(N, triton.cdiv(H, block_h))](ids, table, positions, inv_freq, x, cos, sin, H, half,
                                                          BLOCK_H=block_h, BLOCK_F=next_pow2(half), num_warps=4,
                                                          **pdl_launch())
    return x, cos, sin
