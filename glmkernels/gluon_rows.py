"""Gluon (Triton's layout-explicit dialect) kernels for a few rows: the FP8 block-scaled linear
``y = x @ (W8 · S).T`` for 2..MAX_ROWS bf16 rows and the fused MoE experts' two GEMMs for 2..MOE_MAX_ROWS.

The Triton tile kernels (glmkernels/triton_linear.py, triton_moe.py) hand ``tl.dot`` a weight tile loaded in
a coalesced layout; the compiler then moves it through shared memory into the tensor cores' operand layout
(a store, a barrier and ldmatrix every K step). Here the layouts are ours to name, so the weight is loaded
from HBM straight into the registers of an ``mma.sync`` A operand and never touches shared memory:

* the accumulator is an Ampere-style MMA layout (``NVMMADistributedLayout`` v2, m16n8k16), its M the
  weight's output rows (16 per warp per repeat) and its N the activation rows (8) — the swap that lets
  1–8 rows fill an instruction whose smallest tile is 16 × 8;
* the weight tile is ``DotOperandLayout(0, k_width=16)``: each thread holds 16 consecutive K elements of a
  row, i.e. loads 16 fp8 bytes at once (one ``ld.global.v4``). The activation tile is the B operand in the
  same k_width — a K permutation that A and B share, so the dot product is unchanged;
* fp8 → bf16 is a bit move (``FP8_TO_BF16``): e4m3's sign, exponent and mantissa bits placed into a bf16
  (exponent bias 7 vs 127), then one packed bf16 multiply by 2^120 — exact for every e4m3 value, zeros
  and subnormals included, and cheaper than the cvt chain the compiler emits (e4m3x2 → f16x2, then one
  f16 → bf16 per element; o_proj at 8 rows 57.7 → 52.0 µs with the same launch).

Math as the Triton kernels': fp32 accumulation, each 128-wide K block's product scaled by its one block
scale; split-K partials reduced in split order by the last split to arrive (no float atomics:
bit-identical run to run). Measured on H200 (``bench/rows_gemm.py [--moe]``, bench/results/session9/): at 8
rows o_proj 41.1 → 33.4 µs, dense down 40.9 → 25.6, q_b 16.3 → 13.2; the 8-row MoE (56 experts of 2048)
681 → 566 µs (3.1 → 3.7 TB/s), a tp shard's (57 experts of 256) 119 → 93. The Triton kernels keep
1 row (FMA kernels), > 8 rows, non-bf16 activations, < 1024 outputs (kv_a, indexer wk: no faster here)
and ``GLMSERVE_GLUON=0``. No programmatic dependent launch (the tile kernels run without it by default).
"""

from __future__ import annotations

import functools
import math
import os
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from glmkernels.triton_utils import num_sms, weight_group

try:                                           # Gluon as in triton 3.6 (the device image) and 3.9 (CI)
    from triton.experimental import gluon
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.language.nvidia.ampere import mma_v2
    # the CTA barrier of the split-K reduce: ``thread_barrier`` in triton 3.6, ``barrier`` from 3.9 on
    _cta_barrier = getattr(gl, "thread_barrier", None) or getattr(gl, "barrier", None)
    HAVE_GLUON = all(hasattr(gl, a) for a in ("NVMMADistributedLayout", "DotOperandLayout", "inline_asm_elementwise")) \
        and hasattr(gluon, "constexpr_function") and _cta_barrier is not None
except ImportError:                            # pragma: no cover - another triton: the Triton tile kernels run
    HAVE_GLUON = False

