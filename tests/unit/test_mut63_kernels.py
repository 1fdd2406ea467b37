"""Session 63's mutation review of the Triton kernels (bench/results/session63/review_mut_kernels/): CPU tests, through
Triton's interpreter, of what the kernels' own tests left unseen — K loops and expert widths past one 128-wide scale
block, launch sizes that are not powers of two, the combine's rounding order, ties, and the FP8 store's rounding edges.
Each compares a kernel with its PyTorch reference (glmkernels/reference.py): fp32 at 1e-5 relative, fp16 bit for bit
where the inputs make every sum exact, selections as identical sets."""

from __future__ import annotations

import pytest
import torch

from glmkernels import reference
from glmkernels.reference import CacheRows, fp8_quantize, kv_fp8_layout
from tests.unit.test_triton_kernels import fp8_kv_b, rel  # and its check that the interpreter is on


def _fp8(shape: tuple[int, ...], g: torch.Generator, std: float = 0.1) -> tuple[torch.Tensor, torch.Tensor]:
    """A block-quantized FP8 weight whose scales differ from block to block by up to 2× (so that a wrong block's
    scale shows)."""
    w8, s = fp8_quantize(std * torch.randn(shape, generator=g))
    return w8, s * (1 + torch.rand(s.shape, generator=g))


# ---- triton_linear.py ---------------------------------------------------------------------------------------------
def test_gemv_k_steps_past_one_scale_block(tk):
    """The one-row GEMV's K loop with steps of 256 and 512 columns (two and four scale blocks a step) and a split that
    starts past column 0 with more than one step, reduced per step or once: every 128 columns keep their own scale
    (K = 700: a partial last block and step)."""
    lin = tk["lin"]
    g = torch.Generator().manual_seed(63)
    w8, s = _fp8((76, 700), g)
    x = torch.randn(1, 700, generator=g)
    want = reference.linear(x, w8, s)
    for tile in (lin.GemvTile(8, 256, 1), lin.GemvTile(4, 128, 2), lin.GemvTile(4, 512, 1, each=True)):
        out = torch.empty(1, 76)
        lin._gemv(x, w8, s, out, tile)
        assert rel(out, want) < 1e-5, tile


# ---- triton_moe.py, triton_w8a8.py --------------------------------------------------------------------------------
def _experts(g: torch.Generator, N: int, H: int = 200, I: int = 136, E: int = 4, k: int = 2):
    """Rows, routing and FP8 experts whose H (200) and I (136) span two scale blocks each, the second partial."""
    x = torch.randn(N, H, generator=g)
    idx = torch.stack([torch.randperm(E, generator=g)[:k] for _ in range(N)])
    w = torch.rand(N, k, generator=g)
    (gate, gs), (up, us), (down, ds) = (_fp8(shape, g) for shape in ((E, I, H), (E, I, H), (E, H, I)))
    return x, idx, w, gate, up, down, gs, us, ds


@pytest.mark.parametrize("path", ["fused", "one_row", "grouped", "w8a8"])
def test_moe_experts_past_one_scale_block(tk, path):
    """Every MoE launch on experts wider than one scale block in both H and I: each 128 columns of x (gate/up) and
    of the activation (down) scaled by its own block's scale, each 128 output rows by theirs. The fused tile kernels
    (3 rows), the one-row FMA kernels (their default K step and one of 128), the grouped launches (16-row blocks) and
    the W8A8 ones against the reference."""
    moe = tk["moe"]
    g = torch.Generator().manual_seed(64)
    x, idx, w, *experts = _experts(g, {"fused": 3, "one_row": 1, "grouped": 10, "w8a8": 10}[path])
    if path == "w8a8":
        got = tk["w8a8"].w8a8_moe(x, idx, w, *experts, block_m=16)
        assert rel(got, reference.moe_experts_w8a8(x, idx, w, *experts)) < 1e-4    # see test_triton_moe's 1e-4
        return
    want = reference.moe_experts(x, idx, w, *experts)
    if path == "grouped":
        got = moe.grouped_moe(x, idx, w, *experts, block_m=16)
    else:
        got = moe.moe_experts(x, idx, w, *experts)
    assert rel(got, want) < 1e-5
    if path == "one_row":                      # K steps of 128 (H and I take two each), products kept per lane
        tiles = (moe.ExpertTile(8, 128, fma=True), moe.ExpertTile(32, 128, fma=True))
        assert rel(moe.fused_moe(x, idx, w, *experts, tiles=tiles), want) < 1e-5


