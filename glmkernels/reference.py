"""PyTorch reference implementations of every op the model uses: the numerics anchor.

Each function is registered under its op name; faster implementations (Triton) register beside it
and are tested against these. Shapes: N rows (tokens of the step, flattened over requests), H hidden,
nh heads, rkv latent rank, dr rope dims, T keys of one request, K selected keys, E experts.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import NamedTuple

import torch
import torch.nn.functional as F

from glmkernels.registry import ops

FP8_DTYPE = torch.float8_e4m3fn
FP8_MAX = 448.0
BLOCK = 128
# A prefill chunk's index scores are rows × keys: scored in slabs of rows whose scores fit this, so that a long
# context's chunk does not need (chunk × context) memory at once — 8.6 GB for 8192 rows at 262144 keys in fp32.
INDEXER_SCORE_BYTES = 512 << 20


# ---- norms -------------------------------------------------------------------------------------
@ops.register("rms_norm")
def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """``weight * normalize(x)``: the core in fp32, cast back to x's dtype before the weight (as HF)."""
    xf = x.float()
    return weight * (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype)


@ops.register("add_rms_norm")
def add_rms_norm(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor,
                 eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Residual add then RMSNorm: returns (rms_norm(x + residual), x + residual)."""
    s = x + residual
    return rms_norm(s, weight, eps), s


@ops.register("layer_norm")
def layer_norm(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, eps: float) -> torch.Tensor:
    return F.layer_norm(x, (x.shape[-1],), weight, bias, eps)


# ---- rotary embedding --------------------------------------------------------------------------
@ops.register("embed_rope")
def embed_rope(ids: torch.Tensor, table: torch.Tensor, positions: torch.Tensor, inv_freq: torch.Tensor
               ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """A step's start: the token embeddings ``table[ids]`` [N, H] and the rope angles' cos / sin [N, dr/2] of its
    ``positions`` (``positions · inv_freq`` in fp32, as HF's ``.float()`` product), in the table's dtype."""
    ang = positions[:, None] * inv_freq[None, :]
    return F.embedding(ids, table), ang.cos().to(table.dtype), ang.sin().to(table.dtype)


@ops.register("rope")
def rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, interleaved: bool) -> torch.Tensor:
    """Rotate the first d = 2·cos.shape[-1] dims of ``x``'s last dim by angles with ``cos``/``sin``
    broadcastable to [..., d/2]; dims past d pass through (the indexer's [rope | nope] heads).

    ``interleaved`` (GPT-J, GLM-5): pairs (x[2i], x[2i+1]); otherwise half-split (NeoX): (x[i], x[i+d/2]).
    Both return the rotated pairs de-interleaved as ``cat([a', b'])`` (HF's layout); q and k use the same
    layout, so dot products equal those of the in-place layout.
    """
    d = 2 * cos.shape[-1]
    r = x[..., :d]
    if interleaved:
        a, b = r[..., 0::2], r[..., 1::2]
    else:
        a, b = r.chunk(2, dim=-1)
    return torch.cat([a * cos - b * sin, b * cos + a * sin] + ([x[..., d:]] if d < x.shape[-1] else []), dim=-1)


class CacheRows(NamedTuple):
    """A further set of rows for ``norm_rope_store`` (its arguments but the step's angles and slots): rows x [N, D]
    normalized on [0, n_norm), roped on [rope_at, rope_at + dr) (``rope_at`` None: not roped), stored to
    ``cache[slots]`` — or, ``at_slots`` False, to ``cache[:N]`` (a plain normalized output, as q_a's RMSNorm)."""

    x: torch.Tensor
    weight: torch.Tensor
    bias: torch.Tensor | None
    eps: float
    n_norm: int
    rope_at: int | None
    interleaved: bool
    cache: torch.Tensor
    at_slots: bool = True


@ops.register("norm_rope_store")
def norm_rope_store(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, eps: float, n_norm: int,
                    cos: torch.Tensor, sin: torch.Tensor, rope_at: int, interleaved: bool, cache: torch.Tensor,
                    slots: torch.Tensor, also: tuple[CacheRows, ...] = ()) -> None:
    """Cache one key row per step row: ``cache[slots] = y``, y = x [N, D] with columns ``[0, n_norm)``
    normalized (RMSNorm; LayerNorm when ``bias`` is given) and then columns ``[rope_at, rope_at + dr)``
    rotated (cos/sin [N, dr/2]). MLA: (latent RMSNorm | rope key) = n_norm 512, rope_at 512 (a uint8 cache holds
    packed FP8 rows, ``kv_fp8_pack``: the latent is the first n_norm columns); the indexer:
    a LayerNorm'd key whose first dr columns are roped = n_norm 128, rope_at 0. ``also``: the same for further
    sets of rows with the same angles and slots (the indexer's keys, q_a's RMSNorm: one launch on the GPU)."""
    for r in (CacheRows(x, weight, bias, eps, n_norm, rope_at, interleaved, cache), *also):
        head = (rms_norm(r.x[:, :r.n_norm], r.weight, r.eps) if r.bias is None
                else layer_norm(r.x[:, :r.n_norm], r.weight, r.bias, r.eps))
        y = torch.cat([head, r.x[:, r.n_norm:]], dim=-1) if r.n_norm < r.x.shape[-1] else head
        if r.rope_at is not None:
            at, dr = r.rope_at, 2 * cos.shape[-1]
            y = torch.cat([y[:, :at], rope(y[:, at:at + dr], cos, sin, r.interleaved), y[:, at + dr:]], dim=-1)
        if r.at_slots:
            r.cache[slots] = kv_fp8_pack(y, r.n_norm) if r.cache.dtype == torch.uint8 else y.to(r.cache.dtype)
        else:
            r.cache[:y.shape[0]] = y.to(r.cache.dtype)


# ---- FP8 block-scaled weights ------------------------------------------------------------------
@ops.register("fp8_dequant")
def fp8_dequant(w8: torch.Tensor, scale_inv: torch.Tensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """``W[r, c] = float(W8[r, c]) * S[r // 128, c // 128]``, partial edge blocks included.

    w8: [..., R, C] float8_e4m3fn; scale_inv: [..., ceil(R/128), ceil(C/128)] fp32. The product is formed in
    fp32 (a single correctly rounded multiply), then cast to ``dtype``.
    """
    R, C = w8.shape[-2:]
    s = scale_inv.repeat_interleave(BLOCK, dim=-2)[..., :R, :].repeat_interleave(BLOCK, dim=-1)[..., :C]
    return (w8.float() * s.float()).to(dtype)


def fp8_quantize(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per 128×128 block: s = max|W|/448 (≥1e-12), W8 = clamp(W/s, ±448) in e4m3. Returns (W8, s)."""
    R, C = w.shape[-2:]
    rb, cb = -(-R // BLOCK), -(-C // BLOCK)
    wp = F.pad(w.float(), (0, cb * BLOCK - C, 0, rb * BLOCK - R))
    blocks = wp.unflatten(-1, (cb, BLOCK)).unflatten(-3, (rb, BLOCK))          # [..., rb, 128, cb, 128]
    s = blocks.abs().amax(dim=(-3, -1)).div(FP8_MAX).clamp(min=1e-12)          # [..., rb, cb]
    q = (blocks / s[..., :, None, :, None]).clamp(-FP8_MAX, FP8_MAX)
    w8 = q.flatten(-4, -3).flatten(-2, -1)[..., :R, :C].to(FP8_DTYPE)
    return w8.contiguous(), s.float().contiguous()


@ops.register("linear")
def linear(x: torch.Tensor, weight: torch.Tensor, scale_inv: torch.Tensor | None = None) -> torch.Tensor:
    """``x @ W.T``; an FP8 weight (with its block scales) is dequantized to x's dtype on the fly."""
    if scale_inv is not None:
        weight = fp8_dequant(weight, scale_inv, x.dtype)
    return F.linear(x, weight)


def act_quant(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Activations to FP8 per 128 columns of each row ("dynamic" activations of an FP8 checkpoint): s = max|x| ·
    fp32(1/448) (≥ 1e-12; a product, not a quotient: torch on CUDA divides by a scalar as a multiply by its
    reciprocal, so ``/ 448`` would differ by an ulp between devices), q = e4m3(x / s).
    x: [M, K] → (q [M, K] float8_e4m3fn, s [M, ⌈K/128⌉] fp32)."""
    M, K = x.shape
    kb = -(-K // BLOCK)
    blocks = F.pad(x.float(), (0, kb * BLOCK - K)).view(M, kb, BLOCK)
    s = blocks.abs().amax(dim=-1).mul(1.0 / FP8_MAX).clamp(min=1e-12)           # [M, kb]
    q = (blocks / s[..., None]).clamp(-FP8_MAX, FP8_MAX).to(FP8_DTYPE)
    return q.view(M, kb * BLOCK)[:, :K].contiguous(), s


def linear_w8a8(x: torch.Tensor, weight: torch.Tensor, scale_inv: torch.Tensor | None) -> torch.Tensor:
    """``linear`` of an FP8 weight with the activations quantized first (``act_quant``): the dequantized
    operands' product in fp32, rounded to x's dtype (the oracle of glmkernels/triton_w8a8.py); an unquantized
    weight (no scales) is a plain ``linear``."""
    if scale_inv is None:
        return linear(x, weight)
    K = x.shape[-1]
    q, s = act_quant(x.reshape(-1, K))
    xd = (q.float().view(q.shape[0], -1) * s.repeat_interleave(BLOCK, dim=-1)[:, :K])
    return F.linear(xd, fp8_dequant(weight, scale_inv)).to(x.dtype).view(*x.shape[:-1], -1)


@ops.register("linear_f32")
def linear_f32(x: torch.Tensor, weight: torch.Tensor, rounded: bool = False, scale: float = 1.0) -> torch.Tensor:
    """x @ weight.T in fp32 (both upcast: the router's logits), or, ``rounded``, as a linear in x's dtype whose
    result is then upcast (the indexer's head weights, as HF computes them); times ``scale``."""
    y = F.linear(x, weight.to(x.dtype)).float() if rounded else F.linear(x.float(), weight.float())
    return y * scale if scale != 1.0 else y


@ops.register("linear_group")
def linear_group(x: torch.Tensor, *weights: tuple) -> tuple[torch.Tensor, ...]:
    """Several projections of one input: ``linear(x, *w)`` for each w = (weight, scale_inv or None)."""
    return tuple(linear(x, *w) for w in weights)


# ---- FP8 KV cache rows (kv_cache_dtype fp8) ----------------------------------------------------------
KV_GROUP = 128          # latent values a KV row's scale covers (fewer where kv_lora_rank is smaller: the tiny model)


@functools.cache
def kv_fp8_layout(rkv: int, dr: int, dtype: torch.dtype, field: str = "kv_lora_rank") -> tuple[int, int, int]:
    """(group, rope key's byte offset, row bytes) of a packed FP8 KV row, FlashMLA's layout: the latent's ``rkv``
    values in e4m3 (bytes [0, rkv)), one fp32 power-of-two scale per ``group`` of them, the rope key's ``dr`` values
    in the activation dtype; the row padded to 16 bytes (656 at GLM-5's 512 + 64, bf16). An indexer key: rkv = its
    width (``field`` names the config field for the error), dr = 0 (144 bytes at 128). Cached: launches ask."""
    group = min(KV_GROUP, rkv)
    if rkv < 16 or rkv % group or group & (group - 1):
        raise ValueError(f"kv_cache_dtype fp8 needs a {field} that is a multiple of {KV_GROUP} or a power of two "
                         f"(≥ 16), got {rkv}")
    rope_at = rkv + 4 * (rkv // group)
    size = rope_at + dr * dtype.itemsize
    return group, rope_at, -(-size // 16) * 16


def kv_fp8_scale(amax: torch.Tensor) -> torch.Tensor:
    """The power-of-two scale 2^e of a group whose largest magnitude is ``amax`` (fp32): the least e with
    amax / 2^e ≤ 448, from amax's bits (448 = 1.75 · 2^8), so that no rounding enters it and scaling by it (or by
    1 / it) is exact — the Triton store takes the same integer steps."""
    bits = amax.float().view(torch.int32)
    e = ((bits >> 23) - 135 + ((bits & 0x7FFFFF) > 0x600000).int()).clamp(min=-126)
    return ((e + 127) << 23).int().view(torch.float32)


def kv_fp8_pack(y: torch.Tensor, rkv: int) -> torch.Tensor:
    """Rows y [N, rkv + dr] (latent | rope key, activation dtype) → packed FP8 rows [N, row bytes] uint8: each group
    of the latent scaled by 1 / its scale (exact) and rounded to e4m3 (to nearest even; |·| ≤ 448, no saturation).
    A group whose largest value is within an e4m3 step of the dtype's largest comes back as inf from its rounding up
    (fp16 from 63488, bf16 / fp32 from ~3.3e38: not a normalized latent's)."""
    N, dr = y.shape[0], y.shape[1] - rkv
    group, rope_at, size = kv_fp8_layout(rkv, dr, y.dtype)
    lat = y[:, :rkv].float().view(N, rkv // group, group)
    scale = kv_fp8_scale(lat.abs().amax(-1))                                           # [N, groups]
    out = torch.zeros(N, size, dtype=torch.uint8, device=y.device)
    out[:, :rkv] = (lat / scale[..., None]).to(FP8_DTYPE).view(N, rkv).view(torch.uint8)
    out[:, rkv:rope_at] = scale.view(torch.uint8)
    rope = y[:, rkv:].contiguous().view(torch.uint8)
    out[:, rope_at:rope_at + rope.shape[1]] = rope
    return out


def kv_fp8_unpack(rows: torch.Tensor, rkv: int, dr: int, dtype: torch.dtype) -> torch.Tensor:
    """Packed rows [..., row bytes] → [..., rkv + dr] in ``dtype``: the latent e4m3 · scale (exact in fp32, then
    cast), the rope key as stored."""
    group, rope_at, _ = kv_fp8_layout(rkv, dr, dtype)
    q = rows[..., :rkv].contiguous().view(FP8_DTYPE).float().unflatten(-1, (rkv // group, group))
    scale = rows[..., rkv:rope_at].contiguous().view(torch.float32)
    rope = rows[..., rope_at:rope_at + dr * dtype.itemsize].contiguous().view(dtype)
    return torch.cat([(q * scale[..., None]).flatten(-2).to(dtype), rope], dim=-1)


# ---- DSA lightning indexer ---------------------------------------------------------------------
@dataclass(eq=False)
class RaggedSlots:
    """A ragged step's keys as one list — the form the Triton indexer takes them in —, built once a step (by
    ``models.cache.build_batch``, in the step's one host → device copy) rather than at every layer: every request's
    slots of positions 0..T_i-1 in turn (``slots`` [S]), each row's offset into them and its request's T_i (``base``,
    ``length`` [N] int64, on the device; ``bases``, ``lengths`` the same on the host). ``derived``: what a kernel
    derives from them, kept for the step's other layers under the kernel's own key."""

    slots: torch.Tensor
    base: torch.Tensor
    length: torch.Tensor
    bases: list[int]
    lengths: list[int]
    derived: dict = field(default_factory=dict)


def ragged_slots(seq_rows: list[tuple[int, int]], seq_slots: list[torch.Tensor], device: torch.device
                 ) -> RaggedSlots:
    """``RaggedSlots`` of a step given as per-request slot lists (a Batch not from ``build_batch``)."""
    all_slots = torch.cat([s.to(torch.int64) for s in seq_slots])
    bases, lens = [], []
    off = 0
    for (r0, nr), s in zip(seq_rows, seq_slots):
        bases += [off] * nr
        lens += [s.numel()] * nr
        off += s.numel()
    # pinned host → device copy: asynchronous; rows padded to an even count (each row of meta 16-byte aligned, as
    # build_batch's: Triton compiles a kernel per pointer alignment)
    pad = [0] * (len(bases) % 2)
    meta = torch.tensor([bases + pad, lens + pad], dtype=torch.int64, pin_memory=device.type == "cuda").to(
        device, non_blocking=True)
    return RaggedSlots(all_slots, meta[0, :len(bases)], meta[1, :len(bases)], bases, lens)


def index_keys(k_cache: torch.Tensor, slots: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """The indexer's keys of ``slots`` [...] → [..., idd] (a uint8 cache: packed FP8 rows, unpacked into q's
    dtype; idd = q's last dim)."""
    rows = k_cache[slots]
    return kv_fp8_unpack(rows, q.shape[-1], 0, q.dtype) if rows.dtype == torch.uint8 else rows


@ops.register("indexer_topk")
def indexer_topk(q: torch.Tensor, head_weights: torch.Tensor, k_cache: torch.Tensor,
                 seq_rows: list[tuple[int, int]], seq_slots: list[torch.Tensor], positions: torch.Tensor,
                 topk: int, scale: float, ragged: RaggedSlots | None = None) -> torch.Tensor:
    """Select, per query row, the top-``topk`` causally visible keys of its request by index score.

    q: [N, ih, idd] (roped), head_weights: [N, ih] fp32, k_cache: [num_slots, idd];
    seq_rows[i] = (first row, row count) of request i; seq_slots[i]: [T_i] cache slot of each position
    0..T_i-1; positions: [N]. score[t] = Σ_h w_h · relu(q_h·k_t · scale). Returns slots [N, K] int64 with
    K = min(topk, max T_i), -1 where fewer keys are visible. When a request's T_i ≤ topk every visible key
    is selected (what top-k over the causally masked scores returns), so scoring is skipped. ``ragged``: the same
    keys as ``RaggedSlots`` (the Triton path's form; unused here).
    """
    N, ih = q.shape[:2]
    K = min(topk, max((int(s.numel()) for s in seq_slots), default=0))
    out = torch.full((N, K), -1, dtype=torch.long, device=q.device)
    for (r0, nr), slots in zip(seq_rows, seq_slots):
        T = slots.numel()
        key_pos = torch.arange(T, device=q.device)
        if T <= topk:
            visible = key_pos[None, :] <= positions[r0:r0 + nr, None]           # [S, T]
            out[r0:r0 + nr, :T] = torch.where(visible, slots[None, :], -1)
            continue
        keys = index_keys(k_cache, slots, q).float()                            # [T, idd]
        slab = max(1, INDEXER_SCORE_BYTES // (ih * T * 4))                     # rows whose [S, ih, T] fits
        for a in range(r0, r0 + nr, slab):
            b = min(a + slab, r0 + nr)
            s = torch.einsum("shd,td->sht", q[a:b].float(), keys) * scale
            score = torch.einsum("sh,sht->st", head_weights[a:b].float(), F.relu(s))
            score = score.masked_fill(key_pos[None, :] > positions[a:b, None], float("-inf"))
            val, idx = score.topk(K, dim=-1)                                    # [S, K]
            out[a:b] = torch.where(torch.isfinite(val), slots[idx], -1)
    return out


def paged_slots(block_table: torch.Tensor, block_size: int, width: int) -> torch.Tensor:
    """block_table: [N, MB] block ids of each row's request → slots [N, width] of positions 0..width-1."""
    t = torch.arange(width, device=block_table.device)
    return block_table.long()[:, t // block_size] * block_size + t % block_size


@ops.register("indexer_topk_paged")
def indexer_topk_paged(q: torch.Tensor, head_weights: torch.Tensor, k_cache: torch.Tensor,
                       block_table: torch.Tensor, block_size: int, positions: torch.Tensor, topk: int,
                       scale: float) -> torch.Tensor:
    """``indexer_topk`` with static shapes (for CUDA graphs): each row carries its request's block table.

    block_table: [N, MB] (int32/int64); the scored width is W = MB·block_size keys, key t visible iff
    t ≤ positions[n]. Returns slots [N, K], K = min(topk, W), -1 where fewer keys are visible. Always
    scores (no T ≤ topk shortcut), so the selected *sets* equal ``indexer_topk``'s; the order may differ.
    """
    W = block_table.shape[1] * block_size
    slots = paged_slots(block_table, block_size, W)                              # [N, W]
    visible = torch.arange(W, device=q.device)[None, :] <= positions[:, None]
    keys = index_keys(k_cache, slots, q).float()                                # [N, W, idd]
    s = torch.einsum("nhd,ntd->nht", q.float(), keys) * scale
    score = torch.einsum("nh,nht->nt", head_weights.float(), F.relu(s)).masked_fill(~visible, float("-inf"))
    val, idx = score.topk(min(topk, W), dim=-1, sorted=False)
    return torch.where(torch.isfinite(val), slots.gather(1, idx), -1)


# ---- MLA weight absorption: W_UK into the query, W_UV out of the latent output ---------------------
def _kv_b_heads(kv_b, dtype: torch.dtype, nh: int) -> torch.Tensor:
    return kv_b.dense_weight(dtype).view(nh, -1, kv_b.in_features)                   # [nh, dn + dv, rkv]


@ops.register("mla_absorb")
def mla_absorb(q_nope: torch.Tensor, kv_b) -> torch.Tensor:
    """q_nope [N, nh, dn] → q_lat [N, nh, rkv] = q_nope · W_UK (W_UK = the first dn rows of each head of
    ``kv_b``: the kv_b_proj Linear, weight [nh·(dn + dv), rkv], dequantized once and kept)."""
    nh, dn = q_nope.shape[1:]
    return torch.einsum("nhd,hdc->nhc", q_nope, _kv_b_heads(kv_b, q_nope.dtype, nh)[:, :dn])


@ops.register("mla_absorb_rope")
def mla_absorb_rope(q: torch.Tensor, kv_b, dn: int, cos: torch.Tensor, sin: torch.Tensor, interleaved: bool
                    ) -> tuple[torch.Tensor, torch.Tensor]:
    """q [N, nh, dn + dr] (MLA's [nope | rope] heads), cos/sin [N, dr/2] → (``mla_absorb`` of the nope dims,
    the rope dims roped: [N, nh, dr], ``rope``)."""
    N, half = q.shape[0], cos.shape[-1]
    return mla_absorb(q[..., :dn], kv_b), rope(q[..., dn:], cos.view(N, 1, half), sin.view(N, 1, half), interleaved)


@ops.register("mla_expand")
def mla_expand(o_lat: torch.Tensor, kv_b, dn: int) -> torch.Tensor:
    """o_lat [N, nh, rkv] → o [N, nh, dv] = o_lat · W_UVᵀ (W_UV = each head's rows after the first dn)."""
    return torch.einsum("nhc,hvc->nhv", o_lat, _kv_b_heads(kv_b, o_lat.dtype, o_lat.shape[1])[:, dn:])


# ---- MLA attention over the selected keys (absorbed, latent space) -------------------------------
@ops.register("mla_sparse_attention")
def mla_sparse_attention(q_lat: torch.Tensor, q_rope: torch.Tensor, kv_cache: torch.Tensor,
                         topk_slots: torch.Tensor, scale: float, row_chunk: int = 256, trim: bool = False
                         ) -> torch.Tensor:
    """Attention in the latent space over each row's selected cache slots.

    q_lat: [N, nh, rkv] (q_nope absorbed through W_UK), q_rope: [N, nh, dr], kv_cache: [num_slots, rkv+dr]
    (latent | rope key; or uint8 [num_slots, row bytes], packed FP8 rows: ``kv_fp8_unpack``), topk_slots: [N, K]
    (-1 = not selected). score = (q_lat·c + q_rope·k_rope)·scale, softmax in fp32 (probs rounded to the activation
    dtype, as HF), output o_lat = Σ p·c: [N, nh, rkv].
    ``trim``: some rows select fewer than K keys (their -1s last) — the Triton kernel's hint; unused here.
    """
    N, nh, rkv = q_lat.shape
    out = torch.empty_like(q_lat)
    q = torch.cat([q_lat, q_rope], dim=-1)      # one product, rounded once (as HF's score; the kernels add in fp32)
    for r in range(0, N, row_chunk):
        sl = slice(r, r + row_chunk)
        idx = topk_slots[sl]
        kv = kv_cache[idx.clamp(min=0)]                                         # [n, K, rkv+dr]
        if kv.dtype == torch.uint8:                                             # packed FP8 rows
            kv = kv_fp8_unpack(kv, rkv, q_rope.shape[-1], q_lat.dtype)
        lat = kv[..., :rkv]
        score = torch.einsum("nhd,nkd->nhk", q[sl], kv) * scale
        score = score.masked_fill((idx < 0)[:, None, :], float("-inf"))
        p = torch.softmax(score.float(), dim=-1).to(q_lat.dtype)
        out[sl] = torch.einsum("nhk,nkc->nhc", p, lat)
    return out


# ---- MoE routing and experts -------------------------------------------------------------------
@ops.register("router_topk")
def router_topk(logits: torch.Tensor, bias: torch.Tensor, top_k: int, n_group: int, topk_group: int,
                norm_topk_prob: bool, scaling: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Sigmoid + e_score_correction_bias, group-limited top-k (group score = sum of its top-2).

    logits: [N, E] fp32; bias: [E] fp32 (selection only). Returns (expert ids [N, k] int64,
    weights [N, k] fp32 = unbiased sigmoid scores, renormalised if asked, times ``scaling``).
    """
    N, E = logits.shape
    scores = logits.sigmoid()
    choice = scores + bias
    if n_group > 1:
        group = choice.view(N, n_group, E // n_group).topk(2, dim=-1)[0].sum(-1)   # [N, G]
        gidx = group.topk(topk_group, dim=-1, sorted=False)[1]
        gmask = torch.zeros_like(group).scatter_(1, gidx, 1.0).bool()
        choice = choice.masked_fill(~gmask.repeat_interleave(E // n_group, dim=1), float("-inf"))
    idx = choice.topk(top_k, dim=-1, sorted=False)[1]
    w = scores.gather(1, idx)
    if norm_topk_prob:
        w = w / (w.sum(-1, keepdim=True) + 1e-20)
    return idx, w * scaling


# ---- sampling ----------------------------------------------------------------------------------
@ops.register("value_id_keys")
def value_id_keys(x: torch.Tensor) -> torch.Tensor:
    """[S, V] fp32 → int64 keys in the order of (value, then the lower id) — distinct, so a ``topk`` of them picks and
    orders tied values as a stable descending sort does (the sampler's top-k): fp32 bits made monotonic (negatives'
    magnitude bits flipped; -0 as +0) in the high word, V - 1 - id in the low."""
    bits = (x + 0.0).view(torch.int32).to(torch.int64)
    bits = torch.where(bits < 0, bits ^ 0x7FFFFFFF, bits)
    ids = torch.arange(x.shape[1] - 1, -1, -1, device=x.device)
    return bits * (1 << 32) + ids


@ops.register("penalize")
def penalize(logits: torch.Tensor, counts: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
    """The sampler's repetition, presence and frequency penalties: logits [B, V] fp32, each row's token counts [B, 2, V]
    int32 (every id of its history, its generated ids) and values [B, 3] fp32 (repetition, presence, frequency) → a new
    [B, V]: logit / rep where logit > 0, else logit * rep, at the history's ids (HF / vLLM); then minus presence +
    frequency * count at the generated ids (OpenAI / vLLM). (A row's 1 / 0 / 0 leaves its logits as they are, bit for
    bit.)"""
    rep, presence, frequency = values[:, 0:1], values[:, 1:2], values[:, 2:3]  # [B, 1] each
    out = torch.where(counts[:, 0] > 0, torch.where(logits > 0, logits / rep, logits * rep), logits)
    generated = counts[:, 1]  # [B, V] int32
    return out - torch.where(generated > 0, presence + frequency * generated, 0.0)


@ops.register("top_p_race")
def top_p_race(scaled: torch.Tensor, noise: torch.Tensor, top_p: torch.Tensor | float,
               min_p: torch.Tensor | float | None) -> torch.Tensor:
    """Each row's draw from its nucleus (the sampler's top-p, no top-k): scaled logits [S, V] fp32 (temperature
    applied), noise [S, V] Exp(1), top_p and min_p [S, 1] or one for every row (a top-p of inf keeps every token; None:
    no min-p) → token ids [S] int64. The weights exp(x - max) in descending order (ties: the lower id first), kept while
    the mass above them is below top_p of the whole (``nucleus``) and at least min_p; the race argmax(w / noise)."""
    top, order = scaled.sort(dim=-1, descending=True, stable=True)  # [S, V]
    weights = nucleus(torch.exp(top - top[:, :1]), top_p)
    if min_p is not None:
        weights = weights.masked_fill(weights < min_p, 0.0)
    pick = (weights / noise.gather(1, order)).argmax(dim=-1, keepdim=True)  # [S, 1]
    return order.gather(1, pick).squeeze(1)


TOPK_SELECT = 4096  # rows that all keep at most this many tokens (top-k) select them instead of sorting


def top_k_weights(scaled: torch.Tensor, top_k: list[int],
                  keys: Callable[[torch.Tensor], torch.Tensor] = value_id_keys) -> tuple[torch.Tensor, torch.Tensor]:
    """The weights exp(x - max) of scaled logits [S, V] in descending order (ties: the lower id first) with each row's
    tokens past its top-k (0 or ≥ V: none) set to 0, and the token at each position: ([S, W], [S, W]). W = V — or, when
    every row keeps at most ``TOPK_SELECT``, the largest top-k: those are selected by ``keys`` (``value_id_keys``, or
    the op), not the vocabulary sorted. (Ties in id order whatever the batch: a cut inside a tie — bf16 logits tie
    often — keeps the same ids, the lowest; topk's own picks among tied values at its end would depend on the batch's
    largest top-k: session 61's review.)"""
    V = scaled.shape[1]
    kept = [k if 0 < k < V else V for k in top_k]
    if max(kept) <= TOPK_SELECT:
        order = keys(scaled).topk(max(kept), dim=-1).indices                                    # [S, W]
        top = scaled.gather(1, order)
    else:
        top, order = scaled.sort(dim=-1, descending=True, stable=True)                         # [S, V]
    weights = torch.exp(top - top[:, :1])
    if min(kept) < top.shape[1]:
        rank = torch.arange(top.shape[1], device=scaled.device)
        limit = torch.tensor(kept, device=scaled.device) if scaled.device.type != "cuda" else \
            torch.tensor(kept).pin_memory().to(scaled.device, non_blocking=True)
        weights = weights.masked_fill(rank >= limit[:, None], 0.0)
    return weights, order


@ops.register("top_k_race")
def top_k_race(scaled: torch.Tensor, noise: torch.Tensor, top_k: list[int], top_p: torch.Tensor | float | None,
               min_p: torch.Tensor | float | None) -> torch.Tensor:
    """As ``top_p_race`` with each row's top-k (``top_k_weights``) first — top-p then of the top-k's mass (None: no
    row has a top-p)."""
    weights, order = _kept_in_order(scaled, top_k, top_p, min_p)
    pick = (weights / noise.gather(1, order)).argmax(dim=-1, keepdim=True)  # [S, 1]
    return order.gather(1, pick).squeeze(1)


@ops.register("kept_weights")
def kept_weights(scaled: torch.Tensor, top_k: list[int], top_p: torch.Tensor | float | None,
                 min_p: torch.Tensor | float | None) -> torch.Tensor:
    """The distribution ``top_k_race`` draws from, up to a factor per row: the weights exp(x - max) [S, V] in vocabulary
    order, 0 where the row's top-k, top-p or min-p drops the token (speculative decoding's rejection sampling weighs
    drafts by it)."""
    weights, order = _kept_in_order(scaled, top_k, top_p, min_p)
    return torch.zeros_like(scaled).scatter_(1, order, weights)


def _kept_in_order(scaled, top_k, top_p, min_p) -> tuple[torch.Tensor, torch.Tensor]:
    weights, order = top_k_weights(scaled, top_k)
    if top_p is not None:
        weights = nucleus(weights, top_p)
    if min_p is not None:
        weights = weights.masked_fill(weights < min_p, 0.0)
    return weights, order


def nucleus(weights: torch.Tensor, top_p: torch.Tensor | float) -> torch.Tensor:
    """Weights [S, W] in descending order with each token dropped (0) whose mass above it reaches top_p of the row's:
    a token is kept while the kept mass strictly above it is below that."""
    above = cumsum_rows(weights) - weights
    return weights.masked_fill(above >= top_p * weights.sum(dim=-1, keepdim=True), 0.0)


SCAN_CHUNK = 256


def cumsum_rows(x: torch.Tensor) -> torch.Tensor:
    """x.cumsum(-1) of [S, W] in two levels — within chunks of 256, then over the chunks' sums: a long row's scan
    runs on one GPU block (205 µs for 8 rows of GLM's vocabulary, bench/sampler.py); the chunks are many rows."""
    S, W = x.shape
    chunks = -(-W // SCAN_CHUNK)
    inner = F.pad(x, (0, chunks * SCAN_CHUNK - W)).view(S, chunks, SCAN_CHUNK).cumsum(dim=-1)
    ends = inner[:, :, -1]  # [S, chunks]
    return (inner + (ends.cumsum(dim=-1) - ends)[:, :, None]).view(S, -1)[:, :W]


def swiglu(x: torch.Tensor, gate: torch.Tensor, up: torch.Tensor, down: torch.Tensor,
           gate_s: torch.Tensor | None, up_s: torch.Tensor | None, down_s: torch.Tensor | None,
           linear: Callable = linear) -> torch.Tensor:
    """The SwiGLU MLP ``down(silu(gate(x)) · up(x))`` (``MLP.forward``), with ``linear`` (default: this
    module's)."""
    return linear(F.silu(linear(x, gate, gate_s)) * linear(x, up, up_s), down, down_s)


@ops.register("moe_experts")
def moe_experts(x: torch.Tensor, topk_idx: torch.Tensor, topk_w: torch.Tensor,
                gate: torch.Tensor, up: torch.Tensor, down: torch.Tensor,
                gate_s: torch.Tensor | None, up_s: torch.Tensor | None, down_s: torch.Tensor | None,
                expert_offset: int = 0, shared: tuple | None = None, n_experts: int | None = None) -> torch.Tensor:
    """Routed experts held locally, for all rows: Σ_j w[n,j] · down(silu(gate(x)) · up(x)); with ``shared``
    = (gate, up, down, gate_s, up_s, down_s) of the shared expert, its output is added last (in x's dtype,
    as HF's ``experts(x) + shared_experts(x)``). ``n_experts`` (how many experts the ids range over) shapes the
    kernels' launches only; the math does not use it.

    x: [N, H]; topk_idx/topk_w: [N, k] global expert ids / weights; gate, up: [E_l, I_l, H];
    down: [E_l, H, I_l] (FP8 with [E_l, ⌈·/128⌉, ⌈·/128⌉] scales, or None). Local expert e holds global
    id ``expert_offset + e``; rows routed elsewhere contribute nothing here. Experts are visited in id
    order and each weighted output is cast to x's dtype before accumulation (HF's eager order).
    """
    out = torch.zeros_like(x)
    local = topk_idx - expert_offset
    num_local = gate.shape[0]
    hit = torch.unique(local[(local >= 0) & (local < num_local)])
    for e in hit.tolist():
        rows, slot = torch.where(local == e)
        h = x[rows]
        g = linear(h, gate[e], None if gate_s is None else gate_s[e])
        u = linear(h, up[e], None if up_s is None else up_s[e])
        y = linear(F.silu(g) * u, down[e], None if down_s is None else down_s[e])
        out.index_add_(0, rows, (y * topk_w[rows, slot, None]).to(x.dtype))
    return out if shared is None else out + swiglu(x, *shared)


def moe_experts_w8a8(x: torch.Tensor, topk_idx: torch.Tensor, topk_w: torch.Tensor, gate: torch.Tensor,
                     up: torch.Tensor, down: torch.Tensor, gate_s: torch.Tensor, up_s: torch.Tensor,
                     down_s: torch.Tensor, expert_offset: int = 0, shared: tuple | None = None) -> torch.Tensor:
    """``moe_experts`` with every FP8 linear as ``linear_w8a8`` (activations quantized per 128 columns; a row's
    groups do not depend on the other rows, so quantizing an expert's rows alone is quantizing all rows once)."""
    out = torch.zeros_like(x)
    local = topk_idx - expert_offset
    hit = torch.unique(local[(local >= 0) & (local < gate.shape[0])])
    for e in hit.tolist():
        rows, slot = torch.where(local == e)
        h = x[rows]
        act = F.silu(linear_w8a8(h, gate[e], gate_s[e])) * linear_w8a8(h, up[e], up_s[e])
        y = linear_w8a8(act, down[e], down_s[e])
        out.index_add_(0, rows, (y * topk_w[rows, slot, None]).to(x.dtype))
    return out if shared is None else out + swiglu(x, *shared, linear=linear_w8a8)
