"""Triton kernels vs their PyTorch references, on the CPU through Triton's interpreter at tiny shapes.

The interpreter is switched on in this process before the kernel modules are (re)loaded, so their
``@triton.jit`` functions become interpreted ones. bf16 ``tl.dot`` is wrong in the interpreter, and its
fp32 → bf16 casts truncate (measured: 1.0078 → 1.0), so kernels run in fp32/fp16 here; bf16 and FP8 at
real widths are checked by tests/gpu/test_kernels_gpu.py.
"""

from __future__ import annotations

import itertools
import os

import pytest
import torch

os.environ["TRITON_INTERPRET"] = "1"          # this test process only, before triton is imported
triton = pytest.importorskip("triton", reason="triton is not installed (it is in the 'gpu' extra)")
from triton.runtime.interpreter import InterpretedFunction  # noqa: E402

if not isinstance(triton.language.standard.sum, InterpretedFunction):
    pytest.skip("triton was imported before TRITON_INTERPRET=1 was set (tests/unit/conftest.py sets it; "
                "collect tests/unit first)", allow_module_level=True)

from glmkernels import ops, reference
from glmkernels.reference import fp8_quantize


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a.double() - b.double()).norm() / b.double().norm().clamp(min=1e-30)).item()


@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-6), (torch.float16, 1e-3)])
def test_add_rms_norm_and_rms_norm(tk, dtype, tol):
    g = torch.Generator().manual_seed(0)
    x, r = (torch.randn(3, 200, generator=g).to(dtype) for _ in range(2))
    w = (1 + 0.1 * torch.randn(200, generator=g)).to(dtype)
    out, s = tk["norm"].add_rms_norm(x, r, w, 1e-5)
    ref_out, ref_s = reference.add_rms_norm(x, r, w, 1e-5)
    assert torch.equal(s, ref_s)
    assert rel(out, ref_out) < tol
    strided = torch.randn(3, 260, generator=g).to(dtype)[:, :200]           # rows strided, as ckv[..., :rkv]
    assert rel(tk["norm"].rms_norm(strided, w, 1e-6), reference.rms_norm(strided, w, 1e-6)) < tol


@pytest.mark.parametrize("interleaved", [True, False])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_rope_bit_identical(tk, interleaved, dtype):
    g = torch.Generator().manual_seed(1)
    q = torch.randn(3, 4, 96, generator=g).to(dtype)[..., 32:]               # [N, nh, 64] slice, as q[..., dn:]
    cos, sin = (torch.randn(3, 32, generator=g).to(dtype) for _ in range(2))
    got = tk["norm"].rope(q, cos.view(3, 1, 32), sin.view(3, 1, 32), interleaved)
    assert torch.equal(got, reference.rope(q, cos.view(3, 1, 32), sin.view(3, 1, 32), interleaved))
    k = torch.randn(3, 64, generator=g).to(dtype)
    assert torch.equal(tk["norm"].rope(k, cos, sin, interleaved), reference.rope(k, cos, sin, interleaved))
    heads = torch.randn(3, 4, 128, generator=g).to(dtype)                    # indexer heads: [rope 64 | nope 64]
    got = tk["norm"].rope(heads, cos.view(3, 1, 32), sin.view(3, 1, 32), interleaved)
    want = reference.rope(heads, cos.view(3, 1, 32), sin.view(3, 1, 32), interleaved)
    assert torch.equal(got, want) and torch.equal(want[..., 64:], heads[..., 64:])
    assert torch.equal(want[..., :64], reference.rope(heads[..., :64], cos.view(3, 1, 32), sin.view(3, 1, 32),
                                                      interleaved))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_embed_rope(tk, dtype):
    """The step's start in one launch: the gathered rows bit for bit (a row split over two blocks: H 1500), the
    angles' cos / sin as the reference's to an ulp of fp32 (the interpreter's cos is numpy's)."""
    from models.glm5 import inv_freq
    g = torch.Generator().manual_seed(3)
    table = torch.randn(50, 1500, generator=g).to(dtype)
    ids = torch.tensor([7, 0, 49, 7, 3])
    positions = torch.tensor([0, 1, 4095, 131071, 12])
    freq = inv_freq(64, 10000.0, torch.device("cpu"))
    x, cos, sin = tk["norm"].embed_rope(ids, table, positions, freq)
    ref_x, ref_cos, ref_sin = reference.embed_rope(ids, table, positions, freq)
    assert torch.equal(x, ref_x) and torch.equal(x, table[ids])
    assert cos.dtype == sin.dtype == dtype and cos.shape == sin.shape == (5, 32)
    ulp = 1e-6 if dtype == torch.float32 else 1e-3
    assert torch.allclose(cos, ref_cos, atol=ulp, rtol=0) and torch.allclose(sin, ref_sin, atol=ulp, rtol=0)
    assert tk["norm"].embed_rope(ids[:0], table, positions[:0], freq)[0].shape == (0, 1500)


@pytest.mark.parametrize("M,N,K", [(1, 576, 256), (5, 200, 320), (70, 130, 192), (100, 64, 1024), (130, 1100, 256)])
def test_fp8_linear(tk, M, N, K):
    """Decode (split-K) and mid-size tiles (64-row blocks; split-K on a narrow weight: 100 × 64 × 1024; swapped
    128-row blocks over a wide one: 130 × 1100), partial edge blocks on both weight dims (576 = 4·128 + 64)."""
    assert tk["lin"].mid_tile(M, N, K).swap == (N >= 1024)
    g = torch.Generator().manual_seed(2)
    w8, s = fp8_quantize(0.02 * torch.randn(N, K, generator=g))
    s = s * (1 + torch.rand(s.shape, generator=g))                         # distinct scale per block
    for dtype, tol in ((torch.float32, 1e-5), (torch.float16, 1e-2)):     # the interpreter truncates bf16
        x = torch.randn(M, K, generator=g).to(dtype)
        got = tk["lin"].linear(x, w8, s)
        assert got.dtype == dtype and got.shape == (M, N)
        assert rel(got, reference.linear(x.float(), w8, s)) < tol


