"""Gluon FP8 block-scaled linear ``y = x @ (W8 · S).T`` on Hopper for 16..256 bf16 rows: a mixed step's attention
projections, short prefill chunks, a dp step's MLPs over every rank's rows, batched decode steps of 16..64 rows.

The Triton tile kernel (glmkernels/triton_linear.py) loads every tile with plain loads and lets the compiler stage
them; on these shapes it ran 3–5× its byte / FLOP floor (bench/results/session25/). Here the data path is Hopper's:

* TMA copies each K step's tiles — the fp8 weight [64, 128] and the activations [BLOCK_M, 128] — into a ring of
  STAGES shared-memory buffers, one mbarrier a stage counting its bytes in; step i + STAGES is fetched as soon as
  step i's buffers are read, so the weight streams under the MMAs;
* the product is taken transposed, ``W · x.T``: the weight tile goes from shared memory into the registers of the
  warpgroup MMA's A operand (the 64 outputs are its M), widened there, and the activations are the MMA's B operand
  straight from their TMA buffer (the rows are its N: 16..128);
* the widening is a bit move on each pair of e4m3 bytes as the A layout holds them (two consecutive K a thread):
  ``PAIR_TO_BF16``, glmkernels/gluon_rows.py's move on a 16-bit pair (its four-byte form made the compiler repack the
  pairs: 1.12× slower, median over the sweep);
* step i's MMA is issued asynchronously, and while it runs the warpgroup loads and widens step i + 1's weight tile.

Math as the Triton kernels': fp32 accumulation, each 128-wide K block's product scaled by its one block scale
(``acc += part · S``), split-K partials reduced in split order by the last split to arrive (no float atomics:
bit-identical run to run). TMA zero-fills the edges (rows past M, outputs past N, K past its end): no masks in the
loop. Measured on H200 against the Triton tile kernel's picks on eight GLM-5.2 shapes (``bench/mid_gemm.py --sweep
hopper``, bench/results/session26/): 1.11–1.62× faster at 100 and 200 rows; on the large weights 1.0–1.3× at 16 rows,
1.1–2.2× at 32 and 64; still 1.3–2.4× slower than cuBLAS on the weight dequantized to bf16 beforehand past 64 rows.
Tried and dropped: two warpgroups a program (the CTA barrier each K step holds them in lock step: slower), the weight
scaled before its MMA (the fp32 multiply costs more than the scaled add it saves), two MMAs in flight (ptxas
serialized them: the loop-carried accumulators shared registers).

GPU only (Hopper, sm_90; TMA, wgmma): Triton's CPU interpreter runs no Gluon. Tests: tests/gpu/test_kernels_gpu.py;
on the CPU the launch rule and an sm_90 compile (tests/unit/test_gluon_mid.py, ``bench/gluon_regs.py``).
``GLMSERVE_GLUON=0`` keeps the Triton tile kernels, as for the rows kernels.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton

from glmkernels import gluon_rows
from glmkernels.triton_utils import weight_group

try:                                           # Hopper's Gluon modules, as in triton 3.6 (the device image) and 3.9
    from triton.experimental import gluon
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.language.nvidia.hopper import (
        fence_async_shared,
        mbarrier,
        tma,
        warpgroup_mma,
        warpgroup_mma_wait,
    )
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor
    # TMA's global → shared copy: ``async_load`` in triton 3.9 (which removed 3.6's name, the device image's)
    _tma_load = getattr(tma, "async_load", None) or tma.async_copy_global_to_shared
    HAVE_HOPPER = gluon_rows.HAVE_GLUON
except ImportError:                            # pragma: no cover - another triton: the Triton tile kernel runs
    HAVE_HOPPER = False

# Two e4m3 bytes of a 16-bit register → one bf16x2 register (byte 0 the low half): each byte placed in the high byte
# of a 16-bit lane, its 7 exponent+mantissa bits shifted down by 4 into bf16's fields, its sign kept, then × 2^120
# (0x7B80) from e4m3's exponent bias 7 to bf16's 127 — exact for every e4m3 value (glmkernels/gluon_rows.py's move).
PAIR_TO_BF16 = """{
.reg .b32 a, t, s;
cvt.u32.u16 s, $1;
prmt.b32 a, s, 0, 0x1404;
shr.b32 t, a, 4;
and.b32 t, t, 0x07F007F0;
and.b32 a, a, 0x80008000;
or.b32 a, a, t;
mov.b32 t, 0x7B807B80;
mul.rn.bf16x2 $0, a, t;
}"""
_PAIR_TO_BF16 = gl.constexpr(PAIR_TO_BF16) if HAVE_HOPPER else None
MIN_ROWS = 16          # fewer: glmkernels/gluon_rows.py (2..8) or the Triton decode tile (9..15)
MAX_ROWS = 256         # more: the dequantized weight on cuBLAS (glmkernels/triton_linear.py)
LARGE = 1 << 24        # weight elements (N·K) from which ≤ 64 rows take this kernel: q_b, o_proj, the dense MLP


@dataclass(frozen=True)
class MidTile:
    """Launch of the kernel: BLOCK_N outputs (64 a warpgroup) × BLOCK_M rows a program, K split over ``split``
    programs, a ring of ``stages`` TMA buffers."""
    block_n: int = 64
    block_m: int = 128
    split: int = 1
    stages: int = 4

    @property
    def num_warps(self) -> int:
        return self.block_n // 16           # one warpgroup a 64 outputs


if HAVE_HOPPER:
    @gluon.jit
    def _mid_kernel(x_desc, w_desc, wb_desc, wc_desc, s_ptr, out_ptr, part_ptr, count_ptr, M, N, num_sb_k,
                    kb_per_split, N_a, N_ab, s_b_off, s_c_off, BLOCK_N: gl.constexpr, BLOCK_M: gl.constexpr,
                    STAGES: gl.constexpr, WARPS: gl.constexpr, SPLIT: gl.constexpr, GROUP: gl.constexpr = False):
        """out[m, n] = Σ_k x[m, k] · W8[n, k] · S[n // 128, k // 128] for this program's BLOCK_N outputs ×
        BLOCK_M rows over its split's K blocks; accumulated transposed ([BLOCK_N, BLOCK_M], the rows on the
        MMA's N side).

        ``GROUP``: outputs from N_a on come from a second weight (``wb_desc``, its scales at element offset
        ``s_b_off`` from ``s_ptr``), from N_ab on from a third (``wc_desc``, ``s_c_off``) — several projections of
        one input in one launch, as gluon_rows._rows_kernel's (N_a, N_ab multiples of BLOCK_N)."""
        mma: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[WARPS, 1],
                                                      instr_shape=[16, BLOCK_M, 16])
        wl: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=mma, k_width=2)
        pid_m = gl.program_id(0)               # row tiles first: the programs of one weight tile run together
        pid_n = gl.program_id(1)
        pid_k = gl.program_id(2)
        n0 = pid_n * BLOCK_N
        m0 = pid_m * BLOCK_M
        sel = 0                                # the weight this tile lies in, its first row there
        r0 = n0
        s_off = 0
        if GROUP:
            sel = gl.where(n0 >= N_ab, 2, gl.where(n0 >= N_a, 1, 0))
            r0 = n0 - gl.where(sel == 2, N_ab, gl.where(sel == 1, N_a, 0))
            s_off = gl.where(sel == 2, s_c_off, gl.where(sel == 1, s_b_off, 0))
        kb0 = pid_k * kb_per_split
        steps = gl.minimum(kb_per_split, num_sb_k - kb0)
        w_s = gl.allocate_shared_memory(w_desc.dtype, [STAGES, BLOCK_N, 128], w_desc.layout)
        x_s = gl.allocate_shared_memory(x_desc.dtype, [STAGES, BLOCK_M, 128], x_desc.layout)
        ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        for i in gl.static_range(STAGES):
            mbarrier.init(ready.index(i), count=1)
        fence_async_shared()
        for i in gl.static_range(STAGES):      # the ring's first fill: steps 0 .. STAGES - 1
            _fetch(x_desc, w_desc, wb_desc, wc_desc, w_s, x_s, ready, i, i, r0, m0, kb0, i < steps, sel, GROUP)
        s_row = s_ptr + s_off + r0 // 128 * num_sb_k + kb0
        acc = gl.zeros([BLOCK_N, BLOCK_M], gl.float32, layout=mma)
        mbarrier.wait(ready.index(0), 0)
        a = _widen(w_s.index(0).load(wl))
        for i in range(steps):
            stage = i % STAGES
            part = warpgroup_mma(a, x_s.index(stage).permute((1, 0)), acc, use_acc=False, is_async=True)
            nxt = i + 1                        # the next step's weight widened while this step's MMA runs
            mbarrier.wait(ready.index(nxt % STAGES), (nxt // STAGES) & 1, pred=nxt < steps)
            a = _widen(w_s.index(nxt % STAGES).load(wl))
            acc += warpgroup_mma_wait(0, deps=[part]) * gl.load(s_row + i)
            gluon_rows._cta_barrier()          # every warp is done with this stage's buffers: refill them
            _fetch(x_desc, w_desc, wb_desc, wc_desc, w_s, x_s, ready, stage, i + STAGES, r0, m0, kb0,
                   i + STAGES < steps, sel, GROUP)
        for i in gl.static_range(STAGES):
            mbarrier.invalidate(ready.index(i))
        on = n0 + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(1, mma))
        om = m0 + gl.arange(0, BLOCK_M, layout=gl.SliceLayout(0, mma))
        mask = (om[None, :] < M) & (on[:, None] < N)
        offs = om[None, :] * N + on[:, None]
        if SPLIT:                              # as triton_linear._reduce_splits, in this layout
            gl.store(part_ptr + pid_k * M * N + offs, acc, mask=mask)
            gluon_rows._cta_barrier()
            tile = pid_n * gl.num_programs(0) + pid_m
            if gl.atomic_add(count_ptr + tile, 1, sem="acq_rel") == gl.num_programs(2) - 1:
                total = gl.zeros([BLOCK_N, BLOCK_M], gl.float32, layout=mma)
                for s in range(gl.num_programs(2)):
                    total += gl.load(part_ptr + s * M * N + offs, mask=mask, other=0.0, cache_modifier=".cg")
                gl.store(out_ptr + offs, total.to(out_ptr.dtype.element_ty), mask=mask)
                gl.store(count_ptr + tile, 0)
        else:
            gl.store(out_ptr + offs, acc.to(out_ptr.dtype.element_ty), mask=mask)

    @gluon.jit
    def _widen(w):
        """An e4m3 weight tile in the MMA's A layout, in bf16: ``PAIR_TO_BF16`` on each pair as loaded."""
        return gl.inline_asm_elementwise(_PAIR_TO_BF16, "=r,h", [w], dtype=gl.bfloat16, is_pure=True, pack=2)

    @gluon.jit
    def _fetch(x_desc, w_desc, wb_desc, wc_desc, w_s, x_s, ready, stage, step, r0, m0, kb0, pred, sel,
               GROUP: gl.constexpr):
        """Issue the TMA copies of K step ``step`` (this split's) into ring buffer ``stage`` (if ``pred``): the
        weight tile from row r0 of weight ``sel`` (``GROUP``; else of ``w_desc``)."""
        bar = ready.index(stage)
        mbarrier.expect(bar, w_desc.block_type.nbytes + x_desc.block_type.nbytes, pred=pred)
        k = (kb0 + step) * 128
        if GROUP:
            if sel == 2:
                _tma_load(wc_desc, [r0, k], bar, w_s.index(stage), pred=pred)
            elif sel == 1:
                _tma_load(wb_desc, [r0, k], bar, w_s.index(stage), pred=pred)
            else:
                _tma_load(w_desc, [r0, k], bar, w_s.index(stage), pred=pred)
        else:
            _tma_load(w_desc, [r0, k], bar, w_s.index(stage), pred=pred)
        _tma_load(x_desc, [m0, k], bar, x_s.index(stage), pred=pred)


def applies(M: int, N: int, K: int, group: bool = False) -> bool:
    """The shapes this kernel takes (where it measured faster): MIN_ROWS..MAX_ROWS rows — to 64 rows only on LARGE
    weights (the Triton decode tile was as fast or faster on the smaller ones) —, ≥ 1024 outputs, and K a multiple of
    16 (TMA: the weight's row stride a 16-byte multiple). A ``group`` of weights (``linear_group``) from 512 outputs
    at any of those rows: one launch measured 1.05–2.1× faster than its weights' launches apart on every group of the
    GLM-5.2 shapes at 16..64 rows (q_a / kv_a / wk 1.6–2.1×, a dp rank's shared expert, 2 × 256 outputs, 1.4–1.7×),
    0.98–2.7× past that (``bench/linear_group.py``, bench/results/session35/call2/)."""
    if group:
        return MIN_ROWS <= M <= MAX_ROWS and N >= 512 and K % 16 == 0
    return MIN_ROWS <= M <= MAX_ROWS and N >= 1024 and (M > 64 or N * K >= LARGE) and K % 16 == 0


def usable(x2: torch.Tensor, N: int, K: int, weights: tuple = ()) -> bool:
    """``applies``, with Gluon on and x2 bf16 on a Hopper GPU, its rows' stride and base (and the ``weights``' bases:
    a group of them if more than one) as TMA needs them (16-byte multiples)."""
    return (HAVE_HOPPER and applies(x2.shape[0], N, K, len(weights) > 1) and gluon_rows.enabled() and x2.is_cuda
            and x2.dtype == torch.bfloat16 and x2.stride(0) % 8 == 0 and x2.data_ptr() % 16 == 0
            and all(w.data_ptr() % 16 == 0 for w in weights) and gluon_rows._sm_major(x2.device.index or 0) == 9)


def mid_tile(M: int, N: int, K: int, sms: int) -> MidTile:
    """The launch measured best on H200 over the GLM-5.2 shapes and groups at 16..256 rows (``bench/mid_gemm.py
    --sweep hopper``, ``bench/linear_group.py --sweep``; bench/results/session26/, session27/call1, session36/):
    64 outputs a program (one warpgroup).

    To 64 rows all rows in one tile, a 4-deep ring. At 16 / 32 rows (three or four programs an SM fit) a weight of
    fewer than ~2 programs an SM splits over K for the best balanced waves of at least that many programs
    (``_balanced_split``; session 36: o_proj at 16 rows 41.0 → 32.9 µs, q_a / kv_a / wk 13.5 → 11.6); at 64 rows
    about one program an SM. 65..128 rows: on large weights with long rows (K ≥ 4096: o_proj, the dense MLP) 64 rows
    and a 3-deep ring at ~2 programs an SM (session 27: o_proj at 128 rows 82.2 → 70.3 µs); on the other large
    weights (q_b) 128 rows and a 2-deep ring (the weight tile read once for 128 rows) where two an SM are one wave,
    else as on long rows (q_b with the indexer's wq_b, 20480 outputs: 38.4 → 31.6 µs); else 64 rows, a 4-deep ring.
    Past 128 rows: 128-row tiles on large weights where they pad no more rows than 64-row tiles do (193..256 rows) —
    a 2-deep ring where there are tiles for two an SM (the dense gate / up at 256 rows 195.7 → 175.0 µs), else 4 —,
    else 64 with a 3-deep ring (at 192 rows two 128-row tiles are a third padding: q_a / kv_a / wk 39.7 → 26.1 µs,
    the dense gate / up 213.9 → 155.4); about one program an SM (the 1/8 dense gate / up at 256 rows 43.1 → 30.7 µs
    unsplit: a split's partial sums cost more than the balance it buys), two on the longest rows (K ≥ 8192: o_proj).
    A split count rounds down to whole waves, up on the longest rows; every split ≥ 2 K steps, at most 8, and at
    most 1024 rows summed over the splits."""
    large, kbs = N * K >= LARGE, triton.cdiv(K, 128)
    if M <= 64:
        block_m, stages = max(16, triton.next_power_of_2(M)), 4
    elif M <= 128:
        wave = triton.cdiv(N, 64) <= 2 * sms          # 128-row tiles, two an SM: one wave
        block_m, stages = (64, 3) if large and (K >= 4096 or not wave) else ((128, 2) if large else (64, 4))
    else:
        block_m = 128 if large and -M % 128 < 64 else 64
        stages = 3
    tiles = triton.cdiv(N, 64) * triton.cdiv(M, block_m)
    if block_m == 128 and M > 128:
        stages = 2 if tiles >= 2 * sms else 4         # enough tiles to run two an SM (a 2-deep ring fits two)
    cap = max(1, min(kbs // 2, 8, 1024 // M))
    if M <= 32:
        return MidTile(64, block_m, _balanced_split(tiles, sms, 2 * sms, cap), stages)
    per_sm = 2 if (large and K >= 4096 and 64 < M <= 128) or (K >= 8192 and M > 128) else 1
    split = triton.cdiv(per_sm * sms, tiles) if K >= 8192 else per_sm * sms // tiles
    return MidTile(64, block_m, max(1, min(split, cap)), stages)


def _balanced_split(tiles: int, sms: int, programs: int, cap: int) -> int:
    """The split (≤ ``cap``) of ``tiles`` programs over K with at least ~``programs`` programs whose busiest SM does
    the least work (⌈tiles·s / SMs⌉ / s, the fewest splits of the least); 1 where the tiles alone reach that many."""
    if tiles * 20 >= programs * 19:
        return 1
    low = min(cap, triton.cdiv(programs * 19, tiles * 20))
    return min(range(low, cap + 1), key=lambda s: (triton.cdiv(tiles * s, sms) / s, s))


def fp8_linear_mid(x2: torch.Tensor, w8: torch.Tensor, scale_inv: torch.Tensor, out: torch.Tensor, tile: MidTile,
                   counters: torch.Tensor, more: tuple = ()) -> None:
    """out [M, N] (bf16) = x2 [M, K] (bf16, rows contiguous) @ (w8 [N, K] e4m3 · scale_inv).T, or w8 stacked over
    ``more``'s one or two FP8 (weight, scales) of the same K (``triton_utils.weight_group``; N = all of them)."""
    M, K = x2.shape
    assert tile.block_n in (64, 128) and tile.block_m in (16, 32, 64, 128) and x2.stride(1) == 1
    N, N_a, N_ab, _, s_b_off, _, s_c_off = weight_group(w8, scale_inv, more, tile.block_n)
    kbs = triton.cdiv(K, 128)
    per_split = triton.cdiv(kbs, tile.split)
    split = triton.cdiv(kbs, per_split)
    grid = (triton.cdiv(M, tile.block_m), triton.cdiv(N, tile.block_n), split)
    if split > 1:
        part = torch.empty(split, M, N, dtype=torch.float32, device=x2.device)
        assert grid[0] * grid[1] <= counters.numel()
    else:
        part = counters = out
    w_layout = gl.NVMMASharedLayout.get_default_for([tile.block_n, 128], gl.float8e4nv)
    x_layout = gl.NVMMASharedLayout.get_default_for([tile.block_m, 128], gl.bfloat16)
    w_descs = [TensorDescriptor(w, [w.shape[0], K], [K, 1], [tile.block_n, 128], w_layout)
               for w in (w8, *(w for w, _ in more))]
    w_descs += w_descs[-1:] * (3 - len(w_descs))          # the unused weights' arguments: any descriptor
    x_desc = TensorDescriptor(x2, [M, K], [x2.stride(0), 1], [tile.block_m, 128], x_layout)
    _mid_kernel[grid](x_desc, *w_descs, scale_inv, out, part, counters, M, N, kbs, per_split, N_a, N_ab, s_b_off,
                      s_c_off, BLOCK_N=tile.block_n, BLOCK_M=tile.block_m, STAGES=tile.stages, WARPS=tile.num_warps,
                      SPLIT=split > 1, GROUP=bool(more), num_warps=tile.num_warps)
