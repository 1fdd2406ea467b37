"""Triton FP8 block-scaled linear: ``y = x @ (W8 · S).T`` with the weight dequantized tile by tile.

Two kernels; the launcher picks by rows:

* one row (``_gemv_kernel``, ``GemvTile``): no tensor-core tile at all — each program streams a
  BLOCK_N × BLOCK_K fp8 tile per step, widens it to fp32 and multiplies by the activation pre-scaled by its
  block's scale; products stay per K lane and are summed once at the end. Split-K as below. Measured on
  H200 at 3.0–3.2 TB/s on the big shapes vs 2.3 for the tile kernel at one row (bench/results/
  tune_decode_kernels_one_row.md), 75–100 % of a bare Triton load stream of the weight (bench/gemv_ceiling.py).
  It can also run two or three weights of one input in one launch (``linear_group``: q_a, kv_a and the
  indexer's wk), each reached by its element offset from the first, and small unquantized weights with an fp32
  result (``linear_f32``: the router, the indexer's head weights), where cuBLAS took 5–6 µs a launch plus the
  casts around it. Those under 2..GEMV_ROWS rows (a verify span, a dp step's MoE over every rank's rows) run its
  several-row form (``_gemv_rows_kernel``: each weight tile multiplied with every row): the router 3.3–4.6×
  faster than the tile kernel there, the head weights 1.0–1.9×.
* decode (2..64 rows): one row tile holds every row (16..64, rows masked), so each weight byte is read
  once; split-K over the reduction so that even a 576-row projection keeps every SM streaming
  (``LinearTile``: BLOCK_N × BLOCK_K weight tile, split, warps, stages; ``decode_tile`` picks it; ``linear_f32``
  runs it on unquantized weights with 3-pass TF32 dots, or dots in x's dtype). The split partials are
  reduced inside the same launch, deterministically: each split program stores its fp32 partial to a
  workspace and bumps its output tile's counter (acq_rel); the program that arrives last adds the
  partials in split order 0, 1, 2, … (bypassing L1), writes the output and resets the counter to 0.
  No float atomics, so results are bit-identical run to run. The counters are one zeroed buffer per
  device, shared by every launch: launches on a device must not overlap (the engine computes on one
  stream), and the first call on a device must come before any CUDA-graph capture.
* 2..8 bf16 rows, ≥ 1024 outputs, where Gluon is present: glmkernels/gluon_rows.py instead — the same math with
  the weight loaded straight into the tensor cores' register operand (no shared-memory pass) and a bit-move
  fp8 → bf16; 1.2–1.6× faster than this tile kernel on the big decode shapes (bench/rows_gemm.py). It runs
  ``linear_group``'s weights in one launch there too (q_a + kv_a + wk, q_b + wq_b).
* mid-size (65..PREFILL_ROWS rows: a dp graph step's MLPs over every rank's rows, short prefill chunks): the same
  kernel on 128- or 64-row blocks (``mid_tile``), split over K as the decode tiles are — a W8A16 "dequant-tile
  GEMM": fp8 tiles are widened to the activation dtype in registers and multiplied on the tensor cores, on the
  wide weights with the weight as the dot's first operand (``swap``: Hopper's wgmma takes it from registers).
  3–5× its byte / FLOP floor (bench/results/session25/).
* 16..PREFILL_ROWS bf16 rows on Hopper, where glmkernels/gluon_mid.py applies (past 64 rows ≥ 1024 outputs; to 64
  rows on the large weights only): that kernel instead — the weight streamed into shared memory by TMA, widened
  into the warpgroup MMA's register operand — the tile kernel's time / its: 1.11–1.62 at 100 and 200 rows, 1.0–1.3 at
  16 rows and 1.1–2.2 at 32 and 64 on the large weights (bench/results/session26/).
* prefill (> PREFILL_ROWS rows): one Triton pass dequantizes the weight to the activation dtype, then
  cuBLAS runs the bf16 GEMM (measured faster than the tile GEMM above on H200 at 4096 rows; the weight
  pass is ≤ 1/20 of the GEMM there). This backend never quantizes activations (W8A16), so all paths stay
  close to the reference, which dequantizes the whole weight too; the opt-in W8A8 prefill is
  glmkernels/triton_w8a8.py.

Math of every path: fp32 accumulation, scales per 128×128 block. A K step of BLOCK_K covers BLOCK_K/128
whole scale columns and BLOCK_N divides 128, so each 128-wide sub-product is scaled by one scalar:
``acc += dot(x, w8.T) * S[n//128, k//128]`` (a tile over several 128-row blocks: by a vector of its rows' scales).
Partial edge blocks (576 = 4·128 + 64 rows, K not a multiple of 128) are masked loads.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from glmkernels import gluon_mid, gluon_rows, reference
from glmkernels.registry import ops
from glmkernels.triton_utils import (
    dot_precision,
    next_pow2,
    num_sms,
    on_cuda,
    pdl_launch,
    pdl_wait,
    weight_group,
)

DECODE_ROWS = 64
GEMV_ROWS = 8          # ``linear_f32`` runs 2..GEMV_ROWS rows on the FMA rows kernel, more on the tile kernel
GEMV_GROUP_N = 4096    # ``linear_group``'s one row: a group of more outputs runs apart
PREFILL_ROWS = 256
NUM_TILE_COUNTERS = 65536


@dataclass(frozen=True)
class LinearTile:
    """Launch shape of the tile kernel: weight tile BLOCK_N × BLOCK_K, K split over ``split`` programs."""
    block_n: int
    block_k: int
    split: int
    num_warps: int = 4
    num_stages: int = 4
    swap: bool = False         # the weight as the dot's first operand: out.T = W · x.T (see ``_tile_kernel``)
    block_m: int = 0           # rows a program: 0 = by the launch's rows (all of them to 64, then 64)
    prescale: bool = False     # the weight tile dequantized before its dot (see ``_tile_kernel``)


@triton.jit
def _tile_kernel(x_ptr, w_ptr, s_ptr, out_ptr, part_ptr, count_ptr, M, N, K, stride_xm, stride_om,
                       num_sb_k, k_steps_per_split,
                       BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                       SPLIT: tl.constexpr, PREC: tl.constexpr, HAS_SCALE: tl.constexpr = True,
                       UPCAST: tl.constexpr = False, ROUND_TO: tl.constexpr = None, OUT_SCALE: tl.constexpr = 1.0,
                       PDL: tl.constexpr = False, SWAP: tl.constexpr = False, PRESCALE: tl.constexpr = False,
                       F32_PREC: tl.constexpr = "ieee"):
    """Rows × weight tiles on the tensor cores: the weight in x's dtype (fp8 blocks scaled per 128-wide
    sub-product: by one scale where BLOCK_N divides 128, by each output row's past that), or, ``UPCAST``, both in
    fp32 with ``F32_PREC`` dots (``linear_f32``: "tf32x3", three TF32 products a dot, ~fp32-exact, on the tensor
    cores — the router [256 × 6144] at 16 / 64 rows 8.5 / 13.5 µs, with "ieee" FMA dots 24.1 / 47.1, session 30);
    stored through ``_finish``.

    ``SWAP``: the product is taken transposed, ``W · x.T`` ([BLOCK_N, BLOCK_M], transposed once after the loop),
    so the widened weight is the dot's first operand, which Hopper's wgmma reads from registers: the weight tile
    goes from its load through the cast into the tensor cores, where as the second operand it is stored to shared
    memory every K step. The same products and sums; on the H200 bit for bit at 128 and 256 rows, not at 32
    (bench/mid_gemm.py's check).

    ``PRESCALE``: each weight tile is dequantized in registers (w · s in fp32, rounded to x's dtype: the weight
    ``reference.linear`` multiplies by) and the dot accumulates into ``acc`` itself, so no K step waits for its
    product to scale it before the next one is issued; its roundings are the reference's, not the scaled sums'.
    No default launch takes it: its best launches beat ``mid_tile``'s by 1.07–1.15×, but at ``mid_tile``'s own it
    is slower, and so was the engine (bench/results/session25/, call 7)."""
    pdl_wait(PDL)
    pid_n = tl.program_id(0)
    pid_m = tl.program_id(1)
    pid_k = tl.program_id(2)
    rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    rk = tl.arange(0, 128)
    if SWAP:
        acc = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)
    else:
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    s_row = s_ptr + (pid_n * BLOCK_N) // 128 * num_sb_k
    step0 = pid_k * k_steps_per_split
    for step in range(step0, tl.minimum(step0 + k_steps_per_split, tl.cdiv(K, BLOCK_K))):
        for j in tl.static_range(BLOCK_K // 128):      # one scale column per 128-wide sub-block
            kb = step * (BLOCK_K // 128) + j
            k = kb * 128 + rk
            x = tl.load(x_ptr + rm[:, None] * stride_xm + k[None, :],
                        mask=(rm[:, None] < M) & (k[None, :] < K), other=0.0)
            w = tl.load(w_ptr + rn[:, None] * K + k[None, :], mask=(rn[:, None] < N) & (k[None, :] < K),
                        other=0.0)
            if HAS_SCALE and BLOCK_N > 128:    # a tile over several scale rows: each output row's own scale
                sc = tl.load(s_ptr + rn // 128 * num_sb_k + tl.minimum(kb, num_sb_k - 1), mask=rn < N, other=0.0)
            elif HAS_SCALE:
                sc = tl.load(s_row + kb, mask=kb < num_sb_k, other=0.0)
            if UPCAST:
                x = x.to(tl.float32)
                w = w.to(tl.float32)
            elif PRESCALE:                     # w · s in fp32, rounded to x's dtype: the reference's weight
                w = (w.to(tl.float32) * (sc[:, None] if BLOCK_N > 128 else sc)).to(x.dtype)
            else:
                w = w.to(x.dtype)
            prec: tl.constexpr = F32_PREC if UPCAST else PREC
            if SWAP:
                a, b = w, tl.trans(x)
            else:
                a, b = x, tl.trans(w)
            if PRESCALE:                       # scaled already: the dot accumulates in place, K step after K step
                acc = tl.dot(a, b, acc, input_precision=prec)
            else:
                part = tl.dot(a, b, input_precision=prec)
                if HAS_SCALE and BLOCK_N > 128:
                    part = part * (sc[:, None] if SWAP else sc[None, :])
                elif HAS_SCALE:
                    part = part * sc
                acc += part
    if SWAP:
        acc = tl.trans(acc)
    mask = (rm[:, None] < M) & (rn[None, :] < N)
    out = out_ptr + rm[:, None] * stride_om + rn[None, :]
    if SPLIT:
        _reduce_splits(acc, out, mask, part_ptr + rm[:, None] * N + rn[None, :], M * N, count_ptr,
                       pid_m * tl.num_programs(0) + pid_n, pid_k, tl.num_programs(2), ROUND_TO, OUT_SCALE)
    else:
        tl.store(out, _finish(acc, ROUND_TO, OUT_SCALE).to(out_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _finish(y, ROUND_TO: tl.constexpr, OUT_SCALE: tl.constexpr):
    """An fp32 sum as the launch stores it: rounded to ``ROUND_TO`` first (None: not), times ``OUT_SCALE``."""
    if ROUND_TO is not None:
        y = y.to(ROUND_TO).to(tl.float32)
    if OUT_SCALE != 1.0:
        y = y * OUT_SCALE
    return y


@triton.jit
def _reduce_splits(acc, out, mask, part, split_stride, count_ptr, tile, pid_k, num_splits,
                   ROUND_TO: tl.constexpr = None, OUT_SCALE: tl.constexpr = 1.0):
    """Split-K epilogue: store this split's fp32 partial; the split that arrives last at ``tile``'s counter
    adds every partial in split order, writes ``out`` (``_finish``) and resets the counter (no float atomics)."""
    tl.store(part + pid_k * split_stride, acc, mask=mask)
    tl.debug_barrier()                         # every thread's partial is stored before the release below
    if tl.atomic_add(count_ptr + tile, 1, sem="acq_rel") == num_splits - 1:
        total = tl.zeros_like(acc)
        for s in range(num_splits):            # fixed order, whoever arrives last
            total += tl.load(part + s * split_stride, mask=mask, other=0.0, cache_modifier=".cg")
        tl.store(out, _finish(total, ROUND_TO, OUT_SCALE).to(out.dtype.element_ty), mask=mask)
        tl.store(count_ptr + tile, 0)          # the next launch (stream-ordered) starts from zero


@triton.jit
def _gemv_kernel(x_ptr, w_ptr, s_ptr, out_ptr, part_ptr, count_ptr, N, K, num_sb_k, k_per_split,
                 N_a, N_ab, w_b_off, s_b_off, w_c_off, s_c_off,
                 BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, SPLIT: tl.constexpr, STAGES: tl.constexpr,
                 HAS_SCALE: tl.constexpr, ROUND_TO: tl.constexpr, OUT_SCALE: tl.constexpr, EACH: tl.constexpr,
                 PDL: tl.constexpr):
    """One row: ``y[n] = Σ_k w[n, k] · (x[k] · S[n//128, k//128])`` on the FMA units (no S: an unquantized
    weight). The activation is scaled by its block's scale once per K step (BLOCK_N divides 128: one scale
    row per program); the products accumulate elementwise in a [BLOCK_N, BLOCK_K] fp32 tile, reduced over K
    once at the end (EACH: reduced every K step into BLOCK_N sums, the registers left to a wider weight tile),
    and stored through ``_finish``.

    Outputs from N_a on come from a second weight (and scales) at element offsets ``w_b_off`` / ``s_b_off``
    from the first, from N_ab on from a third (``w_c_off`` / ``s_c_off``): several projections of one input in
    one launch (N_a = N_ab = N: one weight). The first step's weight tile and scales load before ``pdl_wait``:
    under PDL they stream while the kernel before ends."""
    pid_n = tl.program_id(0)
    pid_k = tl.program_id(1)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    rk = tl.arange(0, BLOCK_K)
    in_b = pid_n * BLOCK_N >= N_a              # N_a, N_ab are multiples of BLOCK_N: a tile is in one weight
    in_c = pid_n * BLOCK_N >= N_ab
    r0 = pid_n * BLOCK_N - tl.where(in_c, N_ab, tl.where(in_b, N_a, 0))
    rw = r0 + tl.arange(0, BLOCK_N)            # row in its own weight
    w_rows = w_ptr + tl.where(in_c, w_c_off, tl.where(in_b, w_b_off, 0)) + rw[:, None] * K
    s_row = s_ptr + tl.where(in_c, s_c_off, tl.where(in_b, s_b_off, 0)) + r0 // 128 * num_sb_k
    k0 = pid_k * k_per_split
    k_end = tl.minimum(k0 + k_per_split, K)
    kk = k0 + rk                               # the first step's weight tile and scales (weights only)
    km = kk < K
    w = tl.load(w_rows + kk[None, :], mask=(rn[:, None] < N) & km[None, :], other=0.0,
                eviction_policy="evict_first")
    s = tl.load(s_row + kk // 128, mask=km, other=0.0) if HAS_SCALE else 1.0
    pdl_wait(PDL)                              # from here on the activation (written by the kernel before)
    acc = w.to(tl.float32) * (tl.load(x_ptr + kk, mask=km, other=0.0).to(tl.float32) * s)[None, :]
    if EACH:
        acc = tl.sum(acc, axis=1)
    for k in tl.range(k0 + BLOCK_K, k_end, BLOCK_K, num_stages=STAGES):
        kk = k + rk
        km = kk < K
        xs = tl.load(x_ptr + kk, mask=km, other=0.0).to(tl.float32)
        if HAS_SCALE:
            xs = xs * tl.load(s_row + kk // 128, mask=km, other=0.0)
        w = tl.load(w_rows + kk[None, :], mask=(rn[:, None] < N) & km[None, :], other=0.0,
                    eviction_policy="evict_first")
        if EACH:
            acc += tl.sum(w.to(tl.float32) * xs[None, :], axis=1)
        else:
            acc += w.to(tl.float32) * xs[None, :]
    y = acc if EACH else tl.sum(acc, axis=1)
    mask = rn < N
    if SPLIT:
        _reduce_splits(y, out_ptr + rn, mask, part_ptr + rn, N, count_ptr, pid_n, pid_k, tl.num_programs(1),
                       ROUND_TO, OUT_SCALE)
    else:
        tl.store(out_ptr + rn, _finish(y, ROUND_TO, OUT_SCALE).to(out_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _gemv_rows_kernel(x_ptr, w_ptr, out_ptr, part_ptr, count_ptr, M, N, K, stride_xm, k_per_split,
                      BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, SPLIT: tl.constexpr,
                      ROUND_TO: tl.constexpr, OUT_SCALE: tl.constexpr, PDL: tl.constexpr):
    """A few rows (≤ BLOCK_M) times a small unquantized weight on the FMA units (``linear_f32``): each program
    streams a BLOCK_N × BLOCK_K weight tile per step, widened to fp32, and multiplies it with every row's K slice
    (upcast to fp32); the products stay per K lane, [BLOCK_M, BLOCK_N, BLOCK_K], and are summed once at the end,
    then split-K reduced and stored as ``_gemv_kernel`` does. The first step's weight tile loads before the wait."""
    pid_n = tl.program_id(0)
    pid_k = tl.program_id(1)
    rm = tl.arange(0, BLOCK_M)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    rk = tl.arange(0, BLOCK_K)
    k0 = pid_k * k_per_split
    k_end = tl.minimum(k0 + k_per_split, K)
    kk = k0 + rk
    w = tl.load(w_ptr + rn[:, None] * K + kk[None, :], mask=(rn[:, None] < N) & (kk[None, :] < K), other=0.0,
                eviction_policy="evict_first")
    pdl_wait(PDL)                              # from here on the rows (written by the kernel before)
    x = tl.load(x_ptr + rm[:, None] * stride_xm + kk[None, :], mask=(rm[:, None] < M) & (kk[None, :] < K), other=0.0)
    acc = x.to(tl.float32)[:, None, :] * w.to(tl.float32)[None, :, :]
    for k in range(k0 + BLOCK_K, k_end, BLOCK_K):
        kk = k + rk
        w = tl.load(w_ptr + rn[:, None] * K + kk[None, :], mask=(rn[:, None] < N) & (kk[None, :] < K), other=0.0,
                    eviction_policy="evict_first")
        x = tl.load(x_ptr + rm[:, None] * stride_xm + kk[None, :], mask=(rm[:, None] < M) & (kk[None, :] < K),
                    other=0.0)
        acc += x.to(tl.float32)[:, None, :] * w.to(tl.float32)[None, :, :]
    y = tl.sum(acc, axis=2)
    mask = (rm[:, None] < M) & (rn[None, :] < N)
    out = out_ptr + rm[:, None] * N + rn[None, :]
    if SPLIT:
        _reduce_splits(y, out, mask, part_ptr + rm[:, None] * N + rn[None, :], M * N, count_ptr, pid_n, pid_k,
                       tl.num_programs(1), ROUND_TO, OUT_SCALE)
    else:
        tl.store(out, _finish(y, ROUND_TO, OUT_SCALE).to(out_ptr.dtype.element_ty), mask=mask)


@dataclass(frozen=True)
class GemvTile(LinearTile):
    """Launch shape of the one-row kernel: BLOCK_N outputs × BLOCK_K per step, K split over ``split``; ``each``:
    the products reduced every K step (``_gemv_kernel``'s EACH)."""
    num_stages: int = 1
    each: bool = False


_tile_counters: dict[torch.device, torch.Tensor] = {}


def tile_counters(device: torch.device) -> torch.Tensor:
    """The device's zeroed int32 tile counters (the split programs of a tile count their arrivals), shared by
    every split-K launch on the device: the Triton linear kernels and the Gluon rows / MoE kernels."""
    counters = _tile_counters.get(device)
    if counters is None:
        assert not (device.type == "cuda" and torch.cuda.is_current_stream_capturing()), \
            "call fp8_linear once on this device before capturing a CUDA graph (allocates its counters)"
        counters = _tile_counters[device] = torch.zeros(NUM_TILE_COUNTERS, dtype=torch.int32, device=device)
    return counters


def decode_tile(M: int, N: int, K: int) -> LinearTile:
    """The decode tile measured best on H200 at 1 and 8 rows (bench/tune_decode_kernels.py; wider N or K
    tiles, more warps or stages were no faster): 64×128 weight tiles (32 wide under 1024 outputs),
    split-K until every SM has ~2 programs and no program walks more than 32 K steps, each ≥ 2."""
    block_n = 64 if N >= 1024 else 32
    k_steps = triton.cdiv(K, 128)
    split = max(triton.cdiv(2 * num_sms(), triton.cdiv(N, block_n)), triton.cdiv(k_steps, 32))
    return LinearTile(block_n, 128, max(1, min(split, k_steps // 2)), num_warps=4, num_stages=3)


def mid_tile(M: int, N: int, K: int) -> LinearTile:
    """65..PREFILL_ROWS rows where glmkernels/gluon_mid.py does not apply (no Hopper GPU, not bf16, < 1024 outputs,
    ``GLMSERVE_GLUON=0``). From 1024 outputs (past 4096 at ≤ 128 rows): ``swap``ped 64-output × 128-row tiles,
    split over K to ~1 program an SM — 1.13–1.47× faster than the unswapped launch below on the GLM-5.2 shapes at
    128 and 256 rows, where wider tiles, 8 warps or 256-row tiles were slower (bench/mid_gemm.py [--sweep wide],
    bench/results/session25/). Else ``unswapped_mid_tile``."""
    if N >= 1024 and (M > 128 or N > 4096):
        tiles = triton.cdiv(N, 64) * triton.cdiv(M, 128)
        return LinearTile(64, 128, max(1, min(triton.cdiv(num_sms(), tiles), triton.cdiv(K, 128) // 2)), num_warps=4,
                          num_stages=3, swap=True, block_m=128)
    return unswapped_mid_tile(M, N, K)


def unswapped_mid_tile(M: int, N: int, K: int) -> LinearTile:
    """``mid_tile``'s launch where it does not swap (every mid-size launch before session 25): 64-row blocks of
    128-wide weight tiles (64 under 1024 outputs), split over K to ~2 programs an SM; unsplit (before session 19), a
    tp rank's shared expert, 256 × 6144 under a dp step's 256 rows, ran on 8 programs (bench/results/session19/)."""
    block_n = 128 if N >= 1024 else 64
    tiles = triton.cdiv(N, block_n) * triton.cdiv(M, 64)
    return LinearTile(block_n, 128, max(1, min(triton.cdiv(2 * num_sms(), tiles), triton.cdiv(K, 128) // 2)),
                      num_warps=4, num_stages=3)


def gemv_tile(N: int, K: int) -> GemvTile:
    """The one-row launch measured best on H200 (bench/tune_decode_kernels.py --one-row [--narrow],
    bench/results/tune_decode_kernels_one_row*.md). 512..4096 outputs: no split-K (its partials and reduce
    cost more than they spread), few rows × long runs of each row per step (2048 K, 1024 on short rows) with
    as many rows per program as keep ≥ 512 programs — 576×6144 3.8 → 3.3 µs, 2048×6144 5.9 → 5.1, 4096×2048
    5.2 → 3.7. Wider: 32 outputs × 256 K per step, split-K to ~3 programs per SM, 8 warps on long rows (the
    narrow tiles were no faster there); from 8192 K 32 × 512 reducing every step (``each``), split to ~3 programs
    per SM — o_proj [6144 × 16384] 30.7 → 27.9 µs, the dense down [6144 × 12288] 23.5 → 21.5, where 16 × 512 tiles
    lose it again (bench/gemv_variants.py --explain, bench/results/session29/: their first step, loaded before the
    PDL wait, costs them ~2 µs; 6144-K rows gain nothing). Under 512 outputs (unquantized, ``linear_f32``): 4–8
    rows × one K step of 1024 per program — router [256 × 6144] fp32 4.4 → 3.5 µs, head weights [32 × 6144] bf16
    2.8 → 2.0.
    No software pipelining (num_stages 3 was slower on every shape; loading the next step into registers
    while this one is used, 40–75 % slower: bench/results/session6/)."""
    if N < 512:                                # the router's fp32 logits, the indexer's head weights: one K step
        return GemvTile(8 if N >= 256 else 4, 1024, triton.cdiv(K, 1024), num_warps=4, num_stages=1)
    if N <= 4096:
        block_n = next((b for b in (8, 4) if N // b >= 512), 2)
        return GemvTile(block_n, 2048 if K >= 4096 else 1024, 1, num_warps=4, num_stages=1)
    if K >= 8192:
        split = triton.cdiv(3 * num_sms(), triton.cdiv(N, 32))
        return GemvTile(32, 512, max(1, min(split, triton.cdiv(K, 512))), num_warps=4, num_stages=1, each=True)
    block_n, block_k = 32, 256
    k_steps = triton.cdiv(K, block_k)
    split = round(3 * num_sms() / triton.cdiv(N, block_n))
    return GemvTile(block_n, block_k, max(1, min(split, k_steps)), num_warps=8 if K >= 4096 else 4,
                    num_stages=1)


def gemv_rows_tile(M: int, N: int, K: int) -> GemvTile:
    """``linear_f32``'s launch for 2..GEMV_ROWS rows (``_gemv_rows_kernel``), measured on H200 (bench/
    tune_small_gemv.py --rows, bench/results/session30/): 4 outputs a program, 1024 K (split-K over the rest), in K
    steps of 256 on the router [256 × 6144] fp32 — 2 / 4 / 8 rows 5.2 / 5.8 / 7.3 µs against the tile kernel's
    23.9–24.0 (IEEE dots) and 8.4–8.5 (3-pass TF32) — and on narrower weights as long as the per-lane products stay
    8192 fp32 values (64 registers a thread on 4 warps): the head weights [32 × 6144] bf16 2.4 / 3.2 / 4.7 against
    4.5–4.8."""
    block_k = 256 if N >= 256 else min(1024, 8192 // (4 * next_pow2(M)))
    return GemvTile(4, block_k, triton.cdiv(K, 1024), num_warps=4, num_stages=1)


TL_DTYPES = {torch.float32: tl.float32, torch.bfloat16: tl.bfloat16, torch.float16: tl.float16}


def _gemv(x2: torch.Tensor, w: torch.Tensor, scale_inv: torch.Tensor | None, out: torch.Tensor,
          tile: GemvTile, more: tuple[tuple[torch.Tensor, torch.Tensor], ...] = (),
          round_to: torch.dtype | None = None, out_scale: float = 1.0) -> None:
    """out [1, N] = x2 @ W.T, W = w (N rows; fp8 with ``scale_inv``, or unquantized with None), or w stacked
    over ``more``'s FP8 weights (one or two; N = all). ``round_to`` / ``out_scale``: as ``_finish``."""
    K = w.shape[1]
    assert 128 % tile.block_n == 0
    N, N_a, N_ab, w_b_off, s_b_off, w_c_off, s_c_off = weight_group(w, scale_inv, more, tile.block_n)
    k_steps = triton.cdiv(K, tile.block_k)
    per_split = triton.cdiv(k_steps, tile.split)
    split = triton.cdiv(k_steps, per_split)
    grid = (triton.cdiv(N, tile.block_n), split)
    if split > 1:
        part = torch.empty(split, N, dtype=torch.float32, device=x2.device)
        counters = tile_counters(x2.device)
        assert grid[0] <= counters.numel()
    else:
        part = counters = out
    _gemv_kernel[grid](x2, w, w if scale_inv is None else scale_inv, out, part, counters, N, K, triton.cdiv(K, 128),
                       per_split * tile.block_k, N_a, N_ab, w_b_off, s_b_off, w_c_off, s_c_off,
                       BLOCK_N=tile.block_n, BLOCK_K=tile.block_k, SPLIT=split > 1, STAGES=tile.num_stages,
                       HAS_SCALE=scale_inv is not None,
                       ROUND_TO=None if round_to is None else TL_DTYPES[round_to], OUT_SCALE=float(out_scale),
                       EACH=tile.each, num_warps=tile.num_warps, **pdl_launch())


def fp8_linear(x: torch.Tensor, w8: torch.Tensor, scale_inv: torch.Tensor,
               tile: LinearTile | gluon_rows.RowsTile | gluon_mid.MidTile | None = None) -> torch.Tensor:
    """x: [..., K] (bf16/fp16/fp32), w8: [N, K] float8_e4m3fn contiguous, scale_inv: [⌈N/128⌉, ⌈K/128⌉]
    fp32 → [..., N] in x's dtype. ``tile`` overrides the decode launch shape (benchmarks; a ``GemvTile``
    runs the one-row kernel, a ``RowsTile`` the Gluon rows kernel, a ``MidTile`` the Gluon mid-size kernel). No host
    sync; graph-capturable."""
    K = x.shape[-1]
    N = w8.shape[0]
    x2 = x.reshape(-1, K)
    if x2.stride(-1) != 1:
        x2 = x2.contiguous()
    M = x2.shape[0]
    num_sb_k = triton.cdiv(K, 128)
    assert w8.is_contiguous() and scale_inv.shape == (triton.cdiv(N, 128), num_sb_k)
    scale_inv = scale_inv.contiguous()
    out = torch.empty(M, N, dtype=x.dtype, device=x.device)
    if M == 0:
        return out.view(*x.shape[:-1], N)
    if isinstance(tile, GemvTile) or (tile is None and M == 1):
        assert M == 1
        _gemv(x2, w8, scale_inv, out, tile or gemv_tile(N, K))
        return out.view(*x.shape[:-1], N)
    if isinstance(tile, gluon_rows.RowsTile) or (tile is None and gluon_rows.usable(x2, N)):
        gluon_rows.fp8_linear_rows(x2, w8, scale_inv, out, tile or gluon_rows.rows_tile(M, N, K, num_sms()),
                                   tile_counters(x2.device))
        return out.view(*x.shape[:-1], N)
    if isinstance(tile, gluon_mid.MidTile) or (tile is None and gluon_mid.usable(x2, N, K)):
        gluon_mid.fp8_linear_mid(x2, w8, scale_inv, out, tile or gluon_mid.mid_tile(M, N, K, num_sms()),
                                 tile_counters(x2.device))
        return out.view(*x.shape[:-1], N)
    tile = tile or (decode_tile(M, N, K) if M <= DECODE_ROWS else mid_tile(M, N, K))
    block_m = tile.block_m or (max(16, next_pow2(M)) if M <= DECODE_ROWS else 64)
    _tiles(x2, w8, scale_inv, out, block_m, tile)
    return out.view(*x.shape[:-1], N)


def _gemv_rows(x2: torch.Tensor, w: torch.Tensor, out: torch.Tensor, tile: GemvTile,
               round_to: torch.dtype | None = None, out_scale: float = 1.0) -> None:
    """out [M, N] = x2 @ w.T for a few rows and an unquantized w on ``_gemv_rows_kernel`` (``tile.split``: programs
    over K; ``round_to`` / ``out_scale``: as ``_finish``)."""
    M, K = x2.shape
    N = w.shape[0]
    per_split = triton.cdiv(triton.cdiv(K, tile.split), tile.block_k) * tile.block_k
    split = triton.cdiv(K, per_split)
    grid = (triton.cdiv(N, tile.block_n), split)
    if split > 1:
        part = torch.empty(split, M, N, dtype=torch.float32, device=x2.device)
        counters = tile_counters(x2.device)
        assert grid[0] <= counters.numel()
    else:
        part = counters = out
    _gemv_rows_kernel[grid](x2, w, out, part, counters, M, N, K, x2.stride(0), per_split, BLOCK_M=next_pow2(M),
                            BLOCK_N=tile.block_n, BLOCK_K=tile.block_k, SPLIT=split > 1,
                            ROUND_TO=None if round_to is None else TL_DTYPES[round_to], OUT_SCALE=float(out_scale),
                            num_warps=tile.num_warps, **pdl_launch())


def _tiles(x2: torch.Tensor, w: torch.Tensor, scale_inv: torch.Tensor | None, out: torch.Tensor, block_m: int,
           tile: LinearTile, upcast: bool = False, round_to: torch.dtype | None = None, out_scale: float = 1.0,
           f32_prec: str = "ieee") -> None:
    """out [M, N] = x2 @ W.T on the tile kernel (``upcast``, ``round_to``, ``out_scale``, ``f32_prec``: as the
    kernel's ``F32_PREC``)."""
    M, K = x2.shape
    N = w.shape[0]
    assert (128 % tile.block_n == 0 or tile.block_n % 128 == 0) and tile.block_k % 128 == 0
    k_steps = triton.cdiv(K, tile.block_k)
    per_split = triton.cdiv(k_steps, tile.split)
    split = triton.cdiv(k_steps, per_split)
    grid = (triton.cdiv(N, tile.block_n), triton.cdiv(M, block_m), split)
    if split > 1:
        part = torch.empty(split, M, N, dtype=torch.float32, device=x2.device)
        counters = tile_counters(x2.device)
        assert grid[0] * grid[1] <= counters.numel()
    else:
        part = counters = out
    _tile_kernel[grid](x2, w, w if scale_inv is None else scale_inv, out, part, counters, M, N, K,
                             x2.stride(0), N, triton.cdiv(K, 128), per_split, BLOCK_M=block_m,
                             BLOCK_N=tile.block_n, BLOCK_K=tile.block_k, SPLIT=split > 1,
                             PREC=dot_precision(x2.dtype), HAS_SCALE=scale_inv is not None, UPCAST=upcast,
                             ROUND_TO=None if round_to is None else TL_DTYPES[round_to], OUT_SCALE=float(out_scale),
                             SWAP=tile.swap, PRESCALE=tile.prescale and scale_inv is not None and not upcast,
                             F32_PREC=f32_prec, num_warps=tile.num_warps, num_stages=tile.num_stages,
                             **pdl_launch(tile=True))


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


@ops.register("linear_group", backend="triton", available=on_cuda)
def linear_group(x: torch.Tensor, *weights: tuple) -> tuple[torch.Tensor, ...]:
    """As ``reference.linear_group``; two or three FP8 projections of one input in one launch (views of one
    output): 2..8 bf16 rows on the Gluon rows kernel — q_a, kv_a and the indexer's wk (apart, kv_a and wk take a
    Triton tile launch each: 8 rows 8.4 + 5.8 + 4.9 µs in session 30's profile), q_b and wq_b —, 16..256 on the
    Gluon mid-size kernel where it applies to the whole group, one row on the GEMV up to GEMV_GROUP_N outputs (q_b +
    wq_b as one GEMV measured slower than two: session 28)."""
    K = x.shape[-1]
    (wa, sa), more = weights[0], weights[1:]
    x2 = x.reshape(-1, K)
    sizes = [w.shape[0] for w, _ in weights]
    fits = 1 <= len(more) <= 2 and wa.dim() == 2 and all(
        s is not None and w.shape[1:] == wa.shape[1:] and w.dtype == wa.dtype and w.is_contiguous()
        and s.is_contiguous() for w, s in weights)
    tile = None
    if fits and x2.shape[0] == 1 and sum(sizes) <= GEMV_GROUP_N:
        tile = gemv_tile(sum(sizes), K)
    elif fits and gluon_rows.usable(x2, sum(sizes)):
        tile = gluon_rows.rows_tile(x2.shape[0], sum(sizes), K, num_sms())
    elif fits and gluon_mid.usable(x2, sum(sizes), K, tuple(w for w, _ in weights)):
        tile = gluon_mid.mid_tile(x2.shape[0], sum(sizes), K, num_sms())
    if tile is None or any(n % tile.block_n for n in sizes[:-1]):      # a tile must lie in one weight
        return tuple(ops.linear(x, w, s) for w, s in weights)         # the configured linear (W8A8 prefill too)
    out = torch.empty(x2.shape[0], sum(sizes), dtype=x.dtype, device=x.device)
    if isinstance(tile, GemvTile):
        _gemv(x2.contiguous(), wa, sa, out, tile, more=more)
    elif isinstance(tile, gluon_mid.MidTile):
        gluon_mid.fp8_linear_mid(x2.contiguous(), wa, sa, out, tile, tile_counters(x.device), more=more)
    else:
        gluon_rows.fp8_linear_rows(x2.contiguous(), wa, sa, out, tile, tile_counters(x.device), more=more)
    return tuple(out.view(*x.shape[:-1], -1).split(sizes, dim=-1))


@ops.register("linear_f32", backend="triton", available=on_cuda)
def linear_f32(x: torch.Tensor, weight: torch.Tensor, rounded: bool = False, scale: float = 1.0) -> torch.Tensor:
    """As ``reference.linear_f32`` for a 2-D unquantized weight: one row on the one-row kernel, to GEMV_ROWS
    rows on its several-row form, up to PREFILL_ROWS on the tile kernel (``f32_tile``; fp32 as 3-pass TF32 dots, or,
    ``rounded``, dots in x's dtype), rounding and scale in their stores; more rows (prefill) on the reference."""
    K = x.shape[-1]
    x2 = x.reshape(-1, K)
    M = x2.shape[0]
    if not 0 < M <= PREFILL_ROWS or weight.dim() != 2 or not weight.is_contiguous() \
            or weight.dtype not in TL_DTYPES or x.dtype not in TL_DTYPES or (rounded and weight.dtype != x.dtype):
        return reference.linear_f32(x, weight, rounded, scale)
    x2 = x2.contiguous()
    N = weight.shape[0]
    out = torch.empty(M, N, dtype=torch.float32, device=x.device)
    round_to = x.dtype if rounded else None
    if M == 1:
        _gemv(x2, weight, None, out, gemv_tile(N, K), round_to=round_to, out_scale=scale)
    elif M <= GEMV_ROWS:
        _gemv_rows(x2, weight, out, gemv_rows_tile(M, N, K), round_to=round_to, out_scale=scale)
    else:
        block_m, tile = f32_tile(M, N, K)
        _tiles(x2, weight, None, out, block_m, tile, upcast=not rounded, round_to=round_to, out_scale=scale,
               f32_prec="tf32x3")
    return out.view(*x.shape[:-1], N)


def f32_tile(M: int, N: int, K: int) -> tuple[int, LinearTile]:
    """``linear_f32``'s tile-kernel launch past GEMV_ROWS rows: (rows a block, tile). To DECODE_ROWS all rows in one
    block on the decode tile; past that (a dp step's MoE over every rank's rows: the router's logits under 128 / 256
    rows, which cuBLAS ran as fp32 FMA GEMMs, 25 µs and a split-K reduce a layer) 64-row blocks of the decode tile,
    split over K to ~2 programs an SM."""
    tile = decode_tile(M, N, K)
    if M <= DECODE_ROWS:
        return max(16, next_pow2(M)), tile
    tiles = triton.cdiv(N, tile.block_n) * triton.cdiv(M, 64)
    return 64, replace(tile, split=max(1, min(triton.cdiv(2 * num_sms(), tiles), triton.cdiv(K, 128) // 2)))


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