def test_linear_group(tk):
    """Two or three FP8 projections of one row in one launch (the others reached by their offsets, ragged
    sizes: 72 rows end in a partial scale block), split-K or not; other cases (more rows, a weight not FP8)
    run them one by one."""
    g = torch.Generator().manual_seed(11)
    (wa, sa), (wb, sb), (wc, sc) = (fp8_quantize(0.02 * torch.randn(n, 300, generator=g)) for n in (128, 72, 40))
    sb = sb * (1 + torch.rand(sb.shape, generator=g))
    sc = sc * (1 + torch.rand(sc.shape, generator=g))
    weights = ((wa, sa), (wb, sb), (wc, sc))
    for rows, dtype, tol in ((1, torch.float32, 1e-5), (1, torch.float16, 1e-2), (3, torch.float32, 1e-5)):
        x = torch.randn(rows, 300, generator=g).to(dtype)
        for n in (2, 3):
            ys = tk["lin"].linear_group(x, *weights[:n])
            assert [y.shape for y in ys] == [(rows, w.shape[0]) for w, _ in weights[:n]]
            assert all(rel(y, reference.linear(x.float(), w, s)) < tol for y, (w, s) in zip(ys, weights))
    expect = torch.cat([reference.linear(x[:1], w, s) for w, s in weights], -1)
    for tile in (tk["lin"].GemvTile(32, 128, 3), tk["lin"].GemvTile(16, 64, 1), tk["lin"].GemvTile(4, 1024, 1),
                 tk["lin"].GemvTile(8, 128, 3), tk["lin"].gemv_tile(600, 6144),    # narrow: 2 rows × 2048, K masked
                 tk["lin"].GemvTile(8, 128, 3, each=True)):
        for n in (2, 3):
            if n == 3 and 72 % tile.block_n:
                continue                                   # a tile would straddle kv-sized and the third weight
            out = torch.empty(1, sum(w.shape[0] for w, _ in weights[:n]))
            tk["lin"]._gemv(x[:1], wa, sa, out, tile, more=weights[1:n])
            assert rel(out, expect[:, :out.shape[1]]) < 1e-5
    dense = torch.randn(72, 300, generator=g)
    _, yb, yc = tk["lin"].linear_group(x[:1], (wa, sa), (dense, None), (wc, sc))
    assert torch.equal(yb, torch.nn.functional.linear(x[:1], dense))
    assert torch.equal(yc, ops.linear(x[:1], wc, sc))                 # apart: each on the configured linear


def test_linear_group_one_row_bound(tk, monkeypatch):
    """One row runs a group as one GEMV launch up to GEMV_GROUP_N outputs; a bigger group (q_b + wq_b: one GEMV was
    slower than two) runs each weight on the configured ``linear`` (W8A8 under ``prefill_activations: fp8``)."""
    g = torch.Generator().manual_seed(12)
    weights = [fp8_quantize(0.02 * torch.randn(n, 256, generator=g)) for n in (128, 64)]
    x = torch.randn(1, 256, generator=g)
    launches = []
    gemv = tk["lin"]._gemv
    monkeypatch.setattr(tk["lin"], "_gemv", lambda *a, **k: launches.append(len(k.get("more", ()))) or gemv(*a, **k))
    grouped = tk["lin"].linear_group(x, *weights)
    assert launches == [1]
    monkeypatch.setattr(tk["lin"], "GEMV_GROUP_N", 191)
    apart = tk["lin"].linear_group(x, *weights)
    assert launches == [1]
    assert all(torch.equal(y, ops.linear(x, w, s)) for y, (w, s) in zip(apart, weights))
    assert all(rel(a, b) < 1e-5 for a, b in zip(apart, grouped))


def test_linear_group_apart_on_the_configured_linear(tk, monkeypatch):
    """Where a group does not run as one launch (here 3 rows: no Gluon under the interpreter) each weight runs on
    the configured ``ops.linear`` — under ``prefill_activations: fp8`` the W8A8 override, which the group used to
    bypass by calling this module's W8A16 ``linear``."""
    g = torch.Generator().manual_seed(13)
    weights = [fp8_quantize(0.02 * torch.randn(n, 256, generator=g)) for n in (128, 72)]
    x = torch.randn(3, 256, generator=g)
    seen = []
    configured = ops.linear
    monkeypatch.setitem(ops._active, "linear", lambda x, w, s=None: seen.append(w.shape[0]) or configured(x, w, s))
    ys = tk["lin"].linear_group(x, *weights)
    assert seen == [128, 72]
    assert all(torch.equal(y, configured(x, w, s)) for y, (w, s) in zip(ys, weights))


