"""The FP8 KV cache's rows (``kv_cache_dtype: fp8``): the packed layout, its power-of-two scales, and the Triton
store and attention against the reference, on the CPU through Triton's interpreter (fp32 / fp16: see
test_triton_kernels.py; bf16 and GLM-5's width are checked by tests/gpu/test_kernels_gpu.py)."""

from __future__ import annotations

import os

import pytest
import torch

os.environ["TRITON_INTERPRET"] = "1"          # this test process only, before triton is imported
triton = pytest.importorskip("triton", reason="triton is not installed (it is in the 'gpu' extra)")
from triton.runtime.interpreter import InterpretedFunction  # noqa: E402

if not isinstance(triton.language.standard.sum, InterpretedFunction):
    pytest.skip("triton was imported before TRITON_INTERPRET=1 was set (tests/unit/conftest.py sets it; "
                "collect tests/unit first)", allow_module_level=True)

from glmkernels import reference
from glmkernels.reference import FP8_DTYPE, kv_fp8_layout, kv_fp8_pack, kv_fp8_scale, kv_fp8_unpack
from models.cache import KVCache
from models.config import ModelConfig


def test_layout_is_flashmlas_at_glm5_width():
    assert kv_fp8_layout(512, 64, torch.bfloat16) == (128, 528, 656)     # 512 e4m3 + 4 fp32 + 64 bf16
    assert kv_fp8_layout(64, 32, torch.float32) == (64, 68, 208)          # the tiny model's, padded to 16 bytes
    with pytest.raises(ValueError, match="kv_lora_rank"):
        kv_fp8_layout(192, 64, torch.bfloat16)
    with pytest.raises(ValueError, match="index_head_dim that is a multiple of 128 or a power of two"):
        kv_fp8_layout(96, 0, torch.bfloat16, "index_head_dim")
    with pytest.raises(ValueError, match="got 0"):
        kv_fp8_layout(0, 0, torch.bfloat16)


