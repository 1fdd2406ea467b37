"""Session 62's mutation review of the model math (models/glm5.py, glmkernels/reference.py, the FP8 block paths):
tests for what the suite let change unseen. Oracles: transformers' own modules (GlmMoeDsaRMSNorm, the top-k router,
the whole model on configs the parity test does not use) and the formulas of reference/glm5_architecture.md."""

from __future__ import annotations

import json

import pytest
import torch
import torch.nn.functional as F

from glmkernels import reference
from glmkernels.reference import FP8_DTYPE, FP8_MAX, fp8_quantize
from models.cache import KVCache, contiguous_batch
from models.checkpoint import write_checkpoint
from models.config import ModelConfig
from models.loader import load_model
from tests.conftest import CONFIGS, hf_model

hf_dsa = pytest.importorskip("transformers.models.glm_moe_dsa.modeling_glm_moe_dsa")


def _logits(model, ids: torch.Tensor, chunks: list[int]) -> torch.Tensor:
    cache = KVCache(model.config, ids.numel() + 8, torch.float32)
    out, pos = [], 0
    with torch.no_grad():
        for n in chunks:
            out.append(model.logits(model(ids[pos:pos + n], contiguous_batch([(pos, n)], ids.numel() + 8), cache)))
            pos += n
    return torch.cat(out)


# A config the parity test does not cover. "eps": a large rms_norm_eps, so that the norms whose eps is HF's fixed 1e-6
# (q_a / kv_a layernorms, the indexer's k_norm) differ visibly from one given rms_norm_eps, and a dropped eps shows.
# "groups": two expert groups keeping one, and weights not renormalized (GLM-5 keeps norm_topk_prob; DeepSeek-style
# configs group their experts).
CHANGES = {"eps": {"rms_norm_eps": 0.1},
           "groups": {"n_group": 2, "topk_group": 1, "norm_topk_prob": False}}


@pytest.mark.parametrize("case", sorted(CHANGES))
def test_logits_match_hf_on_other_configs(tmp_path, case):
    d = json.loads((CONFIGS / "glm5-tiny-random.json").read_text())
    cfg = ModelConfig.from_dict({**d, **CHANGES[case]})
    path = write_checkpoint(tmp_path, cfg, seed=11, dtype="float32")
    ours, hf = load_model(path, dtype=torch.float32, progress=False), hf_model(path)
    ids = torch.randint(0, cfg.vocab_size, (40,), generator=torch.Generator().manual_seed(12))
    logits = _logits(ours, ids, [32] + [1] * 8)
    with torch.no_grad():
        ref = hf(ids[None]).logits[0]
    assert (logits - ref).abs().max().item() <= 1e-4


@pytest.mark.parametrize("n_group,topk_group,norm", [(1, 1, True), (2, 1, False), (4, 2, True), (8, 3, False)])
def test_router_is_transformers_top_k_router(n_group, topk_group, norm):
    """``router_topk`` against transformers' GlmMoeDsaTopkRouter: the same expert sets and weights."""
    from transformers import GlmMoeDsaConfig

    E, H, k = 32, 64, 6
    g = torch.Generator().manual_seed(20 + n_group)
    conf = GlmMoeDsaConfig(hidden_size=H, n_routed_experts=E, num_experts_per_tok=k, n_group=n_group,
                           topk_group=topk_group, norm_topk_prob=norm, routed_scaling_factor=2.5)
    router = hf_dsa.GlmMoeDsaTopkRouter(conf)
    with torch.no_grad():
        router.weight.copy_(torch.randn(E, H, generator=g))
        router.e_score_correction_bias.copy_(0.5 * torch.randn(E, generator=g))
    x = torch.randn(9, H, generator=g)
    with torch.no_grad():
        logits, want_w, want_i = router(x)
    ids, w = reference.router_topk(F.linear(x, router.weight), router.e_score_correction_bias, k, n_group,
                                   topk_group, norm, 2.5)
    for n in range(x.shape[0]):
        got = dict(zip(ids[n].tolist(), w[n].tolist()))
        want = dict(zip(want_i[n].tolist(), want_w[n].tolist()))
        assert set(got) == set(want), n
        assert all(abs(got[e] - want[e]) <= 1e-6 for e in want)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_rms_norm_is_transformers_bit_for_bit(dtype):
    """HF rounds the normalized rows to the activation dtype, then multiplies by the weight: in bf16 that order
    shows (GlmMoeDsaRMSNorm; add_rms_norm is the residual add, then that norm)."""
    g = torch.Generator().manual_seed(30)
    x, r = (torch.randn(7, 256, generator=g).to(dtype) for _ in range(2))
    norm = hf_dsa.GlmMoeDsaRMSNorm(256, eps=1e-5).to(dtype)
    with torch.no_grad():
        norm.weight.copy_(1 + 0.3 * torch.randn(256, generator=g))
        want = norm(x)
        assert torch.equal(reference.rms_norm(x, norm.weight, 1e-5), want)
        got, s = reference.add_rms_norm(x, r, norm.weight, 1e-5)
        assert torch.equal(s, x + r) and torch.equal(got, norm(x + r))