def test_combine_adds_in_expert_order(tk):
    """The combine adds a row's pairs in x's dtype one at a time in expert-id order — the reference's ``index_add_``
    per expert, in id order — and skips pairs routed to experts held elsewhere (their y rows are never written: here
    large, so that adding one shows). fp16 partial outputs of mixed magnitudes make the order visible; the routed
    combine (``route_pairs``' order) and the one-row one (ranking the row's ids itself) equal it bit for bit."""
    moe = tk["moe"]
    g = torch.Generator().manual_seed(65)
    N, k, E_l, offset, H = 5, 4, 6, 2, 72
    idx = torch.stack([torch.randperm(10, generator=g)[:k] for _ in range(N)])
    local = idx - offset
    held = (local >= 0) & (local < E_l)
    y = (torch.randn(N * k, H, generator=g) * 10.0 ** (6 * torch.rand(N * k, 1, generator=g) - 3)).half()
    y[~held.flatten()] = 1e4
    want = torch.zeros(N, H, dtype=torch.half)
    for e in sorted(set(local[held].tolist())):
        rows, slot = torch.where(local == e)
        want.index_add_(0, rows, y.view(N, k, H)[rows, slot])
    _, _, order, valid, _ = moe.route_pairs(idx, offset, E_l)
    assert torch.equal(moe._combine(y, order, valid, torch.empty(N, H, dtype=torch.half), N, H, k), want)
    for n in range(N):
        one = moe._combine(y.view(N, k, H)[n], None, None, torch.empty(1, H, dtype=torch.half), 1, H, k,
                           ids=(idx[n:n + 1], offset, E_l))
        assert torch.equal(one[0], want[n]), n


# ---- triton_attention.py -----------------------------------------------------------------------------------------
def test_mla_attention_three_splits(tk):
    """Sparse attention over three splits of each row's keys (the combine's lanes padded to four) — one row's last
    split all unselected (-1) — against the reference, trimmed or not."""
    att = tk["att"]
    g = torch.Generator().manual_seed(66)
    N, nh, rkv, dr, slots, K = 2, 4, 64, 16, 200, 150
    q_lat, q_rope = torch.randn(N, nh, rkv, generator=g), torch.randn(N, nh, dr, generator=g)
    kv = torch.randn(slots, rkv + dr, generator=g)
    sel = torch.stack([torch.randperm(slots, generator=g)[:K] for _ in range(N)])
    sel[1, 40:] = -1
    block_k, per_sm, most = 32, 4, 3
    assert att.mla_splits(N, K, block_k, per_sm, most, att.num_sms()) == (3, 64)
    want = reference.mla_sparse_attention(q_lat, q_rope, kv, sel, 0.1)
    got = att._mla(q_lat, q_rope, kv, sel, 0.1, block_k, per_sm, most)
    assert rel(got, want) < 1e-5
    assert torch.equal(att._mla(q_lat, q_rope, kv, sel, 0.1, block_k, per_sm, most, trim=True), got)


# ---- triton_router.py --------------------------------------------------------------------------------------------
def _same_routing(tk, logits, bias, top_k, n_group, topk_group, norm):
    ids, w = tk["router"].router_topk(logits, bias, top_k, n_group, topk_group, norm, 2.5)
    ref_ids, ref_w = reference.router_topk(logits, bias, top_k, n_group, topk_group, norm, 2.5)
    for n in range(logits.shape[0]):
        got = dict(zip(ids[n].tolist(), w[n].tolist()))
        assert set(got) == set(ref_ids[n].tolist()), n
        assert all(abs(got[i] - v) <= 1e-6 * abs(v) for i, v in zip(ref_ids[n].tolist(), ref_w[n].tolist())), n