def test_scales_are_the_least_powers_of_two_that_fit():
    amax = torch.tensor([448.0, 448.5, 1.0, 1.75, 1.7501, 3e-3, 0.0, 1e-40, 3e38])
    s = kv_fp8_scale(amax)
    assert torch.equal(s, torch.exp2(torch.round(torch.log2(s))))                       # powers of two
    assert bool((amax / s <= 448).all()) and bool((amax[:-3] / (s[:-3] / 2) > 448).all())   # the least (normal ones)
    assert s[6] == 2.0 ** -126 and s[7] == 2.0 ** -126


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_pack_round_trips_within_e4m3_and_exactly_on_its_grid(dtype):
    g = torch.Generator().manual_seed(0)
    rkv, dr = 256, 32
    y = (torch.randn(5, rkv + dr, generator=g) * torch.logspace(-3, 2, 5)[:, None]).to(dtype)
    y[3, :128] = 0                                                         # an all-zero group
    rows = kv_fp8_pack(y, rkv)
    assert rows.dtype == torch.uint8 and rows.shape == (5, kv_fp8_layout(rkv, dr, dtype)[2])
    back = kv_fp8_unpack(rows, rkv, dr, dtype)
    assert torch.equal(back[:, rkv:], y[:, rkv:])                          # the rope key as it was
    lat, got = y[:, :rkv].float(), back[:, :rkv].float()
    assert bool(((got - lat).abs() <= lat.abs().view(5, 2, 128).amax(-1).repeat_interleave(128, 1) / 16).all())
    assert rel_err(got, lat) < 0.04 and torch.equal(got[3, :128], lat[3, :128])
    assert torch.equal(kv_fp8_unpack(kv_fp8_pack(back, rkv), rkv, dr, dtype), back)   # values on the grid stay


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a.double() - b.double()).norm() / b.double().norm().clamp(min=1e-30)).item()


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_triton_store_packs_the_rows_the_reference_packs(tk, dtype, monkeypatch):
    """MLA's key rows (RMSNorm'd latent, roped key) into a packed cache, with the indexer's packed keys in the same
    launch: every MLA byte as the reference writes it (the row's padding aside: the kernel leaves it)."""
    from glmkernels.reference import CacheRows
    g = torch.Generator().manual_seed(3)
    rkv, dr, N = 256, 32, 4
    group, rope_at, size = kv_fp8_layout(rkv, dr, dtype)
    used = rope_at + dr * torch.empty((), dtype=dtype).element_size()
    for interleaved in (True, False):
        ckv = (torch.randn(N, rkv + dr, generator=g) * 3).to(dtype)
        ckv[1, :64] = -1e-9                        # negative values that round to zero: -0 bytes (0x80), as torch's
        w = (1 + 0.5 * torch.randn(rkv, generator=g)).to(dtype)
        k = torch.randn(N, 32, generator=g).to(dtype)
        w_k, b_k = (1 + 0.1 * torch.randn(32, generator=g)).to(dtype), (0.1 * torch.randn(32, generator=g)).to(dtype)
        cos, sin = (torch.randn(N, dr // 2, generator=g).to(dtype) for _ in range(2))
        slots = torch.tensor([5, 0, -1, 9])
        caches = [torch.randint(0, 256, (12, size), dtype=torch.uint8, generator=g) for _ in range(2)]
        caches = [caches[0], caches[0].clone()]
        key_bytes = kv_fp8_layout(32, 0, dtype)[2]                             # the indexer's keys packed too
        keys = [torch.randint(0, 256, (12, key_bytes), dtype=torch.uint8, generator=g)]
        keys.append(keys[0].clone())
        for store, cache, key in zip((tk["norm"].norm_rope_store, reference.norm_rope_store), caches, keys):
            with monkeypatch.context() as m:                # the kernel's launch, not its fallback to the reference
                if store is tk["norm"].norm_rope_store:
                    m.setattr(tk["norm"].reference, "norm_rope_store", None)
                store(ckv, w, None, 1e-6, rkv, cos, sin, rkv, interleaved, cache, slots,
                      also=(CacheRows(k, w_k, b_k, 1e-6, 32, 0, interleaved, key),))
        assert torch.equal(caches[0][:, :used], caches[1][:, :used])
        assert torch.equal(caches[0][[1, 2, 3, 4, 6, 7, 8, 10]], caches[1][[1, 2, 3, 4, 6, 7, 8, 10]])
        back = kv_fp8_unpack(caches[0][slots], rkv, dr, dtype)
        assert back[:, :rkv].abs().amax() > 0 and group == 128
        # the keys, LayerNorm'd and roped in the kernel as in torch (equal here; at fp32 rounding in general), packed
        assert torch.equal(keys[0][:, :36], keys[1][:, :36])
        assert torch.equal(keys[0][[1, 2, 3, 4, 6, 7, 8, 10]], keys[1][[1, 2, 3, 4, 6, 7, 8, 10]])


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_triton_attention_on_packed_rows_equals_it_on_their_values(tk, dtype):
    """The split kernel reading packed rows == the same kernel on the rows unpacked (bit for bit: the dequantized
    values are exact), and both near the reference on the packed cache."""
    g = torch.Generator().manual_seed(4)
    N, nh, rkv, dr, slots, K = 3, 4, 256, 32, 300, 150
    q_lat = torch.randn(N, nh, rkv, generator=g).to(dtype)
    q_rope = torch.randn(N, nh, dr, generator=g).to(dtype)
    packed = kv_fp8_pack(torch.randn(slots, rkv + dr, generator=g).to(dtype), rkv)
    plain = kv_fp8_unpack(packed, rkv, dr, dtype)
    sel = torch.stack([torch.randperm(slots, generator=g)[:K] for _ in range(N)])
    sel[1, 20:] = -1
    sel[2, ::3] = -1
    for tile in ((64, 1, 64, 32, 4), (32, 2, 64, 64, 8)):
        for trim in (False, True):
            got = tk["att"]._mla(q_lat, q_rope, packed, sel, 0.1, *tile, trim=trim)
            assert torch.equal(got, tk["att"]._mla(q_lat, q_rope, plain, sel, 0.1, *tile, trim=trim))
    ref = reference.mla_sparse_attention(q_lat.float(), q_rope.float(), plain.float(), sel, 0.1)
    assert rel_err(tk["att"].mla_sparse_attention(q_lat, q_rope, packed, sel, 0.1), ref) < (
        1e-5 if dtype == torch.float32 else 1e-2)
    assert torch.equal(reference.mla_sparse_attention(q_lat, q_rope, packed, sel, 0.1),
                       reference.mla_sparse_attention(q_lat, q_rope, plain, sel, 0.1))


def test_cache_sizes():
    import json
    from tests.conftest import CONFIGS
    d = json.loads((CONFIGS / "glm5-tiny-random.json").read_text())
    d.update(kv_lora_rank=512, qk_rope_head_dim=64)
    cfg = ModelConfig.from_dict(d)
    L, n_idx = cfg.num_cache_layers, sum(cfg.has_indexer(layer) for layer in range(cfg.num_cache_layers))
    d["index_head_dim"] = 128
    cfg = ModelConfig.from_dict(d)
    assert KVCache.bytes_per_slot(cfg, torch.bfloat16) == L * 576 * 2 + n_idx * 128 * 2
    assert KVCache.bytes_per_slot(cfg, torch.bfloat16, fp8=True) == L * 656 + n_idx * 144     # 128 e4m3 + 4, padded
    cache = KVCache(cfg, 10, torch.bfloat16, fp8=True)
    assert cache.kv[0].shape == (10, 656) and cache.kv[0].dtype == torch.uint8 and cache.dtype == torch.bfloat16
    assert cache.index_k[0].shape == (10, 144) and cache.index_k[0].dtype == torch.uint8
    assert FP8_DTYPE == torch.float8_e4m3fn


@pytest.mark.parametrize("idd", [32, 256])         # one scale a key (dotted, then scaled); two (unpacked first)
def test_indexer_scores_on_packed_keys_equal_them_on_their_values(tk, idd):
    """The scoring kernels (paged with the select's first pass, ragged one-row, prefill rows) on packed keys == on
    the keys unpacked, bit for bit; the selections equal; the reference selects the same from both caches."""
    from models.cache import build_batch

    g = torch.Generator().manual_seed(8)
    ih, bs, blocks, topk = 16, 4, 40, 24
    packed = kv_fp8_pack(torch.randn(blocks * bs, idd, generator=g), idd)
    plain = kv_fp8_unpack(packed, idd, 0, torch.float32)
    att = tk["att"]
    table = torch.stack([torch.randperm(blocks, generator=g)[:25] for _ in range(4)]).to(torch.int32)
    positions = torch.tensor([57, 99, 9, 0])
    q, w = torch.randn(4, ih, idd, generator=g), torch.randn(4, ih, generator=g)
    for cache in (packed, plain):
        assert cache is plain or cache.dtype == torch.uint8
    paged = [att._score(q, w, c, table, None, None, positions, 100, bs, idd ** -0.5, select_k=topk) for c in
             (packed, plain)]
    assert torch.equal(paged[0], paged[1])
    sets = [att.indexer_topk_paged(q, w, c, table, bs, positions, topk, idd ** -0.5) for c in (packed, plain)]
    assert torch.equal(sets[0], sets[1])
    ref = [reference.indexer_topk_paged(q, w, c, table, bs, positions, topk, idd ** -0.5) for c in (packed, plain)]
    assert torch.equal(ref[0], ref[1])
    batch = build_batch([(40, 20, [0, 1, 2, 3]), (99, 1, list(range(10, 17))), (0, 10, [20])], 16)
    q, w = torch.randn(31, ih, idd, generator=g), torch.randn(31, ih, generator=g)
    packed = kv_fp8_pack(torch.randn(336, idd, generator=g), idd)
    plain = kv_fp8_unpack(packed, idd, 0, torch.float32)
    args = (batch.seq_rows, batch.seq_slots, batch.positions)
    one_row = [att.index_scores(q, w, c, *args, idd ** -0.5)[0] for c in (packed, plain)]
    assert torch.equal(one_row[0], one_row[1])
    r = batch.ragged
    rows = [att._score_rows(q[:20], w[:20], c, r, batch.seq_rows, 0, batch.positions[:20], 60, idd ** -0.5)
            for c in (packed, plain)]
    assert torch.equal(rows[0], rows[1])
    sel = [att.indexer_topk(q, w, c, *args, topk, idd ** -0.5) for c in (packed, plain)]
    assert torch.equal(sel[0], sel[1])
    ref = [reference.indexer_topk(q, w, c, *args, topk, idd ** -0.5) for c in (packed, plain)]
    assert torch.equal(ref[0], ref[1])
