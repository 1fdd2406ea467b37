#!/usr/bin/env python
"""Mutation testing of glmserve's Triton kernels against their CPU tests (session 63's review).

    python mutants.py REPO_DIR [--no-new-tests] [--only ID,ID] [--check]

Each mutant is a one-string replace in one ``glmkernels/triton_*.py`` file (asserted to match exactly once) that
models a plausible kernel bug: a wrong mask at a tile edge, an off-by-one in a block offset, a wrong scale block index
or stride, a missing accumulate, a top-k tie order, a dropped bias, a wrong rounding order, a kernel that only works
when the shape is a multiple of its block. The repository's tracked and untracked, not ignored, files are copied to a
temporary folder (REPO_DIR itself is never changed); for each mutant the file is changed there, the mutant's targeted
CPU tests run (``-x``; tests/unit's conftest turns on Triton's interpreter, which runs the kernels' Python source in
the test process: no compiled-kernel cache can hold an unmutated kernel, and ``TRITON_CACHE_DIR`` points at a fresh
folder per mutant all the same; no bytecode is written), and the file is restored. ``tests/unit/test_mut63_kernels.py``
(this review's tests) runs after them with every mutant when it exists, unless ``--no-new-tests``. A test process
killed by a signal counts as a kill (``killed(crash)``: the interpreter does not check stores, and a mutant's
out-of-bounds write can take the process down). Prints a table; exits 0 when every mutant not marked equivalent or
GPU-only is killed, 1 otherwise (2: the unmutated tests fail, or a mutant's text is not found once).
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

NEW_TESTS = "tests/unit/test_mut63_kernels.py"
U = "tests/unit/"
TK = U + "test_triton_kernels.py::"
TM = U + "test_triton_moe.py::"
KV = U + "test_kv_fp8.py::"
LINEAR = [TK + "test_fp8_linear", TK + "test_linear_group", TK + "test_fp8_linear_split_k_semaphore",
          TK + "test_fp8_linear_wide_tiles"]
F32 = [TK + "test_linear_f32"]
DEQUANT = [TK + "test_fp8_dequant", U + "test_fp8.py"]
FUSED = [TM + "test_moe_experts", TM + "test_moe_experts_runs_in_chunks", TM + "test_moe_experts_with_shared"]
ROUTE = [TM + "test_route_pairs"] + FUSED
GROUPED = [TM + "test_grouped_moe"]
W8A8 = [TM + "test_act_quant_codes_equal_the_reference", TM + "test_w8a8_linear", TM + "test_w8a8_moe"]
ATT = [TK + "test_mla_sparse_attention", TK + "test_mla_splits_fill_one_wave",
       KV + "test_triton_attention_on_packed_rows_equals_it_on_their_values"]
INDEX = [TK + "test_indexer_topk_sets", TK + "test_indexer_topk_takes_the_steps_ragged_slots",
         TK + "test_prefill_rows_scores_equal_the_one_row_kernel", TK + "test_indexer_topk_paged_sets",
         KV + "test_indexer_scores_on_packed_keys_equal_them_on_their_values"]
SELECT = [TK + "test_wide_select", TK + "test_indexer_topk_paged_sets",
          KV + "test_indexer_scores_on_packed_keys_equal_them_on_their_values"]
NORM = [TK + "test_add_rms_norm_and_rms_norm", TK + "test_zero_rows_fall_through"]
ROPE = [TK + "test_rope_bit_identical", TK + "test_mla_absorb_rope", TK + "test_norm_rope_store",
        TK + "test_norm_rope_store_row_sets", KV + "test_triton_store_packs_the_rows_the_reference_packs"]
STORE = [TK + "test_norm_rope_store", TK + "test_norm_rope_store_row_sets",
         KV + "test_triton_store_packs_the_rows_the_reference_packs"]
ROUTER = [TK + "test_router_topk"]
ABSORB = [TK + "test_mla_absorb_expand", TK + "test_mla_absorb_rope"]


def M(mid, file, old, new, tests, what, eq=None, gpu=None):
    """``eq``: why the mutant cannot change a result; ``gpu``: why only a GPU run can show it (the interpreter runs a
    launch's programs one after another, without PDL, with exact dots). Neither counts in the exit code."""
    return {"id": mid, "file": file, "old": old, "new": new, "tests": tests, "what": what, "eq": eq, "gpu": gpu}


LIN, MOE, ATTN = "glmkernels/triton_linear.py", "glmkernels/triton_moe.py", "glmkernels/triton_attention.py"
NRM, RTR = "glmkernels/triton_norm.py", "glmkernels/triton_router.py"
ABS, W8 = "glmkernels/triton_absorb.py", "glmkernels/triton_w8a8.py"
UTL = "glmkernels/triton_utils.py"

MUTANTS = [
    # ---- triton_linear.py: the tile kernel, the split-K epilogue, the one-row GEMV, the dequant ----------------------
    M("L01", LIN, "s_row = s_ptr + (pid_n * BLOCK_N) // 128 * num_sb_k", "s_row = s_ptr + (pid_n * BLOCK_N) // 128",
      LINEAR, "tile kernel: the scale row's stride (num_sb_k) dropped: output block r reads S[0, r + k]"),
    M("L02", LIN, "sc = tl.load(s_ptr + rn // 128 * num_sb_k + tl.minimum(kb, num_sb_k - 1), mask=rn < N, other=0.0)",
      "sc = tl.load(s_ptr + rn * 0 + (pid_n * BLOCK_N) // 128 * num_sb_k + tl.minimum(kb, num_sb_k - 1), mask=rn < N,"
      " other=0.0)", LINEAR, "tile kernel, tiles over several scale rows: every row scaled by the tile's first row's"),
    M("L03", LIN, "kb = step * (BLOCK_K // 128) + j\n", "kb = step + j\n", LINEAR,
      "tile kernel: K sub-block index step + j (right only for BLOCK_K = 128)"),
    M("L04", LIN, "step0 + k_steps_per_split, tl.cdiv(K, BLOCK_K))):", "step0 + k_steps_per_split, K // BLOCK_K)):",
      LINEAR, "tile kernel: the partial last K step dropped (works when K is a multiple of BLOCK_K)"),
    M("L05", LIN, "for s in range(num_splits):            # fixed order",
      "for s in range(1, num_splits):  # fixed order",
      LINEAR + F32, "split-K epilogue: split 0's partial not accumulated"),
    M("L06", LIN, "        tl.store(count_ptr + tile, 0)          # the next launch (stream-ordered) starts from zero"
      "\n",
      "", LINEAR + F32, "split-K epilogue: the tile counter not reset (the next launch never finds its last split)"),
    M("L07", LIN, "    if ROUND_TO is not None:\n        y = y.to(ROUND_TO).to(tl.float32)\n    if OUT_SCALE != 1.0:\n"
      "        y = y * OUT_SCALE\n",
      "    if OUT_SCALE != 1.0:\n        y = y * OUT_SCALE\n    if ROUND_TO is not None:\n"
      "        y = y.to(ROUND_TO).to(tl.float32)\n", F32,
      "_finish: scaled, then rounded (the indexer's head weights: HF rounds the linear's output, then scales)"),
    M("L08", LIN, "r0 = pid_n * BLOCK_N - tl.where(in_c, N_ab, tl.where(in_b, N_a, 0))",
      "r0 = pid_n * BLOCK_N - tl.where(in_c, N_a, tl.where(in_b, N_a, 0))", LINEAR,
      "GEMV group: the third weight's rows offset by N_a instead of N_ab"),
    M("L09", LIN, "            xs = xs * tl.load(s_row + kk // 128, mask=km, other=0.0)",
      "            xs = xs * tl.load(s_row + (kk - k0) // 128, mask=km, other=0.0)", LINEAR,
      "GEMV, K steps after a split's first: scale columns counted from the split's start, not from column 0"),
    M("L10", LIN, "            acc += tl.sum(w.to(tl.float32) * xs[None, :], axis=1)",
      "            acc = tl.sum(w.to(tl.float32) * xs[None, :], axis=1)", LINEAR,
      "GEMV (EACH): a K step's sums replace the accumulator instead of adding to it"),
    M("L11", LIN, "_fp8_dequant_kernel[(triton.cdiv(R, 64), triton.cdiv(C, 128), lead)]",
      "_fp8_dequant_kernel[(R // 64, triton.cdiv(C, 128), lead)]", DEQUANT,
      "fp8_dequant: grid of whole row blocks only (the partial last rows never written)"),
    # ---- triton_moe.py: routing, the fused expert GEMMs, the one-row kernels, the grouped ones, the combine ----------
    M("M01", MOE, "before = key_j[None, :] < key[:, None]", "before = key_j[None, :] <= key[:, None]", ROUTE,
      "route: a pair counted before itself (ranks off by one)"),
    M("M02", MOE, "owner = (e < E_local) & (into % BLOCK_R == 0)", "owner = (e < E_local) & (into == 0)", FUSED,
      "fused: only a run's first chunk owned (a run longer than RUN_ROWS loses its later chunks)"),
    M("M03", MOE, "    s_blk = ((ib * BLOCK_I) // 128) * num_sb_h\n    gs_base",
      "    s_blk = ((ib * BLOCK_I) // 128)\n    gs_base", FUSED,
      "fused gate/up: the scale row's stride (num_sb_h) dropped"),
    M("M04", MOE, "pg = pg * tl.load(gs_ptr + gs_base + hb, mask=hb < num_sb_h, other=0.0)",
      "pg = pg * tl.load(gs_ptr + gs_base + step, mask=hb < num_sb_h, other=0.0)", FUSED,
      "fused gate/up: the gate's H scale indexed by K step, not by 128-column block"),
    M("M05", MOE, "    g = acc_g.to(dt).to(tl.float32)\n    u = acc_u.to(dt).to(tl.float32)\n"
      "    a = (g / (1.0 + tl.exp(-g))).to(dt).to(tl.float32) * u\n    tl.store(act_ptr + j[:, None] * I",
      "    g = acc_g\n    u = acc_u.to(dt).to(tl.float32)\n"
      "    a = (g / (1.0 + tl.exp(-g))).to(dt).to(tl.float32) * u\n    tl.store(act_ptr + j[:, None] * I", FUSED,
      "fused gate/up: the gate's output not rounded to x's dtype before the SiLU"),
    M("M06", MOE, "w = tl.load(w_route_ptr + pair, mask=in_run, other=0.0)",
      "w = tl.load(w_route_ptr + j, mask=in_run, other=0.0)", FUSED,
      "fused down: routing weight read at the sorted position, not the pair"),
    M("M07", MOE, "e.to(tl.int64) * num_sb_h * num_sb_i) + ((hb * BLOCK_HO) // 128) * num_sb_i\n    for step",
      "e.to(tl.int64) * num_sb_h * num_sb_i) + ((hb * BLOCK_HO) // 128)\n    for step", FUSED,
      "fused down: the scale row's stride (num_sb_i) dropped"),
    M("M08", MOE, "    w = tl.load(w_route_ptr + pair, mask=in_run, other=0.0)\n"
      "    y = (acc.to(dt).to(tl.float32) * w[:, None]).to(dt)",
      "    w = tl.load(w_route_ptr + pair, mask=in_run, other=0.0)\n    y = (acc * w[:, None]).to(dt)", FUSED,
      "fused down: the expert's output not rounded before the routing weight (one rounding, not the reference's two)"),
    M("M09", MOE, "            slot = tl.load(order_ptr + n * TOPK + t)\n", "            slot = t\n", FUSED + GROUPED,
      "combine: a row's pairs added in slot order, not expert-id order (the reference's index_add_ order)"),
    M("M10", MOE, "pg = wg.to(tl.float32) * (x * tl.load(g_s + h // 128, mask=hm, other=0.0))[None, :]",
      "pg = wg.to(tl.float32) * (x * tl.load(g_s + rh // 128, mask=hm, other=0.0))[None, :]", FUSED,
      "one-row gate/up: the gate's scale column counted from the K step's start, not from column 0"),
    M("M11", MOE, "((hb * BLOCK_HO) // 128) * num_sb_i\n    for i0", "((hb * BLOCK_HO) // 128)\n    for i0", FUSED,
      "one-row down: the scale row's stride (num_sb_i) dropped"),
    M("M12", MOE, "wg = wg.to(tl.float32) * tl.load(gs_ptr + s_base + hb)",
      "wg = wg.to(tl.float32) * tl.load(gs_ptr + s_base)",
      GROUPED, "grouped gate/up: every H block takes the first block's gate scale"),
    M("M13", MOE, "s_base = e * num_sb_h * num_sb_i + ((hb * BLOCK_HO) // 128) * num_sb_i",
      "s_base = e * num_sb_h * num_sb_i + ((hb * BLOCK_HO) // 128)", GROUPED + W8A8,
      "grouped down: the scale row's stride (num_sb_i) dropped"),
    M("M14", MOE, "            held = first // TOPK < E_local\n", "            held = first < 2 ** 30\n", FUSED,
      "one-row combine: pairs of experts held elsewhere added (their y rows never written)"),
    # ---- triton_attention.py: sparse MLA, its combine, the indexer's scoring and the wide select ---------------------
    M("A01", ATTN, "s = tl.where(sel[None, :], s * scale_log2, float(\"-inf\"))", "s = s * scale_log2", ATT,
      "sparse attention: unselected (-1) keys not masked (they score 0 and take probability)"),
    M("A02", ATTN, "alpha = tl.exp2(m_i - m_new)", "alpha = tl.exp2(m_new - m_i)", ATT,
      "online softmax: the rescale factor inverted"),
    M("A03", ATTN, "k_end = tl.minimum(k0 + keys_per_split, K)\n    # a row",
      "k_end = k0 + keys_per_split\n    # a row", ATT,
      "split kernel: the last split runs past K (into the next row's selection) when K is not a multiple of it"),
    M("A04", ATTN, "lse = tl.load(lse_ptr + nh_row * NUM_SPLITS + s, mask=s < NUM_SPLITS, other=float(\"-inf\"))",
      "lse = tl.load(lse_ptr + nh_row * NUM_SPLITS + s, mask=s < NUM_SPLITS, other=0.0)", ATT,
      "combine: the padded split lanes (splits not a power of two) weigh in with lse 0"),
    M("A05", ATTN, "last = tl.maximum(last, tl.max(tl.where(slot >= 0, kk + 1, 0), axis=0))",
      "last = tl.maximum(last, tl.max(tl.where(slot >= 0, kk, 0), axis=0))", ATT,
      "trim: a split stops one key early (its last selected key dropped)"),
    M("A06", ATTN, "if TRIM and tl.load(idx_ptr + n * stride_idx + k_end - 1) < 0:",
      "if TRIM and tl.load(idx_ptr + n * stride_idx + k_end) < 0:", ATT,
      "trim: the guard reads the key after the split's last",
      eq="trim only skips key blocks that are all -1 and the scan finds the split's last selected key whatever the "
         "guard says: a wrong guard only changes whether the scan runs, never the result (bit for bit, as the trim "
         "itself; when the guard reads past the row it reads the next row's first slot, still inside the tensor but "
         "for the last row, whose read lands in torch's allocation slack)"),
    M("A07", ATTN, "+ tl.arange(0, RKV // GROUP)[None, :],\n", "+ 0 * tl.arange(0, RKV // GROUP)[None, :],\n", ATT,
      "packed FP8 rows: every latent group takes the row's first scale"),
    M("A08", ATTN, "visible = (t < length) & (t <= pos)", "visible = (t < length) & (t < pos)", INDEX,
      "indexer scores (one row): a row's own key masked"),
    M("A09", ATTN, "if tl.program_id(1) * BLOCK_T <= tl.minimum(pos, length - 1):",
      "if tl.program_id(1) * BLOCK_T < tl.minimum(pos, length - 1):", INDEX,
      "indexer scores: a key block whose first key is the row's last visible one skipped"),
    M("A10", ATTN, "score = tl.where((t[None, :] < length) & (t[None, :] <= pos[:, None]), score, float(\"-inf\"))",
      "score = tl.where((t[None, :] < length) & (t[None, :] <= last), score, float(\"-inf\"))", INDEX,
      "indexer prefill rows: the causal mask by the block's last row (a row sees the keys of later rows)"),
    M("A11", ATTN, "w = tl.load(w_ptr + (row0 + r // IH) * IH + r % IH, mask=pair_ok, other=0.0)",
      "w = tl.load(w_ptr + (row0 + r % IH) * IH + r // IH, mask=pair_ok, other=0.0)", INDEX,
      "indexer prefill rows: head weights read transposed (row and head swapped)"),
    M("A12", ATTN, "rank_eq = tl.sum(tl.where(q < p, n_eq, 0), 0) + tl.cumsum(eq.to(tl.int32), 0) - 1",
      "rank_eq = tl.sum(tl.where(q > p, n_eq, 0), 0) + tl.cumsum(eq.to(tl.int32), 0) - 1", SELECT,
      "wide select: ties at the K-th value ranked after the later programs' (not in key order)"),
    M("A13", ATTN, "tl.atomic_add(hist + ((_EMPTY_KEY >> SHIFT) & ((1 << BITS) - 1)), num_empty,",
      "tl.atomic_add(hist + ((_EMPTY_KEY >> SHIFT) & ((1 << BITS) - 1)), 1,", SELECT,
      "wide select: a program's -inf keys counted once, not num_empty times"),
    M("A14", ATTN, "        out[a:b, val.shape[1]:] = -1\n", "", INDEX,
      "indexer_topk: a slab of short contexts (fewer keys than K) leaves its last columns unwritten"),
    # ---- triton_norm.py: RMSNorm, rope, the cache-row store and its FP8 packing --------------------------------------
    M("N01", NRM, "rstd = 1.0 / tl.sqrt(tl.sum(xf * xf, axis=0) / D + eps)",
      "rstd = 1.0 / tl.sqrt(tl.sum(xf * xf, axis=0) / BLOCK_D + eps)", NORM,
      "rms_norm: mean over the padded block (BLOCK_D) instead of D"),
    M("N02", NRM, "tl.store(sum_ptr + row * D + cols, x, mask=mask)",
      "tl.store(sum_ptr + row * stride_x + cols, x, mask=mask)",
      NORM, "add_rms_norm: the residual sum stored with x's row stride (its output is contiguous)"),
    M("N03", NRM, "    y = w.to(tl.float32) * normed.to(tl.float32)\n", "    y = w.to(tl.float32) * (xf * rstd)\n",
      NORM,
      "rms_norm: the weight applied before the normalized value is rounded to x's dtype (HF rounds first)"),
    M("N04", NRM, "ac, bs, bc, as_ = (a * c).to(dt), (b * s).to(dt), (b * c).to(dt), (a * s).to(dt)",
      "ac, bs, bc, as_ = a * c, b * s, b * c, a * s", ROPE,
      "rope: products not rounded before the sum (one rounding where PyTorch's ops round twice)"),
    M("N05", NRM, "rstd = 1.0 / tl.sqrt(tl.sum(xc * xc, axis=0) / n_norm + eps)",
      "rstd = 1.0 / tl.sqrt(tl.sum(xf * xf, axis=0) / n_norm + eps)", STORE,
      "LayerNorm store: variance of the uncentred values"),
    M("N06", NRM, " + tl.load(b_ptr + cols, mask=m, other=0.0).to(tl.float32)).to(dt)", ").to(dt)", STORE,
      "LayerNorm store: the bias dropped"),
    M("N07", NRM, "y = (w * (x.to(tl.float32) * rstd).to(dt).to(tl.float32)).to(dt)",
      "y = (w * (x.to(tl.float32) * rstd)).to(dt)", STORE,
      "RMSNorm store: one rounding (the normalized value not rounded before the weight)"),
    M("N08", NRM, "y = tl.where(in_rope, tl.where(j < HALF, lo, hi), y)",
      "y = tl.where(in_rope, tl.where(j <= HALF, lo, hi), y)",
      STORE, "packed indexer key: the first rotated value of the second half taken from the first half"),
    M("N09", NRM, "e = tl.maximum((bits >> 23) - 135 + ((bits & 0x7FFFFF) > 0x600000).to(tl.int32), -126)",
      "e = tl.maximum((bits >> 23) - 135 + ((bits & 0x7FFFFF) >= 0x600000).to(tl.int32), -126)", STORE,
      "FP8 store: a group whose amax is exactly 1.75·2^k (fits 448) takes the next power of two"),
    M("N10", NRM, "normal = ((bits + 0x7FFFF + ((bits >> 20) & 1)) & -0x100000)",
      "normal = ((bits + 0x80000) & -0x100000)",
      STORE, "FP8 store: e4m3 ties rounded away from zero, not to even"),
    M("N11", NRM, "return tl.where(tl.abs(v) < 0.015625, tl.where(bits < 0, -small, small), normal)",
      "return tl.where(tl.abs(v) < 0.0078125, tl.where(bits < 0, -small, small), normal)", STORE,
      "FP8 store: values in [2^-7, 2^-6) rounded as normals (3 mantissa bits) though e4m3's are subnormal there"),
    # ---- triton_router.py --------------------------------------------------------------------------------------------
    M("R01", RTR, "top2 = tl.max(tl.where(eid == first[:, None], -float(\"inf\"), choice), 1)",
      "top2 = tl.max(tl.where(choice == top1[:, None], -float(\"inf\"), choice), 1)", ROUTER,
      "router: a group's top-2 sum drops every copy of a tied top value (top1 + third, not top1 + top1)"),
    M("R02", RTR, "pick = tl.min(tl.where(group_score == tl.max(group_score, 0), g, BLOCK_G), 0)",
      "pick = tl.max(tl.where(group_score == tl.max(group_score, 0), g, -1), 0)", ROUTER,
      "router: tied groups go to the highest group index"),
    M("R03", RTR, "real = (g[:, None] < n_group) & (tl.arange(0, BLOCK_S)[None, :] < group_size)",
      "real = tl.arange(0, BLOCK_S)[None, :] < group_size", ROUTER,
      "router: padded group lanes (n_group not a power of two) read past the row's logits as real experts",
      eq="padded groups exist only when grouped (n_group > 1), and there the group score of a padded group is forced "
         "to -inf (``tl.where(g < n_group, …)``), so it is never kept and its lanes' choices become -inf before the "
         "top-k; their ids (≥ n_group · group size = E) never equal a pick, so no weight reads them. The reads past "
         "the row stay (harmless loads). That guard is equivalent on its own too (without it a padded group's lanes, "
         "not real, choose -inf, and so does its top-2 sum): each covers the other"),
    M("R04", RTR, "choice = tl.where(real, score + tl.load(bias_ptr + eid, mask=real, other=0.0), -float(\"inf\"))",
      "choice = score + tl.load(bias_ptr + eid, mask=real, other=0.0)", ROUTER,
      "router: padded lanes (a group size not a power of two) choose with 0 instead of -inf"),
    M("R05", RTR, "w = tl.where(slot == t, tl.sum(tl.sum(tl.where(eid == pick, score, 0.0), 1), 0), w)",
      "w = tl.where(slot == t, tl.sum(tl.sum(tl.where(eid == pick, choice, 0.0), 1), 0), w)", ROUTER,
      "router: the correction bias kept in the weights (it is for selection only)"),
    # ---- triton_absorb.py --------------------------------------------------------------------------------------------
    M("B01", ABS, "s_col = s_ptr + (tl.program_id(2) * BLOCK_C) // 128", "s_col = s_ptr + tl.program_id(2)", ABSORB,
      "one-row absorb: scale column = column block index (right only for 128-wide column blocks)"),
    M("B02", ABS, "        acc += w.to(tl.float32) * qs[:, None]\n", "        acc = w.to(tl.float32) * qs[:, None]\n",
      ABSORB, "one-row absorb: a later D step's products replace the accumulator (heads of more than 64 dims)"),
    M("B03", ABS, "        qs = q * tl.load(s_col + (row // 128) * num_sb_c, mask=dm, other=0.0)",
      "        qs = q * tl.load(s_col + (row // 128), mask=dm, other=0.0)", ABSORB,
      "one-row absorb, D steps after the first: the scale row's stride dropped"),
    M("B04", ABS, "        xs = x * tl.load(s_row + c // 128)", "        xs = x * tl.load(s_row + c0 // 128)", ABSORB,
      "one-row expand, C steps after the first: one scale a step (its first block's)"),
    M("B05", ABS, "scale = tl.load(s_col + ((h * rows_per_head + d0) // 128) * num_sb_c)",
      "scale = tl.load(s_col + ((h * rows_per_head) // 128) * num_sb_c)", ABSORB,
      "rows absorb: every D step scaled by the head's first row block (heads of more than 64 dims straddle two)"),
    M("B06", ABS, "acc += tl.dot(w.to(ot.dtype), ot, input_precision=PREC) * tl.load(s_row + c0 // 128)",
      "acc += tl.dot(w.to(ot.dtype), ot, input_precision=PREC) * tl.load(s_row + c0 // BLOCK_C)", ABSORB,
      "rows expand: scale column = step index (right only for 128-wide steps)"),
    # ---- triton_w8a8.py ----------------------------------------------------------------------------------------------
    M("W01", W8, "e = tl.maximum(((bits >> 23) & 0xFF) - 127, -6)", "e = tl.maximum(((bits >> 23) & 0xFF) - 127, -7)",
      W8A8, "e4m3 rounding: the subnormal binade's ulp one binade too fine"),
    M("W02", W8, "rows_in_group = tl.minimum(num_m - first_m, GROUP_M)", "rows_in_group = GROUP_M", W8A8,
      "W8A8 GEMM: the last group of row tiles taken as full (tiles past M computed, real ones skipped)"),
    M("W03", W8, "sx = tl.load(qs_ptr + row * num_sb_h + hb, mask=live, other=0.0)",
      "sx = tl.load(qs_ptr + row * num_sb_h, mask=live, other=0.0)", W8A8,
      "W8A8 MoE gate/up: every H block takes the row's first activation scale"),
    M("W04", MOE, "sa = tl.load(as_ptr + slots * num_sb_i + ib)", "sa = tl.load(as_ptr + slots * num_sb_i)", W8A8,
      "W8A8 MoE down (the grouped down kernel's ACT_SCALED): every I block takes the slot's first activation scale"),
    M("W05", W8, "tl.store(s_ptr + rm * stride_sm + kb * stride_sk, s, mask=rm < M_out)",
      "tl.store(s_ptr + rm * stride_sm + kb, s, mask=rm < M_out)", W8A8,
      "act_quant: the scales' column stride taken as 1 (wrong for cuBLAS's column-major scales)"),
    M("W06", W8, "s = tl.maximum(tl.max(tl.abs(x), axis=1) * (1.0 / 448.0), 1e-12)",
      "s = tl.maximum(tl.max(tl.abs(x), axis=1) / 448.0, 1e-12)", W8A8,
      "act_quant: scale amax / 448 (a division) where the reference multiplies by fp32(1/448)"),
]


MUTANTS += [
    # ---- out of the interpreter's reach: what only a GPU run can show ------------------------------------------------
    M("G01", LIN, 'if tl.atomic_add(count_ptr + tile, 1, sem="acq_rel") == num_splits - 1:',
      'if tl.atomic_add(count_ptr + tile, 1, sem="relaxed") == num_splits - 1:', LINEAR + F32,
      "split-K epilogue: the arrival counter relaxed (the last split may read partials not yet visible)",
      gpu="a race between programs: the interpreter runs a launch's programs one after another, so every partial is "
          "stored before the last one sums them; on a GPU it shows only by chance (tests/gpu's bitwise decode tests, "
          "run to run)"),
    M("G02", UTL, 'return "ieee" if dtype == torch.float32 else "tf32"', 'return "tf32"', LINEAR + FUSED + ATT,
      "fp32 activations' dots in TF32 (10-bit mantissas) instead of IEEE fp32",
      gpu="the interpreter's tl.dot is exact whatever input_precision asks; tests/gpu/test_kernels_gpu.py::"
          "test_moe_fp8 (fp32 rows at 1e-4) would see it"),
    M("G03", LIN, "    pdl_wait(PDL)                              # from here on the activation (written by the kernel "
      "before)\n    acc = w.to(tl.float32) * (tl.load(x_ptr + kk, mask=km, other=0.0).to(tl.float32) * s)[None, :]",
      "    x0 = tl.load(x_ptr + kk, mask=km, other=0.0).to(tl.float32)\n    pdl_wait(PDL)\n"
      "    acc = w.to(tl.float32) * (x0 * s)[None, :]", LINEAR,
      "GEMV: the first activation load moved before the PDL wait (it may read the previous kernel's output early)",
      gpu="PDL is off in the interpreter (and off GPUs before Hopper); under PDL a race that tests/gpu's graph and "
          "engine tests see only by chance"),
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


def run_tests(work: Path, python: str, tests: list[str], timeout: int = 600) -> tuple[str, float, str]:
    cache = work / ".triton-cache"
    shutil.rmtree(cache, ignore_errors=True)               # nothing compiled survives from one mutant to the next
    env = {**os.environ, "PYTHONPATH": str(work), "RAY_AUTH_MODE": "disabled", "RAY_USAGE_STATS_ENABLED": "0",
           "PYTHONDONTWRITEBYTECODE": "1", "TRITON_CACHE_DIR": str(cache), "TRITON_INTERPRET": "1"}
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
    if p.returncode < 0:    # a signal (SIGSEGV, glibc's SIGABRT): the interpreter's unchecked stores went out of bounds
        current = next((ln.strip() for ln in tail if "tests/unit/test_" in ln and " in test_" in ln), last)
        return f"killed(crash {p.returncode})", time.time() - t0, current
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
    assert len({m["id"] for m in MUTANTS}) == len(MUTANTS)
    bad = [(m["id"], (repo / m["file"]).read_text().count(m["old"])) for m in chosen]
    bad = [b for b in bad if b[1] != 1]
    if bad:
        print(f"mutant text not found exactly once: {bad}")
        return 2
    if a.check:
        print(f"{len(chosen)} mutants, each matching once")
        return 0
    with tempfile.TemporaryDirectory(prefix="mut63-") as tmp:
        work = Path(tmp)
        copy_repo(repo, work)
        extra = [NEW_TESTS] if (work / NEW_TESTS).exists() and not a.no_new_tests else []
        every = sorted({t for m in chosen for t in m["tests"]}) + extra
        status, dt, last = run_tests(work, python, every, timeout=1800)
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
                  + (f"  [GPU only: {m['gpu']}]" if m["gpu"] else "")
                  + (f"  <- {last}" if status != "survived" else ""),
                  flush=True)
    counted = [(m, s) for m, s in rows if not m["eq"] and not m["gpu"]]
    live = [m["id"] for m, s in counted if not s.startswith("killed")]
    eq = [m["id"] for m, _ in rows if m["eq"]]
    gpu = [f"{m['id']} ({s})" for m, s in rows if m["gpu"]]
    killed = len(counted) - len(live)
    print(f"\n{len(rows)} mutants ({len(eq)} equivalent: {', '.join(eq) or '-'}; {len(gpu)} GPU-only: "
          f"{', '.join(gpu) or '-'}); {killed} of {len(counted)} counted killed; "
          f"surviving: {', '.join(live) or 'none'}")
    return 1 if live else 0


if __name__ == "__main__":
    sys.exit(main())