@pytest.mark.parametrize("n_group,topk_group", [(3, 2), (4, 2), (1, 1)])
def test_router_padded_lanes_never_chosen(tk, n_group, topk_group):
    """Groups whose count (3) or size (12, 9, 36) is not a power of two pad the router's [groups, size] tile; with a
    negative correction bias every real expert's choice is below 0, so a padded lane must still lose."""
    g = torch.Generator().manual_seed(67)
    logits = torch.randn(3, 36, generator=g)
    for bias in (0.1 * torch.randn(36, generator=g), -2.0 + 0.1 * torch.randn(36, generator=g)):
        _same_routing(tk, logits, bias, 6, n_group, topk_group, n_group != 4)


def test_router_group_with_a_tied_top(tk):
    """A group's score is the sum of its top two choices, both copies when its top value is tied: group 0 (two
    experts at logit 3) outscores groups 1 and 2 (2.5 + 2.4, 2.3 + 2.2) only with both copies counted."""
    logits = torch.full((1, 32), -5.0)
    logits[0, [2, 5]] = 3.0
    logits[0, [8, 9]] = torch.tensor([2.5, 2.4])
    logits[0, [16, 17]] = torch.tensor([2.3, 2.2])
    _same_routing(tk, logits, torch.zeros(32), 4, 4, 2, True)


# ---- triton_absorb.py --------------------------------------------------------------------------------------------
def test_absorb_expand_past_one_step(tk):
    """W_UK / W_UV from the FP8 kv_b on heads of more than one 64-dim step (dn 128: a head's rows straddle two scale
    blocks; dn 160: a partial last step) and latents past one column step (rkv 512: the one-row expand's 256-wide
    steps cover two scale columns each; rkv 192: 64-wide column blocks, not a multiple of 128), one row and several."""
    absorb = tk["absorb"]
    g = torch.Generator().manual_seed(68)
    kv_b = fp8_kv_b(2, 128, 64, 512, g)
    for rows in (1, 3):
        q, o_lat = torch.randn(rows, 2, 128, generator=g), torch.randn(rows, 2, 512, generator=g)
        assert rel(absorb.mla_absorb(q, kv_b), reference.mla_absorb(q, kv_b)) < 1e-5
        assert rel(absorb.mla_expand(o_lat, kv_b, 128), reference.mla_expand(o_lat, kv_b, 128)) < 1e-5
    kv_b = fp8_kv_b(2, 160, 64, 192, g)
    for rows in (1, 2):
        q = torch.randn(rows, 2, 160, generator=g)
        assert rel(absorb.mla_absorb(q, kv_b), reference.mla_absorb(q, kv_b)) < 1e-5


# ---- triton_norm.py ----------------------------------------------------------------------------------------------
def _integers(shape: tuple[int, ...], g: torch.Generator) -> torch.Tensor:
    """fp16 integers in [-8, 8]: every sum of their squares is exact in fp32 in any order, so a norm's statistics do
    not depend on the kernel's summation order and its output must equal the reference's bit for bit."""
    return torch.randint(-8, 9, shape, generator=g).half()


def test_rms_norm_rounds_as_the_reference(tk):
    """fp16 RMSNorm bit for bit: the normalized value rounded to fp16 before the weight (HF's order), plain and fused
    with the residual add — rows strided (a view of a wider tensor), the sum stored contiguous."""
    norm = tk["norm"]
    g = torch.Generator().manual_seed(69)
    x = _integers((3, 201), g)[:, :200]            # one column of slack: a sum stored at x's stride shows at once
    r = _integers((3, 200), g)
    w = (1 + 0.5 * torch.randn(200, generator=g)).half()
    out, s = norm.add_rms_norm(x, r, w, 1e-5)
    ref_out, ref_s = reference.add_rms_norm(x, r, w, 1e-5)
    assert torch.equal(s, ref_s) and torch.equal(out, ref_out)
    assert torch.equal(norm.rms_norm(x, w, 1e-5), reference.rms_norm(x, w, 1e-5))


