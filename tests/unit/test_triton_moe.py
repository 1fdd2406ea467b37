"""The MoE kernels (fused and grouped experts, the W8A8 ones, the shared expert, routing) vs their PyTorch
references, on the CPU through Triton's interpreter at tiny shapes — as test_triton_kernels.py, whose interpreter
switch (and the skip where it is not on) this file shares, as conftest's ``tk``."""

from __future__ import annotations

import pytest
import torch

from glmkernels import reference
from glmkernels.reference import fp8_quantize
from tests.unit.test_triton_kernels import rel  # and its check that the interpreter is on


def _moe_inputs(g, N, H, I, E, k, fp8):
    x = torch.randn(N, H, generator=g)
    idx = torch.stack([torch.randperm(E, generator=g)[:k] for _ in range(N)])       # distinct per row
    w = torch.rand(N, k, generator=g)
    gate, up, down = (0.1 * torch.randn(E, a, b, generator=g) for a, b in ((I, H), (I, H), (H, I)))
    if not fp8:
        return x, idx, w, gate, up, down, None, None, None
    (gate, gs), (up, us), (down, ds) = (fp8_quantize(t) for t in (gate, up, down))
    return x, idx, w, gate, up, down, gs, us, ds


@pytest.mark.parametrize("fp8", [True, False])
@pytest.mark.parametrize("N,offset", [(1, 0), (3, 0), (4, 4)])
def test_moe_experts(tk, N, offset, fp8):
    """Expert union (a run of rows shares an expert), rows routed to experts held elsewhere (offset)."""
    g = torch.Generator().manual_seed(3 + N)
    x, idx, w, gate, up, down, gs, us, ds = _moe_inputs(g, N, 128, 192, 8, 4, fp8)
    idx[:, 0] = 5                                                             # every row hits expert 5
    E_l = 4 if offset else 8
    sl = slice(0, E_l)
    args = [gate[sl], up[sl], down[sl]] + ([gs[sl], us[sl], ds[sl]] if fp8 else [None, None, None])
    ref = reference.moe_experts(x, idx, w, *args, expert_offset=offset)
    assert rel(tk["moe"].moe_experts(x, idx, w, *args, expert_offset=offset), ref) < 1e-5
    args16 = [a.half() if a is not None and a.dtype == torch.float32 and a.dim() == 3 and not fp8 else a
              for a in args]
    got16 = tk["moe"].moe_experts(x.half(), idx, w, *args16, expert_offset=offset)
    assert got16.dtype == torch.float16 and rel(got16, ref) < 1e-2
    wide = (tk["moe"].ExpertTile(16, 256), tk["moe"].ExpertTile(32, 256))          # K steps past H and I
    assert rel(tk["moe"].fused_moe(x, idx, w, *args, expert_offset=offset, tiles=wide), ref) < 1e-5
    if N == 1:                                 # the one-row FMA kernels: K steps past H and I, and within
        for fma, each in (((16, 256, 8, 64), False), ((8, 64, 16, 128), False), ((4, 64, 8, 128), True)):
            tiles = tuple(tk["moe"].ExpertTile(*t, fma=True, each=each) for t in (fma[:2], fma[2:]))   # each: reduced
            assert rel(tk["moe"].fused_moe(x, idx, w, *args, expert_offset=offset, tiles=tiles), ref) < 1e-5  # a step
        fma16 = tk["moe"].fused_moe(x.half(), idx, w, *args16, expert_offset=offset)   # FMA (the default)
        dot16 = tk["moe"].fused_moe(x.half(), idx, w, *args16, expert_offset=offset, tiles=wide)
        assert torch.equal(fma16, dot16)       # the same roundings, the same sums at these sizes


def test_moe_experts_runs_in_chunks(tk):
    """Past 32 rows (a graph step's MoE in 8 ranks takes up to 64) an expert's run of pairs goes in chunks of
    RUN_ROWS, each its own program's: a run of every row (40 > 2 chunks) and short runs, against the reference."""
    g = torch.Generator().manual_seed(41)
    x, idx, w, gate, up, down, gs, us, ds = _moe_inputs(g, 40, 128, 192, 8, 4, True)
    idx[:, 0] = 5                                                             # a run of 40 pairs: 16 + 16 + 8
    args = [gate[:4], up[:4], down[:4], gs[:4], us[:4], ds[:4]]
    ref = reference.moe_experts(x, idx, w, *args, expert_offset=4)
    assert tk["moe"].RUN_ROWS < 40 <= tk["moe"].FUSED_MAX_ROWS
    assert rel(tk["moe"].moe_experts(x, idx, w, *args, expert_offset=4), ref) < 1e-5


