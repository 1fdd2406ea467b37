"""Triton fused MoE experts for few rows (decode / verify): each routed expert's weights are read once
for every row routed to it.

The step's N·k (row, expert) pairs are sorted by expert id (stable, so rows ascend within an expert);
the first pair of each expert's run owns that expert and processes the whole run (≤ N rows, one per
row at most) as one 16+-row tile. Programs on the other pairs exit at once, so the grid has a static
size and no host sync (graph-capturable). Three launches:

1. gate/up: ``act = silu(x @ G.T) * (x @ U.T)`` per pair, [N·k, I] in x's dtype (rounded as the
   reference rounds each linear output).
2. down: ``y = (act @ D.T)`` rounded to x's dtype, times the pair's routing weight, rounded again.
3. combine: per row, its pairs in expert-id order are added in x's dtype one at a time — the reference's
   ``index_add_`` order, so bf16 results match it up to the GEMM summation order.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels import reference
from kernels.registry import ops
from kernels.triton_utils import dot_precision, next_pow2, num_sms, on_cuda

FUSED_MAX_ROWS = 32


@triton.jit
def _run_rows(sorted_e_ptr, sorted_pair_ptr, p, P, E_local, TOPK: tl.constexpr, BLOCK_R: tl.constexpr):
    """The run of pairs starting at sorted position p: (expert, valid, mask [BR], pair ids [BR], rows [BR])."""
    e = tl.load(sorted_e_ptr + p)
    prev = tl.load(sorted_e_ptr + p - 1, mask=p > 0, other=-1)
    owner = (e < E_local) & (prev != e)
    j = p + tl.arange(0, BLOCK_R)
    in_run = (j < P) & (tl.load(sorted_e_ptr + j, mask=j < P, other=-1) == e)
    in_run = in_run & ((j * 0 + prev) != e) & ((j * 0 + e) < E_local)   # non-owners store nothing
    pair = tl.load(sorted_pair_ptr + j, mask=in_run, other=0)
    return e, owner, in_run, j, pair // TOPK


@triton.jit
def _gate_up_kernel(x_ptr, g_ptr, u_ptr, gs_ptr, us_ptr, sorted_e_ptr, sorted_pair_ptr, act_ptr,
                    P, E_local, H, I, num_sb_h, num_sb_i,
                    TOPK: tl.constexpr, HAS_SCALE: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_I: tl.constexpr,
                    BLOCK_H: tl.constexpr, PREC: tl.constexpr):
    p = tl.program_id(0)
    ib = tl.program_id(1)
    e, owner, in_run, j, row = _run_rows(sorted_e_ptr, sorted_pair_ptr, p, P, E_local, TOPK, BLOCK_R)
    ri = ib * BLOCK_I + tl.arange(0, BLOCK_I)
    rh = tl.arange(0, BLOCK_H)
    acc_g = tl.zeros((BLOCK_R, BLOCK_I), dtype=tl.float32)
    acc_u = tl.zeros((BLOCK_R, BLOCK_I), dtype=tl.float32)
    w_base = e.to(tl.int64) * I * H
    for hb in range(tl.where(owner, num_sb_h, 0)):  # loop not under `if`: pipelined
        h = hb * BLOCK_H + rh
        x = tl.load(x_ptr + row[:, None] * H + h[None, :], mask=in_run[:, None] & (h[None, :] < H), other=0.0)
        wmask = (ri[:, None] < I) & (h[None, :] < H)
        wg = tl.load(g_ptr + w_base + ri[:, None] * H + h[None, :], mask=wmask, other=0.0).to(x.dtype)
        wu = tl.load(u_ptr + w_base + ri[:, None] * H + h[None, :], mask=wmask, other=0.0).to(x.dtype)
        pg = tl.dot(x, tl.trans(wg), input_precision=PREC)
        pu = tl.dot(x, tl.trans(wu), input_precision=PREC)
        if HAS_SCALE:
            s_off = e * num_sb_i * num_sb_h + ((ib * BLOCK_I) // 128) * num_sb_h + hb
            pg = pg * tl.load(gs_ptr + s_off)
            pu = pu * tl.load(us_ptr + s_off)
        acc_g += pg
        acc_u += pu
    dt = act_ptr.dtype.element_ty
    g = acc_g.to(dt).to(tl.float32)
    u = acc_u.to(dt).to(tl.float32)
    a = (g / (1.0 + tl.exp(-g))).to(dt).to(tl.float32) * u
    tl.store(act_ptr + j[:, None] * I + ri[None, :], a.to(dt), mask=in_run[:, None] & (ri[None, :] < I))


@triton.jit
def _down_kernel(act_ptr, d_ptr, ds_ptr, w_route_ptr, sorted_e_ptr, sorted_pair_ptr, y_ptr,
                 P, E_local, H, I, num_sb_h, num_sb_i,
                 TOPK: tl.constexpr, HAS_SCALE: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_HO: tl.constexpr,
                 BLOCK_I: tl.constexpr, PREC: tl.constexpr):
    p = tl.program_id(0)
    hb = tl.program_id(1)
    e, owner, in_run, j, row = _run_rows(sorted_e_ptr, sorted_pair_ptr, p, P, E_local, TOPK, BLOCK_R)
    rh = hb * BLOCK_HO + tl.arange(0, BLOCK_HO)
    ri = tl.arange(0, BLOCK_I)
    acc = tl.zeros((BLOCK_R, BLOCK_HO), dtype=tl.float32)
    w_base = e.to(tl.int64) * H * I
    for ib in range(tl.where(owner, num_sb_i, 0)):
        i = ib * BLOCK_I + ri
        a = tl.load(act_ptr + j[:, None] * I + i[None, :], mask=in_run[:, None] & (i[None, :] < I), other=0.0)
        wd = tl.load(d_ptr + w_base + rh[:, None] * I + i[None, :],
                     mask=(rh[:, None] < H) & (i[None, :] < I), other=0.0).to(a.dtype)
        part = tl.dot(a, tl.trans(wd), input_precision=PREC)
        if HAS_SCALE:
            part = part * tl.load(ds_ptr + e * num_sb_h * num_sb_i + ((hb * BLOCK_HO) // 128) * num_sb_i + ib)
        acc += part
    dt = y_ptr.dtype.element_ty
    pair = tl.load(sorted_pair_ptr + j, mask=in_run, other=0)
    w = tl.load(w_route_ptr + pair, mask=in_run, other=0.0)
    y = (acc.to(dt).to(tl.float32) * w[:, None]).to(dt)
    tl.store(y_ptr + pair[:, None] * H + rh[None, :], y, mask=in_run[:, None] & (rh[None, :] < H))


@triton.jit
def _combine_kernel(y_ptr, order_ptr, valid_ptr, out_ptr, H, TOPK: tl.constexpr, BLOCK_H: tl.constexpr):
    n = tl.program_id(0)
    h = tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)
    mask = h < H
    dt = out_ptr.dtype.element_ty
    acc = tl.zeros((BLOCK_H,), dtype=tl.float32).to(dt)
    for t in range(TOPK):                      # this row's experts in id order (``order``)
        slot = tl.load(order_ptr + n * TOPK + t)
        if tl.load(valid_ptr + n * TOPK + slot) != 0:
            y = tl.load(y_ptr + (n * TOPK + slot) * H + h, mask=mask, other=0.0)
            acc = (acc.to(tl.float32) + y.to(tl.float32)).to(dt)
    tl.store(out_ptr + n * H + h, acc, mask=mask)


def _block_i(num_pairs: int, I: int) -> int:
    """Intermediate tile: the widest ≤ 128 that still gives ~2 programs per SM."""
    for b in (128, 64, 32):
        if num_pairs * triton.cdiv(I, b) >= 2 * num_sms():
            return b
    return 16


def fused_moe(x: torch.Tensor, topk_idx: torch.Tensor, topk_w: torch.Tensor, gate: torch.Tensor,
              up: torch.Tensor, down: torch.Tensor, gate_s: torch.Tensor | None, up_s: torch.Tensor | None,
              down_s: torch.Tensor | None, expert_offset: int = 0) -> torch.Tensor:
    """x: [N, H] (N ≤ FUSED_MAX_ROWS), topk_idx/topk_w: [N, k] global ids / fp32 weights, gate/up:
    [E_l, I, H], down: [E_l, H, I] (fp8 with block scales, or x's dtype with None) → [N, H] in x's dtype:
    Σ_j w[n,j] · down(silu(gate(x)) · up(x)) over this rank's experts. Graph-capturable."""
    N, H = x.shape
    E_local, I, _ = gate.shape
    k = topk_idx.shape[1]
    x = x.contiguous()
    local = topk_idx - expert_offset
    valid = (local >= 0) & (local < E_local)
    local = torch.where(valid, local, E_local)                                   # sentinel sorts last
    order = local.argsort(dim=1, stable=True).to(torch.int32)                    # per row: experts by id
    sorted_e, sorted_pair = local.flatten().sort(stable=True)                    # [P]: pairs by expert
    sorted_e, sorted_pair = sorted_e.to(torch.int32), sorted_pair.to(torch.int32)
    P = N * k
    act = torch.empty(P, I, dtype=x.dtype, device=x.device)
    y = torch.empty(P, H, dtype=x.dtype, device=x.device)
    out = torch.empty_like(x)
    has_scale = gate_s is not None
    dummy = torch.empty(1, dtype=torch.float32, device=x.device)
    gs, us, ds = (gate_s, up_s, down_s) if has_scale else (dummy, dummy, dummy)
    prec = dot_precision(x.dtype)
    block_r = max(16, next_pow2(N))
    block_i = _block_i(P, I)
    num_sb_h, num_sb_i = triton.cdiv(H, 128), triton.cdiv(I, 128)
    _gate_up_kernel[(P, triton.cdiv(I, block_i))](
        x, gate, up, gs, us, sorted_e, sorted_pair, act, P, E_local, H, I, num_sb_h, num_sb_i,
        TOPK=k, HAS_SCALE=has_scale, BLOCK_R=block_r, BLOCK_I=block_i, BLOCK_H=128, PREC=prec,
        num_warps=4, num_stages=3)
    block_ho = 64 if P * triton.cdiv(H, 64) >= 2 * num_sms() else 32
    _down_kernel[(P, triton.cdiv(H, block_ho))](
        act, down, ds, topk_w.float().contiguous(), sorted_e, sorted_pair, y, P, E_local, H, I,
        triton.cdiv(H, 128), num_sb_i, TOPK=k, HAS_SCALE=has_scale, BLOCK_R=block_r, BLOCK_HO=block_ho,
        BLOCK_I=128, PREC=prec, num_warps=4, num_stages=3)
    block_h = min(1024, next_pow2(H))
    _combine_kernel[(N, triton.cdiv(H, block_h))](y, order, valid.to(torch.int8), out, H, TOPK=k,
                                                 BLOCK_H=block_h, num_warps=4)
    return out


@ops.register("moe_experts", backend="triton", available=on_cuda)
def moe_experts(x: torch.Tensor, topk_idx: torch.Tensor, topk_w: torch.Tensor,
                gate: torch.Tensor, up: torch.Tensor, down: torch.Tensor,
                gate_s: torch.Tensor | None, up_s: torch.Tensor | None, down_s: torch.Tensor | None,
                expert_offset: int = 0) -> torch.Tensor:
    """As ``reference.moe_experts``; few rows run fused, many rows (prefill) the per-expert reference."""
    if x.shape[0] > FUSED_MAX_ROWS or x.shape[0] == 0:
        return reference.moe_experts(x, topk_idx, topk_w, gate, up, down, gate_s, up_s, down_s, expert_offset)
    return fused_moe(x, topk_idx, topk_w, gate, up, down, gate_s, up_s, down_s, expert_offset)