MAX_ROWS = 8
MOE_MAX_ROWS = 256      # the expert kernels: up to a graph step's MoE (triton_moe.FUSED_MAX_ROWS)
RUN_PAIRS = 8           # pairs of an expert's run a program takes (the mma's N side); a longer run goes in chunks

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
    @gluon.constexpr_function
    def _acc_layout(warps):
        """The accumulator: m16n8k16 MMA tiles, warps stacked along the weight's output rows."""
        return gl.NVMMADistributedLayout(version=[2, 0], warps_per_cta=[warps, 1], instr_shape=[16, 8])

    @gluon.constexpr_function
    def _operand_layout(index, warps):
        """A (0: the weight, 16 consecutive K bytes a thread) or B (1: the activation rows) of that MMA."""
        return gl.DotOperandLayout(operand_index=index, parent=_acc_layout(warps), k_width=16)

    @gluon.jit
    def _k_lanes(WARPS: gl.constexpr):
        """The 128 K offsets of one scale block in the weight's (A) and the activations' (B) operand layouts."""
        return (gl.arange(0, 128, layout=gl.SliceLayout(0, _operand_layout(0, WARPS))),
                gl.arange(0, 128, layout=gl.SliceLayout(1, _operand_layout(1, WARPS))))

    @gluon.jit
    def _to_bf16(w, BITS: gl.constexpr):
        """An e4m3 weight tile in bf16, same layout: the bit move (``FP8_TO_BF16``) or the compiler's cvt."""
        if BITS:
            return gl.inline_asm_elementwise(_FP8_TO_BF16, "=r,=r,r", [w], dtype=gl.bfloat16, is_pure=True,
                                             pack=4)
        else:
            return w.to(gl.bfloat16)

    @gluon.jit
    def _rows_kernel(x_ptr, w_ptr, s_ptr, out_ptr, part_ptr, count_ptr, M, N, K, stride_xm, num_sb_k,
                     kb_per_split, N_a, N_ab, w_b_off, s_b_off, w_c_off, s_c_off, BLOCK_N: gl.constexpr,
                     BLOCK_M: gl.constexpr, SUB: gl.constexpr, WARPS: gl.constexpr, SPLIT: gl.constexpr,
                     BITS: gl.constexpr, EVEN_K: gl.constexpr, GROUP: gl.constexpr = False):
        """out[m, n] = Σ_k x[m, k] · W8[n, k] · S[n // 128, k // 128] for BLOCK_N outputs × this split's K
        blocks, the M ≤ BLOCK_M rows on the MMA's N side; split partials reduced by the last split.

        ``GROUP``: outputs from N_a on come from a second weight (and scales) at element offsets ``w_b_off`` /
        ``s_b_off`` from the first, from N_ab on from a third (``w_c_off`` / ``s_c_off``) — several projections
        of one input in one launch, as triton_linear._gemv_kernel's one row (N_a, N_ab multiples of BLOCK_N)."""
        mma: gl.constexpr = _acc_layout(WARPS)
        wl: gl.constexpr = _operand_layout(0, WARPS)
        xl: gl.constexpr = _operand_layout(1, WARPS)
        pid_n = gl.program_id(0)
        pid_k = gl.program_id(1)
        kw, kx = _k_lanes(WARPS)
        rm = gl.arange(0, BLOCK_M, layout=gl.SliceLayout(0, xl))
        x_rows = x_ptr + rm[None, :] * stride_xm
        if GROUP:                              # this tile's weight: its first row there, its N, its offsets
            in_b = pid_n * BLOCK_N >= N_a
            in_c = pid_n * BLOCK_N >= N_ab
            r0 = pid_n * BLOCK_N - gl.where(in_c, N_ab, gl.where(in_b, N_a, 0))
            n_w = gl.where(in_c, N - N_ab, gl.where(in_b, N_ab - N_a, N_a))
            rn = r0 + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(1, wl))
            w_rows = w_ptr + gl.where(in_c, w_c_off, gl.where(in_b, w_b_off, 0)) + rn[:, None] * K
            s_row = s_ptr + gl.where(in_c, s_c_off, gl.where(in_b, s_b_off, 0)) + r0 // 128 * num_sb_k
        else:
            n_w = N
            rn = pid_n * BLOCK_N + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(1, wl))
            w_rows = w_ptr + rn[:, None] * K
            s_row = s_ptr + (pid_n * BLOCK_N) // 128 * num_sb_k
        acc = gl.zeros([BLOCK_N, BLOCK_M], gl.float32, layout=mma)
        kb0 = pid_k * kb_per_split
        kb_end = gl.minimum(kb0 + kb_per_split, num_sb_k)
        for kb in range(kb0, kb_end, SUB):
            for j in gl.static_range(SUB):     # SUB scale blocks a step, each its own product and scale
                k = (kb + j) * 128
                w_mask = (rn[:, None] < n_w) & (kb + j < kb_end)
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
            _cta_barrier()
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


def _rows_fit(x2: torch.Tensor, max_rows: int = MAX_ROWS) -> bool:
    """Gluon on and x2 [M, ·] bf16 with 2..max_rows rows on an sm_80+ GPU (the capability cached per device)."""
    return (enabled() and x2.is_cuda and x2.dtype == torch.bfloat16 and 2 <= x2.shape[0] <= max_rows
            and _sm_major(x2.device.index or 0) >= 8)


@functools.cache
def _sm_major(index: int) -> int:
    return torch.cuda.get_device_capability(index)[0]


def usable(x2: torch.Tensor, N: int) -> bool:
    """The rows kernel applies: ``_rows_fit`` and at least 1024 outputs (below that the Triton tile kernel
    measured as fast or faster: bench/results/session9/)."""
    return N >= 1024 and _rows_fit(x2)