@pytest.mark.parametrize("fp8", [True, False])
@pytest.mark.parametrize("offset", [0, 4])
def test_grouped_moe(tk, offset, fp8):
    """More rows than the fused launches take (prefill): each expert's run padded to whole blocks, a run over
    several blocks, rows routed to experts held elsewhere — against the reference; the shared expert after."""
    g = torch.Generator().manual_seed(31 + offset)
    N = tk["moe"].FUSED_MAX_ROWS + 8
    x, idx, w, gate, up, down, gs, us, ds = _moe_inputs(g, N, 128, 192, 8, 4, fp8)
    idx[:, 0] = 5                                                             # a run of ≥ N rows: ≥ 3 blocks of 16
    E_l = 4 if offset else 8
    sl = slice(0, E_l)
    args = [gate[sl], up[sl], down[sl]] + ([gs[sl], us[sl], ds[sl]] if fp8 else [None, None, None])
    ref = reference.moe_experts(x, idx, w, *args, expert_offset=offset)
    block_e, slot_pair, _, valid = tk["moe"].group_pairs(idx, offset, E_l, 16)
    held = (idx - offset >= 0) & (idx - offset < E_l)
    assert int(valid.sum()) == int(held.sum()) == int((slot_pair >= 0).sum())
    runs = torch.bincount((idx - offset)[held], minlength=E_l)                 # pairs per local expert
    real = torch.repeat_interleave(torch.arange(E_l, dtype=torch.int32), (runs + 15) // 16)
    bound = -(-idx.numel() // 16) + E_l                                      # known on the host: no sync
    assert block_e.shape == (bound,) and slot_pair.shape == (bound * 16,)
    assert torch.equal(block_e[:len(real)], real) and (block_e[len(real):] == -1).all()
    assert (slot_pair[len(real) * 16:] == -1).all()
    assert rel(tk["moe"].grouped_moe(x, idx, w, *args, expert_offset=offset, block_m=16), ref) < 1e-5
    sh = tuple(t[0] if t is not None else None for t in _moe_inputs(g, 1, 128, 192, 1, 1, fp8)[3:])
    got = tk["moe"].moe_experts(x, idx, w, *args, expert_offset=offset, shared=sh)   # default blocks
    assert rel(got, reference.moe_experts(x, idx, w, *args, expert_offset=offset, shared=sh)) < 1e-5
    args16 = [a.half() if a is not None and a.dtype == torch.float32 and a.dim() == 3 and not fp8 else a
              for a in args]
    got16 = tk["moe"].moe_experts(x.half(), idx, w, *args16, expert_offset=offset)
    assert got16.dtype == torch.float16 and rel(got16, ref) < 1e-2


def test_act_quant_codes_equal_the_reference(tk):
    """Activations to e4m3 per 128 columns: the reference's codes and scales bit for bit — ragged K, a zero row,
    rows whose values sit on rounding ties, mantissa carries (7.99 → 8, which the interpreter's own cast gets
    wrong) and the subnormal range."""
    g = torch.Generator().manual_seed(41)
    x = torch.randn(37, 300, generator=g) * torch.logspace(-6, 3, 37)[:, None]
    x[3] = 0.0
    x[4, :128] = torch.linspace(-448, 448, 128) / 448 * 7.995                # amax ≈ 7.995: s ≈ 1/56
    x[5, :128] = torch.arange(128) * 2.0 ** -10                              # subnormal e4m3 codes after scaling
    x[6, :128] = torch.tensor([448.0, 9.0, 11.0, 13.0, 17.0, 19.0, -9.0, -11.0] * 16)   # ties at 3 mantissa bits
    q, s = tk["w8a8"].act_quant(x)
    ref_q, ref_s = reference.act_quant(x)
    assert torch.equal(s, ref_s)
    assert torch.equal(q.view(torch.uint8), ref_q.view(torch.uint8))
    assert torch.equal(reference.act_quant(x.half())[0].view(torch.uint8), tk["w8a8"].act_quant(x.half())[0].view(
        torch.uint8))


@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-5), (torch.float16, 2e-3)])
def test_w8a8_linear(tk, dtype, tol, monkeypatch):
    """FP8 activations × FP8 block weights on the FP8 dot (exact products): against the reference's fp32 product
    of the dequantized operands; ragged N and K; and how far the activations' quantization moves the result from
    the W8A16 linear (a few per cent, the price of the opt-in)."""
    g = torch.Generator().manual_seed(43)
    x = torch.randn(150, 200, generator=g).to(dtype)
    w8, s = fp8_quantize(0.1 * torch.randn(192, 200, generator=g))
    got = tk["w8a8"].w8a8_linear(x, w8, s)
    assert got.dtype == dtype and rel(got, reference.linear_w8a8(x, w8, s)) < tol
    assert 1e-3 < rel(got, reference.linear(x.float(), w8, s)) < 5e-2
    op, rows = tk["w8a8"].linear, tk["w8a8"].MIN_ROWS
    x_many = torch.randn(rows, 200, generator=g)
    assert torch.equal(op(x_many, w8, s), tk["lin"].linear(x_many, w8, s))         # too little work: W8A16
    monkeypatch.setattr(tk["w8a8"], "MIN_LINEAR_WORK", rows * w8.numel())
    assert torch.equal(op(x_many, w8, s), tk["w8a8"].w8a8_linear(x_many, w8, s))
    assert torch.equal(op(x_many[:rows - 1], w8, s), tk["lin"].linear(x_many[:rows - 1], w8, s))   # too few rows
    q, qs = tk["w8a8"].act_quant(x, rows=152, col_major=True)                   # cuBLAS's layout: padded rows
    ref_q, ref_s = reference.act_quant(x)
    assert qs.stride(0) == 1 and torch.equal(qs[:150], ref_s) and torch.equal(q[:150].view(torch.uint8),
                                                                               ref_q.view(torch.uint8))
    assert not q[150:].float().any()


