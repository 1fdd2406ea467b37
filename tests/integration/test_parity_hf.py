"""Our logits and DSA selections against Hugging Face transformers (eager attention, eager experts)."""

from __future__ import annotations

import warnings

import pytest
import torch

from models.cache import KVCache, contiguous_batch
from models.checkpoint import write_checkpoint
from models.config import ModelConfig
from models.loader import load_model
from tests.conftest import CONFIGS, hf_model

TOL = 1e-4
PREFILL, DECODE = 64, 16


def _ids(n: int, vocab: int, seed: int = 1) -> torch.Tensor:
    return torch.randint(0, vocab, (n,), generator=torch.Generator().manual_seed(seed))


def run_ours(model, ids: torch.Tensor, chunks: list[int], topk_out=None):
    """Feed ``ids`` in consecutive chunks through one cache; returns logits of every position [S, V]."""
    cfg = model.config
    cache = KVCache(cfg, ids.numel() + 8, torch.float32)
    out, pos = [], 0
    with torch.no_grad():
        for n in chunks:
            batch = contiguous_batch([(pos, n)], ids.numel() + 8)
            layer_topk = [] if topk_out is not None else None
            h = model(ids[pos:pos + n], batch, cache, layer_topk)
            if topk_out is not None:
                topk_out.append(layer_topk)
            out.append(model.logits(h))
            pos += n
    return torch.cat(out)


def hf_selections(hf, ids: torch.Tensor):
    """Run HF once; return (logits [S, V], per full layer the selected index sets and the index scores)."""
    captured = {}

    def hook(mod, args, kwargs, out):
        captured[mod.layer_idx] = (out[0], _hf_index_scores(mod, args, kwargs))

    handles = [layer.self_attn.indexer.register_forward_hook(hook, with_kwargs=True)
               for layer in hf.model.layers if layer.self_attn.indexer is not None]
    with torch.no_grad():
        logits = hf(ids[None]).logits[0]
    for h in handles:
        h.remove()
    return logits, captured


def _hf_index_scores(mod, args, kwargs):
    """HF's index scores (same code path as its forward, before top-k), for tie margins."""
    from transformers.models.glm_moe_dsa.modeling_glm_moe_dsa import apply_rotary_pos_emb_interleave

    hidden, q_resid, (cos, sin), mask = args[:4]
    B, S, _ = hidden.shape
    q = mod.wq_b(q_resid).view(B, S, mod.n_heads, mod.head_dim)
    dr = mod.qk_rope_head_dim
    k = mod.k_norm(mod.wk(hidden)).unsqueeze(2)
    qr, kr = apply_rotary_pos_emb_interleave(q[..., :dr], k[..., :dr], cos, sin, unsqueeze_dim=2)
    q = torch.cat([qr, q[..., dr:]], -1)
    k = torch.cat([kr, k[..., dr:]], -1).squeeze(2)
    s = torch.relu(torch.matmul(q.float(), k.transpose(-1, -2).float().unsqueeze(1)) * mod.softmax_scale)
    w = mod.weights_proj(hidden).float() * mod.n_heads ** -0.5
    scores = torch.matmul(w.unsqueeze(-2), s).squeeze(-2)
    return (scores + mask if mask.dtype != torch.bool else scores.masked_fill(~mask, float("-inf")))[0]


def compare_selections(ours_by_layer: list[torch.Tensor], hf_captured: dict, cfg: ModelConfig) -> int:
    """Per full layer and query row: our selected positions == HF's causally visible selection.
    A difference is accepted only at an exact-tie boundary (margin < 1e-6), and reported. Returns #ties."""
    ties = 0
    for layer, ours in enumerate(ours_by_layer):
        if not cfg.has_indexer(layer):
            assert torch.equal(ours, ours_by_layer[layer - 1]), "a shared layer must reuse the previous selection"
            continue
        hf_idx, scores = hf_captured[layer]
        for s in range(ours.shape[0]):
            mine = {int(t) for t in ours[s] if t >= 0}
            theirs = {int(t) for t in hf_idx[s] if t <= s}
            if mine == theirs:
                continue
            row = scores[s, : s + 1].sort(descending=True).values
            k = min(cfg.index_topk, s + 1)
            margin = float(row[k - 1] - row[k]) if k < row.numel() else float("inf")
            assert margin < 1e-6, f"layer {layer} row {s}: selection differs from HF with margin {margin}"
            ties += 1
            warnings.warn(f"top-k tie at layer {layer} row {s} (margin {margin:.2e}): sets differ by a tie")
    return ties


@pytest.fixture(scope="module")
def pair(tiny_ckpt):
    return load_model(tiny_ckpt, dtype=torch.float32, progress=False), hf_model(tiny_ckpt)


def test_prefill_logits_and_selections_match_hf(pair, tiny_config):
    ours, hf = pair
    ids = _ids(PREFILL, tiny_config.vocab_size)
    topk = []
    logits = run_ours(ours, ids, [PREFILL], topk)
    ref, captured = hf_selections(hf, ids)
    diff = (logits - ref).abs().max().item()
    print(f"prefill {PREFILL}: max |Δlogit| = {diff:.2e}")
    assert diff <= TOL
    compare_selections(topk[0], captured, tiny_config)