def test_linear_f32(tk, monkeypatch):
    """Unquantized weights, fp32 result: the router (fp32 weight, x upcast) and the indexer's head weights
    (rounded to x's dtype first, then scaled) on the one-row kernel (split-K or not), its several-row form (2..8
    rows), the tile kernel (to 256 rows: one block to 64, 64-row blocks past that); prefill rows on the reference."""
    lin = tk["lin"]
    g = torch.Generator().manual_seed(5)
    w32 = torch.randn(40, 300, generator=g)
    for dtype in (torch.float32, torch.float16):
        x = torch.randn(1, 300, generator=g).to(dtype)
        for tile in (lin.gemv_tile(40, 300), lin.GemvTile(8, 128, 3), lin.GemvTile(32, 256, 1)):
            out = torch.empty(1, 40)
            lin._gemv(x, w32, None, out, tile)
            assert rel(out, torch.nn.functional.linear(x.float(), w32)) < 1e-6
        got = lin.linear_f32(x, w32)
        assert got.dtype == torch.float32 and rel(got, reference.linear_f32(x, w32)) < 1e-6
        w = w32.to(dtype)
        want = reference.linear_f32(x, w, rounded=True, scale=32 ** -0.5)
        assert rel(want, torch.nn.functional.linear(x, w).float() * 32 ** -0.5) == 0
        got = lin.linear_f32(x, w, rounded=True, scale=32 ** -0.5)
        assert got.dtype == torch.float32 and rel(got, want) < (1e-6 if dtype == torch.float32 else 1e-3)
        if dtype == torch.float16:             # rounded: every value is an fp16 value times the scale
            assert torch.equal((got / 32 ** -0.5).half().float() * 32 ** -0.5, got)
    for dtype, M in itertools.product((torch.float32, torch.float16), (2, 3, 8, 12)):   # rows kernel, tile kernel
        xm = torch.randn(M, 300, generator=g).to(dtype)
        got = lin.linear_f32(xm, w32)
        assert got.dtype == torch.float32 and rel(got, reference.linear_f32(xm, w32)) < 1e-6
        w = w32.to(dtype)
        got = lin.linear_f32(xm, w, rounded=True, scale=0.5)
        assert rel(got, reference.linear_f32(xm, w, rounded=True, scale=0.5)) < (1e-6 if dtype == torch.float32
                                                                                 else 1e-3)
        assert torch.equal((got * 2).to(dtype).float() * 0.5, got)
    for M, tile in ((3, lin.GemvTile(8, 64, 3)), (5, lin.GemvTile(4, 128, 1)), (8, lin.GemvTile(8, 32, 2))):
        xm = torch.randn(M, 300, generator=g)              # the rows kernel's K steps and splits (2 or 3 or none)
        out = torch.empty(M, 40)
        lin._gemv_rows(xm, w32, out, tile)
        assert rel(out, torch.nn.functional.linear(xm, w32)) < 1e-6
    blocks = []                                            # a dp step's MoE rows: 64-row blocks of the tile kernel
    tiles = lin._tiles
    monkeypatch.setattr(lin, "_tiles", lambda x2, w, s, out, block_m, *a, **kw: (blocks.append(block_m),
                                                                               tiles(x2, w, s, out, block_m, *a, **kw)))
    for M in (70, 130):
        xm = torch.randn(M, 300, generator=g)
        assert rel(lin.linear_f32(xm, w32), reference.linear_f32(xm, w32)) < 1e-6
    assert blocks == [64, 64]
    monkeypatch.undo()
    many = torch.randn(300, 300, generator=g)              # prefill rows: the reference
    assert torch.equal(lin.linear_f32(many, w32), reference.linear_f32(many, w32))


@pytest.mark.parametrize("M", [1, 3])
def test_fp8_linear_split_k_semaphore(tk, M):
    """Split-K reduced in the launch: the last split of each tile sums the partials in split order and
    resets its counter, so a second call gives the same bits and leaves every counter at zero."""
    lin = tk["lin"]
    g = torch.Generator().manual_seed(7)
    w8, s = fp8_quantize(0.02 * torch.randn(40, 300, generator=g))
    s = s * (1 + torch.rand(s.shape, generator=g))
    x = torch.randn(M, 300, generator=g)
    tiles = [lin.LinearTile(16, 128, 3), lin.LinearTile(32, 256, 2),            # 3 and 2 splits, edge K step
             lin.LinearTile(32, 128, 3, swap=True), lin.LinearTile(64, 256, 1, swap=True, block_m=32),  # W · x.T
             lin.LinearTile(32, 128, 3, prescale=True), lin.LinearTile(64, 256, 2, swap=True, prescale=True)]
    if M == 1:                                                                 # the one-row (FMA) kernel too
        tiles += [lin.GemvTile(16, 128, 3), lin.GemvTile(32, 256, 2), lin.GemvTile(8, 64, 1),
                  lin.GemvTile(32, 128, 3, each=True), lin.GemvTile(16, 256, 1, each=True)]   # reduced every K step
    for tile in tiles:
        first = lin.fp8_linear(x, w8, s, tile)
        assert rel(first, reference.linear(x, w8, s)) < 1e-5
        assert torch.equal(lin.fp8_linear(x, w8, s, tile), first)
        assert not lin.tile_counters(x.device).any()


def test_fp8_linear_wide_tiles(tk):
    """Weight tiles over several 128-row scale blocks (256 outputs a program: each row scaled by its own block's
    scale, a partial last block), swapped or not, split or not, the weight scaled before its dot or the product
    after (fp16: the prescaled tile is the reference's fp16 weight times x)."""
    lin = tk["lin"]
    g = torch.Generator().manual_seed(9)
    w8, s = fp8_quantize(0.02 * torch.randn(300, 300, generator=g))
    s = s * (1 + torch.rand(s.shape, generator=g))                         # distinct scale per block
    x = torch.randn(70, 300, generator=g)
    for tile in (lin.LinearTile(256, 128, 2, swap=True, block_m=64), lin.LinearTile(256, 256, 1, block_m=16),
                 lin.LinearTile(256, 128, 2, swap=True, block_m=64, prescale=True),
                 lin.LinearTile(256, 256, 1, block_m=16, prescale=True)):
        assert rel(lin.fp8_linear(x, w8, s, tile), reference.linear(x, w8, s)) < 1e-5
        if tile.prescale:
            assert rel(lin.fp8_linear(x.half(), w8, s, tile), reference.linear(x.half(), w8, s)) < 1e-4
    assert not lin.tile_counters(x.device).any()


@pytest.mark.parametrize("n_group,topk_group,norm", [(1, 1, True), (4, 2, False)])
def test_router_topk(tk, n_group, topk_group, norm):
    """Same id sets as the reference, weights within 1e-6; ties inside the selection; all-tied rows pick the
    lowest ids (groups too)."""
    router = tk["router"].router_topk
    g = torch.Generator().manual_seed(9)
    for N in (1, 3):
        logits, bias = torch.randn(N, 32, generator=g), 0.1 * torch.randn(32, generator=g)
        logits[:, 9] = logits[:, 10] = 5.0                                  # tied, one group
        bias[9] = bias[10] = 0.0
        ids, w = router(logits, bias, 6, n_group, topk_group, norm, 2.5)
        ref_ids, ref_w = reference.router_topk(logits, bias, 6, n_group, topk_group, norm, 2.5)
        for n in range(N):
            assert set(ids[n].tolist()) == set(ref_ids[n].tolist()) and {9, 10} <= set(ids[n].tolist())
            got_w = dict(zip(ids[n].tolist(), w[n].tolist()))
            assert all(abs(got_w[i] - x) <= 1e-6 * abs(x) for i, x in zip(ref_ids[n].tolist(), ref_w[n].tolist()))
    ids, w = router(torch.zeros(2, 32), torch.zeros(32), 6, n_group, topk_group, True, 1.0)
    assert torch.equal(ids, torch.arange(6).expand(2, 6)) and torch.allclose(w, torch.full((2, 6), 1 / 6))
    logits, bias = torch.randn(2, 36, generator=g), 0.1 * torch.randn(36, generator=g)   # groups of 9: padded lanes
    ids, w = router(logits, bias, 6, 4, 2, norm, 2.5)
    ref_ids, ref_w = reference.router_topk(logits, bias, 6, 4, 2, norm, 2.5)
    for n in range(2):
        got_w = dict(zip(ids[n].tolist(), w[n].tolist()))
        assert set(got_w) == set(ref_ids[n].tolist())
        assert all(abs(got_w[i] - x) <= 1e-6 * abs(x) for i, x in zip(ref_ids[n].tolist(), ref_w[n].tolist()))