@pytest.mark.parametrize("offset", [0, 4])
def test_w8a8_moe(tk, offset, monkeypatch):
    """Grouped experts with FP8 activations (rows quantized once, the SiLU-gated activation per 128 columns inside
    the gate/up launch; I = 192 leaves a ragged group): against the reference loop, experts held elsewhere, a run
    over several blocks; the op takes it from MIN_ROWS rows with the shared expert after."""
    g = torch.Generator().manual_seed(47 + offset)
    w8a8 = tk["w8a8"]
    x, idx, w, gate, up, down, gs, us, ds = _moe_inputs(g, 40, 128, 192, 8, 4, True)
    idx[:, 0] = 5
    E_l = 4 if offset else 8
    args = [t[:E_l] for t in (gate, up, down, gs, us, ds)]
    ref = reference.moe_experts_w8a8(x, idx, w, *args, expert_offset=offset)
    # 1e-4, not fp32's 1e-5: a sum order differing in the last fp32 bit can move a value across an e4m3 rounding
    # boundary, and then that activation moves by a whole e4m3 step (measured up to 2.5e-5 here)
    assert rel(w8a8.w8a8_moe(x, idx, w, *args, expert_offset=offset, block_m=16), ref) < 1e-4
    assert 1e-3 < rel(ref, reference.moe_experts(x, idx, w, *args, expert_offset=offset)) < 5e-2
    xm, idxm, wm = _moe_inputs(g, w8a8.MIN_ROWS, 128, 192, 8, 4, True)[:3]
    sh = tuple(t[0] for t in _moe_inputs(g, 1, 128, 192, 1, 1, True)[3:])
    monkeypatch.setattr(w8a8, "MIN_LINEAR_WORK", 0)                       # the shared expert's linears W8A8 too
    got = w8a8.moe_experts(xm, idxm, wm, *args, expert_offset=offset, shared=sh)
    assert rel(got, reference.moe_experts_w8a8(xm, idxm, wm, *args, expert_offset=offset, shared=sh)) < 1e-4
    few = w8a8.moe_experts(xm[:40], idxm[:40], wm[:40], *args, expert_offset=offset)
    assert torch.equal(few, tk["moe"].moe_experts(xm[:40], idxm[:40], wm[:40], *args, expert_offset=offset))


