"""Triton MoE router top-k: one program per row does the whole selection in registers, one launch.

The row's E scores sit in a [groups, group size] tile (one group when ungrouped). Selection is by
iterative max; among equal values the lowest id (or group index) wins, where ``torch.topk`` leaves ties
unspecified. The ids come out in selection order (descending choice score), so they equal the
reference's as sets per row; the MoE sorts them anyway.

One row (``router``: the logits' GEMV and the selection) is one launch: programs of BLOCK_E experts × BLOCK_K
of the hidden dim store fp32 partial logits; the program that arrives last at the launch's counter adds them in
split order and selects (``_select_row``), as the split-K linear's last arrival finishes its tile
(kernels/triton_linear.py) — the selection's launch and its gap gone from every MoE layer's one-row step.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from kernels.registry import ops
from kernels.triton_linear import TL_DTYPES, linear_f32, tile_counters
from kernels.triton_utils import next_pow2, on_cuda, pdl_launch, pdl_wait


@triton.jit
def _select_row(logits_ptr, bias_ptr, idx_ptr, w_ptr, E, group_size, n_group, topk_group, scaling,
                TOPK: tl.constexpr, GROUPED: tl.constexpr, NORM: tl.constexpr, BLOCK_G: tl.constexpr,
                BLOCK_S: tl.constexpr, BLOCK_K: tl.constexpr):
    """One row's selection from its E logits at ``logits_ptr``: ids and weights to idx_ptr / w_ptr [TOPK]."""
    g = tl.arange(0, BLOCK_G)
    eid = g[:, None] * group_size + tl.arange(0, BLOCK_S)[None, :]                # [BG, BS] expert ids
    real = (g[:, None] < n_group) & (tl.arange(0, BLOCK_S)[None, :] < group_size)
    # padded lanes: score 0 (a group of fewer than BLOCK_S ids repeats the next group's ids there)
    score = tl.where(real, tl.sigmoid(tl.load(logits_ptr + eid, mask=real, other=0.0)), 0.0)
    choice = tl.where(real, score + tl.load(bias_ptr + eid, mask=real, other=0.0), -float("inf"))
    if GROUPED:                                # keep the topk_group groups of highest top-2 sum
        top1 = tl.max(choice, 1)
        first = tl.min(tl.where(choice == top1[:, None], eid, E), 1)
        top2 = tl.max(tl.where(eid == first[:, None], -float("inf"), choice), 1)
        group_score = tl.where(g < n_group, top1 + top2, -float("inf"))          # [BG]
        keep = g < 0
        for _ in range(topk_group):
            pick = tl.min(tl.where(group_score == tl.max(group_score, 0), g, BLOCK_G), 0)
            keep = keep | (g == pick)
            group_score = tl.where(g == pick, -float("inf"), group_score)
        choice = tl.where(keep[:, None], choice, -float("inf"))
    slot = tl.arange(0, BLOCK_K)
    ids = tl.zeros((BLOCK_K,), dtype=tl.int32)
    w = tl.zeros((BLOCK_K,), dtype=tl.float32)
    for t in tl.static_range(TOPK):
        best = tl.max(tl.max(choice, 1), 0)
        pick = tl.min(tl.min(tl.where(choice == best, eid, E), 1), 0)
        ids = tl.where(slot == t, pick, ids)
        w = tl.where(slot == t, tl.sum(tl.sum(tl.where(eid == pick, score, 0.0), 1), 0), w)
        choice = tl.where(eid == pick, -float("inf"), choice)
    if NORM:
        w = w / (tl.sum(w, 0) + 1e-20)
    tl.store(idx_ptr + slot, ids.to(tl.int64), mask=slot < TOPK)
    tl.store(w_ptr + slot, w * scaling, mask=slot < TOPK)