def test_value_id_keys(tk):
    """The sampler's top-k keys: equal to the reference's bit for bit (signed zeros, infinities, subnormals, ties across
    a block's edge), and a topk of them is a stable descending sort."""
    keys = tk["sample"].value_id_keys
    x = (torch.randn(3, 2500, generator=torch.Generator().manual_seed(0)) * 4).bfloat16().float()   # ties, as bf16
    x[0, :6] = torch.tensor([0.0, -0.0, float("inf"), -float("inf"), 1e-40, -1e-40])
    x[1, 2040:2056] = 0.5                                                   # a tie over the first block's end
    got = keys(x)
    assert got.dtype == torch.int64 and torch.equal(got, reference.value_id_keys(x))
    stable = x.sort(dim=-1, descending=True, stable=True).indices[:, :300]
    assert torch.equal(got.topk(300, dim=-1).indices, stable)
    assert keys(x[:0]).shape == (0, 2500)


def test_penalize_as_the_reference(tk):
    """The penalties in one launch: the reference's bits (interpreted: the division and the separate roundings) over
    positive, negative, zero and -inf logits, ids seen or not, generated once or often, and a row of 1 / 0 / 0."""
    g = torch.Generator().manual_seed(4)
    x = torch.randn(4, 2500, generator=g) * 5
    x[0, :4] = torch.tensor([0.0, -0.0, -float("inf"), float("inf")])
    counts = torch.randint(0, 3, (4, 2, 2500), generator=g, dtype=torch.int32)
    counts[:, 1] *= torch.randint(0, 2, (4, 2500), generator=g, dtype=torch.int32) * 7         # generated: 0 or often
    values = torch.tensor([[1.3, 0.5, 0.25], [1.0, 0.0, 0.0], [0.7, -1.0, 0.1], [1.05, 0.0, 1.7]])
    got = tk["sample"].penalize(x, counts, values)
    assert torch.equal(got, reference.penalize(x, counts, values)) and got.data_ptr() != x.data_ptr()
    assert torch.equal(got[1], x[1])                                        # 1 / 0 / 0: untouched
    assert tk["sample"].penalize(x[:0], counts[:0], values[:0]).shape == (0, 2500)


@pytest.mark.parametrize("per_row", [False, True])
def test_top_p_race_draws_as_the_reference(tk, per_row):
    """The nucleus without a sort: the reference's draws (bf16-valued logits: ties; two chunks of the pass), with
    top-p per row or one for all, min-p or none, a row without top-p (inf)."""
    race = tk["sample"].top_p_race
    g = torch.Generator().manual_seed(1)
    for trial in range(6):
        x = (torch.randn(4, 2500, generator=g) * (1 + trial)).bfloat16().float() / 0.7
        noise = torch.empty_like(x).exponential_(generator=g).clamp_(min=torch.finfo(torch.float32).tiny)
        top_p = torch.tensor([[0.5], [0.9], [0.99], [float("inf")]]) if per_row else 0.9
        for min_p in (None, 0.05, torch.tensor([[0.0], [0.2], [0.01], [0.5]]) if per_row else None):
            assert torch.equal(race(x, noise, top_p, min_p), reference.top_p_race(x, noise, top_p, min_p))


@pytest.mark.parametrize("bf16", [False, True])
def test_top_p_race_finds_the_boundary(tk, bf16):
    """Noise that makes the last kept token (in the order value, then id) win the race: the draw is the nucleus's
    boundary, the same as the reference's for top-p across the range (its bits are decided at every level)."""
    race = tk["sample"].top_p_race
    g = torch.Generator().manual_seed(3)
    for trial in range(3):
        x = torch.randn(2, 2500, generator=g) * (1.5 + trial)
        x = x.bfloat16().float() if bf16 else x / 0.7
        order = x.sort(dim=-1, descending=True, stable=True).indices
        rank_from_end = torch.empty_like(order).scatter_(1, order, torch.arange(2499, -1, -1).expand(2, -1))
        noise = torch.exp(x - x.amax(dim=-1, keepdim=True)) * (1 + 1e-4 * rank_from_end)   # w / noise falls by order
        for top_p in (0.05, 0.3, 0.7, 0.9, 0.999):
            want = reference.top_p_race(x, noise, top_p, None)
            assert torch.equal(race(x, noise, top_p, None), want), (trial, top_p)
            assert (want != order[:, 0]).any() or top_p < 0.1                  # (the boundary, not the top token)


