"""Triton MLA sparse attention (absorbed, latent space) and the DSA indexer's scoring.

``mla_sparse_attention`` is split-K flash-decoding over each row's selected slots: a program owns one
row, a block of heads and a slice of the K selected slots; it gathers those cache rows (latent | rope
key, 576 values), keeps an online softmax in fp32 and writes an un-normalised partial with its
log-sum-exp; a combine kernel merges the slices. Scores and probabilities stay in fp32 (the reference
rounds scores and probabilities to the activation dtype, so bf16 results differ by rounding only).

``indexer_topk`` scores every visible key of the row's request (``Σ_h w_h · relu(q_h·k · scale)`` in fp32 on the
tensor cores) — a program per row and 64 keys, or for a prefill chunk a program per 8 rows of a request and 1024
keys (each key tile loaded once for the 8 rows: 151 → 215 TF/s at 131k keys, bench/index_prefill.py) — in slabs of
rows of at most 512 MiB of scores, and selects with ``torch.topk``; the paged
form (CUDA-graph steps) selects with ``wide_select``, a radix select over many programs a row (three
passes of 11/11/10 bits on integer-atomic histograms, the first inside the scoring launch, then a count
and a scatter that also maps the keys to their slots). Top-2048 of 5k–41k keys, one row, on H200: 15–20 µs,
where torch.topk + the slot gather took 48–96 µs and session 4's one-program bit-by-bit select (≤ 16k keys)
23–39 µs (bench/results/select_topk.md, session7/).

Packed FP8 cache rows (``kv_cache_dtype: fp8``, ``reference.kv_fp8_layout``) are unpacked as they load
(``fp8_packed``; an indexer key's e4m3 values dotted, then scaled). W_UK / W_UV (the absorb and expand around this
attention) are in ``triton_absorb.py``.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from glmkernels import reference
from glmkernels.registry import ops
from glmkernels.triton_utils import dot_precision, next_pow2, num_sms, on_cuda, pdl_launch, pdl_wait

LOG2E = 1.4426950408889634
TRIM_BLOCK: tl.constexpr = tl.constexpr(256)    # selected slots a step of the attention's scan for its last key


@triton.jit
def _mla_split_kernel(ql_ptr, qr_ptr, kv_ptr, idx_ptr, o_ptr, lse_ptr, nh, K, keys_per_split, scale_log2,
                      stride_ql_n, stride_ql_h, stride_qr_n, stride_qr_h, stride_kv, stride_idx,
                      RKV: tl.constexpr, DR: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_K: tl.constexpr,
                      PREC: tl.constexpr, PDL: tl.constexpr, TRIM: tl.constexpr, FP8: tl.constexpr = False,
                      GROUP: tl.constexpr = 128, ROPE_AT: tl.constexpr = 0):
    pdl_wait(PDL)
    n = tl.program_id(0)
    hb = tl.program_id(1)
    sp = tl.program_id(2)
    num_splits = tl.num_programs(2)
    h = hb * BLOCK_H + tl.arange(0, BLOCK_H)
    hmask = h < nh
    c = tl.arange(0, RKV)
    r = tl.arange(0, DR)
    ql = tl.load(ql_ptr + n * stride_ql_n + h[:, None] * stride_ql_h + c[None, :], mask=hmask[:, None], other=0.0)
    qr = tl.load(qr_ptr + n * stride_qr_n + h[:, None] * stride_qr_h + r[None, :], mask=hmask[:, None], other=0.0)
    m_i = tl.full((BLOCK_H,), -1.0e30, dtype=tl.float32)
    l_i = tl.zeros((BLOCK_H,), dtype=tl.float32)
    acc = tl.zeros((BLOCK_H, RKV), dtype=tl.float32)
    k0 = sp * keys_per_split
    k_end = tl.minimum(k0 + keys_per_split, K)
    # a row that sees fewer keys than K ends in -1s: when the split's last key is one, stop after its last selected
    # key (a scan of the split's slots; a split that ends in a selected key pays one load)
    if TRIM and tl.load(idx_ptr + n * stride_idx + k_end - 1) < 0:       # (TRIM is constexpr: off, no code)
        last = k0
        for kb in range(k0, k_end, TRIM_BLOCK):
            kk = kb + tl.arange(0, TRIM_BLOCK)
            slot = tl.load(idx_ptr + n * stride_idx + kk, mask=kk < k_end, other=-1)
            last = tl.maximum(last, tl.max(tl.where(slot >= 0, kk + 1, 0), axis=0))
        k_end = last
    for kb in range(k0, k_end, BLOCK_K):
        kk = kb + tl.arange(0, BLOCK_K)
        slot = tl.load(idx_ptr + n * stride_idx + kk, mask=kk < k_end, other=-1)
        sel = slot >= 0
        base = kv_ptr + tl.maximum(slot, 0).to(tl.int64)[:, None] * stride_kv
        if FP8:     # packed rows (bytes): e4m3 latent, a power-of-two scale a GROUP, the rope key in q's dtype
            lat, kr = _fp8_rows(base, sel, c, r, ql.dtype, RKV, BLOCK_K, GROUP, ROPE_AT)
        else:
            lat = tl.load(base + c[None, :], mask=sel[:, None], other=0.0)                    # [BK, RKV]
            kr = tl.load(base + RKV + r[None, :], mask=sel[:, None], other=0.0)               # [BK, DR]
        s = tl.dot(ql, tl.trans(lat), input_precision=PREC) + tl.dot(qr, tl.trans(kr), input_precision=PREC)
        s = tl.where(sel[None, :], s * scale_log2, float("-inf"))                            # [BH, BK]
        m_new = tl.maximum(m_i, tl.max(s, axis=1))
        alpha = tl.exp2(m_i - m_new)
        p = tl.exp2(s - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, axis=1)
        acc = acc * alpha[:, None] + tl.dot(p.to(lat.dtype), lat, input_precision=PREC)
        m_i = m_new
    row = (n * nh + h) * num_splits + sp
    lse = tl.where(l_i > 0, m_i + tl.log2(tl.maximum(l_i, 1e-30)), float("-inf"))                            # log2 domain
    tl.store(lse_ptr + row, lse, mask=hmask)
    tl.store(o_ptr + row[:, None] * RKV + c[None, :], acc / tl.maximum(l_i, 1e-30)[:, None], mask=hmask[:, None])


@triton.jit
def fp8_packed(base, sel, c, dt: tl.constexpr, RKV: tl.constexpr, BLOCK_K: tl.constexpr, GROUP: tl.constexpr):
    """The packed values of FP8 cache rows at byte pointers ``base`` [BK, 1] (``reference.kv_fp8_layout``; ``sel``
    [BK] the rows to load, c = arange(RKV)) → [BK, RKV] in ``dt``: e4m3 · scale is exact in fp32, so they equal
    ``reference.kv_fp8_unpack``'s bit for bit. The scales: a [BK, groups] load broadcast through a reshape (loading
    one a value was 2–3× slower on the H200, and past shared memory at 64 heads a program: session 42)."""
    lat = tl.load(base.to(tl.pointer_type(tl.float8e4nv)) + c[None, :], mask=sel[:, None], other=0.0)
    scale = tl.load((base + RKV).to(tl.pointer_type(tl.float32)) + tl.arange(0, RKV // GROUP)[None, :],
                    mask=sel[:, None], other=0.0)
    lat = tl.reshape(tl.reshape(lat.to(tl.float32), (BLOCK_K, RKV // GROUP, GROUP)) * scale[:, :, None],
                     (BLOCK_K, RKV))
    return lat.to(dt)


@triton.jit
def _fp8_keys(rows, sel, d, dt: tl.constexpr, IDD: tl.constexpr):
    """Packed keys of one scale each at byte pointers ``rows`` [BT] → (their e4m3 values in ``dt`` [BT, IDD], exact;
    the scales [BT]): a dot of the values times the scale equals the dot of the unpacked keys — a power of two
    scales every product and partial sum exactly."""
    k = tl.load(rows.to(tl.pointer_type(tl.float8e4nv))[:, None] + d[None, :], mask=sel[:, None], other=0.0).to(dt)
    return k, tl.load((rows + IDD).to(tl.pointer_type(tl.float32)), mask=sel, other=0.0)


@triton.jit
def _fp8_rows(base, sel, c, r, dt: tl.constexpr, RKV: tl.constexpr, BLOCK_K: tl.constexpr, GROUP: tl.constexpr,
              ROPE_AT: tl.constexpr):
    """Packed MLA rows → (latent [BK, RKV], rope key [BK, DR]) in ``dt`` (the rope key stored in it)."""
    kr = tl.load((base + ROPE_AT).to(tl.pointer_type(dt)) + r[None, :], mask=sel[:, None], other=0.0)
    return fp8_packed(base, sel, c, dt, RKV, BLOCK_K, GROUP), kr


@triton.jit
def _mla_combine_kernel(o_ptr, lse_ptr, out_ptr, NUM_SPLITS: tl.constexpr, SPLITS_P2: tl.constexpr,
                        RKV: tl.constexpr, PDL: tl.constexpr):
    pdl_wait(PDL)
    nh_row = tl.program_id(0)                  # n * nh + h
    s = tl.arange(0, SPLITS_P2)
    lse = tl.load(lse_ptr + nh_row * NUM_SPLITS + s, mask=s < NUM_SPLITS, other=float("-inf"))
    m = tl.max(lse, axis=0)
    w = tl.exp2(lse - m)
    w = w / tl.sum(w, axis=0)
    c = tl.arange(0, RKV)
    o = tl.load(o_ptr + (nh_row * NUM_SPLITS + s)[:, None] * RKV + c[None, :], mask=(s < NUM_SPLITS)[:, None],
                other=0.0)
    tl.store(out_ptr + nh_row * RKV + c, tl.sum(o * w[:, None], axis=0).to(out_ptr.dtype.element_ty))


@ops.register("mla_sparse_attention", backend="triton", available=on_cuda)
def mla_sparse_attention(q_lat: torch.Tensor, q_rope: torch.Tensor, kv_cache: torch.Tensor,
                         topk_slots: torch.Tensor, scale: float, row_chunk: int = 256, trim: bool = False
                         ) -> torch.Tensor:
    """q_lat: [N, nh, rkv] and q_rope: [N, nh, dr] (last dim contiguous), kv_cache: [slots, rkv+dr] (rows
    contiguous; uint8: packed FP8 rows, ``reference.kv_fp8_layout``), topk_slots: [N, K] (-1 = not selected)
    → o_lat [N, nh, rkv] in q_lat's dtype.
    rkv and dr must be powers of two (512, 64). Graph-capturable. ``row_chunk`` is the reference's knob; ``trim``
    (the caller knows that some rows select fewer than K keys, their -1s last): see ``_mla``."""
    N, rkv = q_lat.shape[0], q_lat.shape[-1]
    dr = q_rope.shape[-1]
    K = topk_slots.shape[1]
    if rkv & (rkv - 1) or dr & (dr - 1) or q_lat.stride(-1) != 1 or q_rope.stride(-1) != 1 \
            or kv_cache.stride(-1) != 1 or N == 0 or K == 0:
        return reference.mla_sparse_attention(q_lat, q_rope, kv_cache, topk_slots, scale, row_chunk)
    return _mla(q_lat, q_rope, kv_cache, topk_slots.contiguous(), scale, *mla_tile(N), trim=trim)


def _fp8_args(kv_cache: torch.Tensor, rkv: int, dr: int, dtype: torch.dtype) -> dict:
    """The split kernel's constexprs for the cache's row format."""
    if kv_cache.dtype != torch.uint8:
        return {}
    group, rope_at, _ = reference.kv_fp8_layout(rkv, dr, dtype)
    return {"FP8": True, "GROUP": group, "ROPE_AT": rope_at}


def mla_tile(N: int) -> tuple:
    """(keys per step, programs per SM to aim for, most splits of a row's keys, heads per program, warps),
    measured on H200 (bench/tune_attention.py): one row of 2048 keys 12.3 → 9.1–9.3 µs with 64 keys a step
    instead of 32 (32 splits), 16 heads a program (32: 10.8, 64: 13.4); more rows ~1 program per SM, from four
    rows 32 heads a program — two rows 12.8 → 11.8 µs, four 17.6 → 17.3, eight 33.4 → 27.9 → 25.1 (64 heads on
    8 warps: 25.4; bench/results/session8/). Past 8 rows all 64 heads a program on 8 warps, so that a row's selected
    keys are gathered once: 16 rows 47.9 → 35.3 µs (bench/results/session31/call2/, 144 shapes); 2048 rows of 2048 keys
    3.21 → 2.53 ms (bench/mla_prefill.py, the best of 37 shapes; bench/results/session13/). Not faster (session 31):
    the gather pipelined deeper, bf16 partials. The splits fill one wave of programs (``_mla``: at most per_sm · SMs
    programs): 32 / 64 rows 67.8 / 115.2 → 52.6 / 88.6 µs with 4 / 2 splits instead of 5 / 3 (160 / 192 programs, a
    second wave a quarter / half full; bench/tune_attention.py --splits, bench/results/session35/call1/). At 2–8 rows
    two to four programs an SM (more splits) were no faster: 8 rows 27.7–31.7 µs against the pick's 25.0
    (``--per-sm``, bench/results/session38/call2/)."""
    if N == 1:
        return 64, 2, 64, 16, 4
    if N > 8:
        return 64, 1, 64, 64, 8
    return (64, 1, 64, 32, 4) if N >= 4 else (64, 1, 64, 16, 4)


def mla_splits(programs: int, K: int, block_k: int, per_sm: float, max_splits: int, sms: int) -> tuple[int, int]:
    """(splits of a row's K selected keys, keys a split) for ``programs`` (rows × head blocks) programs a split: few
    rows split K (down to one key block a program) so that a decode row still covers every SM, within one wave of
    ``per_sm`` programs an SM (a second wave only part full costs a whole program's time: see ``mla_tile``)."""
    splits = max(1, min(int(per_sm * sms) // programs, triton.cdiv(K, block_k), max_splits))
    keys_per_split = triton.cdiv(triton.cdiv(K, splits), block_k) * block_k
    return triton.cdiv(K, keys_per_split), keys_per_split


def _mla(q_lat: torch.Tensor, q_rope: torch.Tensor, kv_cache: torch.Tensor, topk_slots: torch.Tensor, scale: float,
         block_k: int, per_sm: float, max_splits: int, block_h: int = 16, warps: int = 4, stages: int = 2,
         trim: bool = False) -> torch.Tensor:
    """``trim``: a program whose keys end in -1 first finds its last selected key and attends up to it — a row of a
    request with fewer visible keys than the step's K (a prompt's rows beside long-context decoders; a fresh prompt's
    early rows) holds -1s after its selection (the indexer puts them last), so its masked key blocks cost nothing; the
    same result bit for bit (a fully masked block leaves the softmax state as it was). Only where some row has them:
    the trimmed kernel's main loop spills more (prefill tile), its rows of K keys take ~1.47× as long (one H200,
    bench/results/session24/)."""
    N, nh, rkv = q_lat.shape
    dr = q_rope.shape[-1]
    K = topk_slots.shape[1]
    head_blocks = triton.cdiv(nh, block_h)
    splits, keys_per_split = mla_splits(N * head_blocks, K, block_k, per_sm, max_splits, num_sms())
    o_part = torch.empty(N * nh * splits, rkv, dtype=torch.float32, device=q_lat.device)
    lse = torch.empty(N * nh * splits, dtype=torch.float32, device=q_lat.device)
    _mla_split_kernel[(N, head_blocks, splits)](
        q_lat, q_rope, kv_cache, topk_slots, o_part, lse, nh, K, keys_per_split, scale * LOG2E,
        q_lat.stride(0), q_lat.stride(1), q_rope.stride(0), q_rope.stride(1), kv_cache.stride(0),
        topk_slots.stride(0), RKV=rkv, DR=dr, BLOCK_H=block_h, BLOCK_K=block_k,
        PREC=dot_precision(q_lat.dtype), TRIM=trim, **_fp8_args(kv_cache, rkv, dr, q_lat.dtype), num_warps=warps,
        num_stages=stages, **pdl_launch())
    out = torch.empty(N, nh, rkv, dtype=q_lat.dtype, device=q_lat.device)
    _mla_combine_kernel[(N * nh,)](o_part, lse, out, NUM_SPLITS=splits, SPLITS_P2=next_pow2(splits), RKV=rkv,
                                   num_warps=4, **pdl_launch())
    return out


@triton.jit
def _index_score_kernel(q_ptr, w_ptr, k_ptr, table_ptr, base_ptr, len_ptr, pos_ptr, score_ptr, hist_ptr, count_ptr,
                        state_ptr, T_max, K, scale, stride_qn, stride_qh, stride_k, stride_table, BS: tl.constexpr,
                        RAGGED: tl.constexpr, IH: tl.constexpr, IDD: tl.constexpr, BLOCK_T: tl.constexpr,
                        PREC: tl.constexpr, SELECT: tl.constexpr, SHIFT: tl.constexpr, BITS: tl.constexpr,
                        PDL: tl.constexpr, FP8: tl.constexpr, GROUP: tl.constexpr):
    """Row n's key t sits in slot table[base + t // BS] * BS + t % BS: ragged (BS = 1), a flat slot list with
    base = base[n] and length len[n]; paged, row n of a block table (base = n · stride_table, length T_max).
    SELECT: also the wide select's first pass over the row's scores (``_radix_count`` on digit SHIFT, BITS).
    FP8: the keys are packed rows (bytes), read in q's dtype."""
    pdl_wait(PDL)
    n = tl.program_id(0)
    t = tl.program_id(1) * BLOCK_T + tl.arange(0, BLOCK_T)
    if RAGGED:
        base = tl.load(base_ptr + n)
        length = tl.load(len_ptr + n)
    else:
        base = n * stride_table
        length = T_max
    pos = tl.load(pos_ptr + n)
    visible = (t < length) & (t <= pos)
    if tl.program_id(1) * BLOCK_T <= tl.minimum(pos, length - 1):       # a key of the block is visible
        block = tl.load(table_ptr + base + t // BS, mask=visible, other=0)
        slot = block.to(tl.int64) * BS + t % BS
        d = tl.arange(0, IDD)
        hh = tl.arange(0, IH)
        q = tl.load(q_ptr + n * stride_qn + hh[:, None] * stride_qh + d[None, :])                # [IH, IDD]
        if FP8 and GROUP == IDD:         # one scale a key (a power of two): the dot of the e4m3 values, then scaled
            k, key_scale = _fp8_keys(k_ptr + slot * stride_k, visible, d, q.dtype, IDD)
            s = tl.dot(k, tl.trans(q), input_precision=PREC) * key_scale[:, None]                # [BT, IH]
        else:
            if FP8:
                k = fp8_packed(k_ptr + slot[:, None] * stride_k, visible, d, q.dtype, IDD, BLOCK_T, GROUP)
            else:
                k = tl.load(k_ptr + slot[:, None] * stride_k + d[None, :], mask=visible[:, None], other=0.0)
            s = tl.dot(k, tl.trans(q.to(k.dtype)), input_precision=PREC)                        # [BT, IH]
        w = tl.load(w_ptr + n * IH + hh)
        score = tl.sum(tl.maximum(s * scale, 0.0) * w[None, :], axis=1)
        score = tl.where(visible, score, float("-inf"))
    else:                                  # past the row's position (a graph width's padding): no loads, no dot
        score = tl.full((BLOCK_T,), float("-inf"), tl.float32)
    tl.store(score_ptr + n * T_max + t, score, mask=t < T_max)
    if SELECT:
        _radix_count(_order_key(score), t < T_max, hist_ptr, count_ptr, state_ptr, n, K, 0, SHIFT, BITS)


def _key_args(k_cache: torch.Tensor, q: torch.Tensor) -> dict:
    """The scoring kernels' constexprs for the key cache's format (uint8: packed FP8 rows, read in q's dtype)."""
    if k_cache.dtype != torch.uint8:
        return {"PREC": dot_precision(k_cache.dtype), "FP8": False, "GROUP": 1}
    group = reference.kv_fp8_layout(q.shape[-1], 0, q.dtype)[0]
    return {"PREC": dot_precision(q.dtype), "FP8": True, "GROUP": group}


def _score(q: torch.Tensor, head_weights: torch.Tensor, k_cache: torch.Tensor, table: torch.Tensor,
           base: torch.Tensor | None, length: torch.Tensor | None, positions: torch.Tensor, T_max: int,
           block_size: int, scale: float, select_k: int = 0) -> torch.Tensor:
    """Scores [N, T_max]: ragged (``base``/``length`` per row into a flat slot list) or paged (``table`` is a
    block table, one row per query row). ``select_k``: run the first pass of ``wide_select(score, …, select_k)``."""
    N, ih, idd = q.shape
    score = torch.empty(N, T_max, dtype=torch.float32, device=q.device)
    block_t = 64
    ragged = base is not None
    ws = _select_workspace(q.device, N) if select_k else None
    _index_score_kernel[(N, triton.cdiv(T_max, block_t))](
        q, head_weights.float().contiguous(), k_cache, table, base if ragged else table,
        length if ragged else table, positions, score, ws.hist[0] if ws else table, ws.count[0] if ws else table,
        ws.state if ws else table, T_max, select_k, scale, q.stride(0), q.stride(1), k_cache.stride(0),
        table.stride(0), BS=block_size, RAGGED=ragged, IH=ih, IDD=idd, BLOCK_T=block_t,
        SELECT=bool(select_k), SHIFT=SELECT_DIGITS[0][0], BITS=SELECT_DIGITS[0][1], **_key_args(k_cache, q),
        num_warps=4, **pdl_launch())
    return score


# Prefill rows: a program scores BLOCK_M rows of one request against KEYS of its keys, BLOCK_T at a time — each step
# a [BLOCK_M·heads, idd] × [idd, BLOCK_T] dot with the rows' queries held across the steps, so each key tile is loaded
# once for BLOCK_M rows (the one-row kernel loads it for each row, and its query with it).
SCORE_ROWS = (8, 64, 1024, 4)      # (rows a program, keys a step, keys a program, warps): bench/index_prefill.py


@triton.jit
def _index_score_rows_kernel(q_ptr, w_ptr, k_ptr, slots_ptr, blk_ptr, pos_ptr, score_ptr, T_max, scale, stride_qn,
                             stride_qh, stride_k, IH: tl.constexpr, IDD: tl.constexpr, BLOCK_M: tl.constexpr,
                             BLOCK_T: tl.constexpr, KEYS: tl.constexpr, PREC: tl.constexpr, PDL: tl.constexpr,
                             FP8: tl.constexpr, GROUP: tl.constexpr):
    """Block b = (first row, rows ≤ BLOCK_M, base, length): rows of one request, whose key t sits in slot
    slots[base + t] and is visible to row n iff t < length and t ≤ pos[n]."""
    pdl_wait(PDL)
    blk = blk_ptr + tl.program_id(0) * 4
    row0, num_rows, base, length = tl.load(blk), tl.load(blk + 1), tl.load(blk + 2), tl.load(blk + 3)
    m = tl.arange(0, BLOCK_M)
    rows = row0 + m
    pos = tl.load(pos_ptr + rows, mask=m < num_rows, other=-1)                                   # [BM]
    last = tl.minimum(tl.max(pos, 0), length - 1)                  # the last key visible to a row of the block
    d = tl.arange(0, IDD)
    r = tl.arange(0, BLOCK_M * IH)                                     # (row, head) pairs, head fastest
    pair_ok = r // IH < num_rows
    q = tl.load(q_ptr + (row0 + r // IH)[:, None] * stride_qn + (r % IH)[:, None] * stride_qh + d[None, :],
                mask=pair_ok[:, None], other=0.0)                                                # [BM·IH, IDD]
    w = tl.load(w_ptr + (row0 + r // IH) * IH + r % IH, mask=pair_ok, other=0.0)
    for step in range(0, KEYS, BLOCK_T):
        t = tl.program_id(1) * KEYS + step + tl.arange(0, BLOCK_T)
        if tl.program_id(1) * KEYS + step <= last:
            key_ok = t <= last
            slot = tl.load(slots_ptr + base + t, mask=key_ok, other=0)
            if FP8 and GROUP == IDD:     # one scale a key: the dot of the e4m3 values, then scaled (exactly)
                k, key_scale = _fp8_keys(k_ptr + slot * stride_k, key_ok, d, q.dtype, IDD)
                s = tl.dot(q, tl.trans(k), input_precision=PREC) * key_scale[None, :]           # [BM·IH, BT]
            else:
                if FP8:
                    k = fp8_packed(k_ptr + slot[:, None] * stride_k, key_ok, d, q.dtype, IDD, BLOCK_T, GROUP)
                else:
                    k = tl.load(k_ptr + slot[:, None] * stride_k + d[None, :], mask=key_ok[:, None], other=0.0)
                s = tl.dot(q.to(k.dtype), tl.trans(k), input_precision=PREC)                      # [BM·IH, BT]
            score = tl.sum(tl.reshape(tl.maximum(s * scale, 0.0) * w[:, None], (BLOCK_M, IH, BLOCK_T)), axis=1)
            score = tl.where((t[None, :] < length) & (t[None, :] <= pos[:, None]), score, float("-inf"))
        else:                              # past every row's position: no loads, no dot
            score = tl.full((BLOCK_M, BLOCK_T), float("-inf"), tl.float32)
        tl.store(score_ptr + rows[:, None] * T_max + t[None, :], score,
                 mask=(m < num_rows)[:, None] & (t < T_max)[None, :])


def _score_rows(q: torch.Tensor, head_weights: torch.Tensor, k_cache: torch.Tensor, r: reference.RaggedSlots,
                seq_rows, first: int, positions: torch.Tensor, T_max: int, scale: float,
                tile: tuple[int, int, int, int] = SCORE_ROWS) -> torch.Tensor:
    """``_score``'s ragged scores [N, T_max] through the prefill rows kernel, for rows ``first`` … ``first`` + N − 1 of
    the step (q, head_weights and positions: those rows; ``r`` and ``seq_rows``: the whole step's). The row blocks
    (``_row_blocks``) go to the device once a step (kept in ``r.derived``)."""
    N, ih, idd = q.shape
    block_m, block_t, keys, warps = tile    # (KEYS whatever T_max, one variant: steps past T_max store nothing)
    score = torch.empty(N, T_max, dtype=torch.float32, device=q.device)
    key = ("score_rows", first, N, block_m)
    if key not in r.derived:
        blocks = _row_blocks(seq_rows, r.bases, r.lengths, first, first + N, block_m)
        r.derived[key] = torch.tensor(blocks, dtype=torch.int64, pin_memory=q.is_cuda).to(q.device, non_blocking=True)
    meta = r.derived[key]
    _index_score_rows_kernel[(meta.shape[0], triton.cdiv(T_max, keys))](
        q, head_weights.float().contiguous(), k_cache, r.slots, meta, positions, score, T_max, scale, q.stride(0),
        q.stride(1), k_cache.stride(0), IH=ih, IDD=idd, BLOCK_M=block_m, BLOCK_T=block_t, KEYS=keys,
        **_key_args(k_cache, q), num_warps=warps, **pdl_launch())
    return score


def _row_blocks(seq_rows, bases: list[int], lengths: list[int], first: int, end: int, block_m: int
                ) -> list[tuple[int, int, int, int]]:
    """Rows first … end − 1 as blocks of at most ``block_m`` rows of one request: (first row − ``first``, rows,
    the request's offset into the concatenated slots, its length); ``bases`` / ``lengths``: per row, as
    ``RaggedSlots``'."""
    return [(a - first, min(block_m, r0 + nr - a, end - a), bases[a], lengths[a])
            for r0, nr in seq_rows for a in range(max(r0, first), min(r0 + nr, end), block_m)]


# ---- The wide select: a radix select over many programs a row -----------------------------------
SELECT_BLOCK = 1024                            # keys a program of the wide select's later launches holds
SELECT_BITS = (11, 11, 10)                     # digit widths of its three passes over the 32-bit keys, high first
SELECT_DIGITS = tuple((32 - sum(SELECT_BITS[:i + 1]), b) for i, b in enumerate(SELECT_BITS))   # (shift, bits)
# the kernels index a row's state as [pass 0..2]; the histograms hold 2^11 bins
assert len(SELECT_BITS) == 3 and sum(SELECT_BITS) == 32 and max(SELECT_BITS) <= 11


_EMPTY_KEY: tl.constexpr = tl.constexpr(0x007FFFFF)   # ``_order_key`` of -inf


@triton.jit
def _order_key(score):
    """fp32 scores as unsigned ints ordered as the floats (negative: every bit flipped; else the sign bit
    set); the key of -inf is 0x007FFFFF."""
    bits = score.to(tl.int32, bitcast=True)
    return (bits ^ ((bits >> 31) | (-2147483648))).to(tl.uint32, bitcast=True)


@triton.jit
def _load_keys(score_ptr, n, t, W):
    m = t < W
    return _order_key(tl.load(score_ptr + n * W + t, mask=m, other=float("-inf"))), m


@triton.jit
def _radix_count(key, m, hist_ptr, count_ptr, state_ptr, n, K, PASS: tl.constexpr, SHIFT: tl.constexpr,
                 BITS: tl.constexpr):
    """One digit of the wide select, in every program of row n (axis 1 of the grid). Before pass i,
    state[n, i-1] = (prefix, rem): the K-th largest key has its bits above this digit equal to prefix, and
    rem of the keys with that prefix are still to take (pass 0: no prefix, rem = K). Each program counts
    its keys (m) with the prefix into the row's digit histogram (integer atomics: the order of arrival
    cannot change a count); the one arriving last at the row's counter finds the digit d of the rem-th
    largest (the largest d with #{digit ≥ d} ≥ rem), stores state[n, i] = (prefix·2^BITS + d,
    rem − #{digit > d}) and zeroes the histogram and the counter for the next launch."""
    if PASS == 0:
        prefix = tl.zeros((), dtype=tl.uint32)
        rem = K
    else:
        prefix = tl.load(state_ptr + (n * 3 + PASS - 1) * 2).to(tl.uint32, bitcast=True)
        rem = tl.load(state_ptr + (n * 3 + PASS - 1) * 2 + 1)
        m = m & ((key >> (SHIFT + BITS)) == prefix)
    hist = hist_ptr + n * (1 << BITS)
    # the -inf keys (past a row's position: a padded graph width's tail) in one add — they share a digit, and
    # same-address atomics serialize
    empty = m & (key == _EMPTY_KEY)
    num_empty = tl.sum(empty.to(tl.int32), 0)
    tl.atomic_add(hist + ((_EMPTY_KEY >> SHIFT) & ((1 << BITS) - 1)), num_empty, mask=num_empty > 0, sem="relaxed")
    tl.atomic_add(hist + ((key >> SHIFT) & ((1 << BITS) - 1)).to(tl.int32), 1, mask=m & ~empty, sem="relaxed")
    tl.debug_barrier()                         # every thread's counts are in before the release below
    if tl.atomic_add(count_ptr + n, 1, sem="acq_rel") == tl.num_programs(1) - 1:
        b = tl.arange(0, 1 << BITS)
        h = tl.load(hist + b, cache_modifier=".cg")
        ge = tl.sum(h, 0) - tl.cumsum(h, 0) + h                                                  # #{digit ≥ b}
        d = tl.sum((ge >= rem).to(tl.int32), 0) - 1
        state = state_ptr + (n * 3 + PASS) * 2
        tl.store(state, ((prefix << BITS) | d.to(tl.uint32)).to(tl.int32, bitcast=True))
        tl.store(state + 1, rem - tl.sum(tl.where(b > d, h, 0), 0))
        tl.store(hist + b, tl.zeros_like(h))
        tl.store(count_ptr + n, 0)


@triton.jit
def _radix_pass_kernel(score_ptr, hist_ptr, count_ptr, state_ptr, W, K, PASS: tl.constexpr, SHIFT: tl.constexpr,
                       BITS: tl.constexpr, BLOCK: tl.constexpr, PDL: tl.constexpr):
    """A later pass of the wide select (the first runs in the scoring launch): ``_radix_count`` on a block
    of row n's scores."""
    n = tl.program_id(0)
    pdl_wait(PDL)
    key, m = _load_keys(score_ptr, n, tl.program_id(1) * BLOCK + tl.arange(0, BLOCK), W)
    _radix_count(key, m, hist_ptr, count_ptr, state_ptr, n, K, PASS, SHIFT, BITS)


@triton.jit
def _select_count_kernel(score_ptr, state_ptr, part_ptr, W, BLOCK: tl.constexpr, PDL: tl.constexpr):
    """After the passes state[n, 2] = (T, e): T is row n's K-th largest key and the first e keys equal to T
    (in key order) complete the K. Each program counts its keys > T and == T."""
    n = tl.program_id(0)
    p = tl.program_id(1)
    pdl_wait(PDL)
    key, m = _load_keys(score_ptr, n, p * BLOCK + tl.arange(0, BLOCK), W)
    T = tl.load(state_ptr + (n * 3 + 2) * 2).to(tl.uint32, bitcast=True)
    part = part_ptr + (n * tl.num_programs(1) + p) * 2
    tl.store(part, tl.sum((m & (key > T)).to(tl.int32), 0))
    tl.store(part + 1, tl.sum((m & (key == T)).to(tl.int32), 0))


@triton.jit
def _select_scatter_kernel(score_ptr, table_ptr, state_ptr, part_ptr, out_ptr, W, K, stride_table,
                           BS: tl.constexpr, BLOCK: tl.constexpr, PARTS_P2: tl.constexpr, PDL: tl.constexpr):
    """Row n's K slots (-1 for -inf): every key > T, in key order, then the first e keys == T. A program
    places its keys after those of the programs before it (their counts: ``_select_count_kernel``)."""
    n = tl.program_id(0)
    p = tl.program_id(1)
    parts = tl.num_programs(1)
    pdl_wait(PDL)
    q = tl.arange(0, PARTS_P2)
    n_gt = tl.load(part_ptr + (n * parts + q) * 2, mask=q < parts, other=0)
    n_eq = tl.load(part_ptr + (n * parts + q) * 2 + 1, mask=q < parts, other=0)
    t = p * BLOCK + tl.arange(0, BLOCK)
    key, m = _load_keys(score_ptr, n, t, W)
    T = tl.load(state_ptr + (n * 3 + 2) * 2).to(tl.uint32, bitcast=True)
    e = tl.load(state_ptr + (n * 3 + 2) * 2 + 1)
    gt = m & (key > T)
    eq = m & (key == T)
    rank_eq = tl.sum(tl.where(q < p, n_eq, 0), 0) + tl.cumsum(eq.to(tl.int32), 0) - 1
    pos = tl.where(gt, tl.sum(tl.where(q < p, n_gt, 0), 0) + tl.cumsum(gt.to(tl.int32), 0) - 1,
                   tl.sum(n_gt, 0) + rank_eq)
    sel = gt | (eq & (rank_eq < e))
    block = tl.load(table_ptr + n * stride_table + t // BS, mask=sel, other=0).to(tl.int64)
    tl.store(out_ptr + n * K + pos, tl.where(key > 0x007FFFFF, block * BS + t % BS, -1), mask=sel)


class _SelectWorkspace:
    """A device's zeroed histograms and counters of the wide select (each launch leaves them zeroed) and its
    per-row state, for up to ``rows`` rows. One per device: selects on one device run one after another
    (one stream), as the forward and its graphs do."""

    def __init__(self, device: torch.device, rows: int):
        self.rows = rows
        self.hist = torch.zeros(len(SELECT_DIGITS), rows, 2048, dtype=torch.int32, device=device)
        self.count = torch.zeros(len(SELECT_DIGITS), rows, dtype=torch.int32, device=device)
        self.state = torch.empty(rows, len(SELECT_DIGITS), 2, dtype=torch.int32, device=device)


_select_workspaces: dict[torch.device, _SelectWorkspace] = {}


def _select_workspace(device: torch.device, rows: int) -> _SelectWorkspace:
    ws = _select_workspaces.get(device)
    if ws is None or ws.rows < rows:
        assert not (device.type == "cuda" and torch.cuda.is_current_stream_capturing()), \
            f"run the paged indexer on {rows} rows once before capturing a CUDA graph (allocates its workspace)"
        ws = _select_workspaces[device] = _SelectWorkspace(device, max(rows, 64))
    return ws


def wide_select(score: torch.Tensor, table: torch.Tensor, block_size: int, K: int, block: int = SELECT_BLOCK,
                warps: int = 4, first_done: bool = False) -> torch.Tensor:
    """Slots [N, K] of each row's K highest scores (score: [N, W] fp32, K ≤ W) through the block table
    (-1 for a selected -inf): three radix passes, a count and a scatter, each one launch of
    N × cdiv(W, block) programs (``first_done``: the scoring launch ran the first pass); no host sync,
    static shapes, bit-identical run to run."""
    N, W = score.shape
    ws = _select_workspace(score.device, N)
    parts = triton.cdiv(W, block)
    for i, (shift, bits) in enumerate(SELECT_DIGITS):
        if i or not first_done:
            _radix_pass_kernel[(N, parts)](score, ws.hist[i], ws.count[i], ws.state, W, K, PASS=i, SHIFT=shift,
                                           BITS=bits, BLOCK=block, num_warps=warps, **pdl_launch())
    counts = torch.empty(N, parts, 2, dtype=torch.int32, device=score.device)
    _select_count_kernel[(N, parts)](score, ws.state, counts, W, BLOCK=block, num_warps=warps, **pdl_launch())
    out = torch.empty(N, K, dtype=torch.int64, device=score.device)
    _select_scatter_kernel[(N, parts)](score, table, ws.state, counts, out, W, K, table.stride(0), BS=block_size,
                                       BLOCK=block, PARTS_P2=next_pow2(parts), num_warps=warps, **pdl_launch())
    return out


def _scorable(q: torch.Tensor) -> bool:
    ih, idd = q.shape[1:]
    return not (ih & (ih - 1) or idd & (idd - 1) or ih < 16 or q.stride(-1) != 1)


def index_scores(q: torch.Tensor, head_weights: torch.Tensor, k_cache: torch.Tensor, seq_rows, seq_slots,
                 positions: torch.Tensor, scale: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Scores [N, T_max] fp32 (-inf where not visible), the concatenated slots and each row's offset into
    them. q: [N, ih, idd] (pow-2 ih ≥ 16 and idd), head_weights: [N, ih], k_cache: [slots, idd]."""
    r = reference.ragged_slots(seq_rows, seq_slots, q.device)
    score = _score(q, head_weights, k_cache, r.slots, r.base, r.length, positions, max(r.lengths), 1, scale)
    return score, r.slots, r.base


@ops.register("indexer_topk", backend="triton", available=on_cuda)
def indexer_topk(q: torch.Tensor, head_weights: torch.Tensor, k_cache: torch.Tensor,
                 seq_rows: list[tuple[int, int]], seq_slots: list[torch.Tensor], positions: torch.Tensor,
                 topk: int, scale: float, ragged: reference.RaggedSlots | None = None) -> torch.Tensor:
    """As ``reference.indexer_topk`` (same selected sets; the order within a row may differ). A scoring launch and
    ``torch.topk`` per slab of rows whose scores fit ``reference.INDEXER_SCORE_BYTES`` (one slab unless the
    context is long); contexts of at most ``topk`` keys select every visible key in a few launches whatever the
    requests, once a step (kept in ``ragged.derived`` for the step's other layers). ``ragged``: the step's keys as
    ``RaggedSlots`` (``build_batch``'s; else built here). No host sync beyond the host-side request metadata."""
    T_max = max((int(s.numel()) for s in seq_slots), default=0)   # 0: a rank with no rows this step
    if T_max == 0 or T_max > topk and not _scorable(q):
        return reference.indexer_topk(q, head_weights, k_cache, seq_rows, seq_slots, positions, topk, scale)
    r = ragged or reference.ragged_slots(seq_rows, seq_slots, q.device)
    if T_max <= topk:                     # row n selects its request's slots of positions 0 … positions[n]
        if "visible" not in r.derived:
            t = torch.arange(T_max, device=q.device)
            sel = r.slots[(r.base[:, None] + t).clamp(max=r.slots.numel() - 1)]
            r.derived["visible"] = torch.where(t <= positions[:, None], sel, -1)
        return r.derived["visible"]
    N, K = q.shape[0], min(topk, T_max)
    # slabs of a multiple of 16 rows: their row pointers keep one alignment (Triton compiles per alignment)
    slab = max(16, reference.INDEXER_SCORE_BYTES // (T_max * 4) // 16 * 16)
    prefill = max(nr for _, nr in seq_rows) >= SCORE_ROWS[0]      # a request with rows to fill the rows kernel's
    out = torch.empty(N, K, dtype=torch.int64, device=q.device)
    for a in range(0, N, slab):
        b = min(a + slab, N)
        # the scores' width rounded up to 16 keys (the kernels mask keys past a row's length): one variant of each
        # kernel whatever the contexts (Triton compiles per an integer's divisibility by 16)
        T = -(-(T_max if b - a == N else max(r.lengths[a:b])) // 16) * 16
        if prefill:
            score = _score_rows(q[a:b], head_weights[a:b], k_cache, r, seq_rows, a, positions[a:b], T, scale)
        else:
            score = _score(q[a:b], head_weights[a:b], k_cache, r.slots, r.base[a:b], r.length[a:b], positions[a:b],
                           T, 1, scale)
        val, idx = score.topk(min(K, T), dim=-1, sorted=False)                                 # [S, ≤ K]
        sel = r.slots[(r.base[a:b, None] + idx).clamp(max=r.slots.numel() - 1)]
        out[a:b, :val.shape[1]] = torch.where(val > float("-inf"), sel, -1)      # one launch (isfinite: four)
        out[a:b, val.shape[1]:] = -1
    return out


@ops.register("indexer_topk_paged", backend="triton", available=on_cuda)
def indexer_topk_paged(q: torch.Tensor, head_weights: torch.Tensor, k_cache: torch.Tensor,
                       block_table: torch.Tensor, block_size: int, positions: torch.Tensor, topk: int,
                       scale: float) -> torch.Tensor:
    """As ``reference.indexer_topk_paged`` (same selected sets). Static shapes, no host sync:
    graph-capturable. block_table: [N, MB] with unit stride along MB (row stride free)."""
    N, MB = block_table.shape
    if not _scorable(q) or block_table.stride(1) != 1 or N == 0:
        return reference.indexer_topk_paged(q, head_weights, k_cache, block_table, block_size, positions, topk,
                                            scale)
    W = MB * block_size
    K = min(topk, W)
    score = _score(q, head_weights, k_cache, block_table, None, None, positions, W, block_size, scale, select_k=K)
    return wide_select(score, block_table, block_size, K, first_done=True)