@triton.jit
def _rank_select_row(logits_ptr, bias_ptr, idx_ptr, w_ptr, E, scaling, TOPK: tl.constexpr, NORM: tl.constexpr,
                     BLOCK_S: tl.constexpr, CHUNK: tl.constexpr):
    """``_select_row`` ungrouped, by rank: expert i's place in (choice descending, id ascending) order counted
    against every other's in CHUNK-wide steps, the first TOPK stored at their place — two reductions where the
    iterative pick takes three a slot (the same ids in the same order)."""
    i = tl.arange(0, BLOCK_S)
    real = i < E
    score = tl.where(real, tl.sigmoid(tl.load(logits_ptr + i, mask=real, other=0.0)), 0.0)
    choice = tl.where(real, score + tl.load(bias_ptr + i, mask=real, other=0.0), -float("inf"))
    rank = tl.zeros((BLOCK_S,), dtype=tl.int32)
    for j0 in tl.static_range(0, BLOCK_S, CHUNK):
        j = j0 + tl.arange(0, CHUNK)
        cj = tl.sigmoid(tl.load(logits_ptr + j, mask=j < E, other=0.0)) + tl.load(bias_ptr + j, mask=j < E, other=0.0)
        cj = tl.where(j < E, cj, -float("inf"))
        before = (cj[None, :] > choice[:, None]) | ((cj[None, :] == choice[:, None]) & (j[None, :] < i[:, None]))
        rank += tl.sum(before.to(tl.int32), 1)
    sel = real & (rank < TOPK)
    w = tl.where(sel, score, 0.0)
    if NORM:
        w = w / (tl.sum(w, 0) + 1e-20)
    tl.store(idx_ptr + rank, i.to(tl.int64), mask=sel)
    tl.store(w_ptr + rank, w * scaling, mask=sel)


@triton.jit
def _router_topk_kernel(logits_ptr, bias_ptr, idx_ptr, w_ptr, E, group_size, n_group, topk_group, scaling,
                        TOPK: tl.constexpr, GROUPED: tl.constexpr, NORM: tl.constexpr, BLOCK_G: tl.constexpr,
                        BLOCK_S: tl.constexpr, BLOCK_K: tl.constexpr, PDL: tl.constexpr):
    pdl_wait(PDL)
    n = tl.program_id(0)
    _select_row(logits_ptr + n * E, bias_ptr, idx_ptr + n * TOPK, w_ptr + n * TOPK, E, group_size, n_group,
                topk_group, scaling, TOPK, GROUPED, NORM, BLOCK_G, BLOCK_S, BLOCK_K)


@triton.jit
def _router_row_kernel(x_ptr, wt_ptr, part_ptr, count_ptr, bias_ptr, idx_ptr, w_ptr, E, K, group_size, n_group,
                       topk_group, scaling, TOPK: tl.constexpr, GROUPED: tl.constexpr, NORM: tl.constexpr,
                       BLOCK_G: tl.constexpr, BLOCK_S: tl.constexpr, BLOCK_T: tl.constexpr,
                       BLOCK_E: tl.constexpr, BLOCK_K: tl.constexpr, SPLITS_P2: tl.constexpr,
                       BLOCK_ALL: tl.constexpr, RANK: tl.constexpr, PDL: tl.constexpr):
    """One row: program (eb, s) stores the fp32 partial logits of experts eb·BLOCK_E.. over the hidden dims
    s·BLOCK_K..; the last to arrive adds the splits' partials in order into part's last row, selects from it and
    resets the counter. The weight tile is read before the wait (PDL)."""
    eb = tl.program_id(0)
    sp = tl.program_id(1)
    splits = tl.num_programs(1)
    e = eb * BLOCK_E + tl.arange(0, BLOCK_E)
    k = sp * BLOCK_K + tl.arange(0, BLOCK_K)
    km = k < K
    wt = tl.load(wt_ptr + e[:, None] * K + k[None, :], mask=(e[:, None] < E) & km[None, :], other=0.0,
                 eviction_policy="evict_first")
    pdl_wait(PDL)
    x = tl.load(x_ptr + k, mask=km, other=0.0).to(tl.float32)
    tl.store(part_ptr + sp * E + e, tl.sum(wt.to(tl.float32) * x[None, :], axis=1), mask=e < E)
    tl.debug_barrier()                         # every thread's partial is stored before the release below
    if tl.atomic_add(count_ptr, 1, sem="acq_rel") == tl.num_programs(0) * splits - 1:
        s = tl.arange(0, SPLITS_P2)
        a = tl.arange(0, BLOCK_ALL)
        part = tl.load(part_ptr + s[:, None] * E + a[None, :], mask=(s[:, None] < splits) & (a[None, :] < E),
                       other=0.0, cache_modifier=".cg")
        tl.store(part_ptr + splits * E + a, tl.sum(part, axis=0), mask=a < E)
        tl.debug_barrier()                     # the logits are stored before the selection reads them
        if RANK:
            _rank_select_row(part_ptr + splits * E, bias_ptr, idx_ptr, w_ptr, E, scaling, TOPK, NORM, BLOCK_ALL,
                             RANK_CHUNK)
        else:
            _select_row(part_ptr + splits * E, bias_ptr, idx_ptr, w_ptr, E, group_size, n_group, topk_group,
                        scaling, TOPK, GROUPED, NORM, BLOCK_G, BLOCK_S, BLOCK_T)
        tl.store(count_ptr, 0)                 # the next launch (stream-ordered) starts from zero