def test_top_p_race_splits_a_tie_by_id_across_chunks(tk):
    """The cut inside a tie of 40 tokens spread over the pass's first chunk's end: the lowest ids are kept, as many as
    stay below top-p — a probe token with the smallest noise wins where it is kept, else the best kept one."""
    race = tk["sample"].top_p_race
    V = 2500
    x = torch.full((1, V), -30.0)
    x[0, 7] = 2.0                                           # weight 1; the ties weigh e^-1 each
    ties = list(range(2030, 2070))
    x[0, ties] = 1.0
    w_tie, total = float(torch.exp(torch.tensor(-1.0))), 1 + 40 * float(torch.exp(torch.tensor(-1.0)))
    for top_p in (0.3, 0.55, 0.8):
        kept = [i for i, t in enumerate(ties) if 1 + i * w_tie < top_p * total]          # (fp64: off any edge)
        for probe in (ties[len(kept) - 1], ties[len(kept)]):
            noise = torch.ones(1, V)
            noise[0, probe] = 1e-6
            want = probe if probe in [ties[i] for i in range(len(kept))] else 7
            assert race(x, noise, top_p, None).item() == want == reference.top_p_race(x, noise, top_p, None).item()
    assert race(x, noise, 0.8, 1.0).item() == 7          # min-p 1: the most likely token alone (a weight of 1 is kept)
    tiny = float(torch.tensor(1e-300, dtype=torch.float32))                          # 0: a top-p of 1e-300 in fp32
    assert race(x, noise, tiny, None).item() == 7 == reference.top_p_race(x, noise, tiny, None).item()


@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-5), (torch.float16, 1e-2)])
def test_mla_sparse_attention(tk, dtype, tol):
    g = torch.Generator().manual_seed(4)
    N, nh, rkv, dr, slots, K = 3, 4, 64, 16, 300, 150
    q_lat = torch.randn(N, nh, rkv, generator=g).to(dtype)
    q_rope = torch.randn(N, nh, dr + 16, generator=g).to(dtype)[..., 16:]       # strided heads
    kv = torch.randn(slots, rkv + dr, generator=g).to(dtype)
    sel = torch.stack([torch.randperm(slots, generator=g)[:K] for _ in range(N)])
    sel[1, 20:] = -1                                                           # fewer keys selected: -1s last
    sel[2, ::3] = -1                                                           # and among them
    got = tk["att"].mla_sparse_attention(q_lat, q_rope, kv, sel, 0.1)
    ref = reference.mla_sparse_attention(q_lat.float(), q_rope.float(), kv.float(), sel, 0.1)
    assert got.shape == (N, nh, rkv) and got.dtype == dtype and rel(got, ref) < tol
    for tile in ((64, 1, 64, 32, 4), (32, 2, 64, 64, 8)):         # more heads a program than there are (masked)
        trimmed = tk["att"]._mla(q_lat, q_rope, kv, sel, 0.1, *tile, trim=True)   # row 1 stops after key 20
        assert rel(trimmed, ref) < tol and torch.equal(trimmed, tk["att"]._mla(q_lat, q_rope, kv, sel, 0.1, *tile))