def test_decode_after_prefill_matches_hf(pair, tiny_config):
    """Prefill 64, then 16 single-token decode steps against the cache, vs HF over the whole sequence."""
    ours, hf = pair
    ids = _ids(PREFILL + DECODE, tiny_config.vocab_size, seed=2)
    logits = run_ours(ours, ids, [PREFILL] + [1] * DECODE)
    with torch.no_grad():
        ref = hf(ids[None]).logits[0]
    diff = (logits[PREFILL - 1:] - ref[PREFILL - 1:]).abs().max().item()
    print(f"decode steps: max |Δlogit| = {diff:.2e}")
    assert diff <= TOL


def test_sparsity_matters(pair, tiny_config):
    """index_topk (16) < sequence length must change logits, or the parity test would not test DSA."""
    ours, _ = pair
    ids = _ids(PREFILL, tiny_config.vocab_size)
    sparse = run_ours(ours, ids, [PREFILL])
    dense_model = load_model(write_checkpoint_like(ours, index_topk=4096), dtype=torch.float32, progress=False)
    dense = run_ours(dense_model, ids, [PREFILL])
    assert (sparse[:16] - dense[:16]).abs().max() < 1e-5
    assert (sparse[16:] - dense[16:]).abs().max() > 1e-3


def write_checkpoint_like(model, **changes):
    import tempfile

    d = tempfile.mkdtemp()
    sd = {k: v for k, v in model.state_dict().items()}
    full = {}
    for k, v in sd.items():
        if ".mlp.experts." in k:
            base, proj, leaf = k.rsplit(".", 2)
            for e in range(v.shape[0]):
                full[f"{base}.{e}.{proj}.{leaf}"] = v[e]
        else:
            full[k] = v
    return write_checkpoint(d, model.config.replace(**changes), dtype="float32", state_dict=full)


@pytest.mark.parametrize("kind", ["bf16", "fp8", "sharded"])
def test_made_checkpoints_load_and_match_hf(tmp_path, tiny_config, kind):
    path = write_checkpoint(tmp_path, tiny_config, seed=3, dtype="bfloat16" if kind != "sharded" else "float32",
                            fp8=kind == "fp8", num_shards=3 if kind == "sharded" else 1)
    ours = load_model(path, dtype=torch.float32, progress=False)
    if kind == "fp8":
        w = ours.model.layers[3].mlp.experts.gate_proj.weight
        assert w.dtype == torch.float8_e4m3fn, "FP8 weights must stay FP8 in memory"
    hf = hf_model(path)
    ids = _ids(48, tiny_config.vocab_size, seed=4)
    logits = run_ours(ours, ids, [48])
    with torch.no_grad():
        ref = hf(ids[None]).logits[0]
    diff = (logits - ref).abs().max().item()
    print(f"{kind}: max |Δlogit| = {diff:.2e}")
    assert diff <= TOL


YARN = {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0, "original_max_position_embeddings": 16,
        "beta_fast": 32, "beta_slow": 1, "mscale": 1.0, "mscale_all_dim": 1.0}


@pytest.mark.parametrize("model_type,rope", [("deepseek_v32", "default"), ("deepseek_v32", "yarn"),
                                             ("glm_moe_dsa", "yarn")])
def test_deepseek_v32_matches_hf(tmp_path, model_type, rope):
    """DeepSeek-V3.2 (half-split indexer RoPE, no IndexShare), and YaRN RoPE scaling (DeepSeek-V3.2's real config has
    it: factor 40 over 4096 positions; here 4 over 16) as transformers computes it — blended frequencies and MLA's
    softmax scale × mscale² — for either model type."""
    import json

    d = json.loads((CONFIGS / "glm5-tiny-random.json").read_text())
    if model_type == "deepseek_v32":
        d.update(model_type="deepseek_v32", architectures=["DeepseekV32ForCausalLM"])
        for k in ("indexer_types", "index_share_for_mtp_iteration", "index_topk_freq", "index_skip_topk_offset",
                  "index_topk_pattern", "indexer_rope_interleave"):
            d.pop(k, None)
    if rope == "yarn":
        d["rope_parameters"] = YARN
    cfg = ModelConfig.from_dict(d)
    assert (cfg.rope_yarn is not None) == (rope == "yarn")
    path = write_checkpoint(tmp_path, cfg, seed=5, dtype="float32")
    ours = load_model(path, dtype=torch.float32, progress=False)
    hf = hf_model(path)
    ids = _ids(40, cfg.vocab_size, seed=6)
    logits = run_ours(ours, ids, [32] + [1] * 8)
    with torch.no_grad():
        ref = hf(ids[None]).logits[0]
    diff = (logits - ref).abs().max().item()
    print(f"{model_type} {rope}: max |Δlogit| = {diff:.2e}")
    assert diff <= TOL