@ops.register("router_topk", backend="triton", available=on_cuda)
def router_topk(logits: torch.Tensor, bias: torch.Tensor, top_k: int, n_group: int, topk_group: int,
                norm_topk_prob: bool, scaling: float) -> tuple[torch.Tensor, torch.Tensor]:
    """As ``reference.router_topk`` (logits [N, E] fp32, bias [E] fp32 → ids [N, k] int64, weights [N, k]
    fp32); ids equal as sets per row, in selection order; ties go to the lowest id."""
    N, E = logits.shape
    assert E % n_group == 0 and (n_group == 1 or (E // n_group >= 2 and topk_group <= n_group))
    idx = torch.empty(N, top_k, dtype=torch.int64, device=logits.device)
    w = torch.empty(N, top_k, dtype=torch.float32, device=logits.device)
    if N:
        group_size = E // n_group
        _router_topk_kernel[(N,)](logits.float().contiguous(), bias.float().contiguous(), idx, w, E,
                                  group_size, n_group, topk_group, float(scaling), TOPK=top_k,
                                  GROUPED=n_group > 1, NORM=norm_topk_prob, BLOCK_G=next_pow2(n_group),
                                  BLOCK_S=next_pow2(group_size), BLOCK_K=next_pow2(top_k), num_warps=1, **pdl_launch())
    return idx, w


RANK_CHUNK: tl.constexpr = tl.constexpr(16)     # experts a step of ``_rank_select_row``'s count


@dataclass(frozen=True)
class RouterTile:
    """The one-row router's launch: BLOCK_E experts × BLOCK_K hidden dims a program, warps, selection by rank
    (ungrouped) or by iterative pick."""
    block_e: int = 8
    block_k: int = 1024
    num_warps: int = 4
    rank: bool = True


@ops.register("router", backend="triton", available=on_cuda)
def router(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, top_k: int, n_group: int, topk_group: int,
           norm_topk_prob: bool, scaling: float, tile: RouterTile | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """As ``reference.router``: one row in one launch (``_router_row_kernel``; ``tile`` overrides its launch:
    benchmarks), more rows the logits' linear and the selection apart."""
    N, K = x.shape
    E = weight.shape[0]
    if N != 1 or weight.dtype != torch.float32 or not weight.is_contiguous() or x.dtype not in TL_DTYPES:
        return router_topk(linear_f32(x, weight), bias, top_k, n_group, topk_group, norm_topk_prob, scaling)
    assert E % n_group == 0 and (n_group == 1 or (E // n_group >= 2 and topk_group <= n_group))
    tile = tile or RouterTile()
    block_e, block_k = tile.block_e, tile.block_k
    splits = triton.cdiv(K, block_k)
    part = torch.empty(splits + 1, E, dtype=torch.float32, device=x.device)
    idx = torch.empty(1, top_k, dtype=torch.int64, device=x.device)
    w = torch.empty(1, top_k, dtype=torch.float32, device=x.device)
    group_size = E // n_group
    _router_row_kernel[(triton.cdiv(E, block_e), splits)](
        x.contiguous(), weight, part, tile_counters(x.device), bias.float().contiguous(), idx, w, E, K, group_size,
        n_group, topk_group, float(scaling), TOPK=top_k, GROUPED=n_group > 1, NORM=norm_topk_prob,
        BLOCK_G=next_pow2(n_group), BLOCK_S=next_pow2(group_size), BLOCK_T=next_pow2(top_k), BLOCK_E=block_e,
        BLOCK_K=block_k, SPLITS_P2=next_pow2(splits), BLOCK_ALL=next_pow2(E), RANK=tile.rank and n_group == 1,
        num_warps=tile.num_warps, **pdl_launch())
    return idx, w