def test_mla_splits_fill_one_wave(tk):
    """The sparse attention's splits of a row's 2048 keys on an H200's 132 SMs: the few-row picks as tuned (1..8
    rows), and past 8 rows the most splits whose programs (rows × splits, all 64 heads in one) fit one wave — 16 / 32 /
    64 rows 8 / 4 / 2 splits (5 and 3 at 32 and 64 rows left a second wave part full: 1.29× / 1.30× slower, session
    35). Every key in exactly one split, each split whole key blocks."""
    att = tk["att"]

    def split(N):
        bk, per_sm, most, bh, _ = att.mla_tile(N)
        programs = N * -(-64 // bh)
        return (programs, per_sm, bk, *att.mla_splits(programs, 2048, bk, per_sm, most, 132))
    assert [split(N)[3] for N in (1, 2, 4, 8, 16, 32, 64, 128, 256)] == [32, 16, 16, 8, 8, 4, 2, 1, 1]
    for N in range(1, 300):
        programs, per_sm, bk, splits, keys = split(N)
        assert splits == 1 or programs * splits <= per_sm * 132, N
        assert (splits - 1) * keys < 2048 <= splits * keys and keys % bk == 0, N


def _same_sets_or_tied(got, ref, score_of, margin=1e-4):
    """Per row the selected sets must match, except members whose scores tie at the top-k boundary."""
    for n in range(got.shape[0]):
        a, b = set(got[n].tolist()), set(ref[n].tolist())
        if a != b:
            s = score_of(n)
            diff = [s[x] for x in a ^ b if x >= 0]
            assert diff and max(diff) - min(diff) < margin, f"row {n}: sets differ beyond a tie"


def _ragged_case(prefill_rows: int):
    """A ragged indexer step: request 0 has ``prefill_rows`` rows ending at position 59 (a prefill chunk or a verify);
    request 1 one decode row at position 99; request 2 is short (T = 10 ≤ topk: every visible key selected)."""
    g = torch.Generator().manual_seed(5)
    ih, idd, slots = 16, 32, 256
    k_cache = torch.randn(slots, idd, generator=g)
    seq_slots = [torch.randperm(slots, generator=g)[:60], torch.randperm(slots, generator=g)[:100],
                 torch.randperm(slots, generator=g)[:10]]
    n = prefill_rows + 2
    seq_rows = [(0, prefill_rows), (prefill_rows, 1), (prefill_rows + 1, 1)]
    positions = torch.tensor([*range(60 - prefill_rows, 60), 99, 9])
    q, w = torch.randn(n, ih, idd, generator=g), torch.randn(n, ih, generator=g)
    return q, w, k_cache, seq_rows, seq_slots, positions


@pytest.mark.parametrize("prefill_rows", [3, 11, 31])
@pytest.mark.parametrize("score_bytes", [None, 800])
def test_indexer_topk_sets(tk, monkeypatch, prefill_rows, score_bytes):
    """The prefill indexer against the reference — 11 or 31 rows of one request take the rows kernel (blocks of 8
    rows), 3 the one-row kernel; ``score_bytes``: both score in slabs of rows (800 bytes: the Triton path's least
    slab, 16 rows, so that 31 rows cut a request and leave the short request alone in the last slab; 1 row in the
    reference's) and select what they select unslabbed."""
    q, w, k_cache, seq_rows, seq_slots, positions = _ragged_case(prefill_rows)
    args = (q, w, k_cache, seq_rows, seq_slots, positions, 24, q.shape[2] ** -0.5)
    whole, whole_ref = tk["att"].indexer_topk(*args), reference.indexer_topk(*args)
    if score_bytes is not None:
        monkeypatch.setattr(reference, "INDEXER_SCORE_BYTES", score_bytes)
    got, ref = tk["att"].indexer_topk(*args), reference.indexer_topk(*args)
    assert got.shape == ref.shape == whole.shape
    for n in range(q.shape[0]):
        assert set(got[n].tolist()) == set(whole[n].tolist()) and set(ref[n].tolist()) == set(whole_ref[n].tolist())
    scores, _, _ = tk["att"].index_scores(*args[:6], args[7])

    def score_of(n):
        req = next(i for i, (r0, nr) in enumerate(seq_rows) if r0 <= n < r0 + nr)
        return {int(s): float(scores[n, t]) for t, s in enumerate(seq_slots[req].tolist())}
    _same_sets_or_tied(got, ref, score_of)


def test_indexer_topk_takes_the_steps_ragged_slots(tk):
    """A step's keys as ``build_batch`` gives them (``RaggedSlots``: built once a step, in its one copy) select what
    the per-request slot lists select; with every context within ``topk`` the selection is every visible key — the
    reference's tensor exactly, in a few launches whatever the requests — computed once and kept for the step's
    other layers, as the scorer's row blocks are."""
    from models.cache import build_batch

    g = torch.Generator().manual_seed(8)
    batch = build_batch([(40, 20, [0, 1, 2, 3]), (99, 1, list(range(10, 17))), (0, 10, [20])], 16)  # 60, 100, 10 keys
    q, w, k_cache = torch.randn(31, 16, 32, generator=g), torch.randn(31, 16, generator=g), torch.randn(336, 32,
                                                                                                        generator=g)
    args = (q, w, k_cache, batch.seq_rows, batch.seq_slots, batch.positions)
    got = tk["att"].indexer_topk(*args, 24, 32 ** -0.5, batch.ragged)             # scored: 100 keys > 24
    want = tk["att"].indexer_topk(*args, 24, 32 ** -0.5)
    assert all(set(a) == set(b) for a, b in zip(got.tolist(), want.tolist()))
    assert [k[0] for k in batch.ragged.derived] == ["score_rows"]                  # 20 rows of one request: rows kernel
    got = tk["att"].indexer_topk(*args, 100, 32 ** -0.5, batch.ragged)            # every context within 100
    assert torch.equal(got, reference.indexer_topk(*args, 100, 32 ** -0.5))
    assert tk["att"].indexer_topk(*args, 100, 32 ** -0.5, batch.ragged) is got


@pytest.mark.parametrize("tile", [(8, 64, 1024, 8), (4, 16, 32, 4)])     # one program a block; 4 steps of 16 keys
def test_prefill_rows_scores_equal_the_one_row_kernel(tk, tile):
    """The rows kernel's scores (blocks of rows of one request, a block's last rows and keys masked) equal the one-row
    kernel's at fp32 rounding, with -inf exactly where a key is not visible to the row."""
    q, w, k_cache, seq_rows, seq_slots, positions = _ragged_case(11)
    scale = q.shape[2] ** -0.5
    want, _, _ = tk["att"].index_scores(q, w, k_cache, seq_rows, seq_slots, positions, scale)
    r = reference.ragged_slots(seq_rows, seq_slots, q.device)
    blocks = tk["att"]._row_blocks(seq_rows, r.bases, r.lengths, 0, q.shape[0], tile[0])
    assert blocks[:2] == [(0, tile[0], 0, 60), (tile[0], min(tile[0], 11 - tile[0]), 0, 60)]
    got = tk["att"]._score_rows(q, w, k_cache, r, seq_rows, 0, positions, want.shape[1], scale, tile)
    assert torch.equal(torch.isinf(got), torch.isinf(want))
    finite = torch.isfinite(want)
    assert torch.allclose(got[finite], want[finite], rtol=1e-5, atol=1e-5)


def test_indexer_topk_paged_sets(tk):
    """The graph path's paged indexer: block-table rows (strided view, a pad row), the same sets as the
    reference's paged indexer; -1 exactly where fewer keys are visible than K."""
    g = torch.Generator().manual_seed(8)
    ih, idd, topk, bs, blocks = 16, 32, 24, 4, 40
    k_cache = torch.randn(blocks * bs, idd, generator=g)
    table = torch.zeros(4, 32, dtype=torch.int32)
    for r in range(3):
        table[r, :25] = torch.randperm(blocks, generator=g)[:25].to(torch.int32)
    table = table[:, :25]                                         # a strided view, as the graph buffers are
    positions = torch.tensor([57, 99, 9, 0])                     # row 2: 10 keys ≤ topk; row 3: a pad row
    q, w = torch.randn(4, ih, idd, generator=g), torch.randn(4, ih, generator=g)
    got = tk["att"].indexer_topk_paged(q, w, k_cache, table, bs, positions, topk, idd ** -0.5)
    ref = reference.indexer_topk_paged(q, w, k_cache, table, bs, positions, topk, idd ** -0.5)
    assert got.shape == ref.shape == (4, topk)
    for n in range(4):
        assert set(got[n].tolist()) == set(ref[n].tolist()), n
    assert (got[2] == -1).sum() == topk - 10 and (got[3] == -1).sum() == topk - 1


def test_wide_select(tk):
    """The many-programs select of wide rows, on rows spread over several programs: keys > the K-th value in
    key order, then the first ties in key order; negative, zero and -inf scores; the ends (K = 1, K = W);
    one value throughout; the workspace left zeroed for the next launch."""
    g = torch.Generator().manual_seed(11)
    W, K, bs = 300, 37, 4
    score = torch.randn(3, W, generator=g)
    score[0, :100] = 0.5                                         # 100-way tie across the K-th value
    score[0, 100:] = torch.rand(200, generator=g) * 0.4 - 0.2
    score[0, 100:120] = 0.9                                      # 20 above the tie, in a later program
    score[1, 20:] = float("-inf")                                # 20 visible < K
    score[2, ::3] = -0.0
    table = torch.randperm(W // bs + 5, generator=g)[:W // bs].repeat(3, 1).to(torch.int32)
    slot = (table[0].long()[:, None] * bs + torch.arange(bs)).flatten()
    out = tk["att"].wide_select(score, table, bs, K, block=64)                 # 5 programs a row, the last partial
    assert out[0].tolist() == slot[list(range(100, 120)) + list(range(17))].tolist()
    assert set(out[1].tolist()) == set(slot[:20].tolist()) | {-1} and (out[1] == -1).sum() == K - 20
    assert set(out[2].tolist()) == set(slot[score[2].topk(K).indices].tolist())
    for k in (1, 2, 299, 300):
        one = tk["att"].wide_select(score[2:], table[2:], bs, k, block=32)
        assert set(one[0].tolist()) == set(slot[score[2].topk(k).indices].tolist()), k
    score[2] = 3.0
    assert tk["att"].wide_select(score[2:], table[2:], bs, 300, block=64)[0].tolist() == slot.tolist()
    assert tk["att"].wide_select(score[2:], table[2:], bs, K, block=64)[0].tolist() == slot[:K].tolist()
    ws = tk["att"]._select_workspaces[torch.device("cpu")]
    assert not ws.hist.any() and not ws.count.any()


@pytest.mark.parametrize("interleaved", [True, False])
def test_norm_rope_store(tk, interleaved):
    """MLA's (RMSNorm'd latent | roped key) and the indexer's (LayerNorm'd key, first dims roped) cache rows,
    scattered to slots (a negative slot wraps as in indexing): equal to the reference composition."""
    g = torch.Generator().manual_seed(10)
    for dtype in (torch.float32, torch.float16):
        for D, n_norm, rope_at, layer in ((72, 64, 64, False), (32, 32, 0, True)):
            x = torch.randn(3, D, generator=g).to(dtype)
            w = (1 + 0.1 * torch.randn(n_norm, generator=g)).to(dtype)
            b = (0.1 * torch.randn(n_norm, generator=g)).to(dtype) if layer else None
            cos, sin = (torch.randn(3, 4, generator=g).to(dtype) for _ in range(2))
            slots = torch.tensor([5, 0, -1])
            got, want = (torch.full((8, D), float("nan"), dtype=dtype) for _ in range(2))
            tk["norm"].norm_rope_store(x, w, b, 1e-6, n_norm, cos, sin, rope_at, interleaved, got, slots)
            reference.norm_rope_store(x, w, b, 1e-6, n_norm, cos, sin, rope_at, interleaved, want, slots)
            assert torch.equal(got.isnan(), want.isnan()) and got.isnan().sum() == 5 * D
            assert rel(got.nan_to_num(), want.nan_to_num()) < (1e-6 if dtype == torch.float32 else 1e-3)


@pytest.mark.parametrize("interleaved", [True, False])
def test_norm_rope_store_row_sets(tk, interleaved):
    """MLA's key rows, the indexer's and q_a's RMSNorm (no rope, row n to row n) in one launch (``also``: programs
    (n, 1), (n, 2)) — each output as the reference writes it, and as the one-set launches and ``rms_norm`` do."""
    from glmkernels.reference import CacheRows
    g = torch.Generator().manual_seed(14)
    for dtype in (torch.float32, torch.float16):
        group = torch.randn(3, 48 + 72 + 32, generator=g).to(dtype)           # one projection launch's output
        q_a, ckv, k = group[:, :48], group[:, 48:120], group[:, 120:]          # strided views of it
        w_q, w_kv = ((1 + 0.1 * torch.randn(n, generator=g)).to(dtype) for n in (48, 64))
        w_k, b_k = (1 + 0.1 * torch.randn(32, generator=g)).to(dtype), (0.1 * torch.randn(32, generator=g)).to(dtype)
        cos, sin = (torch.randn(3, 4, generator=g).to(dtype) for _ in range(2))
        slots = torch.tensor([5, 0, -1])
        outs = {name: [torch.full(shape, float("nan"), dtype=dtype) for _ in range(3)]
                for name, shape in (("kv", (8, 72)), ("k", (8, 32)), ("q", (3, 48)))}
        stores = ((tk["norm"].norm_rope_store, True), (reference.norm_rope_store, True),
                  (tk["norm"].norm_rope_store, False))
        for i, (store, one_launch) in enumerate(stores):
            also = (CacheRows(k, w_k, b_k, 1e-6, 32, 0, not interleaved, outs["k"][i]),
                    CacheRows(q_a, w_q, None, 1e-6, 48, None, False, outs["q"][i], at_slots=False))
            store(ckv, w_kv, None, 1e-6, 64, cos, sin, 64, interleaved, outs["kv"][i], slots,
                  also=also if one_launch else ())
            if not one_launch:
                store(k, w_k, b_k, 1e-6, 32, cos, sin, 0, not interleaved, outs["k"][i], slots)
                outs["q"][i].copy_(tk["norm"].rms_norm(q_a, w_q, 1e-6))
        for got, want, alone in outs.values():
            unwritten = 5 * got.shape[1] if got.shape[0] == 8 else 0             # caches: 5 of 8 slots unwritten
            assert torch.equal(got.isnan(), want.isnan()) and got.isnan().sum() == unwritten
            assert rel(got.nan_to_num(), want.nan_to_num()) < (1e-6 if dtype == torch.float32 else 1e-3)
            assert torch.equal(got.nan_to_num(), alone.nan_to_num())


def fp8_kv_b(nh: int, dn: int, dv: int, rkv: int, g: torch.Generator):
    """An FP8 kv_b_proj Linear (nh heads of dn + dv rows, latent rkv) with a distinct scale per block."""
    from models.glm5 import Linear
    kv_b = Linear(rkv, nh * (dn + dv))
    kv_b.to_fp8()
    w8, sc = fp8_quantize(0.05 * torch.randn(nh * (dn + dv), rkv, generator=g))
    kv_b.weight.data.copy_(w8)
    kv_b.weight_scale_inv.data.copy_(sc * (1 + torch.rand(sc.shape, generator=g)))
    return kv_b


def test_mla_absorb_expand(tk):
    """W_UK / W_UV applied from the FP8 kv_b weight (scale blocks straddle heads: 192 rows a head), as the
    reference's einsums over the dequantized weight; bf16 kv_b (no scales) falls back to them."""
    g = torch.Generator().manual_seed(12)
    nh, dn, dv, rkv = 3, 64, 128, 256
    kv_b = fp8_kv_b(nh, dn, dv, rkv, g)
    for dtype, tol in ((torch.float32, 1e-5), (torch.float16, 1e-2)):
        q = torch.randn(4, nh, dn + 64, generator=g).to(dtype)[..., :dn]          # a strided view, as q_nope
        o_lat = torch.randn(4, nh, rkv, generator=g).to(dtype)
        for rows in (4, 2, 1):                 # several rows: one read of the weight for all; one row: FMA
            q, o_lat = q[:rows], o_lat[:rows]
            assert rel(tk["absorb"].mla_absorb(q, kv_b), reference.mla_absorb(q.float(), kv_b)) < tol
            assert rel(tk["absorb"].mla_expand(o_lat, kv_b, dn), reference.mla_expand(o_lat.float(), kv_b, dn)) < tol
            for block_c in (64, 128):          # the several-row kernels at one row too, and 64-wide steps
                a = tk["absorb"]._absorb_rows(q, kv_b, block_c, 4)
                e = tk["absorb"]._expand_rows(o_lat, kv_b, dn, block_c, 4)
                assert rel(a, reference.mla_absorb(q.float(), kv_b)) < tol
                assert rel(e, reference.mla_expand(o_lat.float(), kv_b, dn)) < tol


@pytest.mark.parametrize("interleaved", [True, False])
def test_mla_absorb_rope(tk, interleaved):
    """The absorb with q's rope dims roped in the same launch (the few-row kernels' first column block): q_lat
    as ``mla_absorb``, q_rope bit-identical to ``rope`` — one row (FMA kernel) and several (the dot kernel, also
    at one row); a bf16 kv_b (no scales) falls back to the two ops."""
    from models.glm5 import Linear
    g = torch.Generator().manual_seed(13)
    nh, dn, dv, rkv, half = 3, 64, 128, 256, 32
    kv_b = fp8_kv_b(nh, dn, dv, rkv, g)
    for dtype, tol in ((torch.float32, 1e-5), (torch.float16, 1e-2)):
        q = torch.randn(4, nh, dn + 2 * half, generator=g).to(dtype)
        cos, sin = (torch.randn(4, half, generator=g).to(dtype) for _ in range(2))
        for rows in (4, 2, 1):
            c, s = cos[:rows], sin[:rows]
            want = reference.rope(q[:rows, :, dn:], c.view(rows, 1, half), s.view(rows, 1, half), interleaved)
            q_lat, q_rope = tk["absorb"].mla_absorb_rope(q[:rows], kv_b, dn, c, s, interleaved)
            assert rel(q_lat, reference.mla_absorb(q[:rows, :, :dn].float(), kv_b)) < tol
            assert torch.equal(q_rope, want)
            out = torch.full_like(want, float("nan"))
            tk["absorb"]._absorb_rows(q[:rows, :, :dn], kv_b, 64, 4, rope=(c, s, out, interleaved))
            assert torch.equal(out, want)
    dense = Linear(rkv, nh * (dn + dv))
    dense.weight.data.copy_(torch.randn(dense.weight.shape, generator=g))
    q_lat, q_rope = tk["absorb"].mla_absorb_rope(q[:1].float(), dense, dn, cos[:1].float(), sin[:1].float(), interleaved)
    assert torch.equal(q_lat, reference.mla_absorb(q[:1, :, :dn].float(), dense))
    assert torch.equal(q_rope, reference.rope(q[:1, :, dn:].float(), cos[:1].float().view(1, 1, half),
                                              sin[:1].float().view(1, 1, half), interleaved))


def test_fp8_dequant(tk):
    g = torch.Generator().manual_seed(6)
    w8, s = fp8_quantize(torch.randn(2, 200, 130, generator=g))                 # stacked, partial blocks
    for dtype in (torch.float32, torch.float16):
        assert torch.equal(tk["lin"].fp8_dequant(w8, s, dtype), reference.fp8_dequant(w8, s, dtype))


def test_zero_rows_fall_through(tk):
    """A rank with no rows this step (span non-owner, idle dp rank) still runs every op: N = 0 must work."""
    norm, lin, att = tk["norm"], tk["lin"], tk["att"]
    x, w = torch.zeros(0, 64), torch.ones(64)
    assert norm.rms_norm(x, w, 1e-6).shape == (0, 64) and norm.add_rms_norm(x, x, w, 1e-6)[0].shape == (0, 64)
    assert norm.rope(torch.zeros(0, 4, 32), torch.zeros(0, 1, 16), torch.zeros(0, 1, 16), True).shape == (0, 4, 32)
    empty = torch.zeros(0, dtype=torch.long)
    assert att.indexer_topk(torch.zeros(0, 16, 64), torch.zeros(0, 16), torch.zeros(8, 64), [], [], empty, 4,
                            0.1).shape[0] == 0
    assert att.mla_sparse_attention(torch.zeros(0, 4, 64), torch.zeros(0, 4, 32), torch.zeros(8, 96),
                                    torch.zeros(0, 4, dtype=torch.long), 0.1).shape == (0, 4, 64)
    w8, s = fp8_quantize(torch.randn(256, 64))
    assert lin.linear(torch.zeros(0, 64), w8, s).shape == (0, 256)


def test_pdl_mode_env(monkeypatch):
    """GLMSERVE_PDL: a bad value is an error naming the variable; without a Hopper GPU (here) PDL is off
    whatever it asks, so every launch passes PDL=False and no launch attribute."""
    from glmkernels import triton_utils
    try:
        for value, want in (("0", "0"), ("1", "0"), ("all", "0"), ("yes", ValueError)):
            monkeypatch.setenv("GLMSERVE_PDL", value)
            triton_utils.pdl_mode.cache_clear()
            if want is ValueError:
                with pytest.raises(ValueError, match="GLMSERVE_PDL"):
                    triton_utils.pdl_mode()
            elif not torch.cuda.is_available():
                assert triton_utils.pdl_mode() == want
                assert triton_utils.pdl_launch() == triton_utils.pdl_launch(tile=True) == {"PDL": False,
                                                                                            "launch_pdl": False}
    finally:
        monkeypatch.delenv("GLMSERVE_PDL")
        triton_utils.pdl_mode.cache_clear()