def test_fp8_quantize_is_the_block_formula():
    """§4: per 128×128 block s = max|W_blk| / 448 and W8 = e4m3(W_blk / s), blocks contiguous (a partial last
    block of rows and of columns here); every block's largest magnitude is coded as ±448."""
    g = torch.Generator().manual_seed(31)
    w = torch.randn(200, 300, generator=g) * torch.logspace(-2, 1, 300)[None, :]
    w8, s = fp8_quantize(w)
    assert w8.dtype == FP8_DTYPE and s.shape == (2, 3)
    for bi, rows in enumerate((slice(0, 128), slice(128, 200))):
        for bj, cols in enumerate((slice(0, 128), slice(128, 256), slice(256, 300))):
            blk = w[rows, cols]
            want_s = blk.abs().max() / FP8_MAX
            assert s[bi, bj] == want_s
            assert torch.equal(w8[rows, cols], (blk / want_s).clamp(-FP8_MAX, FP8_MAX).to(FP8_DTYPE))
            assert w8[rows, cols].float().abs().max() == FP8_MAX


def test_fp8_dense_weight_follows_an_in_place_reload():
    """``Linear.dense_weight`` keeps the dequantized FP8 weight; weights loaded in place (the same storage) must
    invalidate it, the scales too (a stale kv_b_proj would keep absorbing the old W_UK)."""
    from models.glm5 import Linear

    g = torch.Generator().manual_seed(32)
    lin = Linear(192, 160)
    lin.to_fp8()
    with torch.no_grad():
        for seed in range(3):
            w8, s = fp8_quantize(torch.randn(160, 192, generator=g))
            lin.weight.copy_(w8)
            lin.weight_scale_inv.copy_(s)
            assert torch.equal(lin.dense_weight(torch.float32), reference.fp8_dequant(w8, s)), seed
        lin.weight_scale_inv.mul_(2)
        assert torch.equal(lin.dense_weight(torch.float32), reference.fp8_dequant(w8, s * 2))


def _index_case(g, N: int, ih: int = 4, idd: int = 16, slots: int = 64):
    return torch.randn(N, ih, idd, generator=g), torch.rand(N, ih, generator=g), torch.randn(slots, idd, generator=g)


def test_selection_width_is_clamped_to_the_keys():
    """§2.4: topk(min(index_topk, T)). A context shorter than index_topk selects every visible key in a selection as
    wide as its keys — the paged (graph) form too, whose scored width is the block table's."""
    g = torch.Generator().manual_seed(33)
    q, w, k_cache = _index_case(g, 5)
    positions = torch.tensor([0, 3, 5, 6, 9])
    slots = torch.arange(10) + 20
    got = reference.indexer_topk(q, w, k_cache, [(0, 5)], [slots], positions, 16, 0.25)
    assert got.shape == (5, 10)
    for n, p in enumerate(positions.tolist()):
        assert sorted(t for t in got[n].tolist() if t >= 0) == list(range(20, 21 + p))
    table = torch.tensor([[1, 3, 2]] * 5)                       # 3 blocks of 4: 12 keys scored < index_topk 16
    paged = reference.indexer_topk_paged(q, w, k_cache, table, 4, positions, 16, 0.25)
    assert paged.shape == (5, 12)
    for n, p in enumerate(positions.tolist()):
        want = reference.paged_slots(table[n:n + 1], 4, p + 1)[0].tolist()
        assert sorted(t for t in paged[n].tolist() if t >= 0) == sorted(want)


def test_sparse_attention_past_one_chunk_of_rows():
    """The reference attends in chunks of 256 rows: 300 rows (a prefill chunk) against the §2.3 absorbed formula,
    row by row in float64."""
    g = torch.Generator().manual_seed(34)
    N, nh, rkv, dr, K = 300, 2, 16, 8, 12
    q_lat, q_rope = torch.randn(N, nh, rkv, generator=g), torch.randn(N, nh, dr, generator=g)
    kv = torch.randn(40, rkv + dr, generator=g)
    sel = torch.stack([torch.randperm(40, generator=g)[:K] for _ in range(N)])
    sel[::7, K // 2:] = -1
    got = reference.mla_sparse_attention(q_lat, q_rope, kv, sel, 0.3)
    for n in range(N):
        keys = kv[sel[n][sel[n] >= 0]].double()
        score = (q_lat[n].double() @ keys[:, :rkv].T + q_rope[n].double() @ keys[:, rkv:].T) * 0.3
        want = score.softmax(-1) @ keys[:, :rkv]
        assert torch.allclose(got[n].double(), want, atol=1e-5), n