def rows_tile(M: int, N: int, K: int, sms: int) -> RowsTile:
    """The launch measured best on H200 over the GLM-5.2 decode shapes at 2–8 rows (``bench/rows_gemm.py``,
    bench/results/session9/rows_gemm_call2.md): 128 weight rows on 8 warps for long rows or many outputs
    (o_proj, dense down, q_b), else 64 on 4; four 128-wide K blocks a step; split-K to the programs that fit an SM
    at once (32 warps: 4 of 8 warps, 8 of 4), rounded down to whole waves, each split ≥ one step. Rounded up, the
    dense gate / up as one group (192 tiles of 8 warps) took 3 splits, a second wave 1/10 full: 54.6 µs at 8 rows,
    2 splits 44.2; the 1/8 dense gate / up 12.1 → 10.6 (12 splits; bench/linear_group.py, session36/call1)."""
    block_n, warps = (128, 8) if K >= 8192 or N >= 16384 else (64, 4)
    split = max(1, min(32 // warps * sms // triton.cdiv(N, block_n), triton.cdiv(K, 128) // 4))
    return RowsTile(block_n, 4, split, warps)


def fp8_linear_rows(x2: torch.Tensor, w8: torch.Tensor, scale_inv: torch.Tensor, out: torch.Tensor,
                    tile: RowsTile, counters: torch.Tensor, more: tuple = ()) -> None:
    """out [M, N] (bf16) = x2 [M, K] (bf16, rows contiguous) @ (w8 [N, K] e4m3 · scale_inv).T, or w8 stacked over
    ``more``'s one or two FP8 (weight, scales) of the same K (``triton_utils.weight_group``; N = all of them)."""
    M, K = x2.shape
    assert tile.block_n % (16 * tile.num_warps) == 0 and 128 % tile.block_n == 0 and x2.stride(1) == 1
    N, *group = weight_group(w8, scale_inv, more, tile.block_n)
    kbs = triton.cdiv(K, 128)
    per_split = triton.cdiv(triton.cdiv(kbs, tile.split), tile.sub) * tile.sub
    split = triton.cdiv(kbs, per_split)
    grid = (triton.cdiv(N, tile.block_n), split)
    if split > 1:
        part = torch.empty(split, M, N, dtype=torch.float32, device=x2.device)
        assert grid[0] <= counters.numel()
    else:
        part = counters = out
    _rows_kernel[grid](x2, w8, scale_inv, out, part, counters, M, N, K, x2.stride(0), kbs, per_split, *group,
                       BLOCK_N=tile.block_n, BLOCK_M=max(8, triton.next_power_of_2(M)), SUB=tile.sub,
                       WARPS=tile.num_warps, SPLIT=split > 1, BITS=tile.bits, EVEN_K=K % 128 == 0,
                       GROUP=bool(more), num_warps=tile.num_warps)


# ---------------------------------------------------------------------------------------------------------
# Fused MoE experts for 2..MOE_MAX_ROWS rows: the two GEMM launches of triton_moe.fused_moe (gate/up with SiLU,
# down with the routing weight) on the same register-operand mma. Routing, sorted pairs and the combine are
# triton_moe's; ≤ 8 (``MoeTile.pairs``: 16) pairs of an expert's run are the mma's N side, a longer run goes in chunks, a
# program each — the grid over every sorted pair (a program exits unless it starts a chunk) or over ``run_chunks``'
# list of chunk starts (many rows: most positions start none).
# ---------------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class MoeTile:
    """gate/up: BLOCK_I expert outputs a program, H split over ``split`` programs (narrow experts have few
    tiles to spread); down: BLOCK_HO outputs a program; both SUB 128-wide K blocks a step, ``pairs`` of a run."""
    block_i: int
    split: int
    block_ho: int
    sub: int = 2
    gu_warps: int = 4
    dn_warps: int = 4
    pairs: int = RUN_PAIRS     # the most pairs of a run a program takes (the mma's N side)
    compact: bool = False      # grid over the runs' chunks (``run_chunks``) instead of every sorted pair
    ho_steps: int = 1          # down: BLOCK_HO-output blocks a program takes in turn (its run looked up once)


if HAVE_GLUON:
    @gluon.jit
    def _position(chunk_ptr, COMPACT: gl.constexpr):
        """This program's sorted position and whether it may own a chunk: its grid index, or (COMPACT) the
        index's entry of ``run_chunks``' list (-1 past the chunks)."""
        if COMPACT:
            p = gl.load(chunk_ptr + gl.program_id(0))
            return gl.maximum(p, 0), p >= 0
        else:
            return gl.program_id(0), gl.program_id(0) >= 0

    @gluon.jit
    def _run(sorted_e_ptr, sorted_pair_ptr, run_start_ptr, p, listed, P, E_local, BLOCK_R: gl.constexpr,
             layout: gl.constexpr):
        """The chunk of an expert's run that sorted position p owns, as triton_moe._run_rows: (expert, p owns it
        — p is BLOCK_R · c pairs into its run —, in_run [BLOCK_R], positions [BLOCK_R], pair ids [BLOCK_R]) in
        ``layout``."""
        e = gl.load(sorted_e_ptr + p)
        owner = listed & (e < E_local) & ((p - gl.load(run_start_ptr + p)) % BLOCK_R == 0)
        j = p + gl.arange(0, BLOCK_R, layout=layout)
        in_run = (j < P) & (gl.load(sorted_e_ptr + j, mask=j < P, other=-1) == e) & owner
        pair = gl.load(sorted_pair_ptr + j, mask=in_run, other=0)
        return e, owner, in_run, j, pair

    @gluon.jit
    def _moe_gate_up_kernel(x_ptr, g_ptr, u_ptr, gs_ptr, us_ptr, sg_off, su_off, sgs_off, sus_off, E_shared,
                            sorted_e_ptr, sorted_pair_ptr, run_start_ptr, chunk_ptr, act_ptr, part_ptr, count_ptr, P,
                            E_local, H, I, num_sb_h, num_sb_i, kb_per_split, TOPK: gl.constexpr,
                            BLOCK_I: gl.constexpr, BLOCK_R: gl.constexpr, SUB: gl.constexpr, WARPS: gl.constexpr,
                            SPLIT: gl.constexpr, BITS: gl.constexpr, COMPACT: gl.constexpr):
        """act[j] = silu(x[row_j] @ G_e.T) * (x[row_j] @ U_e.T) for the run's pairs j, each rounded as the
        reference rounds; split over H: the last split of a tile adds the partials in split order. Expert E_shared
        (-1: none) is the shared expert, its weights and scales at element offsets ``s*_off`` from the stacked
        tensors' (as triton_moe's kernels)."""
        mma: gl.constexpr = _acc_layout(WARPS)
        wl: gl.constexpr = _operand_layout(0, WARPS)
        xl: gl.constexpr = _operand_layout(1, WARPS)
        p, listed = _position(chunk_ptr, COMPACT)
        ib = gl.program_id(1)
        ks = gl.program_id(2)
        e, owner, in_run, _j_x, pair = _run(sorted_e_ptr, sorted_pair_ptr, run_start_ptr, p, listed, P, E_local,
                                            BLOCK_R, gl.SliceLayout(0, xl))
        ri = ib * BLOCK_I + gl.arange(0, BLOCK_I, layout=gl.SliceLayout(1, wl))
        kw, kx = _k_lanes(WARPS)
        shared = e == E_shared
        w_e = e.to(gl.int64) * I * H
        g_off = gl.where(shared, sg_off, w_e) + ri[:, None] * H
        u_off = gl.where(shared, su_off, w_e) + ri[:, None] * H
        x_rows = x_ptr + (pair // TOPK)[None, :] * H
        s_e = e.to(gl.int64) * num_sb_i * num_sb_h
        s_blk = ((ib * BLOCK_I) // 128) * num_sb_h
        gs_off = gl.where(shared, sgs_off, s_e) + s_blk
        us_off = gl.where(shared, sus_off, s_e) + s_blk
        acc_g = gl.zeros([BLOCK_I, BLOCK_R], gl.float32, layout=mma)
        acc_u = gl.zeros([BLOCK_I, BLOCK_R], gl.float32, layout=mma)
        kb0 = ks * kb_per_split
        kb_end = gl.where(owner, gl.minimum(kb0 + kb_per_split, num_sb_h), kb0)
        for kb in range(kb0, kb_end, SUB):
            for s in gl.static_range(SUB):
                k = (kb + s) * 128
                live = kb + s < kb_end
                wm = (ri[:, None] < I) & live
                wg = gl.load(g_ptr + g_off + (k + kw)[None, :], mask=wm, other=0.0, eviction_policy="evict_first")
                wu = gl.load(u_ptr + u_off + (k + kw)[None, :], mask=wm, other=0.0, eviction_policy="evict_first")
                x = gl.load(x_rows + (k + kx)[:, None], mask=in_run[None, :] & live, other=0.0)
                zero = gl.zeros([BLOCK_I, BLOCK_R], gl.float32, layout=mma)
                acc_g += mma_v2(_to_bf16(wg, BITS), x, zero) * gl.load(gs_ptr + gs_off + kb + s, mask=live, other=0.0)
                acc_u += mma_v2(_to_bf16(wu, BITS), x, zero) * gl.load(us_ptr + us_off + kb + s, mask=live, other=0.0)
        if owner:
            _e_o, _owner_o, in_run_o, j_o, _pair_o = _run(sorted_e_ptr, sorted_pair_ptr, run_start_ptr, p, listed, P,
                                                          E_local, BLOCK_R, gl.SliceLayout(0, mma))
            io = ib * BLOCK_I + gl.arange(0, BLOCK_I, layout=gl.SliceLayout(1, mma))
            mask = in_run_o[None, :] & (io[:, None] < I)
            if SPLIT:
                tile = p * gl.num_programs(1) + ib
                lane = gl.arange(0, BLOCK_R, layout=gl.SliceLayout(0, mma))
                loc = (io - ib * BLOCK_I)[:, None] * BLOCK_R + lane[None, :]
                stride = 2 * BLOCK_I * BLOCK_R
                base = part_ptr + tile.to(gl.int64) * gl.num_programs(2) * stride
                gl.store(base + ks * stride + loc, acc_g)
                gl.store(base + ks * stride + BLOCK_I * BLOCK_R + loc, acc_u)
                _cta_barrier()
                if gl.atomic_add(count_ptr + tile, 1, sem="acq_rel") == gl.num_programs(2) - 1:
                    acc_g = gl.zeros([BLOCK_I, BLOCK_R], gl.float32, layout=mma)
                    acc_u = gl.zeros([BLOCK_I, BLOCK_R], gl.float32, layout=mma)
                    for s in range(gl.num_programs(2)):
                        acc_g += gl.load(base + s * stride + loc, cache_modifier=".cg")
                        acc_u += gl.load(base + s * stride + BLOCK_I * BLOCK_R + loc, cache_modifier=".cg")
                    _store_act(act_ptr, acc_g, acc_u, j_o, io, I, mask)
                    gl.store(count_ptr + tile, 0)
            else:
                _store_act(act_ptr, acc_g, acc_u, j_o, io, I, mask)

    @gluon.jit
    def _store_act(act_ptr, acc_g, acc_u, j, i, I, mask):
        dt: gl.constexpr = act_ptr.dtype.element_ty
        g = acc_g.to(dt).to(gl.float32)
        u = acc_u.to(dt).to(gl.float32)
        a = (g / (1.0 + gl.exp(-g))).to(dt).to(gl.float32) * u
        gl.store(act_ptr + j[None, :] * I + i[:, None], a.to(dt), mask=mask)

    @gluon.jit
    def _moe_down_kernel(act_ptr, d_ptr, ds_ptr, sd_off, sds_off, E_shared, w_route_ptr, sorted_e_ptr, sorted_pair_ptr,
                         run_start_ptr, chunk_ptr, y_ptr, P, E_local, H, I, num_sb_h, num_sb_i,
                         BLOCK_HO: gl.constexpr, BLOCK_R: gl.constexpr, SUB: gl.constexpr, WARPS: gl.constexpr,
                         BITS: gl.constexpr, COMPACT: gl.constexpr, HO_STEPS: gl.constexpr):
        """y[pair] = round(round(act[j] @ D_e.T) · w_route[pair]) for the run's pairs j (E_shared: as the gate/up
        kernel's), over HO_STEPS blocks of BLOCK_HO outputs in turn."""
        mma: gl.constexpr = _acc_layout(WARPS)
        wl: gl.constexpr = _operand_layout(0, WARPS)
        xl: gl.constexpr = _operand_layout(1, WARPS)
        p, listed = _position(chunk_ptr, COMPACT)
        e, owner, in_run, j, _pair_x = _run(sorted_e_ptr, sorted_pair_ptr, run_start_ptr, p, listed, P, E_local,
                                            BLOCK_R, gl.SliceLayout(0, xl))
        _e_o, _owner_o, in_run_o, _j_o, pair_o = _run(sorted_e_ptr, sorted_pair_ptr, run_start_ptr, p, listed, P,
                                                      E_local, BLOCK_R, gl.SliceLayout(0, mma))
        kw, kx = _k_lanes(WARPS)
        shared = e == E_shared
        a_rows = act_ptr + j[None, :] * I
        dt: gl.constexpr = y_ptr.dtype.element_ty
        w = gl.load(w_route_ptr + pair_o, mask=in_run_o, other=0.0)
        kb_end = gl.where(owner, num_sb_i, 0)
        for hs in range(HO_STEPS):
            hb = gl.program_id(1) * HO_STEPS + hs
            rh = hb * BLOCK_HO + gl.arange(0, BLOCK_HO, layout=gl.SliceLayout(1, wl))
            d_rows = d_ptr + gl.where(shared, sd_off, e.to(gl.int64) * H * I) + rh[:, None] * I
            s_off = gl.where(shared, sds_off, e.to(gl.int64) * num_sb_h * num_sb_i) \
                + ((hb * BLOCK_HO) // 128) * num_sb_i
            acc = gl.zeros([BLOCK_HO, BLOCK_R], gl.float32, layout=mma)
            for kb in range(0, kb_end, SUB):
                for s in gl.static_range(SUB):
                    k = (kb + s) * 128
                    live = kb + s < kb_end
                    wd = gl.load(d_rows + (k + kw)[None, :], mask=(rh[:, None] < H) & live, other=0.0,
                                 eviction_policy="evict_first")
                    a = gl.load(a_rows + (k + kx)[:, None], mask=in_run[None, :] & live, other=0.0)
                    acc += mma_v2(_to_bf16(wd, BITS), a, gl.zeros([BLOCK_HO, BLOCK_R], gl.float32, layout=mma)) \
                        * gl.load(ds_ptr + s_off + kb + s, mask=live, other=0.0)
            if owner:
                ho = hb * BLOCK_HO + gl.arange(0, BLOCK_HO, layout=gl.SliceLayout(1, mma))
                y = (acc.to(dt).to(gl.float32) * w[None, :]).to(dt)
                gl.store(y_ptr + pair_o[None, :] * H + ho[:, None], y, mask=in_run_o[None, :] & (ho[:, None] < H))


def moe_usable(x: torch.Tensor, gate: torch.Tensor, has_scale: bool) -> bool:
    """The Gluon expert kernels apply: ``_rows_fit`` for x [N, H] but up to MOE_MAX_ROWS rows, FP8 experts with H
    and I multiples of 128."""
    return has_scale and x.shape[1] % 128 == 0 and gate.shape[1] % 128 == 0 and _rows_fit(x, MOE_MAX_ROWS)


def moe_tile(H: int, I: int, experts_hit: int, sms: int, rows: int = 8, share: float = 1.0) -> MoeTile:
    """The launch measured best on H200 at 8 rows of 256 experts (``bench/rows_gemm.py --moe``,
    bench/results/session9/call6, call7). Wide experts (I ≥ 1024): 128 outputs a program on 8 warps for gate/up
    and down, H unsplit (I 2048: 681 → 567–610 µs against the Triton tile kernels). A tp shard's narrow
    experts have few gate/up tiles: 64 outputs on 4 warps, H split to ~16 programs per SM, ≥ 4 K blocks each
    (I 256: split 3 / 5 / 10 = 107 / 102 / 99 µs in one run, against 120 for the Triton tile kernels).
    Past 8 rows (swept at 16–64; bench/results/session18/, calls 2–3): gate/up 128 outputs on 8 warps, H unsplit;
    down 64 outputs on 4 warps, 128 on 8 for wide experts from 32 rows (I 2048, 32 / 64 rows: 1613–1748 /
    2438–2459 µs against 1648–1866 / 2499–2512 with 64). In all, I 2048 at 16 / 32 / 64 rows: 972–1102 / 1613–1748
    / 2438–2459 µs against the Triton tile kernels' 1118–1274 / 1872–2032 / 2751–2836; I 256: 154–165 / 276–277 /
    432 against 185–207 / 318–330 / 542–548 (two calls each). At 128 rows (call 8, bench/moe_prefill.py --fused,
    routing and combine included): 2.88 / 0.55 ms at I 2048 / 256, the grouped launches 5.47 / 1.77; at 256 rows
    (session 19, call 1) 3.41 / 0.67 against 5.44 / 1.72.
    Where an expert's run averages ≥ 4 pairs (a dp step's MoE over every rank's rows: 128 / 256 rows of top-8 on 256
    experts) the grid goes over the runs' chunks, not every sorted pair (at 256 rows the down launch was 2048 × 96
    programs for ~300 chunks), and from 8 pairs a program takes 16 pairs, one K block a step, 64 outputs on 4 warps
    for both GEMMs (session 20, bench/results/session20/: 'rank of dp 8' step at 16 / 32 rows a rank 2.755 → 2.719,
    3.420 → 3.294 ms with the chunk grid, then 3.327 → 3.214 with 16 pairs, one block a step). ``experts_hit`` is
    min(pairs, experts held): in an ep shard a run averages 1/world of what this assumes (not measured there).
    Wide experts at 2 rows (session 32, bench/moe_few_rows.py, the shared expert fused, 4 routings): ~17 runs (16
    routed experts and the shared one) make 17 × 16 gate/up programs of 8 warps, just past one wave of 2 an SM, and
    the last few ran alone: H split in 4 (4.1 waves), 242.8 → 203.7 µs a call; from 3 rows no split measured faster
    than none by more than 2.3 % (3 / 4 / 5 / 6 / 8 rows: 286.7 / 327.5 / 416.5 / 470.1 / 590.6 µs unsplit).
    An ep rank (session 33, ``moe_few_rows.py --held 32``: 32 experts of 2048 held, ``share`` = 1/8 of the pairs
    here, ``experts_hit`` the runs expected here): at 4 / 8 rows its ~4–8 runs' gate/up programs are a fraction of a
    wave, and H split in 4 took 112.8 / 132.6 → 75.9 / 103.7 µs a call — one rule with the 2-row split: split in 4
    where the unsplit gate/up programs (a run's I / 128) are ≤ 2.5 an SM. Past 8 rows most sorted positions are other
    ranks' pairs and runs are short (1–4 pairs): the chunk grid with 8-pair programs, 32 / 64 / 128 rows 307.8 / 336.1
    / 379.1 → 270.7 / 311.2 / 347.3 µs against the pick that counted every pair as local (16 rows: equal).
    Narrow experts past 8 rows (session 34, ``moe_few_rows.py --inter 256 --down``, 3 routings): the down launch's
    programs (a chunk × 64 of H's outputs, two K blocks of I 256) are short — 36,864 of them at 256 rows, 86
    registers, 5 CTAs an SM, 2.45 TB/s in Nsight Compute — and a program taking 4 output blocks in turn (its run
    looked up once) took 64 / 128 / 256 rows 323.1 / 412.7 / 524.4 → 313.1 / 394.3 / 503.8 µs a call (128 outputs,
    8 warps, 1–4 blocks: 317.7–330.0 / 398.3–422.1 / 507.6–530.3; 32 pairs a program or a K block a step: slower).
    One K block a step (``sub`` 1) at ≤ 8 rows (session 34, call 4, 4 routings): narrow experts at 2 / 3 / 4 / 6 / 8
    rows 42.5 / 54.9 / 63.2 / 81.2 / 102.7 → 36.4 / 49.1 / 58.4 / 72.7 / 89.3 µs (its programs hold fewer registers).
    Wide experts keep two: slower with one from 4 rows (320.6 → 396.2) and on an ep rank (85.3 → 87.4); at 2 rows
    213.6 → 202.4 in call 4 but 207.5 → 208.9 in call 6 (4 routings): no gain shown."""
    if rows > 8:
        runs = rows * 8 * share / experts_hit      # pairs an expert's run averages (top-8)
        steps = 4 if I < 1024 else 1
        if runs >= 8:
            return MoeTile(64, 1, 64, sub=1, gu_warps=4, dn_warps=4, pairs=16, compact=True, ho_steps=steps)
        if share < 1:
            return MoeTile(128, 1, 64, sub=2, gu_warps=8, dn_warps=4, compact=True, ho_steps=steps)
        wide = I >= 1024 and rows >= 32
        return MoeTile(128, 1, 128 if wide else 64, sub=2, gu_warps=8, dn_warps=8 if wide else 4, compact=runs >= 4,
                       ho_steps=steps)
    if I >= 1024:            # H split in 4 where the runs' programs are about a wave or less (above)
        few = experts_hit * triton.cdiv(I, 128) <= 2.5 * sms
        return MoeTile(128, 4 if few else 1, 128, sub=2, gu_warps=8, dn_warps=8)
    tiles = experts_hit * triton.cdiv(I, 64)
    split = max(1, min(triton.cdiv(16 * sms, tiles), H // 128 // 4))
    return MoeTile(64, split, 64, sub=1, gu_warps=4, dn_warps=4)


def moe_gemms(x: torch.Tensor, gate: torch.Tensor, up: torch.Tensor, down: torch.Tensor, gate_s: torch.Tensor,
              up_s: torch.Tensor, down_s: torch.Tensor, topk_w: torch.Tensor, sorted_e: torch.Tensor,
              sorted_pair: torch.Tensor, run_start: torch.Tensor, act: torch.Tensor, y: torch.Tensor, k: int,
              E_local: int, counters: torch.Tensor, tile: MoeTile | None = None,
              shared: tuple[list[int], int] = ([0] * 6, -1), share: float = 1.0) -> None:
    """The gate/up and down launches of triton_moe.fused_moe for 2..MOE_MAX_ROWS rows: act [P, I] and y [P, H]
    of the sorted pairs (P = N·k; ``run_start``: where each sorted pair's run starts, from route_pairs), as its
    Triton tile kernels write them. ``shared``: the shared expert's element offsets (gate, up, down and their
    scales) and its local expert id (-1: not among the pairs). ``share``: the part of the pairs routed here (an ep
    rank's E_local / E), for the launch's shape only."""
    N, H = x.shape
    I = gate.shape[1]
    P = N * k
    tile = tile or moe_tile(H, I, min(E_local, max(1, math.ceil(P * share))), num_sms(), N, share)
    num_sb_h, num_sb_i = H // 128, I // 128
    per_split = triton.cdiv(triton.cdiv(num_sb_h, tile.split), tile.sub) * tile.sub
    split = triton.cdiv(num_sb_h, per_split)
    n_ib = triton.cdiv(I, tile.block_i)
    if split > 1:
        part = torch.empty(P * n_ib * split * 2 * tile.block_i * tile.pairs, dtype=torch.float32, device=x.device)
        assert P * n_ib <= counters.numel()
    else:
        part = counters
    chunks = run_chunks(sorted_e, run_start, E_local, tile.pairs) if tile.compact else sorted_e
    programs = chunks.numel() if tile.compact else P
    offs, E_shared = shared
    _moe_gate_up_kernel[(programs, n_ib, split)](
        x, gate, up, gate_s, up_s, offs[0], offs[1], offs[3], offs[4], E_shared, sorted_e, sorted_pair, run_start,
        chunks, act, part, counters, P, E_local, H, I, num_sb_h, num_sb_i, per_split, TOPK=k, BLOCK_I=tile.block_i,
        BLOCK_R=tile.pairs, SUB=tile.sub, WARPS=tile.gu_warps, SPLIT=split > 1, BITS=True, COMPACT=tile.compact,
        num_warps=tile.gu_warps)
    assert H % tile.block_ho == 0
    steps = math.gcd(tile.ho_steps, H // tile.block_ho)      # output blocks a program takes: a divisor of H's
    _moe_down_kernel[(programs, H // (tile.block_ho * steps))](
        act, down, down_s, offs[2], offs[5], E_shared, topk_w, sorted_e, sorted_pair, run_start, chunks, y, P, E_local,
        H, I, num_sb_h, num_sb_i, BLOCK_HO=tile.block_ho, BLOCK_R=tile.pairs, SUB=tile.sub, WARPS=tile.dn_warps,
        BITS=True, COMPACT=tile.compact, HO_STEPS=steps, num_warps=tile.dn_warps)


@triton.jit
def _chunks_kernel(sorted_e_ptr, run_start_ptr, chunk_ptr, P, C, E_local, BLOCK_R: tl.constexpr,
                   BLOCK_P: tl.constexpr, BLOCK_C: tl.constexpr):
    p = tl.arange(0, BLOCK_P)
    e = tl.load(sorted_e_ptr + p, mask=p < P, other=E_local)
    own = (e < E_local) & ((p - tl.load(run_start_ptr + p, mask=p < P, other=0)) % BLOCK_R == 0)
    tl.store(chunk_ptr + tl.cumsum(own.to(tl.int32), axis=0) - 1, p, mask=own)
    c = tl.arange(0, BLOCK_C)
    tl.store(chunk_ptr + c, -1, mask=(c >= tl.sum(own.to(tl.int32), axis=0)) & (c < C))


def run_chunks(sorted_e: torch.Tensor, run_start: torch.Tensor, E_local: int, pairs: int) -> torch.Tensor:
    """The sorted positions that start a chunk of ≤ ``pairs`` pairs of a held expert's run, in order, then -1s:
    [C] int32, C = P // pairs + min(E_local, P) (at most that many chunks, whatever the routing — a static grid
    for CUDA graphs). One program (P ≤ 2048 at MOE_MAX_ROWS rows of top-8)."""
    P = sorted_e.numel()
    C = min(P, P // pairs + min(E_local, P))
    out = torch.empty(C, dtype=torch.int32, device=sorted_e.device)
    _chunks_kernel[(1,)](sorted_e, run_start, out, P, C, E_local, BLOCK_R=pairs, BLOCK_P=triton.next_power_of_2(P),
                         BLOCK_C=triton.next_power_of_2(C), num_warps=8)
    return out