@pytest.mark.parametrize("interleaved", [True, False])
def test_norm_rope_store_rms_rows_bit_exact(tk, interleaved):
    """MLA's cache rows in fp16 (RMSNorm'd latent, roped key) and q_a's RMSNorm in the same launch, bit for bit."""
    g = torch.Generator().manual_seed(70)
    x, q_a = _integers((3, 72), g), _integers((3, 48), g)
    w, w_q = (1 + 0.5 * torch.randn(64, generator=g)).half(), (1 + 0.5 * torch.randn(48, generator=g)).half()
    cos, sin = (torch.randn(3, 4, generator=g).half() for _ in range(2))
    slots = torch.tensor([5, 0, -1])
    outs = [(torch.zeros(8, 72, dtype=torch.half), torch.zeros(3, 48, dtype=torch.half)) for _ in range(2)]
    for store, (cache, q_out) in zip((tk["norm"].norm_rope_store, reference.norm_rope_store), outs):
        store(x, w, None, 1e-6, 64, cos, sin, 64, interleaved, cache, slots,
              also=(CacheRows(q_a, w_q, None, 1e-6, 48, None, False, q_out, at_slots=False),))
    assert torch.equal(outs[0][0], outs[1][0]) and torch.equal(outs[0][1], outs[1][1])


def _edge_weights(rkv: int, dtype: torch.dtype) -> torch.Tensor:
    """A norm weight that is the normalized row itself when every x is ±1 (eps 0): group 0's largest magnitude
    exactly 448 = 1.75·2^8 (its scale 1: the least power of two that fits), values on e4m3's rounding ties (five
    significant bits, the last one set: 17·2^e, 19·2^e, ...) and in its subnormal range, [2^-7, 2^-6) among them;
    group 1's largest exactly 1.75 and values from 2^-10 of it to it."""
    ties = [m * 2.0 ** e for e in range(-4, 4) for m in (17, 19, 21, 23, 25, 27, 29, 31)]
    small = [(1 + j / 32) * 2.0 ** e for e in (-10, -9, -8, -7) for j in range(16)]
    tail = torch.logspace(-3, 0.24, rkv - 128 - 1, base=10) * torch.where(torch.arange(rkv - 129) % 2 == 0, 1, -1)
    w = torch.tensor([448.0, *ties[:63], *small, 1.75]).to(dtype)
    return torch.cat([w, tail.to(dtype)])


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_fp8_store_at_e4m3_rounding_edges(tk, dtype, monkeypatch):
    """Packed MLA rows whose latent groups sit on the FP8 edges: a largest magnitude of exactly 1.75·2^k (its scale
    still 2^(k-8)), e4m3 ties (to even), e4m3's subnormals — every byte as ``reference.kv_fp8_pack`` writes it."""
    g = torch.Generator().manual_seed(71)
    rkv, dr, N = 256, 32, 4
    _, rope_at, size = kv_fp8_layout(rkv, dr, dtype)
    used = rope_at + dr * torch.empty((), dtype=dtype).element_size()
    x = torch.cat([torch.ones(N, rkv) * torch.tensor([1.0, -1.0, 1.0, -1.0])[:, None],
                   torch.randn(N, dr, generator=g)], 1).to(dtype)
    w = _edge_weights(rkv, dtype)
    cos, sin = (torch.randn(N, dr // 2, generator=g).to(dtype) for _ in range(2))
    slots = torch.tensor([5, 0, -1, 9])
    caches = [torch.zeros(12, size, dtype=torch.uint8) for _ in range(2)]
    for store, cache in zip((tk["norm"].norm_rope_store, reference.norm_rope_store), caches):
        with monkeypatch.context() as m:                    # the kernel's launch, not its fallback to the reference
            if store is tk["norm"].norm_rope_store:
                m.setattr(tk["norm"].reference, "norm_rope_store", None)
            store(x, w, None, 0.0, rkv, cos, sin, rkv, True, cache, slots)
    back = reference.kv_fp8_unpack(caches[1][slots], rkv, dr, dtype)
    assert torch.equal(back[:, :rkv].abs().amax(-1), torch.full((N,), 448.0, dtype=dtype))    # the edges reached
    assert torch.equal(caches[0][:, :used], caches[1][:, :used])