def test_group_launch_fits_shared_memory(tk):
    """The grouped launch shapes: Hopper's measured ones for FP8 experts on bf16 rows (128-row blocks once an expert
    averages 128 pairs); for other dtypes and smaller GPUs, tiles whose estimated shared memory fits."""
    moe = tk["moe"]
    assert moe.group_launch(2048, 8, 256, torch.bfloat16, torch.float8_e4m3fn) == (64, moe.GroupTile(), moe.GroupTile())
    assert moe.group_launch(8192, 8, 256, torch.bfloat16, torch.float8_e4m3fn)[0] == 128
    for smem in (moe.HOPPER_SMEM, 166912, 101376):             # H100/H200, A100, consumer parts
        for x_dt, w_dt in ((torch.float32, torch.float8_e4m3fn), (torch.bfloat16, torch.bfloat16),
                           (torch.float32, torch.float32), (torch.bfloat16, torch.float8_e4m3fn)):
            block_m, gate_up, down = moe.group_launch(8192, 8, 256, x_dt, w_dt, smem)
            if smem < moe.HOPPER_SMEM or x_dt.itemsize != 2 or w_dt.itemsize != 1:
                assert block_m == 64
                for tile, n in ((gate_up, 2), (down, 1)):
                    assert moe._smem_bytes(block_m, tile, x_dt.itemsize, w_dt.itemsize, n) <= 0.9 * smem


def test_moe_gluon_launch_sees_the_ep_share(tk, monkeypatch):
    """``n_experts`` reaches the Gluon launch's shape: an ep rank holding 4 of 16 experts passes share 1/4 (its runs
    are counted from the pairs routed here), every expert held or the shared expert fused 1. The launches themselves
    are replaced (Gluon has no CPU interpreter): the routing and the combine run."""
    seen = []
    monkeypatch.setattr(tk["moe"].gluon_rows, "moe_usable", lambda *a: True)
    monkeypatch.setattr(tk["moe"].gluon_rows, "moe_gemms", lambda *a, share, **kw: seen.append(share))
    g = torch.Generator().manual_seed(21)
    x, idx, w, gate, up, down, gs, us, ds = _moe_inputs(g, 4, 128, 128, 16, 4, True)
    held = [t[4:8] for t in (gate, up, down, gs, us, ds)]
    tk["moe"].moe_experts(x, idx, w, *held, 4, n_experts=16)
    tk["moe"].moe_experts(x, idx, w, gate, up, down, gs, us, ds, 0, n_experts=16)
    tk["moe"].moe_experts(x, idx, w, *held, 4)
    assert seen == [0.25, 1.0, 1.0]


