"""The FP8 KV cache (``kv_cache_dtype: fp8``) on a CUDA GPU at GLM-5's widths in bf16: the Triton store packs every
byte as it would store them in bf16 and ``kv_fp8_pack`` packs them (the GPU's own e4m3 cast, which the interpreter
cannot check), the attention (to a rounding: two compiled kernels) and the indexer's scores (bit for bit) on packed
rows equal them on their values, and an engine's tokens with captured graphs, pieces, look-ahead and the host
tier equal its eager tokens.

Run on a lent H200: ``PYTHONPATH=. python -m pytest -q tests/gpu/test_kv_fp8_gpu.py``.
"""

from __future__ import annotations

import pytest
import torch

pytestmark = pytest.mark.gpu
if not torch.cuda.is_available():
    pytest.skip("needs a CUDA GPU", allow_module_level=True)
pytest.importorskip("triton")

from glmkernels import ops, reference
from glmkernels.reference import CacheRows, kv_fp8_layout, kv_fp8_pack, kv_fp8_unpack
from tests.gpu.test_kernels_gpu import BF16, DEV, gen      # the kernel tests' device, dtype and generator

RKV, DR = 512, 64


@pytest.mark.parametrize("N", [1, 8, 300])
def test_store_packs_the_rows_it_would_store_in_bf16(N):
    """MLA's rows with the indexer's keys and q_a's RMSNorm in one launch (the model's call): the packed rows' bytes
    (all but the padding) are ``kv_fp8_pack`` of the rows the same kernel stores into bf16 caches — scales, the GPU's
    e4m3 rounding and the roped values. (Against the torch composition the norm's bf16 rows differ by a rounding at
    places, as ``test_kernels_gpu.py::test_norm_rope_store_bf16`` allows.)"""
    g = gen(N)
    ckv = torch.randn(N, RKV + DR, device=DEV, generator=g).to(BF16) * 4
    w = (1 + 0.3 * torch.randn(RKV, device=DEV, generator=g)).to(BF16)
    k = torch.randn(N, 128, device=DEV, generator=g).to(BF16)
    w_k, b_k = (1 + 0.1 * torch.randn(128, device=DEV, generator=g)).to(BF16), torch.zeros(128, device=DEV, dtype=BF16)
    q_a = torch.randn(N, 2048, device=DEV, generator=g).to(BF16)
    w_q = torch.ones(2048, device=DEV, dtype=BF16)
    cos, sin = (torch.randn(N, DR // 2, device=DEV, generator=g).to(BF16) for _ in range(2))
    slots = torch.randperm(4 * N, device=DEV, generator=g)[:N]
    _, rope_at, size = kv_fp8_layout(RKV, DR, BF16)
    store = ops.impl("norm_rope_store", "triton")
    caches = []
    for fp8 in (True, False):
        cache = torch.zeros(4 * N, size if fp8 else RKV + DR, dtype=torch.uint8 if fp8 else BF16, device=DEV)
        keys = torch.zeros(4 * N, 144 if fp8 else 128, dtype=torch.uint8 if fp8 else BF16, device=DEV)
        store(ckv, w, None, 1e-6, RKV, cos, sin, RKV, True, cache, slots,
              also=(CacheRows(k, w_k, b_k, 1e-6, 128, 0, False, keys),
                    CacheRows(q_a, w_q, None, 1e-6, 2048, None, False, torch.empty_like(q_a), at_slots=False)))
        caches.append((cache[slots], keys[slots]))
    (packed, packed_keys), (rows, keys) = caches
    assert torch.equal(packed[:, :rope_at + 2 * DR], kv_fp8_pack(rows, RKV)[:, :rope_at + 2 * DR])
    assert torch.equal(packed_keys[:, :132], kv_fp8_pack(keys, 128)[:, :132])


@pytest.mark.parametrize("N,K", [(1, 2048), (8, 2048), (64, 2048), (300, 512)])
def test_attention_on_packed_rows_equals_it_on_their_values(N, K):
    g = gen(N)
    nh, slots = 64, 50_000
    q_lat = torch.randn(N, nh, RKV, device=DEV, generator=g).to(BF16)
    q_rope = torch.randn(N, nh, DR, device=DEV, generator=g).to(BF16)
    packed = kv_fp8_pack(torch.randn(slots, RKV + DR, device=DEV, generator=g).to(BF16), RKV)
    plain = kv_fp8_unpack(packed, RKV, DR, BF16)
    sel = torch.stack([torch.randperm(slots, device=DEV, generator=g)[:K] for _ in range(N)])
    sel[N // 2, K // 3:] = -1
    att = ops.impl("mla_sparse_attention", "triton")
    got = att(q_lat, q_rope, packed, sel, 0.1, trim=True)
    want = att(q_lat, q_rope, plain, sel, 0.1, trim=True)
    # the same values, but two compiled kernels: the MMA's accumulation order may differ, so an output's last bf16
    # bits (an output that cancels can be small beside its terms: bounded by its row's largest; call 2 saw 0.002 there)
    diff = (got.float() - want.float()).abs()
    print("attention: outputs differing", (diff > 0).float().mean().item(), "max", diff.max().item())
    assert (diff <= want.float().abs().amax(-1, keepdim=True) * 2 ** -6).all() and (diff > 0).float().mean() < 0.05
    ref = reference.mla_sparse_attention(q_lat.float(), q_rope.float(), plain.float(), sel, 0.1)
    assert ((got.double() - ref.double()).norm() / ref.double().norm()).item() < 1e-2


@pytest.mark.parametrize("N", [1, 8, 64])
def test_indexer_scores_on_packed_keys_equal_them_on_their_values(N):
    """GLM-5's indexer (32 heads of 128) over 8192-key contexts: the paged scores with the select's first pass, the
    ragged one-row scores and the prefill rows kernel's, packed keys == unpacked, bit for bit."""
    import glmkernels.triton_attention as att
    from models.cache import build_batch

    g = gen(N)
    ih, idd, bs, ctx = 32, 128, 64, 8192
    packed = kv_fp8_pack(torch.randn(N * ctx + bs, idd, device=DEV, generator=g).to(BF16), idd)
    plain = kv_fp8_unpack(packed, idd, 0, BF16)
    q = torch.randn(N, ih, idd, device=DEV, generator=g).to(BF16)
    w = torch.randn(N, ih, device=DEV, generator=g)
    table = torch.arange(N * ctx // bs, device=DEV, dtype=torch.int32).view(N, ctx // bs)
    positions = torch.full((N,), ctx - 1, device=DEV)
    paged = [att._score(q, w, c, table, None, None, positions, ctx, bs, idd ** -0.5, select_k=2048)
             for c in (packed, plain)]
    assert torch.equal(paged[0], paged[1])
    batch = build_batch([(ctx - N, N, list(range(ctx // 16)))], 16, DEV)         # N rows of one request's prompt
    q, w = torch.randn(N, ih, idd, device=DEV, generator=g).to(BF16), torch.randn(N, ih, device=DEV, generator=g)
    args = (batch.seq_rows, batch.seq_slots, batch.positions)
    one_row = [att.index_scores(q, w, c, *args, idd ** -0.5)[0] for c in (packed, plain)]
    assert torch.equal(one_row[0], one_row[1])
    rows = [att._score_rows(q, w, c, batch.ragged, batch.seq_rows, 0, batch.positions, ctx, idd ** -0.5)
            for c in (packed, plain)]
    assert torch.equal(rows[0], rows[1])


@pytest.mark.parametrize("k", [0, 3])
def test_engine_graphs_with_the_fp8_cache_equal_eager(k):
    """Captured graph steps, pieces, look-ahead and the host tier, all on packed rows: the eager engine's tokens."""
    from cluster.config import DEFAULT_MODEL
    from models.loader import load_model
    from tests.integration.test_graphs import host_tier_arrivals, make_engine, run_arrivals

    ops.configure("auto", DEV)
    m = load_model(DEFAULT_MODEL, dtype=torch.float32, device=DEV, progress=False)
    arrivals = host_tier_arrivals(m.config.vocab_size)
    on = make_engine(m, True, k, blocks=24, caching=True, host=96, kv_fp8=True, pieces=True)
    assert on.executor.runner.cache.kv[0].dtype == torch.uint8
    assert run_arrivals(on, arrivals) == run_arrivals(make_engine(m, False, k, blocks=24, kv_fp8=True), arrivals)
    assert on.scheduler.host_loads > 0 and on.executor.runner.graphs.captured
