"""Triton kernels of the sampler: the top-k selection's keys in one launch (the reference's eight elementwise
launches: 14 µs of kernels at 1 row of GLM's vocabulary, 34 at 8, on an H100 — ``bench/results/session64/call_a``),
the penalties in one, and the top-k / top-p draw without a topk or sort (below)."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from glmkernels.registry import ops
from glmkernels.triton_utils import on_cuda

_BLOCK = 2048


@triton.jit
def _value_id_keys_kernel(x_ptr, out_ptr, V, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    col = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    live = col < V
    x = tl.load(x_ptr + row * V + col, mask=live, other=0.0)
    bits = tl.where(x == 0.0, 0.0, x).to(tl.int32, bitcast=True)       # -0 as +0
    bits = tl.where(bits < 0, bits ^ 0x7FFFFFFF, bits)                  # monotonic in the value
    key = bits.to(tl.int64) * 4294967296 + (V - 1 - col).to(tl.int64)   # ties: the lower id ranks higher
    tl.store(out_ptr + row * V + col, key, mask=live)


@ops.register("value_id_keys", backend="triton", available=on_cuda)
def value_id_keys(x: torch.Tensor) -> torch.Tensor:
    """As ``reference.value_id_keys`` (x: [S, V] fp32 → [S, V] int64), in one launch."""
    x = x.contiguous()
    S, V = x.shape
    out = torch.empty(S, V, dtype=torch.int64, device=x.device)
    if S and V:
        _value_id_keys_kernel[(S, triton.cdiv(V, _BLOCK))](x, out, V, BLOCK=_BLOCK)
    return out


@triton.jit
def _penalize_kernel(x_ptr, counts_ptr, values_ptr, out_ptr, V, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    col = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    live = col < V
    x = tl.load(x_ptr + row * V + col, mask=live)
    seen = tl.load(counts_ptr + row * 2 * V + col, mask=live, other=0)
    generated = tl.load(counts_ptr + (row * 2 + 1) * V + col, mask=live, other=0)
    rep, presence = tl.load(values_ptr + row * 3), tl.load(values_ptr + row * 3 + 1)
    frequency = tl.load(values_ptr + row * 3 + 2)
    out = tl.where(seen > 0, tl.where(x > 0, tl.math.div_rn(x, rep), x * rep), x)
    out = out - tl.where(generated > 0, presence + frequency * generated.to(tl.float32), 0.0)
    tl.store(out_ptr + row * V + col, out, mask=live)


@ops.register("penalize", backend="triton", available=on_cuda)
def penalize(logits: torch.Tensor, counts: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
    """As ``reference.penalize``, in one launch: its roundings (an IEEE division; no multiply-add fused, as torch's
    separate kernels round each op) bit for bit."""
    logits, counts, values = logits.contiguous(), counts.contiguous(), values.float().contiguous()
    B, V = logits.shape
    out = torch.empty_like(logits)
    if B and V:
        _penalize_kernel[(B, triton.cdiv(V, _BLOCK))](logits, counts, values, out, V, BLOCK=_BLOCK,
                                                      enable_fp_fusion=False)
    return out


# ---- top-k / top-p without a sort ----------------------------------------------------------------------------
# The kept tokens are every one at or above a boundary in the order (value, then the lower id): radix selects find it.
# Top-k's by count: the tokens are counted per bin of the value's 32-bit key, 12 + 12 + 8 bits — level 0 by its high 12
# bits, each next level by the next bits among the tokens of the boundary so far — and a scan per row (by 256 bins,
# then inside one) finds the bin where the count from the top reaches k; the boundary value's ties keep their lowest
# ids, as many as k leaves. Top-p's by mass, the same way: weights w = exp(x - max) in fixed point (2^-40: integer sums,
# the same in any order, so a row's draw repeats whatever the batch or the launch) summed per bin, the scan's target
# top_p of the whole — of the top-k's mass where a row has both (its boundary then at or above top-k's, which caps its
# ties kept). Then every token is kept or not, min-p applied, and the race argmax(w / noise) runs in the same pass (an
# atomic max of (w / noise, -id) packed in 64 bits: the lower id on a tie). Launches: the max, three histograms and
# scans a select, the ties' counts, the race — against the reference's sort or topk and ~25 elementwise launches.
_FIX = 1099511627776.0          # 2^40: the weights' fixed point
_LEVELS = ((20, 12), (8, 12), (0, 8))   # (shift, bits) of each level's bins in the 32-bit key
# per row: 0 max key, 1 mass (the top-k's where a row has one), 2-4 top-p's boundary so far / mass above it / ties
# kept, 5 the race, 6-8 top-k's boundary so far / count above it / ties kept
_STATE = 16
_PASS_BLOCK = 2048
_SET = 4096 + 4096 + 256        # a select's histograms (a copy): its levels' bins, 12 + 12 + 8 bits
_ROW_COPIES = 64                # copies of each histogram, the pass's programs taking them in turn (fewer adds wait on
                                # one address — a bf16 logit's ties): 8 a row up to 8 rows, fewer past them, 1 past 64


@triton.jit
def _key(x):
    """fp32 → int64 in [0, 2^32), ascending with the value (-0 as +0)."""
    b = tl.where(x == 0.0, 0.0, x).to(tl.int32, bitcast=True).to(tl.int64)
    return tl.where(b >= 0, b + 2147483648, -b - 1)


@triton.jit
def _value(k):
    """``_key``'s inverse."""
    b = tl.where(k >= 2147483648, k - 2147483648, -k - 1)
    return b.to(tl.int32).to(tl.float32, bitcast=True)