@pytest.mark.parametrize("fp8", [True, False])
@pytest.mark.parametrize("N,offset", [(1, 0), (1, 4), (3, 0), (3, 4), (8, 0), (20, 0)])
def test_moe_experts_with_shared(tk, N, offset, fp8, monkeypatch):
    """The shared expert inside ``moe_experts``: one more pair of the one-row launches, every row's last pair of
    the several-row launches to SHARED_PAIR_ROWS rows (20: its run in two chunks) — its output added last, as the
    reference —, composed after the routed experts past that (20 rows under a bound of 16) and when its shape is not
    one routed expert's (an ep rank's slice)."""
    g = torch.Generator().manual_seed(13 + N)
    x, idx, w, gate, up, down, gs, us, ds = _moe_inputs(g, N, 128, 192, 8, 4, fp8)
    sh = _moe_inputs(g, 1, 128, 192, 1, 1, fp8)[3:]
    shared = tuple(t[0] if t is not None else None for t in sh)               # one expert: 2-D weights
    E_l = 4 if offset else 8
    sl = slice(0, E_l)
    args = [gate[sl], up[sl], down[sl]] + ([gs[sl], us[sl], ds[sl]] if fp8 else [None, None, None])
    ref = reference.moe_experts(x, idx, w, *args, expert_offset=offset, shared=shared)
    assert rel(ref, reference.moe_experts(x, idx, w, *args, expert_offset=offset)
               + reference.swiglu(x, *shared)) == 0
    got = tk["moe"].moe_experts(x, idx, w, *args, expert_offset=offset, shared=shared)
    assert rel(got, ref) < 1e-5
    if N == 20 and fp8:                        # more rows than the bound: composed after the routed experts
        monkeypatch.setattr(tk["moe"], "SHARED_PAIR_ROWS", 16)
        composed = tk["moe"].moe_experts(x, idx, w, *args, expert_offset=offset, shared=shared)
        assert rel(composed, ref) < 1e-5 and not torch.equal(composed, got)
        monkeypatch.undo()
    if N == 1:                                 # the launch a wide expert takes with the shared one fused (9 pairs)
        tiles = tk["moe"].expert_tiles(1, 6144, 2048)
        assert tiles[0].fma and tiles[0].each and tiles[1].each
        got = tk["moe"].fused_moe(x, idx, w, *args, expert_offset=offset, tiles=tiles, shared=shared)
        assert rel(got, ref) < 1e-5
    half = [a.half() if a is not None and a.dtype == torch.float32 and a.dim() == 3 and not fp8 else a
            for a in args]
    shared16 = tuple(a.half() if a is not None and a.dtype == torch.float32 and a.dim() == 2 and not fp8 else a
                     for a in shared)
    fused = tk["moe"].moe_experts(x.half(), idx, w, *half, expert_offset=offset, shared=shared16)
    composed = tk["moe"].moe_experts(x.half(), idx, w, *half, expert_offset=offset) + \
        reference.swiglu(x.half(), *shared16, linear=tk["lin"].linear)
    if fp8 or N == 1:                          # the same roundings in the same order
        assert torch.equal(fused, composed)
    else:                                      # the composed shared expert's linears are torch's GEMMs there
        assert rel(fused, composed) < 1e-3
    narrow = tuple(t[:96] if i < 2 else (t[:, :96] if i == 2 else t) for i, t in enumerate(shared))
    if not fp8:                                # a slice of the shared expert (ep): composed, not fused
        want = reference.moe_experts(x, idx, w, *args, expert_offset=offset) + reference.swiglu(x, *narrow)
        assert rel(tk["moe"].moe_experts(x, idx, w, *args, expert_offset=offset, shared=narrow), want) < 1e-5


@pytest.mark.parametrize("N,offset,E_l", [(1, 0, 8), (3, 4, 4), (5, 2, 3), (37, 2, 5), (130, 2, 5)])
def test_route_pairs(tk, N, offset, E_l):
    """The routing kernel equals torch's stable sorts; experts outside [offset, offset + E_l) sort last (37 rows:
    148 pairs, three routing programs; 130 rows: 520 pairs, the many-pair launch — 8 a program, 128 a step)."""
    g = torch.Generator().manual_seed(8 + N)
    idx = torch.stack([torch.randperm(8, generator=g)[:4] for _ in range(N)])
    idx[:, 2] = offset + 1                                                      # a run shared by every row
    sorted_e, sorted_pair, order, valid, run_start = tk["moe"].route_pairs(idx, offset, E_l)
    local = idx - offset
    is_local = (local >= 0) & (local < E_l)
    local = torch.where(is_local, local, E_l)
    ref_e, ref_pair = local.flatten().sort(stable=True)
    assert torch.equal(sorted_e, ref_e.int()) and torch.equal(sorted_pair, ref_pair.int())
    assert torch.equal(order, local.argsort(dim=1, stable=True).int())
    assert torch.equal(valid.bool(), is_local.flatten())
    assert torch.equal(run_start, torch.searchsorted(ref_e, ref_e).int())                   # each run's first pair
    # the shared expert as every row's fifth pair, local expert E_l (an id offset + E_l routed here is held elsewhere)
    w = torch.rand(N, 4, generator=g)
    sorted_e, sorted_pair, order, valid, run_start, pair_w = tk["moe"].route_pairs_shared(idx, w, offset, E_l)
    local = torch.cat([torch.where(is_local, idx - offset, E_l + 1), torch.full((N, 1), E_l)], 1)
    ref_e, ref_pair = local.flatten().sort(stable=True)
    assert torch.equal(sorted_e, ref_e.int()) and torch.equal(sorted_pair, ref_pair.int())
    assert torch.equal(order, local.argsort(dim=1, stable=True).int())     # the shared slot after the held ones
    assert torch.equal(valid.bool(), (local <= E_l).flatten())
    assert torch.equal(run_start, torch.searchsorted(ref_e, ref_e).int())
    assert torch.equal(pair_w, torch.cat([w, torch.ones(N, 1)], 1).flatten())
