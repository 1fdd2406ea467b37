"""The MTP layer against an independent float64 re-computation of its formula (HF has no MTP)."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from models.cache import KVCache, contiguous_batch
from models.loader import load_model


def rms(x, w, eps):
    return w * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps))


def rope(x, pos, theta):
    d = x.shape[-1]
    inv = 1.0 / (theta ** (torch.arange(0, d, 2, dtype=torch.float64) / d))
    ang = pos.double()[:, None] * inv[None]
    shape = (x.shape[0],) + (1,) * (x.dim() - 2) + (d // 2,)
    cos, sin = ang.cos().view(shape), ang.sin().view(shape)
    a, b = x[..., 0::2], x[..., 1::2]
    return torch.stack([a * cos - b * sin, b * cos + a * sin], -1).flatten(-2)   # GPT-J in place


def f64_decoder_layer(sd, p, c, x):
    """One MLA + DSA + MoE decoder layer, expanded (non-absorbed) attention, float64 throughout."""
    S = x.shape[0]
    nh, dn, dr, dv, rkv = (c.num_attention_heads, c.qk_nope_head_dim, c.qk_rope_head_dim, c.v_head_dim,
                           c.kv_lora_rank)
    pos = torch.arange(S)
    W = lambda n: sd[p + n].double()  # noqa: E731
    h = rms(x, W("input_layernorm.weight"), c.rms_norm_eps)
    qr = rms(h @ W("self_attn.q_a_proj.weight").T, W("self_attn.q_a_layernorm.weight"), 1e-6)
    q = (qr @ W("self_attn.q_b_proj.weight").T).view(S, nh, dn + dr)
    q_nope, q_rope = q[..., :dn], rope(q[..., dn:], pos, c.rope_theta)
    kv = h @ W("self_attn.kv_a_proj_with_mqa.weight").T
    lat = rms(kv[:, :rkv], W("self_attn.kv_a_layernorm.weight"), 1e-6)
    k_rope = rope(kv[:, rkv:], pos, c.rope_theta)
    kvb = (lat @ W("self_attn.kv_b_proj.weight").T).view(S, nh, dn + dv)
    scores = (torch.einsum("shd,thd->hst", q_nope, kvb[..., :dn])
              + torch.einsum("shd,td->hst", q_rope, k_rope)) / math.sqrt(dn + dr)
    iq = (qr @ W("self_attn.indexer.wq_b.weight").T).view(S, c.index_n_heads, c.index_head_dim)
    ik = F.layer_norm(h @ W("self_attn.indexer.wk.weight").T, (c.index_head_dim,),
                      W("self_attn.indexer.k_norm.weight"), W("self_attn.indexer.k_norm.bias"), 1e-6)
    iq = torch.cat([rope(iq[..., :dr], pos, c.rope_theta), iq[..., dr:]], -1)
    ik = torch.cat([rope(ik[..., :dr], pos, c.rope_theta), ik[..., dr:]], -1)
    w = (h @ W("self_attn.indexer.weights_proj.weight").T) / math.sqrt(c.index_n_heads)
    isc = torch.einsum("sht,sh->st", F.relu(torch.einsum("shd,td->sht", iq, ik) / math.sqrt(c.index_head_dim)), w)
    causal = torch.ones(S, S, dtype=torch.bool).tril()
    isc = isc.masked_fill(~causal, float("-inf"))
    sel = torch.zeros(S, S, dtype=torch.bool).scatter(-1, isc.topk(min(c.index_topk, S), -1).indices, True) & causal
    probs = scores.masked_fill(~sel[None], float("-inf")).softmax(-1)
    o = torch.einsum("hst,thd->shd", probs, kvb[..., dn:]).reshape(S, nh * dv)
    x = x + o @ W("self_attn.o_proj.weight").T
    h = rms(x, W("post_attention_layernorm.weight"), c.rms_norm_eps)
    sc = (h @ W("mlp.gate.weight").T).sigmoid()
    choice = sc + W("mlp.gate.e_score_correction_bias")
    E, G = c.n_routed_experts, c.n_group
    gs = choice.view(S, G, E // G).topk(2, -1).values.sum(-1)
    gm = torch.zeros(S, G, dtype=torch.bool).scatter(1, gs.topk(c.topk_group, -1).indices, True)
    ti = choice.masked_fill(~gm.repeat_interleave(E // G, 1), float("-inf")).topk(c.num_experts_per_tok, -1).indices
    tw = sc.gather(1, ti)
    tw = tw / tw.sum(-1, keepdim=True) * c.routed_scaling_factor
    swiglu = lambda pre, v: (F.silu(v @ W(pre + "gate_proj.weight").T) * (v @ W(pre + "up_proj.weight").T)) \
        @ W(pre + "down_proj.weight").T  # noqa: E731
    out = swiglu("mlp.shared_experts.", h)
    for s in range(S):
        for j in range(c.num_experts_per_tok):
            out[s] += tw[s, j] * swiglu(f"mlp.experts.{int(ti[s, j])}.", h[s:s + 1])[0]
    return x + out


def test_mtp_layer_matches_float64_formula(tiny_ckpt, tiny_config):
    from safetensors.torch import load_file

    c = tiny_config
    sd = load_file(tiny_ckpt / "model.safetensors")
    model = load_model(tiny_ckpt, dtype=torch.float32, progress=False)
    S, L = 32, c.num_hidden_layers
    g = torch.Generator().manual_seed(7)
    hidden = torch.randn(S, c.hidden_size, generator=g)
    next_ids = torch.randint(0, c.vocab_size, (S,), generator=g)
    cache = KVCache(c, S, torch.float32)
    with torch.no_grad():
        hn, _ = model.mtp_forward(hidden, next_ids, contiguous_batch([(0, S)], S), cache)
        draft_logits = model.logits(hn)

    p = f"model.layers.{L}."
    e = sd["model.embed_tokens.weight"].double()[next_ids]
    z = torch.cat([rms(e, sd[p + "enorm.weight"].double(), c.rms_norm_eps),
                   rms(hidden.double(), sd[p + "hnorm.weight"].double(), c.rms_norm_eps)], -1)
    z = z @ sd[p + "eh_proj.weight"].double().T
    x = f64_decoder_layer(sd, p, c, z)
    ref_hn = rms(x, sd[p + "shared_head.norm.weight"].double(), c.rms_norm_eps)
    ref_logits = ref_hn @ sd["lm_head.weight"].double().T
    assert (hn.double() - ref_hn).abs().max() < 1e-4
    assert (draft_logits.double() - ref_logits).abs().max() < 1e-4


def test_mtp_shared_selection_reuses_indices(tiny_ckpt, tiny_config):
    """Index sharing: a draft step given the carried selection uses it verbatim and skips the indexer."""
    model = load_model(tiny_ckpt, dtype=torch.float32, progress=False)
    c = tiny_config
    cache = KVCache(c, 64, torch.float32)
    g = torch.Generator().manual_seed(8)
    h = torch.randn(40, c.hidden_size, generator=g)
    ids = torch.randint(0, c.vocab_size, (41,), generator=g)
    with torch.no_grad():
        _, topk = model.mtp_forward(h, ids[:40], contiguous_batch([(0, 40)], 64), cache)
        carried = topk[-1:]
        _, reused = model.mtp_forward(h[-1:], ids[40:], contiguous_batch([(40, 1)], 64), cache, topk=carried)
    assert torch.equal(reused, carried)
    assert cache.index_k[c.num_hidden_layers][40].abs().sum() > 0, "the MTP indexer key is still cached"