@triton.jit
def _fixed(x, m):
    return (tl.exp(x - m).to(tl.float64) * 1099511627776.0 + 0.5).to(tl.int64)


@triton.jit
def _max_kernel(x_ptr, state_ptr, V, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    col = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    x = tl.load(x_ptr + row * V + col, mask=col < V, other=-float("inf"))
    tl.atomic_max(state_ptr + row * 16, tl.max(_key(x), 0))


@triton.jit(do_not_specialize=["copies"])
def _hist_kernel(x_ptr, state_ptr, hist_ptr, V, copies, LEVEL: tl.constexpr, SHIFT: tl.constexpr, BITS: tl.constexpr,
                 COUNT: tl.constexpr, TOP_K: tl.constexpr, SLOT: tl.constexpr, SELECT: tl.constexpr,
                 SELECTS: tl.constexpr, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    col = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    s = state_ptr + row * 16
    x = tl.load(x_ptr + row * V + col, mask=col < V, other=-float("inf"))
    key = _key(x)
    if COUNT:                   # top-k's select: every token counts (one of weight 0 too, as the reference's topk)
        add = (col < V).to(tl.int64)
    else:
        add = _fixed(x, _value(tl.load(s)))
        if LEVEL == 0:          # the whole mass — or the top-k's above its boundary (the count scan put its ties')
            tl.atomic_add(s + 1, tl.sum(tl.where(key > tl.load(s + 6), add, 0) if TOP_K else add, 0))
    if LEVEL == 0:
        live = add > 0
    else:       # the tokens of the boundary so far (-1 after level 0: every token is kept, none is)
        live = (add > 0) & ((key >> (SHIFT + BITS)) == tl.load(s + SLOT))
    copy = tl.program_id(1) % copies
    bins = hist_ptr + ((row * SELECTS + SELECT) * copies + copy) * 8448 + LEVEL * 4096
    tl.atomic_add(bins + ((key >> SHIFT) & ((1 << BITS) - 1)), add, mask=live)


@triton.jit
def _crossing(masses, above, target, N: tl.constexpr):
    """The highest of N bins where the mass from the top, itself included (``above``: the mass over them), reaches
    ``target`` (-1: none), and the mass strictly above it."""
    i = tl.arange(0, N)
    incl = above + tl.sum(masses, 0) - tl.cumsum(masses, 0) + masses
    b = tl.max(tl.where(incl.to(tl.float64) >= target, i, -1), 0)
    return b, tl.sum(tl.where(i == b, incl - masses, 0), 0)


@triton.jit(do_not_specialize=["copies"])
def _scan_kernel(state_ptr, hist_ptr, p_ptr, p_val, copies, LEVEL: tl.constexpr, BITS: tl.constexpr,
                 PER_ROW: tl.constexpr, COUNT: tl.constexpr, SLOT: tl.constexpr, SELECT: tl.constexpr,
                 SELECTS: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    s = state_ptr + row * 16
    p = tl.load(p_ptr + row) if PER_ROW else p_val      # top-k (inf: none) or top-p (inf: none)
    if COUNT:
        target = p.to(tl.float64)
    else:       # (at least half a unit: a top-p that rounds to 0 in fp32 keeps the most likely token, as the reference)
        target = tl.maximum(p.to(tl.float64) * tl.load(s + 1).to(tl.float64), 0.5)
    prefix = tl.load(s + SLOT)                          # (0 before level 0's scan; -1 after it: every token kept)
    if prefix >= 0:
        base = hist_ptr + (row * SELECTS + SELECT) * copies * 8448 + LEVEL * 4096
        above = tl.load(s + SLOT + 1) if LEVEL > 0 else prefix * 0
        GROUPS: tl.constexpr = (1 << BITS) // 256
        i = tl.arange(0, 256)
        if GROUPS > 1:                                  # the sums by 256 bins, then the bins of one
            j = tl.arange(0, GROUPS)[:, None] * 256 + i[None, :]
            tile = tl.load(base + j)                                                       # [GROUPS, 256]
            for c in range(1, copies):
                tile += tl.load(base + c * 8448 + j)
            g, above = _crossing(tl.sum(tile, 1), above, target, GROUPS)
            f, above = _crossing(tl.sum(tl.where(j // 256 == g, tile, 0), 0), above, target, 256)
            b = tl.where(g >= 0, g * 256 + f, -1)
        else:
            bins = tl.load(base + i)
            for c in range(1, copies):
                bins += tl.load(base + c * 8448 + i)
            b, above = _crossing(bins, above, target, 256)
        if LEVEL == 0:
            tl.store(s + SLOT, b)                       # -1: none (inf), no crossing
        else:
            tl.store(s + SLOT, (prefix << BITS) + b)
        tl.store(s + SLOT + 1, above)
        if LEVEL == 2:              # the boundary value: its ties are kept in id order, as many as k leaves / while
            wq = _fixed(_value((prefix << BITS) + b), _value(tl.load(s)))           # the mass stays below top-p's
            if COUNT:
                kept = (target - above.to(tl.float64)).to(tl.int64)
                tl.store(s + 8, kept)
                tl.store(s + 1, kept * wq)              # (the top-k's mass: the top-p histogram's pass adds the rest)
            else:
                tl.store(s + 4, tl.math.ceil((target - above.to(tl.float64)) / wq.to(tl.float64)).to(tl.int64))


@triton.jit
def _boundary(s, TOP_K: tl.constexpr, TOP_P: tl.constexpr):
    """The kept tokens' boundary key (-1: every token kept) and how many of its ties are kept: top-p's (at or above
    top-k's), its ties capped by top-k's at the same value, or top-k's where a row has no top-p."""
    if TOP_P:
        b, n = tl.load(s + 2), tl.load(s + 4)
        if TOP_K:
            bk, nk = tl.load(s + 6), tl.load(s + 8)
            n = tl.where(b < 0, nk, tl.where(b == bk, tl.minimum(n, nk), n))
            b = tl.where(b < 0, bk, b)
    else:
        b, n = tl.load(s + 6), tl.load(s + 8)
    return b, n


@triton.jit
def _tie_count_kernel(x_ptr, state_ptr, count_ptr, V, CHUNKS, TOP_K: tl.constexpr, TOP_P: tl.constexpr,
                      BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    chunk = tl.program_id(1)
    col = chunk * BLOCK + tl.arange(0, BLOCK)
    x = tl.load(x_ptr + row * V + col, mask=col < V, other=-float("inf"))
    boundary, _ = _boundary(state_ptr + row * 16, TOP_K, TOP_P)
    tie = (col < V) & (_key(x) == boundary)
    tl.store(count_ptr + row * CHUNKS + chunk, tl.sum(tie.to(tl.int32), 0))


@triton.jit
def _race_kernel(x_ptr, noise_ptr, state_ptr, count_ptr, m_ptr, m_val, out_ptr, V, CHUNKS, TOP_K: tl.constexpr,
                 TOP_P: tl.constexpr, MIN_P: tl.constexpr, PER_ROW: tl.constexpr, WEIGHTS: tl.constexpr,
                 BLOCK: tl.constexpr, CHUNKS_P2: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    chunk = tl.program_id(1)
    s = state_ptr + row * 16
    col = chunk * BLOCK + tl.arange(0, BLOCK)
    live = col < V
    x = tl.load(x_ptr + row * V + col, mask=live, other=-float("inf"))
    key = _key(x)
    boundary, ties = _boundary(s, TOP_K, TOP_P)         # (-1: every token kept)
    w = tl.exp(x - _value(tl.load(s)))
    c = tl.arange(0, CHUNKS_P2)
    before = tl.sum(tl.load(count_ptr + row * CHUNKS + c, mask=c < chunk, other=0), 0)
    tie = live & (key == boundary)
    rank = before + tl.cumsum(tie.to(tl.int32), 0) - 1                  # among the boundary's ties, by id
    kept = live & ((key > boundary) | (tie & (rank < ties)))
    if MIN_P:
        kept = kept & (w >= (tl.load(m_ptr + row) if PER_ROW else m_val))
    if WEIGHTS:                 # the kept weights themselves (``kept_weights``), not the race
        tl.store(out_ptr + row * V + col, tl.where(kept, w, 0.0), mask=live)
    else:
        ratio = w / tl.load(noise_ptr + row * V + col, mask=live, other=1.0)
        packed = (ratio.to(tl.int32, bitcast=True).to(tl.int64) << 32) | (4294967295 - col.to(tl.int64))
        tl.atomic_max(s + 5, tl.max(tl.where(kept, packed, -1), 0))


def _per_row(v, S: int, device) -> tuple[torch.Tensor, float, bool]:
    if isinstance(v, torch.Tensor):
        return v.reshape(S).float().contiguous(), 0.0, True
    return torch.empty(1, device=device), float(v), False


def _race(scaled: torch.Tensor, noise: torch.Tensor | None, top_k, top_p, min_p) -> torch.Tensor:
    """The draw of ``top_k_race`` (top_k: one float for every row or [S], inf: none; None: no row has one) and
    ``top_p_race`` (top_p alike) — or, without noise, the kept weights [S, V] (``kept_weights``)."""
    scaled = scaled.contiguous()
    if scaled.shape[0] == 0:                            # (no rows: nothing to draw or weigh)
        return torch.empty_like(scaled) if noise is None else torch.empty(0, dtype=torch.int64, device=scaled.device)
    weights = torch.empty_like(scaled) if noise is None else None
    noise = scaled if noise is None else noise.contiguous()
    S, V = scaled.shape
    chunks = triton.cdiv(V, _PASS_BLOCK)
    top_k = float("inf") if top_k is None and top_p is None else top_k        # (neither: a select that keeps all)
    has_k, has_p = top_k is not None, top_p is not None
    selects, copies = has_k + has_p, max(1, min(8, _ROW_COPIES // max(S, 1)))
    state = torch.zeros(S, _STATE, dtype=torch.int64, device=scaled.device)
    hist = torch.zeros(S, selects, copies, _SET, dtype=torch.int64, device=scaled.device)
    counts = torch.empty(S, chunks, dtype=torch.int32, device=scaled.device)
    m_ptr, m_val, m_rows = _per_row(0.0 if min_p is None else min_p, S, scaled.device)
    grid = (S, chunks)
    _max_kernel[grid](scaled, state, V, BLOCK=_PASS_BLOCK)
    order = [(True, top_k, 6)] if has_k else []                     # (by count, its limit, its state slots)
    order += [(False, top_p, 2)] if has_p else []
    for select, (count, limit, slot) in enumerate(order):
        v_ptr, v_val, v_rows = _per_row(limit, S, scaled.device)
        for level, (shift, bits) in enumerate(_LEVELS):
            _hist_kernel[grid](scaled, state, hist, V, copies, LEVEL=level, SHIFT=shift, BITS=bits, COUNT=count,
                               TOP_K=has_k, SLOT=slot, SELECT=select, SELECTS=selects, BLOCK=_PASS_BLOCK)
            _scan_kernel[(S,)](state, hist, v_ptr, v_val, copies, LEVEL=level, BITS=bits, PER_ROW=v_rows,
                               COUNT=count, SLOT=slot, SELECT=select, SELECTS=selects, num_warps=8)
    _tie_count_kernel[grid](scaled, state, counts, V, chunks, TOP_K=has_k, TOP_P=has_p, BLOCK=_PASS_BLOCK)
    _race_kernel[grid](scaled, noise, state, counts, m_ptr, m_val, scaled if weights is None else weights, V, chunks,
                       TOP_K=has_k, TOP_P=has_p, MIN_P=min_p is not None, PER_ROW=m_rows, WEIGHTS=weights is not None,
                       BLOCK=_PASS_BLOCK, CHUNKS_P2=triton.next_power_of_2(chunks))
    return weights if weights is not None else 4294967295 - (state[:, 5] & 4294967295)


@ops.register("top_p_race", backend="triton", available=on_cuda)
def top_p_race(scaled: torch.Tensor, noise: torch.Tensor, top_p, min_p) -> torch.Tensor:
    """As ``reference.top_p_race``, without its sort (the mass sums in fixed point: the boundary may differ from the
    reference's fp32 scan where the mass above a token is within rounding of the cut)."""
    return _race(scaled, noise, None, top_p, min_p)


@ops.register("top_k_race", backend="triton", available=on_cuda)
def top_k_race(scaled: torch.Tensor, noise: torch.Tensor, top_k: list[int], top_p, min_p) -> torch.Tensor:
    """As ``reference.top_k_race``, without its topk or sort (a radix select by count; top-p's as ``top_p_race``)."""
    return _race(scaled, noise, _top_k(top_k, scaled), top_p, min_p)


@ops.register("kept_weights", backend="triton", available=on_cuda)
def kept_weights(scaled: torch.Tensor, top_k: list[int], top_p, min_p) -> torch.Tensor:
    """As ``reference.kept_weights``, without its topk or sort: the same tokens kept as ``top_k_race`` (the weights
    exp(x - max) by Triton's exp: within float32 rounding of the reference's)."""
    return _race(scaled, None, _top_k(top_k, scaled), top_p, min_p)


def _top_k(top_k: list[int], scaled: torch.Tensor) -> torch.Tensor | float | None:
    """Each row's top-k as the selects take it: one float for every row, or [S] on the device; inf: none (0 or ≥ V);
    None where no row has one."""
    V = scaled.shape[1]
    ks = [float(k) if 0 < k < V else float("inf") for k in top_k]
    if all(k == float("inf") for k in ks):
        return None
    if all(k == ks[0] for k in ks):
        return ks[0]
    rows = torch.tensor(ks, dtype=torch.float32)
    return rows.pin_memory().to(scaled.device, non_blocking=True) if scaled.is_cuda else rows.to(scaled.device)
