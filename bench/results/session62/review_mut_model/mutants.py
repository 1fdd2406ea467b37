#!/usr/bin/env python
"""Mutation testing of glmserve's model math and its CPU references (session 62's review).

    python mutants.py REPO_DIR [--no-new-tests] [--only ID,ID] [--check]

Each mutant is a one-string replace in one source file (asserted to match exactly once) that models a plausible bug
in ``models/glm5.py`` (attention, DSA indexer, MoE routing, norms, RoPE/YaRN, MTP), ``glmkernels/reference.py`` (the
ops the Triton kernels are checked against, and what runs on the CPU) or the FP8 block paths. The repository's
tracked and untracked, not ignored, files are copied to a temporary folder (REPO_DIR itself is never changed); for
each mutant the file is changed there, the mutant's targeted tests run (``-x``; unit files first: their conftest
turns on Triton's interpreter), and the file is restored. ``tests/unit/test_mut62_model.py`` (this review's tests) is
run with every mutant when it exists, unless ``--no-new-tests``. Prints a table; exits 0 when every mutant not marked
equivalent is killed, 1 otherwise (2: the unmutated tests fail, or a mutant's text is not found once).
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

NEW_TESTS = "tests/unit/test_mut62_model.py"
U = "tests/unit/"
TK = U + "test_triton_kernels.py::"
PAR = ["tests/integration/test_parity_hf.py"]                     # logits and selections against transformers
MTP = [U + "test_mtp.py"]                                          # the MTP layer against a float64 formula
MODEL = MTP + PAR
FP8 = [U + "test_fp8.py", TK + "test_fp8_dequant", TK + "test_fp8_linear"] + PAR
NORM = [TK + "test_add_rms_norm_and_rms_norm", TK + "test_norm_rope_store", TK + "test_norm_rope_store_row_sets"]
ROPE = [TK + "test_rope_bit_identical", TK + "test_embed_rope", TK + "test_mla_absorb_rope"] + NORM
INDEX = [TK + "test_indexer_topk_sets", TK + "test_indexer_topk_takes_the_steps_ragged_slots",
         TK + "test_indexer_topk_paged_sets", U + "test_kv_fp8.py"]
ATT = [TK + "test_mla_sparse_attention", U + "test_kv_fp8.py"]
ROUTER = [TK + "test_router_topk"]
MOE = [U + "test_triton_moe.py::test_moe_experts", U + "test_triton_moe.py::test_moe_experts_with_shared"]
KVF = [U + "test_kv_fp8.py"]
CACHE = [U + "test_scheduler.py", U + "test_kv_memory.py"]


def M(mid, file, old, new, tests, what, eq=None):
    return {"id": mid, "file": file, "old": old, "new": new, "tests": tests, "what": what, "eq": eq}


MG, MR, MC, ML = "models/glm5.py", "glmkernels/reference.py", "models/cache.py", "models/loader.py"

MUTANTS = [
    # ---- models/glm5.py: attention -----------------------------------------------------------------------------------
    M("G01", MG, "self.scale = cfg.qk_head_dim ** -0.5 * m * m", "self.scale = cfg.qk_head_dim ** -0.5 * m", MODEL,
      "YaRN: MLA softmax scale takes mscale once, not mscale^2"),
    M("G02", MG, "self.scale = cfg.qk_head_dim ** -0.5 * m * m", "self.scale = cfg.qk_nope_head_dim ** -0.5 * m * m",
      MODEL, "MLA softmax scale from the nope dims only (dn, not dn + dr)"),
    M("G03", MG, "self.q_a_layernorm = RMSNorm(cfg.q_lora_rank, 1e-6)",
      "self.q_a_layernorm = RMSNorm(cfg.q_lora_rank, cfg.rms_norm_eps)", MODEL,
      "q_a_layernorm eps: rms_norm_eps (1e-5, vLLM's) instead of HF's 1e-6"),
    M("G04", MG, "self.kv_a_layernorm = RMSNorm(cfg.kv_lora_rank, 1e-6)",
      "self.kv_a_layernorm = RMSNorm(cfg.kv_lora_rank, cfg.rms_norm_eps)", MODEL,
      "kv_a_layernorm eps: rms_norm_eps instead of 1e-6"),
    M("G05", MG, "self.k_norm = LayerNorm(cfg.index_head_dim, 1e-6)",
      "self.k_norm = LayerNorm(cfg.index_head_dim, cfg.rms_norm_eps)", MODEL,
      "indexer k_norm eps: rms_norm_eps instead of 1e-6"),
    M("G06", MG, "rope.cos, rope.sin, rkv, cfg.rope_interleave, cache.kv[layer]",
      "rope.cos, rope.sin, 0, cfg.rope_interleave, cache.kv[layer]", MODEL,
      "MLA cache row: rope applied to the latent's first dims instead of the rope key"),
    M("G07", MG, "q_lat, q_rope = ops.mla_absorb_rope(q, self.kv_b_proj, dn, rope.cos, rope.sin, cfg.rope_interleave)",
      "q_lat, q_rope = ops.mla_absorb_rope(q, self.kv_b_proj, dn, rope.cos, rope.sin, cfg.indexer_rope_interleave)",
      MODEL, "MLA query roped with the indexer's convention (half-split on DeepSeek-V3.2)"),
    M("G08", MG, "q = rope.apply(q, cfg.indexer_rope_interleave)", "q = rope.apply(q, cfg.rope_interleave)", MODEL,
      "indexer query roped with MLA's convention (interleaved on DeepSeek-V3.2, whose indexer is half-split)"),
    M("G09", MG, "n.eps, self.cfg.index_head_dim, 0,\n" + " " * 25 + "self.cfg.indexer_rope_interleave, k_cache)",
      "n.eps, self.cfg.index_head_dim, 0,\n" + " " * 25 + "self.cfg.rope_interleave, k_cache)", MODEL,
      "indexer key roped with MLA's convention"),
    M("G11", MG, "return CacheRows(k.detach(), n.weight.detach(), n.bias.detach(),",
      "return CacheRows(k.detach(), n.weight.detach(), None,", MODEL,
      "indexer k_norm as RMSNorm (its LayerNorm bias and centring dropped)"),
    M("G12", MG, "q = rope.apply(q, cfg.indexer_rope_interleave)                                 # heads [rope | nope]",
      "q = torch.cat([q[..., q.shape[-1] - cfg.qk_rope_head_dim:], q[..., :q.shape[-1] - cfg.qk_rope_head_dim]], -1)"
      "\n        q = rope.apply(q, cfg.indexer_rope_interleave)", MODEL,
      "indexer query heads taken as [nope | rope] (MLA's layout) instead of [rope | nope]"),
    M("G13", MG, "scale = cfg.index_head_dim ** -0.5\n", "scale = cfg.qk_head_dim ** -0.5\n", MODEL,
      "indexer score scale from the wrong head dim",
      eq="a positive factor before the ReLU and the head-weighted sum scales every score of a row alike: relu(c·s) "
         "= c·relu(s), so top-k picks the same keys (the scores are used for nothing else)"),
    M("G14", MG, "w = (ops.linear_f32(h, wp.weight, rounded=True, scale=cfg.index_n_heads ** -0.5)",
      "w = (ops.linear_f32(h, wp.weight, rounded=True)", MODEL,
      "indexer head weights lose their ih^-0.5 factor",
      eq="one positive factor on every head weight of every row scales each row's scores alike: the same top-k"),
    M("G15", MG, "q, *q_index = ops.linear_group(q_resid,", "q, *q_index = ops.linear_group(q_a,", MODEL,
      "q_b / indexer wq_b fed the un-normed q_a instead of q_a_layernorm's output"),
    # ---- models/glm5.py: layers, MoE, MTP, rope tables ---------------------------------------------------------------
    M("G17", MG, "h, x = self.post_attention_layernorm.add_forward(a, x)",
      "h, x = self.input_layernorm.add_forward(a, x)", MODEL, "post-attention norm uses input_layernorm's weight"),
    M("G18", MG, "return self.model.norm.add_forward(m, x)[0]", "return self.model.norm.add_forward(m, x)[1]", MODEL,
      "final norm dropped: the residual stream goes to the lm_head"),
    M("G19", MG, "return self.experts(x, topk_idx, topk_w, shared=self.shared_experts)",
      "return self.experts(x, topk_idx, topk_w)", MODEL, "shared expert dropped"),
    M("G20", MG, "x, m, topk = layer(x, rope, batch, cache, None if self.config.has_indexer(i) else topk, m)",
      "x, m, topk = layer(x, rope, batch, cache, None if self.config.has_indexer(i) else topk, None)", MODEL,
      "the MLP output of each layer dropped from the residual stream (mlp_out not threaded)"),
    M("G21", MG, "z = mtp.eh_proj(torch.cat([mtp.enorm(e), mtp.hnorm(hidden)], dim=-1))",
      "z = mtp.eh_proj(torch.cat([mtp.hnorm(hidden), mtp.enorm(e)], dim=-1))", MODEL,
      "MTP: eh_proj's input order hidden-first (the spec: embedding first)"),
    M("G22", MG, "z = mtp.eh_proj(torch.cat([mtp.enorm(e), mtp.hnorm(hidden)], dim=-1))",
      "z = mtp.eh_proj(torch.cat([mtp.enorm(e), mtp.enorm(hidden)], dim=-1))", MODEL,
      "MTP: the hidden normed with enorm instead of hnorm"),
    M("G23", MG, "return mtp.shared_head.norm.add_forward(m, x)[0], topk",
      "return self.model.norm.add_forward(m, x)[0], topk", MODEL,
      "MTP: the target's final norm instead of shared_head.norm"),
    M("G24", MG, "e, rope = self._embed(next_ids, batch)", "e, rope = self._embed(next_ids.roll(1), batch)", MODEL,
      "MTP: the token at p (not p+1) embedded: ids shifted by one"),
    M("G25", MG, "    return 1.0 / (yarn.factor * pos_freqs) * (1 - extrapolated) + 1.0 / pos_freqs * extrapolated",
      "    return 1.0 / (yarn.factor * pos_freqs) * extrapolated + 1.0 / pos_freqs * (1 - extrapolated)", MODEL,
      "YaRN blend reversed: high frequencies interpolated, low ones extrapolated"),
    M("G26", MG, "pos_freqs = theta ** (torch.arange(0, dim, 2, dtype=torch.float, device=device) / dim)",
      "pos_freqs = theta ** (torch.arange(0, dim, 2, dtype=torch.float, device=device) / (dim - 2))", MODEL,
      "inverse frequencies' exponent 2i/(dr-2) instead of 2i/dr"),
    M("G27", MG, "    high += 0.001 if low == high else 0.0\n", "", MODEL,
      "YaRN: the low == high guard dropped (a ramp of zero width divides by zero)",
      eq="tests' YaRN configs (and real ones: DeepSeek's factor 40 over 4096) never have low == high after truncation; "
         "with low == high the ramp is (i - low)/0 = ±inf/nan: nan at i == low. A test SHOULD reach it only with a "
         "config crafted for it (beta_fast == beta_slow)"),
    M("G28", MG, "key = (dtype, self.weight.data_ptr(), self.weight._version, self.weight_scale_inv._version)",
      "key = (dtype, self.weight.data_ptr())", [U + "test_fp8.py"] + MODEL,
      "FP8 dense_weight cache ignores an in-place reload of the weight / its scales (stale kv_b_proj)"),
    M("G29", MG, "scale_shape = (*w.shape[:-2], num_blocks(self.out_features), num_blocks(self.in_features))",
      "scale_shape = (*w.shape[:-2], num_blocks(self.in_features), num_blocks(self.out_features))",
      FP8, "to_fp8: block-scale shape transposed ([in/128, out/128])"),
    # ---- glmkernels/reference.py: norms, rope, cache rows ------------------------------------------------------------
    M("R01", MR, "return weight * (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype)",
      "return weight * (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True))).to(x.dtype)", NORM + MODEL,
      "rms_norm: eps dropped"),
    M("R02", MR, "return weight * (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype)",
      "return (weight * xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype)", NORM + MODEL,
      "rms_norm: the weight applied in fp32 before the cast (HF casts, then multiplies: differs in bf16)"),
    M("R04", MR, "    s = x + residual\n    return rms_norm(s, weight, eps), s",
      "    s = x + residual\n    return rms_norm(x, weight, eps), s", NORM + MODEL,
      "add_rms_norm normalizes x, not the residual sum"),
    M("R05", MR, "    if interleaved:\n        a, b = r[..., 0::2], r[..., 1::2]",
      "    if not interleaved:\n        a, b = r[..., 0::2], r[..., 1::2]", ROPE + MODEL,
      "rope: interleaved and half-split swapped"),
    M("R06", MR, "return torch.cat([a * cos - b * sin, b * cos + a * sin]",
      "return torch.cat([a * cos + b * sin, b * cos - a * sin]", ROPE + MODEL,
      "rope: rotation by -angle (sin sign flipped)"),
    M("R07", MR, "ang = positions[:, None] * inv_freq[None, :]\n    return F.embedding",
      "ang = (positions[:, None] + 1) * inv_freq[None, :]\n    return F.embedding", ROPE + MODEL,
      "embed_rope: angles of position + 1 (invisible in the model's logits, rotations being relative: the Triton "
      "kernel's test holds the reference to it)"),
    M("R08", MR, "y = torch.cat([y[:, :at], rope(y[:, at:at + dr], cos, sin, r.interleaved), y[:, at + dr:]], dim=-1)",
      "y = torch.cat([y[:, :at], rope(y[:, at:at + dr], cos, sin, interleaved), y[:, at + dr:]], dim=-1)",
      NORM + MODEL, "norm_rope_store: the indexer's key rows roped with MLA's convention (the first rows' flag)"),
    M("R09", MR, "        if r.at_slots:\n            r.cache[slots] =",
      "        if True:\n            r.cache[slots] =",
      NORM + MODEL, "norm_rope_store: q_a's normed rows scattered to the slots, not written to rows 0..N-1"),
    # ---- glmkernels/reference.py: FP8 weights ------------------------------------------------------------------------
    M("F01", MR, "s = scale_inv.repeat_interleave(BLOCK, dim=-2)[..., :R, :].repeat_interleave(BLOCK, dim=-1)[..., :C]",
      "s = scale_inv.repeat_interleave(BLOCK, dim=-2)[..., -R:, :].repeat_interleave(BLOCK, dim=-1)[..., -C:]", FP8,
      "fp8_dequant: the partial block taken at the start (rows cropped from the end)"),
    M("F03", MR, "return (w8.float() * s.float()).to(dtype)", "return (w8.float().to(dtype) * s.to(dtype))", FP8,
      "fp8_dequant: the product formed in the target dtype (scale rounded to bf16/fp16 first)"),
    M("F04", MR, "s = blocks.abs().amax(dim=(-3, -1)).div(FP8_MAX).clamp(min=1e-12)",
      "s = blocks.abs().amax(dim=(-3, -1)).div(240.0).clamp(min=1e-12)", FP8,
      "fp8_quantize: scale amax/240 (e4m3fnuz's max) instead of amax/448: a quarter of e4m3's range unused"),
    M("F05", MR, "blocks = wp.unflatten(-1, (cb, BLOCK)).unflatten(-3, (rb, BLOCK))",
      "blocks = wp.unflatten(-1, (BLOCK, cb)).unflatten(-3, (rb, BLOCK))", FP8,
      "fp8_quantize: column blocks strided (every cb-th column) instead of contiguous"),
    M("F06", MR, "w8 = q.flatten(-4, -3).flatten(-2, -1)[..., :R, :C].to(FP8_DTYPE)",
      "w8 = q.flatten(-4, -3).flatten(-2, -1)[..., :R, :C].clamp(-240, 240).to(FP8_DTYPE)", FP8,
      "fp8_quantize: codes saturated at 240"),
    # ---- glmkernels/reference.py: indexer ----------------------------------------------------------------------------
    M("I01", MR, "score = score.masked_fill(key_pos[None, :] > positions[a:b, None], float(\"-inf\"))",
      "score = score.masked_fill(key_pos[None, :] >= positions[a:b, None], float(\"-inf\"))", INDEX + MODEL,
      "indexer causal mask off by one: a row's own key not visible"),
    M("I02", MR, "score = score.masked_fill(key_pos[None, :] > positions[a:b, None], float(\"-inf\"))",
      "score = score.masked_fill(key_pos[None, :] > positions[a:b, None] + 1, float(\"-inf\"))", INDEX + MODEL,
      "indexer causal mask off by one: the next (future) key visible"),
    M("I03", MR, "visible = key_pos[None, :] <= positions[r0:r0 + nr, None]           # [S, T]",
      "visible = key_pos[None, :] < positions[r0:r0 + nr, None]           # [S, T]", INDEX + MODEL,
      "indexer, context within topk: a row's own key left out"),
    M("I04", MR, "        if T <= topk:\n", "        if T < topk:\n", INDEX + MODEL,
      "indexer: the select-all shortcut not taken at T == topk (the same sets, in score order)"),
    M("I05", MR, "out[a:b] = torch.where(torch.isfinite(val), slots[idx], -1)", "out[a:b] = slots[idx]",
      INDEX + MODEL, "indexer: masked (-inf) picks kept for rows that see fewer than K keys: future keys attended"),
    M("I06", MR, "score = torch.einsum(\"sh,sht->st\", head_weights[a:b].float(), F.relu(s))",
      "score = torch.einsum(\"sh,sht->st\", head_weights[a:b].float(), s)", INDEX + MODEL,
      "indexer: ReLU dropped"),
    M("I07", MR, "score = torch.einsum(\"sh,sht->st\", head_weights[a:b].float(), F.relu(s))",
      "score = F.relu(s).sum(1)", INDEX + MODEL, "indexer: head weights ignored"),
    M("I08", MR, "            b = min(a + slab, r0 + nr)\n", "            b = a + slab\n", INDEX + MODEL,
      "indexer slabs: the last slab of a request runs into the next request's rows",
      eq="the rows it runs into belong to later requests, which are written after it: a scored one wholly; a short "
         "one (T <= topk) in its first T columns, and the run-over row's finite picks (at most position + 1 <= T of "
         "them, sorted first) all lie there, its -1s beyond; rows past the last request are cut by the slice"),
    M("I09", MR, "val, idx = score.topk(min(topk, W), dim=-1, sorted=False)",
      "val, idx = score.topk(topk, dim=-1, sorted=False)", INDEX + MODEL,
      "paged indexer: top-k not clamped to the scored width (a graph bucket of fewer keys than index_topk)"),
    M("I10", MR, "visible = torch.arange(W, device=q.device)[None, :] <= positions[:, None]",
      "visible = torch.arange(W, device=q.device)[None, :] < positions[:, None]", INDEX + MODEL,
      "paged indexer: a row's own key not visible"),
    M("I11", MR, "return block_table.long()[:, t // block_size] * block_size + t % block_size",
      "return block_table.long()[:, t // block_size] * block_size + t // block_size", INDEX + MODEL,
      "paged slots: the offset in the block taken as the block number"),
    M("I12", MR, "K = min(topk, max((int(s.numel()) for s in seq_slots), default=0))", "K = topk", INDEX + MODEL,
      "indexer: selection width not clamped to the longest context (K = index_topk always)"),
    # ---- glmkernels/reference.py: attention --------------------------------------------------------------------------
    M("A01", MR, "score = score.masked_fill((idx < 0)[:, None, :], float(\"-inf\"))", "", ATT + MODEL,
      "sparse attention: -1 (unselected) entries attend slot 0"),
    M("A02", MR, "+ torch.einsum(\"nhr,nkr->nhk\", q_rope[sl], kr)) * scale",
      "+ torch.einsum(\"nhr,nkr->nhk\", q_rope[sl], kr) * scale)", ATT + MODEL,
      "sparse attention: softmax scale on the rope part only"),
    M("A03", MR, "        sl = slice(r, r + row_chunk)\n", "        sl = slice(r, r + row_chunk - 1)\n", ATT + MODEL,
      "sparse attention: each chunk of rows one short (rows 255, 511, ... never written)"),
    M("A04", MR, "return torch.einsum(\"nhc,hvc->nhv\", o_lat, _kv_b_heads(kv_b, o_lat.dtype, o_lat.shape[1])[:, dn:])",
      "return torch.einsum(\"nhc,hvc->nhv\", o_lat, _kv_b_heads(kv_b, o_lat.dtype, o_lat.shape[1])[:, :dn])",
      [TK + "test_mla_absorb_expand"] + MODEL, "mla_expand: W_UK used as W_UV (dn == dv in the tiny config)"),
    # ---- glmkernels/reference.py: MoE --------------------------------------------------------------------------------
    M("E01", MR, "    w = scores.gather(1, idx)\n", "    w = choice.gather(1, idx)\n", ROUTER + MODEL,
      "router: e_score_correction_bias in the expert weights (it is for selection only)"),
    M("E02", MR, "    return idx, w * scaling\n", "    return idx, w\n", ROUTER + MODEL,
      "router: routed_scaling_factor not applied"),
    M("E03", MR, "    return idx, w * scaling\n", "    return idx, w * scaling * scaling\n", ROUTER + MODEL,
      "router: routed_scaling_factor applied twice"),
    M("E04", MR, ".topk(2, dim=-1)[0].sum(-1)   # [N, G]", ".topk(1, dim=-1)[0].sum(-1)   # [N, G]", ROUTER + MODEL,
      "router: group score = its best expert, not the sum of its top-2"),
    M("E05", MR, "gidx = group.topk(topk_group, dim=-1, sorted=False)[1]",
      "gidx = group.topk(topk_group - 1, dim=-1, sorted=False)[1]", ROUTER + MODEL,
      "router: one group fewer kept (topk_group - 1)"),
    M("E06", MR, "choice.masked_fill(~gmask.repeat_interleave(E // n_group, dim=1), float(\"-inf\"))",
      "choice.masked_fill(~gmask.repeat(1, E // n_group), float(\"-inf\"))", ROUTER + MODEL,
      "router: group mask tiled (expert e in group e % G) instead of contiguous groups"),
    M("E07", MR, "    if norm_topk_prob:\n", "    if True:\n", ROUTER + MODEL,
      "router: weights renormalized even when norm_topk_prob is false"),
    M("E08", MR, "    scores = logits.sigmoid()\n", "    scores = logits.softmax(-1)\n", ROUTER + MODEL,
      "router: softmax scores instead of sigmoid"),
    M("E09", MR, "    if n_group > 1:\n", "    if n_group > 2:\n", ROUTER + MODEL,
      "router: group limiting skipped for 2 groups (no test had n_group 2)"),
    M("E10", MR, "(y * topk_w[rows, slot, None]).to(x.dtype))\n    return out if shared is None else out + swiglu(x, "
      "*shared)\n", "(y * topk_w[rows, 0, None]).to(x.dtype))\n    return out if shared is None else out + swiglu(x, "
      "*shared)\n", MOE + MODEL,
      "moe_experts: every expert weighted by the row's first weight"),
    M("E11", MR, "    local = topk_idx - expert_offset\n    num_local = gate.shape[0]",
      "    local = topk_idx\n    num_local = gate.shape[0]", MOE + MODEL,
      "moe_experts: the ep rank's expert offset ignored"),
    M("E12", MR, "return linear(F.silu(linear(x, gate, gate_s)) * linear(x, up, up_s), down, down_s)",
      "return linear(F.silu(linear(x, up, up_s)) * linear(x, gate, gate_s), down, down_s)", MOE + MODEL,
      "shared expert: gate and up swapped"),
    # ---- glmkernels/reference.py: FP8 KV rows ------------------------------------------------------------------------
    M("K01", MR, "e = ((bits >> 23) - 135 + ((bits & 0x7FFFFF) > 0x600000).int()).clamp(min=-126)",
      "e = ((bits >> 23) - 135 + ((bits & 0x7FFFFF) >= 0x600000).int()).clamp(min=-126)", KVF,
      "kv_fp8_scale: a group whose amax is exactly 1.75·2^k (fits 448) takes the next power"),
    # ---- models/cache.py: where the KV is written --------------------------------------------------------------------
    M("C01", MC, "    slot_mapping = seq_slots[bases + positions]\n",
      "    slot_mapping = seq_slots[bases + np.maximum(positions - 1, 0)]\n", CACHE + MODEL,
      "build_batch: each row's KV written at the previous position's slot"),
]

def copy_repo(repo: Path, dest: Path) -> None:
    out = subprocess.run(["git", "-C", str(repo), "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                         check=True, capture_output=True).stdout.decode()
    for rel in filter(None, out.split("\0")):
        src = repo / rel
        if not src.is_file():
            continue
        (dest / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(src, dest / rel)


def run_tests(work: Path, python: str, tests: list[str], timeout: int = 300) -> tuple[str, float, str]:
    env = {**os.environ, "PYTHONPATH": str(work), "RAY_AUTH_MODE": "disabled", "RAY_USAGE_STATS_ENABLED": "0"}
    t0 = time.time()
    try:
        p = subprocess.run([python, "-m", "pytest", *tests, "-x", "-q", "-p", "no:cacheprovider"], cwd=work, env=env,
                           capture_output=True, text=True, timeout=timeout, check=False)
    except subprocess.TimeoutExpired:
        return "killed(timeout)", time.time() - t0, ""
    tail = (p.stdout + p.stderr).strip().splitlines()
    last = tail[-1] if tail else ""
    if p.returncode == 0:
        return "survived", time.time() - t0, last
    if p.returncode in (1, 2, 3):
        failed = next((ln for ln in tail if ln.startswith(("FAILED", "ERROR"))), last)
        return "killed", time.time() - t0, failed
    return f"error(rc={p.returncode})", time.time() - t0, last


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("repo", type=Path)
    ap.add_argument("--no-new-tests", action="store_true", help=f"do not run {NEW_TESTS}")
    ap.add_argument("--only", default="", help="comma-separated mutant ids")
    ap.add_argument("--check", action="store_true", help="only check that every mutant's text matches once")
    a = ap.parse_args()
    repo = a.repo.resolve()
    python = str(repo / ".venv/bin/python") if (repo / ".venv/bin/python").exists() else sys.executable
    chosen = [m for m in MUTANTS if not a.only or m["id"] in a.only.split(",")]
    bad = [(m["id"], (repo / m["file"]).read_text().count(m["old"])) for m in chosen]
    bad = [b for b in bad if b[1] != 1]
    if bad:
        print(f"mutant text not found exactly once: {bad}")
        return 2
    if a.check:
        print(f"{len(chosen)} mutants, each matching once")
        return 0
    with tempfile.TemporaryDirectory(prefix="mut62-") as tmp:
        work = Path(tmp)
        copy_repo(repo, work)
        extra = [NEW_TESTS] if (work / NEW_TESTS).exists() and not a.no_new_tests else []
        every = sorted({t for m in chosen for t in m["tests"]} | set(extra))
        status, dt, last = run_tests(work, python, every, timeout=600)
        print(f"unmutated: {status} in {dt:.0f} s ({last})", flush=True)
        if status != "survived":
            return 2
        rows = []
        for m in chosen:
            path = work / m["file"]
            original = path.read_text()
            path.write_text(original.replace(m["old"], m["new"], 1))
            try:
                status, dt, last = run_tests(work, python, m["tests"] + extra)
            finally:
                path.write_text(original)
            rows.append((m, status))
            print(f"{m['id']:4} {status:15} {dt:5.0f} s  {m['file']}: {m['what']}"
                  + (f"  [equivalent: {m['eq']}]" if m["eq"] else "")
                  + (f"  <- {last}" if status != "survived" else ""),
                  flush=True)
    live = [m["id"] for m, s in rows if not m["eq"] and not s.startswith("killed")]
    eq = [m["id"] for m, _ in rows if m["eq"]]
    killed = sum(1 for m, s in rows if not m["eq"] and s.startswith("killed"))
    print(f"\n{len(rows)} mutants ({len(eq)} equivalent: {', '.join(eq) or '-'}); {killed} of {len(rows) - len(eq)} "
          f"non-equivalent killed; surviving: {', '.join(live) or 'none'}")
    return 1 if live else 0


if __name__ == "__main__":
    sys.exit(main())
