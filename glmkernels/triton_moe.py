"""Triton fused MoE experts for few rows (decode / verify): each routed expert's weights are read once
for every row routed to it.

The step's N·k (row, expert) pairs are sorted by local expert id (stable, so rows ascend within an
expert; experts held elsewhere take the sentinel id E_local and sort last); the first pair of each
expert's run owns that expert and processes the run (≤ N rows, one per row at most) as one 16-row tile —
a run longer than ``RUN_ROWS`` in chunks, each owned by its first pair (a whole run as one tile of
next_pow2(N) rows was 2–2.8× slower from 24 rows on: bench/moe_prefill.py --fused, bench/results/session17/).
Programs on the other pairs exit at once, so the grid has a static size and no host sync (graph-capturable:
a graph step's MoE in 8 ranks takes up to 256 rows). Four launches:

0. route: each pair's rank by (local expert, pair) among all P = N·k (a [P, P] comparison, a program per
   ROUTE_BLOCK pairs), giving the sorted pairs, each row's slots in expert-id order, the valid mask and each
   run's start — the stable sorts of the reference, without torch's sort launches.
1. gate/up: ``act = silu(x @ G.T) * (x @ U.T)`` per pair, [N·k, I] in x's dtype (rounded as the
   reference rounds each linear output).
2. down: ``y = (act @ D.T)`` rounded to x's dtype, times the pair's routing weight, rounded again.
3. combine: per row, its pairs in expert-id order are added in x's dtype one at a time — the reference's
   ``index_add_`` order, so bf16 results match it up to the GEMM summation order.

The GEMMs accumulate in fp32 and scale each 128-wide sub-block of a K step by its one block scale
(``ExpertTile.block_k`` is a multiple of 128, ``block_n`` divides 128), as glmkernels/triton_linear.py.

2..256 bf16 rows with FP8 experts run launches 1 and 2 as Gluon kernels instead (glmkernels/gluon_rows.py: the
weight straight into the tensor cores' register operand, no shared-memory pass; gate/up split over H for
narrow experts; a program takes ≤ 8 pairs of a run).

More than FUSED_MAX_ROWS rows (prefill chunks) take the grouped launches instead (``grouped_moe``): the pairs are
sorted by expert on the device, each expert's run padded to whole blocks of 64 or 128 rows, and a gate/up and a
down launch run a program per (block, output tile) of a bound of blocks known on the host (programs past the last
real block return), its expert read from a per-block table; the
same roundings and the same combine as above. (The reference's per-expert loop with a host sync per expert and
a whole-weight dequantization per linear took 153 ms a layer for a 2048-row chunk on the slice, H200.)

One row (decode without drafts) takes FMA kernels instead (``_gate_up_row_kernel``, ``_down_row_kernel``:
every pair is its own expert, no 16-row tensor-core tile, as triton_linear's GEMV), and runs the shared
expert as one more pair of the same two launches (its weights reached by element offsets from the stacked
experts'); the combine adds its output last, as HF's ``experts(x) + shared_experts(x)``. Up to SHARED_PAIR_ROWS
rows run it as every row's (k+1)-th pair, a run of local expert E_local sorted after the routed experts'
(``route_pairs_shared``; the same element offsets): 6 launches fewer a layer (its gate, up, silu, product, down and
sum); more rows compose it after the routed experts. One row needs no routing launch: program p runs slot p's
expert, read from the router's ids, and the combine ranks the row's k slots by expert itself.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from glmkernels import gluon_rows, reference
from glmkernels.registry import ops
from glmkernels.triton_linear import linear, linear_group, tile_counters
from glmkernels.triton_utils import (
    HOPPER_SMEM,
    dot_precision,
    element_offset,
    next_pow2,
    on_cuda,
    pdl_launch,
    pdl_wait,
    smem_per_block,
)

# The fused launches take up to this many rows, more (prefill chunks) the grouped ones (tuned for prefill, never
# captured): so at least scheduler.shapes.GRAPH_MOE_ROWS, the most a graph step's MoE takes (a dp step's MoE has
# every rank's rows: 8 ranks × 32).
FUSED_MAX_ROWS = 256
RUN_ROWS = 16          # the most rows of an expert's run one program takes (runs average N·k / E_local pairs)
SHARED_PAIR_ROWS = 64  # the shared expert joins the several-row launches to this many rows (a dp step's MoE at 8
                       # rows a rank: 6 launches fewer a layer, the step 2.35 → 2.18 ms in session 30; past 8 rows each
                       # 8-pair chunk of its run re-reads its weights, and at 128 rows (16 a rank) the step was 0.10 ms
                       # slower fused; bench/results/session30/, session33/)
ROUTE_BLOCK = 32       # pairs a routing program ranks (64 rows: 277 → 7.5 µs; blocks of 16 / 64: 12.1 / 10.4); from
                       # 512 pairs 8, ranked against 128 a step (64 / 128 / 256 rows: 7.6 / 14.1 / 27.3 → 4.1 / 6.9 /
                       # 14.6 µs, bench/results/session20/route_blocks.py)


@dataclass(frozen=True)
class ExpertTile:
    """Launch shape of one expert GEMM: output tile BLOCK_N × K step BLOCK_K per program."""
    block_n: int
    block_k: int
    num_warps: int = 4
    num_stages: int = 3
    fma: bool = False          # one row: the FMA kernels (no tensor-core tile of 16 rows)
    each: bool = False         # the FMA kernels: products reduced every K step (else kept per lane, reduced once)


@triton.jit
def _local_key(idx_ptr, pair, P, expert_offset, E_local, TOPK: tl.constexpr = 1, SHARED: tl.constexpr = False):
    """Sort key of each pair: local expert (E_local for experts held elsewhere) · P + pair, unique, so
    ranking keys is the stable sort; pairs past P get a key above every real one. SHARED: a row's last slot (of
    TOPK) is the shared expert's, local expert E_local - 1, and the ids hold the TOPK - 1 routed slots a row."""
    if SHARED:
        slot = pair % TOPK
        routed = slot < TOPK - 1
        e = tl.load(idx_ptr + pair // TOPK * (TOPK - 1) + slot, mask=(pair < P) & routed, other=0) - expert_offset
        local = tl.where(routed, tl.where((e >= 0) & (e < E_local - 1), e, E_local), E_local - 1).to(tl.int32)
    else:
        e = tl.load(idx_ptr + pair, mask=pair < P, other=0) - expert_offset
        local = tl.where((e >= 0) & (e < E_local), e, E_local).to(tl.int32)
    return local, tl.where(pair < P, local * P + pair, 2 ** 30)


@triton.jit
def _route_kernel(idx_ptr, w_ptr, pair_w_ptr, sorted_e_ptr, sorted_pair_ptr, run_start_ptr, order_ptr, valid_ptr, P,
                  expert_offset, E_local, TOPK: tl.constexpr, SHARED: tl.constexpr, BLOCK_I: tl.constexpr,
                  BLOCK_J: tl.constexpr, PDL: tl.constexpr):
    """Pairs i of this program's block: each one's rank among all P keys (its sorted position), its rank in its
    row and its run's start — every pair's independent of the others', so the blocks run apart. SHARED (see
    ``_local_key``): also each pair's routing weight, 1 for the shared expert's."""
    pdl_wait(PDL)
    i = tl.program_id(0) * BLOCK_I + tl.arange(0, BLOCK_I)
    local, key = _local_key(idx_ptr, i, P, expert_offset, E_local, TOPK, SHARED)
    rank = tl.zeros((BLOCK_I,), dtype=tl.int32)          # pairs before i in the sort
    row_rank = tl.zeros((BLOCK_I,), dtype=tl.int32)      # of those, pairs of i's row
    start = tl.zeros((BLOCK_I,), dtype=tl.int32)         # pairs of lower experts: where i's run starts
    for j0 in range(0, P, BLOCK_J):
        j = j0 + tl.arange(0, BLOCK_J)
        local_j, key_j = _local_key(idx_ptr, j, P, expert_offset, E_local, TOPK, SHARED)
        before = key_j[None, :] < key[:, None]
        rank += tl.sum(before.to(tl.int32), axis=1)
        row_rank += tl.sum((before & (j[None, :] // TOPK == i[:, None] // TOPK)).to(tl.int32), axis=1)
        start += tl.sum(((local_j[None, :] < local[:, None]) & (j[None, :] < P)).to(tl.int32), axis=1)
    m = i < P
    tl.store(sorted_e_ptr + rank, local, mask=m)
    tl.store(sorted_pair_ptr + rank, i, mask=m)
    tl.store(run_start_ptr + rank, start, mask=m)
    tl.store(order_ptr + (i // TOPK) * TOPK + row_rank, i % TOPK, mask=m)
    tl.store(valid_ptr + i, (local < E_local).to(tl.int8), mask=m)
    if SHARED:
        slot = i % TOPK
        routed = slot < TOPK - 1
        w = tl.load(w_ptr + i // TOPK * (TOPK - 1) + slot, mask=m & routed, other=0.0).to(tl.float32)
        tl.store(pair_w_ptr + i, tl.where(routed, w, 1.0), mask=m)


@triton.jit
def _run_rows(sorted_e_ptr, sorted_pair_ptr, run_start_ptr, p, P, E_local, TOPK: tl.constexpr,
              BLOCK_R: tl.constexpr):
    """The chunk of an expert's run of pairs that sorted position p owns — the run's pairs from p on, at most
    BLOCK_R, when p is BLOCK_R · c pairs into the run (a run no longer than BLOCK_R: p is its first pair):
    (expert, owner, mask [BR], sorted positions [BR], rows [BR])."""
    e = tl.load(sorted_e_ptr + p)
    into = p - tl.load(run_start_ptr + p)                                 # pairs of the run before p
    owner = (e < E_local) & (into % BLOCK_R == 0)
    j = p + tl.arange(0, BLOCK_R)
    in_run = (j < P) & (tl.load(sorted_e_ptr + j, mask=j < P, other=-1) == e)
    in_run = in_run & ((j * 0 + into) % BLOCK_R == 0) & ((j * 0 + e) < E_local)   # non-owners store nothing
    pair = tl.load(sorted_pair_ptr + j, mask=in_run, other=0)
    return e, owner, in_run, j, pair // TOPK


@triton.jit
def _gate_up_kernel(x_ptr, g_ptr, u_ptr, gs_ptr, us_ptr, sg_off, su_off, sgs_off, sus_off, E_shared, sorted_e_ptr,
                    sorted_pair_ptr, run_start_ptr, act_ptr, P, E_local, H, I, num_sb_h, num_sb_i,
                    TOPK: tl.constexpr, HAS_SCALE: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_I: tl.constexpr,
                    BLOCK_H: tl.constexpr, PREC: tl.constexpr, PDL: tl.constexpr):
    """act = silu(x @ G_e.T) * (x @ U_e.T) for the chunk of expert e's run that program p owns; expert E_shared (-1:
    none) is the shared expert, its weights and scales at element offsets ``s*_off`` from the stacked tensors'."""
    pdl_wait(PDL)
    p = tl.program_id(0)
    ib = tl.program_id(1)
    e, owner, in_run, j, row = _run_rows(sorted_e_ptr, sorted_pair_ptr, run_start_ptr, p, P, E_local, TOPK, BLOCK_R)
    ri = ib * BLOCK_I + tl.arange(0, BLOCK_I)
    rh = tl.arange(0, 128)
    acc_g = tl.zeros((BLOCK_R, BLOCK_I), dtype=tl.float32)
    acc_u = tl.zeros((BLOCK_R, BLOCK_I), dtype=tl.float32)
    shared = e == E_shared
    w_e = e.to(tl.int64) * I * H
    g_base = tl.where(shared, sg_off, w_e)
    u_base = tl.where(shared, su_off, w_e)
    s_e = e.to(tl.int64) * num_sb_i * num_sb_h
    s_blk = ((ib * BLOCK_I) // 128) * num_sb_h
    gs_base = tl.where(shared, sgs_off, s_e) + s_blk
    us_base = tl.where(shared, sus_off, s_e) + s_blk
    for step in range(tl.where(owner, tl.cdiv(H, BLOCK_H), 0)):  # loop not under `if`: pipelined
        for sub in tl.static_range(BLOCK_H // 128):
            hb = step * (BLOCK_H // 128) + sub
            h = hb * 128 + rh
            x = tl.load(x_ptr + row[:, None] * H + h[None, :], mask=in_run[:, None] & (h[None, :] < H),
                        other=0.0)
            wmask = (ri[:, None] < I) & (h[None, :] < H)
            wg = tl.load(g_ptr + g_base + ri[:, None] * H + h[None, :], mask=wmask, other=0.0).to(x.dtype)
            wu = tl.load(u_ptr + u_base + ri[:, None] * H + h[None, :], mask=wmask, other=0.0).to(x.dtype)
            pg = tl.dot(x, tl.trans(wg), input_precision=PREC)
            pu = tl.dot(x, tl.trans(wu), input_precision=PREC)
            if HAS_SCALE:
                pg = pg * tl.load(gs_ptr + gs_base + hb, mask=hb < num_sb_h, other=0.0)
                pu = pu * tl.load(us_ptr + us_base + hb, mask=hb < num_sb_h, other=0.0)
            acc_g += pg
            acc_u += pu
    dt = act_ptr.dtype.element_ty
    g = acc_g.to(dt).to(tl.float32)
    u = acc_u.to(dt).to(tl.float32)
    a = (g / (1.0 + tl.exp(-g))).to(dt).to(tl.float32) * u
    tl.store(act_ptr + j[:, None] * I + ri[None, :], a.to(dt), mask=in_run[:, None] & (ri[None, :] < I))


@triton.jit
def _down_kernel(act_ptr, d_ptr, ds_ptr, sd_off, sds_off, E_shared, w_route_ptr, sorted_e_ptr, sorted_pair_ptr,
                 run_start_ptr, y_ptr, P, E_local, H, I, num_sb_h, num_sb_i,
                 TOPK: tl.constexpr, HAS_SCALE: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_HO: tl.constexpr,
                 BLOCK_I: tl.constexpr, PREC: tl.constexpr, PDL: tl.constexpr):
    """y[pair] = round(round(act[j] @ D_e.T) · w_route[pair]) for the run's pairs j (E_shared: as
    ``_gate_up_kernel``)."""
    pdl_wait(PDL)
    p = tl.program_id(0)
    hb = tl.program_id(1)
    e, owner, in_run, j, row = _run_rows(sorted_e_ptr, sorted_pair_ptr, run_start_ptr, p, P, E_local, TOPK, BLOCK_R)
    rh = hb * BLOCK_HO + tl.arange(0, BLOCK_HO)
    ri = tl.arange(0, 128)
    acc = tl.zeros((BLOCK_R, BLOCK_HO), dtype=tl.float32)
    shared = e == E_shared
    w_base = tl.where(shared, sd_off, e.to(tl.int64) * H * I)
    s_base = tl.where(shared, sds_off, e.to(tl.int64) * num_sb_h * num_sb_i) + ((hb * BLOCK_HO) // 128) * num_sb_i
    for step in range(tl.where(owner, tl.cdiv(I, BLOCK_I), 0)):
        for sub in tl.static_range(BLOCK_I // 128):
            ib = step * (BLOCK_I // 128) + sub
            i = ib * 128 + ri
            a = tl.load(act_ptr + j[:, None] * I + i[None, :], mask=in_run[:, None] & (i[None, :] < I),
                        other=0.0)
            wd = tl.load(d_ptr + w_base + rh[:, None] * I + i[None, :],
                         mask=(rh[:, None] < H) & (i[None, :] < I), other=0.0).to(a.dtype)
            part = tl.dot(a, tl.trans(wd), input_precision=PREC)
            if HAS_SCALE:
                part = part * tl.load(ds_ptr + s_base + ib, mask=ib < num_sb_i, other=0.0)
            acc += part
    dt = y_ptr.dtype.element_ty
    pair = tl.load(sorted_pair_ptr + j, mask=in_run, other=0)
    w = tl.load(w_route_ptr + pair, mask=in_run, other=0.0)
    y = (acc.to(dt).to(tl.float32) * w[:, None]).to(dt)
    tl.store(y_ptr + pair[:, None] * H + rh[None, :], y, mask=in_run[:, None] & (rh[None, :] < H))


@triton.jit
def _row_pair(idx_ptr, P, expert_offset, E_local, PDL: tl.constexpr):
    """A one-row program's pair p = slot p of the row (after the wait for the router): (p, its local expert e,
    E_local when held elsewhere; shared: p is the shared expert's (p == P); live: it has an expert to run here)."""
    pdl_wait(PDL)
    p = tl.program_id(0)
    e = tl.load(idx_ptr + p, mask=p < P, other=0) - expert_offset
    e = tl.where((e >= 0) & (e < E_local), e, E_local).to(tl.int32)
    shared = p == P
    return p, e, shared, shared | (e < E_local)


@triton.jit
def _gate_up_row_kernel(x_ptr, g_ptr, u_ptr, gs_ptr, us_ptr, sg_off, su_off, sgs_off, sus_off, idx_ptr,
                        act_ptr, P, expert_offset, E_local, H, I, num_sb_h, num_sb_i, HAS_SCALE: tl.constexpr,
                        BLOCK_I: tl.constexpr, BLOCK_H: tl.constexpr, STAGES: tl.constexpr, EACH: tl.constexpr,
                        PDL: tl.constexpr):
    """One row (each pair its own expert): gate/up of pair p on the FMA units, the activation scaled
    by each 128-block's scale, products kept per K lane and reduced once (as triton_linear's GEMV), or, EACH,
    reduced every K step (BLOCK_I sums: the registers go to a wider weight tile; the wide experts' launches).
    Program p == P (when launched) is the shared expert: its weights and scales sit at element offsets
    ``s*_off`` from the stacked tensors' (``triton_utils.element_offset``)."""
    p, e, shared, live = _row_pair(idx_ptr, P, expert_offset, E_local, PDL)
    ib = tl.program_id(1)
    ri = ib * BLOCK_I + tl.arange(0, BLOCK_I)
    rh = tl.arange(0, BLOCK_H)
    acc_g = tl.zeros((BLOCK_I,) if EACH else (BLOCK_I, BLOCK_H), dtype=tl.float32)
    acc_u = tl.zeros((BLOCK_I,) if EACH else (BLOCK_I, BLOCK_H), dtype=tl.float32)
    w_e = e.to(tl.int64) * I * H
    g_w = g_ptr + tl.where(shared, sg_off, w_e) + ri[:, None] * H
    u_w = u_ptr + tl.where(shared, su_off, w_e) + ri[:, None] * H
    s_e = e.to(tl.int64) * num_sb_i * num_sb_h
    s_blk = ((ib * BLOCK_I) // 128) * num_sb_h
    g_s = gs_ptr + tl.where(shared, sgs_off, s_e) + s_blk
    u_s = us_ptr + tl.where(shared, sus_off, s_e) + s_blk
    for h0 in tl.range(0, tl.where(live, H, 0), BLOCK_H, num_stages=STAGES):
        h = h0 + rh
        hm = h < H
        x = tl.load(x_ptr + h, mask=hm, other=0.0).to(tl.float32)
        wmask = (ri[:, None] < I) & hm[None, :]
        wg = tl.load(g_w + h[None, :], mask=wmask, other=0.0, eviction_policy="evict_first")
        wu = tl.load(u_w + h[None, :], mask=wmask, other=0.0, eviction_policy="evict_first")
        if HAS_SCALE:
            pg = wg.to(tl.float32) * (x * tl.load(g_s + h // 128, mask=hm, other=0.0))[None, :]
            pu = wu.to(tl.float32) * (x * tl.load(u_s + h // 128, mask=hm, other=0.0))[None, :]
        else:
            pg = wg.to(tl.float32) * x[None, :]
            pu = wu.to(tl.float32) * x[None, :]
        if EACH:
            acc_g += tl.sum(pg, axis=1)
            acc_u += tl.sum(pu, axis=1)
        else:
            acc_g += pg
            acc_u += pu
    dt = act_ptr.dtype.element_ty
    g = (acc_g if EACH else tl.sum(acc_g, axis=1)).to(dt).to(tl.float32)
    u = (acc_u if EACH else tl.sum(acc_u, axis=1)).to(dt).to(tl.float32)
    a = (g / (1.0 + tl.exp(-g))).to(dt).to(tl.float32) * u
    tl.store(act_ptr + p * I + ri, a.to(dt), mask=(ri < I) & (((ri * 0 + e) < E_local) | ((ri * 0 + p) == P)))   # vector masks


@triton.jit
def _down_row_kernel(act_ptr, d_ptr, ds_ptr, sd_off, sds_off, w_route_ptr, idx_ptr, y_ptr, P, expert_offset,
                     E_local, H, I, num_sb_h, num_sb_i, HAS_SCALE: tl.constexpr, BLOCK_HO: tl.constexpr,
                     BLOCK_I: tl.constexpr, STAGES: tl.constexpr, EACH: tl.constexpr, PDL: tl.constexpr):
    """One row: the down projection of pair p on the FMA units, rounded, times its routing weight, to y[p] (the
    shared expert, p == P: weight 1). EACH: as ``_gate_up_row_kernel``'s."""
    p, e, shared, live = _row_pair(idx_ptr, P, expert_offset, E_local, PDL)
    hb = tl.program_id(1)
    rh = hb * BLOCK_HO + tl.arange(0, BLOCK_HO)
    ri = tl.arange(0, BLOCK_I)
    acc = tl.zeros((BLOCK_HO,) if EACH else (BLOCK_HO, BLOCK_I), dtype=tl.float32)
    d_w = d_ptr + tl.where(shared, sd_off, e.to(tl.int64) * H * I) + rh[:, None] * I
    d_s = ds_ptr + tl.where(shared, sds_off, e.to(tl.int64) * num_sb_h * num_sb_i) + ((hb * BLOCK_HO) // 128) * num_sb_i
    for i0 in tl.range(0, tl.where(live, I, 0), BLOCK_I, num_stages=STAGES):
        i = i0 + ri
        im = i < I
        a = tl.load(act_ptr + p * I + i, mask=im, other=0.0).to(tl.float32)
        if HAS_SCALE:
            a = a * tl.load(d_s + i // 128, mask=im, other=0.0)
        wd = tl.load(d_w + i[None, :], mask=(rh[:, None] < H) & im[None, :], other=0.0,
                     eviction_policy="evict_first")
        if EACH:
            acc += tl.sum(wd.to(tl.float32) * a[None, :], axis=1)
        else:
            acc += wd.to(tl.float32) * a[None, :]
    dt = y_ptr.dtype.element_ty
    w = tl.where(shared, 1.0, tl.load(w_route_ptr + p, mask=p < P, other=0.0))
    y = ((acc if EACH else tl.sum(acc, axis=1)).to(dt).to(tl.float32) * w).to(dt)
    tl.store(y_ptr + p * H + rh, y, mask=(rh < H) & (((rh * 0 + e) < E_local) | ((rh * 0 + p) == P)))


@triton.jit
def _group_block(block_e_ptr, slot_pair_ptr, b, BLOCK_M: tl.constexpr):
    """Grouped block b: (its local expert, its slots [BM], their pairs (row·k + slot), which slots hold one)."""
    slots = b * BLOCK_M + tl.arange(0, BLOCK_M)
    pair = tl.load(slot_pair_ptr + slots)
    return tl.load(block_e_ptr + b), slots, pair, pair >= 0


@triton.jit
def _grouped_gate_up_kernel(x_ptr, g_ptr, u_ptr, gs_ptr, us_ptr, block_e_ptr, slot_pair_ptr, act_ptr,
                            H, I, num_sb_h, num_sb_i, TOPK: tl.constexpr, HAS_SCALE: tl.constexpr,
                            BLOCK_M: tl.constexpr, BLOCK_I: tl.constexpr, PREC: tl.constexpr):
    """Block b of one expert's padded run: act[b·BM + r] = silu(x[row] @ G_e.T) · (x[row] @ U_e.T) (as
    ``_gate_up_kernel``); the block index varies fastest, so an expert's blocks share its weight tiles in L2.
    Each FP8 tile is dequantized as the reference does (W·S in fp32, rounded to x's dtype) and the dots
    accumulate in place (scaling each dot's result instead took 1.3× as long: bench/results/session12/)."""
    ib = tl.program_id(1)
    e, slots, pair, live = _group_block(block_e_ptr, slot_pair_ptr, tl.program_id(0), BLOCK_M)
    if e < 0:                      # past the last block (group_pairs' bound)
        return
    row = tl.where(live, pair // TOPK, 0)
    ri = ib * BLOCK_I + tl.arange(0, BLOCK_I)
    rh = tl.arange(0, 128)
    acc_g = tl.zeros((BLOCK_M, BLOCK_I), dtype=tl.float32)
    acc_u = tl.zeros((BLOCK_M, BLOCK_I), dtype=tl.float32)
    w_base = e.to(tl.int64) * I * H
    s_base = e * num_sb_i * num_sb_h + ((ib * BLOCK_I) // 128) * num_sb_h
    for hb in range(num_sb_h):
        h = hb * 128 + rh
        x = tl.load(x_ptr + row[:, None].to(tl.int64) * H + h[None, :], mask=live[:, None] & (h[None, :] < H),
                    other=0.0)
        wmask = (ri[:, None] < I) & (h[None, :] < H)
        wg = tl.load(g_ptr + w_base + ri[:, None] * H + h[None, :], mask=wmask, other=0.0)
        wu = tl.load(u_ptr + w_base + ri[:, None] * H + h[None, :], mask=wmask, other=0.0)
        if HAS_SCALE:
            wg = wg.to(tl.float32) * tl.load(gs_ptr + s_base + hb)
            wu = wu.to(tl.float32) * tl.load(us_ptr + s_base + hb)
        acc_g = tl.dot(x, tl.trans(wg.to(x.dtype)), acc_g, input_precision=PREC)
        acc_u = tl.dot(x, tl.trans(wu.to(x.dtype)), acc_u, input_precision=PREC)
    dt = act_ptr.dtype.element_ty
    g = acc_g.to(dt).to(tl.float32)
    u = acc_u.to(dt).to(tl.float32)
    a = (g / (1.0 + tl.exp(-g))).to(dt).to(tl.float32) * u
    tl.store(act_ptr + slots[:, None].to(tl.int64) * I + ri[None, :], a.to(dt), mask=ri[None, :] < I)


@triton.jit
def _grouped_down_kernel(act_ptr, d_ptr, ds_ptr, w_route_ptr, block_e_ptr, slot_pair_ptr, y_ptr,
                         H, I, num_sb_h, num_sb_i, HAS_SCALE: tl.constexpr, BLOCK_M: tl.constexpr,
                         BLOCK_HO: tl.constexpr, PREC: tl.constexpr, as_ptr=None, ACT_SCALED: tl.constexpr = False):
    """y[pair] = round(round(act[slot] @ D_e.T) · w[pair]) for block b's live slots (as ``_down_kernel``; the
    weight dequantized per tile as in the gate/up launch). ``ACT_SCALED`` (glmkernels/triton_w8a8.py): act holds e4m3
    codes with a scale per (slot, 128 columns) at ``as_ptr``; each FP8 × FP8 dot is scaled by both block scales."""
    hb = tl.program_id(1)
    e, slots, pair, live = _group_block(block_e_ptr, slot_pair_ptr, tl.program_id(0), BLOCK_M)
    if e < 0:                      # past the last block (group_pairs' bound)
        return
    rh = hb * BLOCK_HO + tl.arange(0, BLOCK_HO)
    ri = tl.arange(0, 128)
    acc = tl.zeros((BLOCK_M, BLOCK_HO), dtype=tl.float32)
    w_base = e.to(tl.int64) * H * I
    s_base = e * num_sb_h * num_sb_i + ((hb * BLOCK_HO) // 128) * num_sb_i
    for ib in range(num_sb_i):
        i = ib * 128 + ri
        a = tl.load(act_ptr + slots[:, None].to(tl.int64) * I + i[None, :], mask=i[None, :] < I, other=0.0)
        wd = tl.load(d_ptr + w_base + rh[:, None] * I + i[None, :], mask=(rh[:, None] < H) & (i[None, :] < I),
                     other=0.0)
        if ACT_SCALED:
            sa = tl.load(as_ptr + slots * num_sb_i + ib)
            acc += tl.dot(a, tl.trans(wd)) * (sa[:, None] * tl.load(ds_ptr + s_base + ib))
        else:
            if HAS_SCALE:
                wd = wd.to(tl.float32) * tl.load(ds_ptr + s_base + ib)
            acc = tl.dot(a, tl.trans(wd.to(a.dtype)), acc, input_precision=PREC)
    dt = y_ptr.dtype.element_ty
    w = tl.load(w_route_ptr + pair, mask=live, other=0.0)
    y = (acc.to(dt).to(tl.float32) * w[:, None]).to(dt)
    tl.store(y_ptr + tl.where(live, pair, 0)[:, None].to(tl.int64) * H + rh[None, :], y,
             mask=live[:, None] & (rh[None, :] < H))


@triton.jit
def _combine_kernel(y_ptr, order_ptr, valid_ptr, idx_ptr, out_ptr, H, P, expert_offset, E_local,
                    TOPK: tl.constexpr, SHARED: tl.constexpr, ROUTED: tl.constexpr, BLOCK_K: tl.constexpr,
                    BLOCK_H: tl.constexpr, PDL: tl.constexpr):
    """out[n] = Σ of row n's pairs' y held here, in expert id order, then the shared expert's. ROUTED: the order
    and whether held from ``route_pairs``; else (one row, no routing launch) ranked here from the ids."""
    pdl_wait(PDL)
    n = tl.program_id(0)
    h = tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)
    mask = h < H
    dt = out_ptr.dtype.element_ty
    acc = tl.zeros((BLOCK_H,), dtype=tl.float32).to(dt)
    if not ROUTED:
        _, key = _local_key(idx_ptr + n * TOPK, tl.arange(0, BLOCK_K), TOPK, expert_offset, E_local)
    for t in range(TOPK):                      # this row's experts in id order
        if ROUTED:
            slot = tl.load(order_ptr + n * TOPK + t)
            held = tl.load(valid_ptr + n * TOPK + slot) != 0
        else:                                  # the t-th smallest key: local expert · TOPK + slot, unique
            first = tl.min(key, 0)
            slot = first % TOPK
            held = first // TOPK < E_local
            key = tl.where(key == first, 2 ** 30, key)
        if held:
            y = tl.load(y_ptr + (n * TOPK + slot) * H + h, mask=mask, other=0.0)
            acc = (acc.to(tl.float32) + y.to(tl.float32)).to(dt)
    if SHARED:                                 # the shared expert's output (row n's at y[P + n]) last
        acc = (acc.to(tl.float32) + tl.load(y_ptr + (P + n) * H + h, mask=mask, other=0.0).to(tl.float32)).to(dt)
    tl.store(out_ptr + n * H + h, acc, mask=mask)


def route_pairs(topk_idx: torch.Tensor, expert_offset: int, E_local: int
                ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """topk_idx: [N, k] global ids → (sorted_e [P] int32, sorted_pair [P] int32, order [N, k] int32,
    valid [P] int8, run_start [P] int32), P = N·k: pairs stably sorted by local expert id (sentinel E_local last),
    each row's slots stably sorted by it, whether a pair's expert is held here, and where each sorted pair's run
    (its expert's pairs) starts. One launch, a program per ROUTE_BLOCK pairs."""
    return _route(topk_idx, None, expert_offset, E_local)[:5]


def route_pairs_shared(topk_idx: torch.Tensor, topk_w: torch.Tensor, expert_offset: int, E_local: int
                       ) -> tuple[torch.Tensor, ...]:
    """``route_pairs`` with the shared expert as every row's (k+1)-th pair, local expert E_local (the last held;
    the sentinel is E_local + 1): its tensors over P = N·(k+1) pairs, order [N, k+1], then the pairs' routing
    weights [P] fp32 (1 for the shared expert's) — so the expert launches run it with the routed experts and the
    combine adds it last, as ``reference.moe_experts`` + the shared expert's output."""
    return _route(topk_idx, topk_w, expert_offset, E_local + 1)


def _route(topk_idx: torch.Tensor, topk_w: torch.Tensor | None, expert_offset: int, E_local: int
           ) -> tuple[torch.Tensor, ...]:
    """``route_pairs`` (topk_w None; the sixth tensor None) or ``route_pairs_shared``."""
    N, k = topk_idx.shape
    shared = topk_w is not None
    k += shared
    P = N * k
    dev = topk_idx.device
    sorted_e, sorted_pair, run_start = (torch.empty(P, dtype=torch.int32, device=dev) for _ in range(3))
    order = torch.empty(N, k, dtype=torch.int32, device=dev)
    valid = torch.empty(P, dtype=torch.int8, device=dev)
    # the pairs' weights only with the shared expert (else the kernel's weight pointers are unused placeholders)
    pair_w = torch.empty(P, dtype=torch.float32, device=dev) if shared else None
    w_in, w_out = (topk_w.contiguous(), pair_w) if shared else (valid, valid)
    block = min(max(16, next_pow2(P)), ROUTE_BLOCK)
    block, block_j = (8, 128) if P >= 512 else (block, block)
    _route_kernel[(triton.cdiv(P, block),)](topk_idx.contiguous(), w_in, w_out, sorted_e, sorted_pair, run_start,
                                           order, valid, P, expert_offset, E_local, TOPK=k, SHARED=shared,
                                           BLOCK_I=block, BLOCK_J=block_j, num_warps=4, **pdl_launch())
    return sorted_e, sorted_pair, order, valid, run_start, pair_w


def expert_tiles(rows: int, H: int, I: int) -> tuple[ExpertTile, ExpertTile]:
    """(gate/up, down) tiles for ``rows`` rows, measured best on H200 at 1 and 8 rows with 256 experts, H 6144,
    I 2048 and 256 (bench/tune_decode_kernels.py): narrow gate/up outputs with 2 scale blocks per K step (more
    programs per expert), 64-wide down outputs. One row takes the FMA kernels with their products reduced every K
    step (``each``; bench/moe_one_row.py --each [--width 256] [--no-shared], bench/results/session28/, session29/):
    a wide expert's gate/up and down 16 × 512 on 4 warps — 8 routed + the shared expert fused 110.4 → 89.9 µs
    (3.78 TB/s; the slice's one-row step 1.27 → 1.22 ms), 8 routed 86.4 → 86.0; a narrow (I ≤ 512, a tp shard's)
    expert's gate/up 8 × 2048 and down 32 × 256 — 26.3 → 22.3 µs with the shared expert fused. (Keeping per-lane
    products instead, the shared expert as a 9th pair made every gate/up launch 1.18–1.60× slower:
    bench/results/session11/.)"""
    if rows == 1:
        if I <= 512:
            return ExpertTile(8, 2048, 4, 1, fma=True, each=True), ExpertTile(32, 256, 4, 1, fma=True, each=True)
        return ExpertTile(16, 512, 4, 1, fma=True, each=True), ExpertTile(16, 512, 4, 1, fma=True, each=True)
    if rows > 16:                  # runs in chunks of 16 (bench/moe_prefill.py --fused: K 128 ≤ K 256 at I 256)
        return ExpertTile(32, 128), ExpertTile(64, 128)
    return ExpertTile(32, 256), ExpertTile(64, 128)


def fused_moe(x: torch.Tensor, topk_idx: torch.Tensor, topk_w: torch.Tensor, gate: torch.Tensor,
              up: torch.Tensor, down: torch.Tensor, gate_s: torch.Tensor | None, up_s: torch.Tensor | None,
              down_s: torch.Tensor | None, expert_offset: int = 0,
              tiles: tuple[ExpertTile, ExpertTile] | gluon_rows.MoeTile | None = None,
              shared: tuple | None = None, n_experts: int | None = None) -> torch.Tensor:
    """x: [N, H] (N ≤ FUSED_MAX_ROWS), topk_idx/topk_w: [N, k] global ids / fp32 weights, gate/up:
    [E_l, I, H], down: [E_l, H, I] (fp8 with block scales, or x's dtype with None) → [N, H] in x's dtype:
    Σ_j w[n,j] · down(silu(gate(x)) · up(x)) over this rank's experts, + the ``shared`` expert's output
    (as ``reference.moe_experts``; where it has a routed expert's shape it runs in the same launches: one more pair
    at one row, every row's last pair to SHARED_PAIR_ROWS rows). 2..256 bf16 rows
    (``gluon_rows.MOE_MAX_ROWS``) with FP8 experts take the Gluon kernels (glmkernels/gluon_rows.py) where present.
    ``tiles`` overrides the (gate/up, down) launch shapes or (a ``MoeTile``) the Gluon launch (benchmarks);
    ``n_experts``: how many experts the ids range over (an ep rank holds E_local of them; None: all), for the Gluon
    launch's shape. Graph-capturable."""
    N, H = x.shape
    E_local, I, _ = gate.shape
    k = topk_idx.shape[1]
    x = x.contiguous()
    topk_idx = topk_idx.contiguous()
    P = N * k
    out = torch.empty_like(x)
    has_scale = gate_s is not None
    dummy = torch.empty(1, dtype=torch.float32, device=x.device)
    gs, us, ds = (gate_s, up_s, down_s) if has_scale else (dummy, dummy, dummy)
    fuse = shared is not None and N <= SHARED_PAIR_ROWS and _fusable(shared, gate, down, has_scale)
    # the shared expert's weights and scales as element offsets from the stacked tensors'
    offs = [element_offset(t, b) if t is not None else 0 for t, b in zip(shared, (gate, up, down, gs, us, ds))] \
        if fuse else [0] * 6
    gluon = isinstance(tiles, gluon_rows.MoeTile) or (tiles is None and gluon_rows.moe_usable(x, gate, has_scale))
    gu, dn = (None, None) if gluon else tiles or expert_tiles(N, H, I)
    num_sb_h, num_sb_i = triton.cdiv(H, 128), triton.cdiv(I, 128)
    if not gluon and N == 1 and gu.fma:        # one row: every pair is its own expert's whole run, no routing
        assert 128 % gu.block_n == 0 and 128 % dn.block_n == 0
        programs = P + fuse                    # the shared expert one more pair, its act and y rows at P
        act, y = (torch.empty(programs, n, dtype=x.dtype, device=x.device) for n in (I, H))
        _gate_up_row_kernel[(programs, triton.cdiv(I, gu.block_n))](
            x, gate, up, gs, us, offs[0], offs[1], offs[3], offs[4], topk_idx, act, P, expert_offset, E_local, H, I,
            num_sb_h, num_sb_i, HAS_SCALE=has_scale, BLOCK_I=gu.block_n, BLOCK_H=gu.block_k, STAGES=gu.num_stages,
            EACH=gu.each, num_warps=gu.num_warps, **pdl_launch())
        _down_row_kernel[(programs, triton.cdiv(H, dn.block_n))](
            act, down, ds, offs[2], offs[5], topk_w.float().contiguous(), topk_idx, y, P, expert_offset, E_local, H,
            I, num_sb_h, num_sb_i, HAS_SCALE=has_scale, BLOCK_HO=dn.block_n, BLOCK_I=dn.block_k,
            STAGES=dn.num_stages, EACH=dn.each, num_warps=dn.num_warps, **pdl_launch())
        out = _combine(y, None, None, out, N, H, k, shared=fuse, ids=(topk_idx, expert_offset, E_local))
        return out if fuse else _plus_shared(out, x, shared)
    # several rows: pairs sorted by expert; the shared expert fused is every row's (k+1)-th pair, local expert E_local
    if fuse:
        sorted_e, sorted_pair, order, valid, run_start, pair_w = route_pairs_shared(topk_idx, topk_w, expert_offset,
                                                                                    E_local)
        k, E_held, E_shared = k + 1, E_local + 1, E_local
    else:
        sorted_e, sorted_pair, order, valid, run_start = route_pairs(topk_idx, expert_offset, E_local)
        pair_w, E_held, E_shared = topk_w.float().contiguous(), E_local, -1
    P = N * k
    act, y = (torch.empty(P, n, dtype=x.dtype, device=x.device) for n in (I, H))
    if gluon:
        gluon_rows.moe_gemms(x, gate, up, down, gate_s, up_s, down_s, pair_w, sorted_e, sorted_pair, run_start, act,
                             y, k, E_held, tile_counters(x.device), tiles, shared=(offs, E_shared),
                             share=E_local / n_experts if n_experts and not fuse else 1.0)
    else:
        assert all(128 % t.block_n == 0 and t.block_k % 128 == 0 for t in (gu, dn))
        prec = dot_precision(x.dtype)
        block_r = min(max(16, next_pow2(N)), RUN_ROWS)       # a longer run goes in chunks, each its own program's
        _gate_up_kernel[(P, triton.cdiv(I, gu.block_n))](
            x, gate, up, gs, us, offs[0], offs[1], offs[3], offs[4], E_shared, sorted_e, sorted_pair, run_start, act,
            P, E_held, H, I, num_sb_h, num_sb_i, TOPK=k, HAS_SCALE=has_scale, BLOCK_R=block_r, BLOCK_I=gu.block_n,
            BLOCK_H=gu.block_k, PREC=prec, num_warps=gu.num_warps, num_stages=gu.num_stages, **pdl_launch(tile=True))
        _down_kernel[(P, triton.cdiv(H, dn.block_n))](
            act, down, ds, offs[2], offs[5], E_shared, pair_w, sorted_e, sorted_pair, run_start, y, P, E_held, H, I,
            num_sb_h, num_sb_i, TOPK=k, HAS_SCALE=has_scale, BLOCK_R=block_r, BLOCK_HO=dn.block_n,
            BLOCK_I=dn.block_k, PREC=prec, num_warps=dn.num_warps, num_stages=dn.num_stages,
            **pdl_launch(tile=True))
    out = _combine(y, order, valid, out, N, H, k)
    return out if fuse else _plus_shared(out, x, shared)


def group_pairs(topk_idx: torch.Tensor, expert_offset: int, E_local: int, block_m: int
                ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """topk_idx: [N, k] global ids → (block_e [B] int32: each block's local expert, slot_pair [B·block_m]
    int32: the pair (row·k + slot) in each padded slot or -1, order [N, k] int32, valid [P] int8 as
    ``route_pairs``): the pairs held here stably sorted by local expert, each expert's run padded to whole
    blocks. No host sync: B is a bound known on the host, ⌈P / block_m⌉ + min(E_local, P) (each expert's run adds
    at most one part-filled block), and the blocks past the last real one have expert -1 (their programs return)."""
    N, k = topk_idx.shape
    P, dev = N * k, topk_idx.device
    local = (topk_idx - expert_offset).flatten()
    held = (local >= 0) & (local < E_local)
    key = torch.where(held, local, E_local)
    sorted_key, sorted_pair = torch.sort(key, stable=True)
    counts = torch.zeros(E_local + 1, dtype=torch.long, device=dev).index_add_(0, key, torch.ones_like(key))
    counts = counts[:E_local]
    blocks = (counts + block_m - 1) // block_m
    ends = torch.cumsum(blocks, 0)
    B = -(-P // block_m) + min(E_local, P)
    block_e = torch.searchsorted(ends, torch.arange(B, device=dev), right=True)     # E_local past the last block
    block_e = torch.where(block_e < E_local, block_e, -1).to(torch.int32)
    first = torch.cumsum(counts, 0) - counts                         # each expert's first pair in the sort
    first_slot = (ends - blocks) * block_m                           # and its first padded slot
    e = sorted_key.clamp(max=E_local - 1)
    slots = torch.where(sorted_key < E_local, first_slot[e] + torch.arange(P, device=dev) - first[e], B * block_m)
    slot_pair = torch.full((B * block_m + 1,), -1, dtype=torch.int32, device=dev)     # + a slot for pairs not held
    slot_pair[slots] = sorted_pair.to(torch.int32)
    order = torch.sort(key.view(N, k), dim=1, stable=True).indices.to(torch.int32)
    return block_e, slot_pair[:B * block_m], order, held.to(torch.int8)


@dataclass(frozen=True)
class GroupTile:
    """Launch shape of a grouped expert GEMM: BLOCK_N outputs per program (dividing 128: one scale row)."""
    block_n: int = 128
    num_warps: int = 8
    num_stages: int = 3


def _smem_bytes(block_m: int, tile: GroupTile, x_size: int, w_size: int, num_weights: int) -> int:
    """Shared memory of a grouped launch: ``num_stages`` buffers of the row tile and the weight tiles as loaded,
    plus the weight tiles widened to the rows' dtype. It matched Triton's refusals of the fp8-bf16 shapes on
    fp32 rows (320 KB) and bf16 weights (240 KB), and over-counts the fp8 weights on bf16 rows at 128 rows."""
    loads = block_m * 128 * x_size + num_weights * tile.block_n * 128 * w_size
    widened = num_weights * tile.block_n * 128 * x_size if w_size != x_size else 0
    return tile.num_stages * loads + widened


def group_rows(rows: int, k: int, E_local: int) -> int:
    """Rows of a grouped block: 128 once an expert averages 128 pairs, else 64 (measured: ``group_launch``)."""
    return 128 if rows * k >= 128 * E_local else 64


def group_launch(rows: int, k: int, E_local: int, x_dtype: torch.dtype, w_dtype: torch.dtype,
                 smem: int = HOPPER_SMEM) -> tuple[int, GroupTile, GroupTile]:
    """(block rows, gate/up tile, down tile). FP8 experts on 2-byte rows: 128-row blocks once an expert averages
    128 pairs, else 64, 128-wide tiles on 8 warps in 3 stages (measured best at 2048 and 8192 rows, 256 experts
    of width 2048 and 256: bench/moe_prefill.py --sweep, bench/results/session12/). Other dtypes (fp32 rows,
    unquantized experts: tests, bf16 checkpoints) and GPUs with less shared memory than Hopper (``smem``, bytes a
    block may opt into): 64-row blocks and the first tile whose shared memory fits with a 10 % margin."""
    block_m = group_rows(rows, k, E_local)
    x_size, w_size = x_dtype.itemsize, w_dtype.itemsize
    if x_size == 2 and w_size == 1 and smem >= HOPPER_SMEM:
        return block_m, GroupTile(), GroupTile()
    tiles = (GroupTile(), GroupTile(64, 4, 3), GroupTile(64, 4, 2), GroupTile(32, 4, 2), GroupTile(32, 4, 1))
    gate_up, down = (next((t for t in tiles if _smem_bytes(64, t, x_size, w_size, n) <= 0.9 * smem), tiles[-1])
                     for n in (2, 1))
    return 64, gate_up, down


def grouped_moe(x: torch.Tensor, topk_idx: torch.Tensor, topk_w: torch.Tensor, gate: torch.Tensor,
                up: torch.Tensor, down: torch.Tensor, gate_s: torch.Tensor | None, up_s: torch.Tensor | None,
                down_s: torch.Tensor | None, expert_offset: int = 0, block_m: int | None = None,
                tiles: tuple[GroupTile, GroupTile] | None = None) -> torch.Tensor:
    """As ``fused_moe`` (routed experts only) for any number of rows, on the grouped launches (no host sync; a
    launch's grid is ``group_pairs``' bound of blocks). ``block_m`` and ``tiles`` (the gate/up and down launch
    shapes; default ``group_launch``'s) for tests and benchmarks."""
    N, H = x.shape
    E_local, I, _ = gate.shape
    k = topk_idx.shape[1]
    x = x.contiguous()
    auto_m, gu, dn = group_launch(N, k, E_local, x.dtype, gate.dtype, smem_per_block(x.device.index or 0))
    block_m, (gu, dn) = block_m or auto_m, tiles or (gu, dn)
    block_e, slot_pair, order, valid = group_pairs(topk_idx, expert_offset, E_local, block_m)
    num_blocks = block_e.numel()
    act = torch.empty(num_blocks * block_m, I, dtype=x.dtype, device=x.device)
    y = torch.empty(N * k, H, dtype=x.dtype, device=x.device)
    out = torch.empty_like(x)
    has_scale = gate_s is not None
    dummy = torch.empty(1, dtype=torch.float32, device=x.device)
    gs, us, ds = (gate_s, up_s, down_s) if has_scale else (dummy, dummy, dummy)
    prec = dot_precision(x.dtype)
    num_sb_h, num_sb_i = triton.cdiv(H, 128), triton.cdiv(I, 128)
    if num_blocks:
        _grouped_gate_up_kernel[(num_blocks, triton.cdiv(I, gu.block_n))](
            x, gate, up, gs, us, block_e, slot_pair, act, H, I, num_sb_h, num_sb_i, TOPK=k, HAS_SCALE=has_scale,
            BLOCK_M=block_m, BLOCK_I=gu.block_n, PREC=prec, num_warps=gu.num_warps,
            num_stages=gu.num_stages)
        _grouped_down_kernel[(num_blocks, triton.cdiv(H, dn.block_n))](
            act, down, ds, topk_w.float().contiguous(), block_e, slot_pair, y, H, I, num_sb_h, num_sb_i,
            HAS_SCALE=has_scale, BLOCK_M=block_m, BLOCK_HO=dn.block_n, PREC=prec,
            num_warps=dn.num_warps, num_stages=dn.num_stages)
    return _combine(y, order, valid, out, N, H, k)


def _plus_shared(out: torch.Tensor, x: torch.Tensor, shared: tuple | None) -> torch.Tensor:
    """The routed experts' sum + the shared expert's output run after them (this backend's linears: its gate and up
    in one launch where ``linear_group`` takes both, as ``models.glm5.MLP``)."""
    if shared is None:
        return out
    gate, up, down, gate_s, up_s, down_s = shared
    g, u = linear_group(x, (gate, gate_s), (up, up_s))
    return out + linear(F.silu(g) * u, down, down_s)


def _fusable(shared: tuple, gate: torch.Tensor, down: torch.Tensor, has_scale: bool) -> bool:
    """The shared expert runs as one more pair when it is one expert of the routed experts' shape (not
    an ep rank's slice of it, not several shared experts) with the same kind of weights."""
    sg, su, sd, sgs = shared[:4]
    return (sg.shape == su.shape == gate.shape[1:] and sd.shape == down.shape[1:] and sg.dtype == gate.dtype
            and all(t.is_contiguous() for t in (sg, su, sd)) and (sgs is not None) == has_scale)


def _combine(y: torch.Tensor, order: torch.Tensor | None, valid: torch.Tensor | None, out: torch.Tensor, N: int,
             H: int, k: int, shared: bool = False, ids: tuple[torch.Tensor, int, int] | None = None) -> torch.Tensor:
    """The combine launch, its order from ``route_pairs`` (order, valid) or, None, from ``ids`` = (topk_idx,
    expert_offset, E_local)."""
    block_h = min(1024, next_pow2(H))
    routed = order is not None
    idx, offset, E_local = ids or (order, 0, 0)
    order, valid = (order, valid) if routed else (idx, idx)
    _combine_kernel[(N, triton.cdiv(H, block_h))](y, order, valid, idx, out, H, N * k, offset, E_local, TOPK=k,
                                                 SHARED=shared, ROUTED=routed, BLOCK_K=next_pow2(k),
                                                 BLOCK_H=block_h, num_warps=4, **pdl_launch())
    return out


@ops.register("moe_experts", backend="triton", available=on_cuda)
def moe_experts(x: torch.Tensor, topk_idx: torch.Tensor, topk_w: torch.Tensor,
                gate: torch.Tensor, up: torch.Tensor, down: torch.Tensor,
                gate_s: torch.Tensor | None, up_s: torch.Tensor | None, down_s: torch.Tensor | None,
                expert_offset: int = 0, shared: tuple | None = None, n_experts: int | None = None) -> torch.Tensor:
    """As ``reference.moe_experts``; few rows run fused, more rows (prefill) grouped (the shared expert through
    this backend's linear); weights the kernels cannot read (not contiguous, a dtype Triton lacks) the reference."""
    if x.shape[0] > FUSED_MAX_ROWS or x.shape[0] == 0:
        if x.shape[0] == 0 or not _groupable(x, gate, up, down):
            out = reference.moe_experts(x, topk_idx, topk_w, gate, up, down, gate_s, up_s, down_s, expert_offset)
        else:
            out = grouped_moe(x, topk_idx, topk_w, gate, up, down, gate_s, up_s, down_s, expert_offset)
        return _plus_shared(out, x, shared)
    return fused_moe(x, topk_idx, topk_w, gate, up, down, gate_s, up_s, down_s, expert_offset, shared=shared,
                     n_experts=n_experts)


def _groupable(x: torch.Tensor, gate: torch.Tensor, up: torch.Tensor, down: torch.Tensor) -> bool:
    return (x.dtype in (torch.float32, torch.bfloat16, torch.float16) and gate.dim() == 3
            and all(t.is_contiguous() for t in (gate, up, down)))
