"""Triton MoE router top-k: one program per row does the whole selection in registers, one launch.

The row's E scores sit in a [groups, group size] tile (one group when ungrouped). Selection is by
iterative max; among equal values the lowest id (or group index) wins, where ``torch.topk`` leaves ties
unspecified. The ids come out in selection order (descending choice score), so they equal the
reference's as sets per row; the MoE sorts them anyway.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from glmkernels.registry import ops
from glmkernels.triton_utils import next_pow2, on_cuda, pdl_launch, pdl_wait


@triton.jit
def _router_topk_kernel(logits_ptr, bias_ptr, idx_ptr, w_ptr, E, group_size, n_group, topk_group, scaling,
                        TOPK: tl.constexpr, GROUPED: tl.constexpr, NORM: tl.constexpr, BLOCK_G: tl.constexpr,
                        BLOCK_S: tl.constexpr, BLOCK_K: tl.constexpr, PDL: tl.constexpr):
    pdl_wait(PDL)
    n = tl.program_id(0)
    g = tl.arange(0, BLOCK_G)
    eid = g[:, None] * group_size + tl.arange(0, BLOCK_S)[None, :]                # [BG, BS] expert ids
    real = (g[:, None] < n_group) & (tl.arange(0, BLOCK_S)[None, :] < group_size)
    # padded lanes: score 0 (a group of fewer than BLOCK_S ids repeats the next group's ids there)
    score = tl.where(real, tl.sigmoid(tl.load(logits_ptr + n * E + eid, mask=real, other=0.0)), 0.0)
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
    tl.store(idx_ptr + n * TOPK + slot, ids.to(tl.int64), mask=slot < TOPK)
    tl.store(w_ptr + n * TOPK + slot, w * scaling, mask=slot < TOPK)


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
