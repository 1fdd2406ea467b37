"""Review of ``ops.top_k_race``'s Triton form (session 65): the radix select by count (top-k) before top-p's
by mass, adversarial rows against the reference and against the order itself, in the interpreter.

Shapes stay small (the interpreter); vocabularies straddle the pass's 2048-token block. Where a draw is
checked against the order rather than the reference, the noise is ``probe``'s (the last kept token wins), so
the draw is the kept set's boundary; its expected position comes from float64 masses of the fp32 weights
(``kept_prefix``), rows whose cut lies within 1e-6 of a token's mass above being left out (the reference's
fp32 cumsum, the kernel's fixed point: documented divergence 1).
"""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton", reason="triton is not installed (it is in the 'gpu' extra)")   # (the kernels: `tk`)

from glmkernels import reference

INF = float("inf")
TINY = torch.finfo(torch.float32).tiny


def _order(x: torch.Tensor) -> torch.Tensor:
    return (x + 0.0).sort(dim=-1, descending=True, stable=True).indices          # (-0 as +0, as the keys)


def probe(x: torch.Tensor) -> torch.Tensor:
    """Noise under which w / noise falls along the order (value, then the lower id): the last kept token of
    positive weight wins, so the draw is the kept set's boundary."""
    S, V = x.shape
    order = _order(x)
    rank_from_end = torch.empty_like(order).scatter_(1, order, torch.arange(V - 1, -1, -1).expand(S, -1))
    return torch.exp(x - x.amax(dim=-1, keepdim=True)).clamp(min=TINY) * (1 + 1e-4 * rank_from_end)


def exp_noise(x: torch.Tensor, g: torch.Generator) -> torch.Tensor:
    return torch.empty_like(x).exponential_(generator=g).clamp_(min=TINY)


def _row(v, r):
    return v if v is None or isinstance(v, float) else float(v[r, 0])


def kept_prefix(x: torch.Tensor, k: int, p: float | None, mp: float | None) -> int | None:
    """How many tokens of a row's order the spec keeps — the top-k, of those the nucleus (float64 masses of
    the fp32 weights: a token kept while the mass above it is below p of the top-k's), then min-p — or None
    where the top-p cut lies within 1e-6 of a token's mass above (the fp32 / fixed-point divergence)."""
    V = x.shape[0]
    w = torch.exp(x - x.max())[_order(x[None])[0]]
    n = k if 0 < k < V else V
    if p is not None and p != INF:
        top = w[:n].double()
        above = (top.cumsum(0) - top) / top.sum()
        gap = above - float(torch.tensor(p, dtype=torch.float32))
        if ((gap.abs() < 1e-6) & (above > 0)).any():
            return None
        n = max(1, int((gap < 0).sum()))
    if mp is not None:
        n = int((w[:n] >= mp).sum())
    return n


def boundary_draws(x, top_k, top_p, min_p) -> list[int | None]:
    """Under ``probe`` noise: each row's last kept token of positive weight (None: a row too close to
    call)."""
    out = []
    for r in range(x.shape[0]):
        n = kept_prefix(x[r], top_k[r], _row(top_p, r), _row(min_p, r))
        if n is None:
            out.append(None)
            continue
        order = _order(x[r][None])[0]
        while n > 1 and torch.exp(x[r, order[n - 1]] - x[r].max()) == 0:
            n -= 1
        out.append(int(order[n - 1]))
    return out


def check(race, x, noise, top_k, top_p, min_p, want=None):
    """The kernel's draws: ids in range, the reference's (or ``want``'s, None: any)."""
    got = race(x, noise, top_k, top_p, min_p)
    assert got.dtype == torch.int64 and got.shape == (x.shape[0],)
    assert ((got >= 0) & (got < x.shape[1])).all(), got
    want = reference.top_k_race(x, noise, top_k, top_p, min_p).tolist() if want is None else want
    assert all(w is None or g == w for g, w in zip(got.tolist(), want)), (got.tolist(), want)
    return got


@pytest.mark.parametrize("V", [700, 2049])
def test_k_at_the_edges(tk, V):
    """k = 1, 2, V - 1 (the cut between the two least likely tokens), V and 0 (none), past V: the k-th token
    of the order under probe noise, each row's k alone (the scalar path) and all in one call (the tensor
    path); bf16 ties."""
    race = tk["sample"].top_k_race
    g = torch.Generator().manual_seed(V)
    x = (torch.randn(2, V, generator=g) * 2).bfloat16().float()
    x[1, [3, V - 1]] = x[1].min() - 1                   # row 1: the last two tokens tie (ids 3, V - 1)
    noise = probe(x)
    ks = [1, 2, V - 1, V, 0, V + 5]
    order = _order(x)
    for k in ks:
        want = order[:, min(k if k > 0 else V, V) - 1].tolist()
        check(race, x, noise, [k, k], None, None, want)
    assert order[1, V - 2] == 3 and race(x, noise, [V - 1, V - 1], None, None)[1] == 3    # the lower id kept
    rows = x[[0, 1, 0, 1, 0, 1]]
    want = [int(_order(rows)[r, min(k if k > 0 else V, V) - 1]) for r, k in enumerate(ks)]
    check(race, rows, probe(rows), ks, None, None, want)
    check(race, rows, exp_noise(rows, g), ks, 0.8, 0.01)


def test_scalar_and_tensor_paths_agree(tk):
    """One k for every row (the scalar path) and the same k beside another row's (the tensor path); a top-p
    and a min-p shared or as equal [S, 1] tensors: the same draws, the reference's."""
    race = tk["sample"].top_k_race
    g = torch.Generator().manual_seed(3)
    x = (torch.randn(4, 2300, generator=g) * 3).bfloat16().float()
    noise = exp_noise(x, g)
    p, m = torch.full((4, 1), 0.7), torch.full((4, 1), 0.02)
    for k in (1, 40, 2100):
        shared = check(race, x, noise, [k] * 4, 0.7, 0.02)
        assert torch.equal(shared[:3], check(race, x, noise, [k] * 3 + [k + 1], p, m)[:3])
        assert torch.equal(shared, check(race, x, noise, [k] * 4, p, None if k == 1 else m))
    check(race, x, noise, [0, 2300, 0, 9999], 0.7, None)                    # 0 and ≥ V: none


def test_masked_logits_and_k_past_the_finite_count(tk):
    """-inf logits (a grammar's mask) count toward k as the reference's topk: k below, at and past the finite
    count (up to V - 1) keeps the finite tokens it reaches; a row whose one finite token lies in the last,
    padded chunk draws it for any k, top-p and min-p."""
    race = tk["sample"].top_k_race
    g = torch.Generator().manual_seed(11)
    V = 4100
    x = (torch.randn(3, V, generator=g) * 2).bfloat16().float()
    x = x.masked_fill(torch.rand(3, V, generator=g) < 0.97, -INF)
    x[2] = -INF
    x[2, V - 2] = -3.0
    f = int((x[0] > -INF).sum())
    noise = probe(x)
    for k in (1, f - 1, f, f + 1, V - 1):
        for top_p, min_p in ((None, None), (0.6, None), (torch.tensor([[INF], [0.3], [1e-6]]), 0.1)):
            want = boundary_draws(x, [k] * 3, top_p, min_p)
            assert want[2] == V - 2
            check(race, x, noise, [k] * 3, top_p, min_p, want)
            check(race, x, exp_noise(x, g), [k, 2, V - 1], top_p, min_p)


def test_ties_cut_by_both_across_chunks(tk):
    """All logits equal over three chunks: top-k keeps the lowest ids of the one tie, top-p then as few as its
    share of the top-k's mass (token j kept while j < p * k), top-p inf or past the tie the top-k's; the draw
    is the last kept id under noise falling with the id."""
    race = tk["sample"].top_k_race
    V = 4500
    x = torch.full((2, V), -1.25)
    noise = (1 + 1e-4 * torch.arange(V - 1, -1, -1, dtype=torch.float32)).expand(2, -1).contiguous()
    for k, top_p, last in ((3000, None, 2999), (3000, 0.5, 1499), (2049, 0.5, 1024), (2049, 0.999, 2046),
                           (4499, 1e-6, 0), (4499, INF, 4498), (2, 0.9, 1), (1, 0.5, 0)):
        assert race(x, noise, [k, k], top_p, None).tolist() == [last, last], (k, top_p)
    rows_p = torch.tensor([[0.5], [INF]])
    assert race(x, noise, [3000, 2100], rows_p, None).tolist() == [1499, 2099]


def test_the_top_k_mass_feeds_top_p(tk):
    """Top-p's share is of the top-k's mass, its boundary tie's kept tokens included and its dropped ones not:
    a top token of weight 1 and a tie of 100 at e^-1 across the first chunk's end, k = 11 keeping 10 of them —
    top-p 0.5 keeps 4 (1 + j e^-1 < 0.5 (1 + 10 e^-1)), 0.9 keeps 9, 0.99 all 10."""
    race = tk["sample"].top_k_race
    V = 2500
    x = torch.full((1, V), -30.0)
    x[0, 2200] = 1.0
    ties = list(range(2040, 2140))                        # (10 kept: 2040..2049, over two chunks)
    x[0, ties] = 0.0
    noise = probe(x)
    for top_p, kept in ((0.5, 4), (0.9, 9), (0.99, 10), (INF, 10), (0.2, 0)):
        want = ties[kept - 1] if kept else 2200
        assert boundary_draws(x, [11], top_p, None) == [want]
        assert race(x, noise, [11], top_p, None).item() == want, (top_p, kept)
        assert reference.top_k_race(x, noise, [11], top_p, None).item() == want


def test_tiny_top_p_and_min_p_one(tk):
    """A top-p of 1e-6, or one that rounds to 0 in fp32 (1e-50; as the reference), keeps the most likely token
    — the lowest id of a tie at the max spread over chunks; min-p 1 keeps the max's ties only, as many as k
    allows."""
    race = tk["sample"].top_k_race
    g = torch.Generator().manual_seed(17)
    V = 4097
    x = torch.randn(2, V, generator=g)
    top = [2047, 2048, 4096]
    x[:, top] = 5.0
    x[:, 100] = 4.0                                       # weight e^-1
    assert (x < 5).sum() == 2 * (V - 3)
    noise = torch.ones(2, V)
    noise[:, 4096] = 0.5                                  # the highest max tie wins wherever it is kept
    noise[:, 100] = 1e-3                                  # a lesser token that wins wherever it is kept
    for top_p in (1e-6, 1e-50, torch.tensor([[1e-50], [1e-6]])):
        for k in (1, 2, 3, 50):
            assert race(x, noise, [k, k], top_p, None).tolist() == [2047, 2047], (top_p, k)
            assert reference.top_k_race(x, noise, [k, k], top_p, None).tolist() == [2047, 2047]
    for k, want in ((1, 2047), (2, 2047), (3, 4096), (50, 4096), (0, 4096)):
        assert race(x, noise, [k, k], None, 1.0).tolist() == [want, want], k
        assert race(x, noise, [k, k], INF, torch.tensor([[1.0], [1.0]])).tolist() == [want, want], k
    assert race(x, noise, [50, 50], None, 0.5).tolist() == [4096, 4096]
    assert race(x, noise, [50, 50], None, None).tolist() == [100, 100]


def test_top_p_of_exactly_one_keeps_the_top_k(tk):
    """A top-p of exactly 1 keeps the whole top-k and nothing past it, though the mass passes float64's
    integers (8192 tokens of weight 1 = 2^53 in the 2^-40 fixed point: 1 · mass rounds up past the cut, so the
    ties' count is capped by top-k's — ``_boundary``'s minimum). (The reference's fp32 cumsum drops the tail
    token here.)"""
    race = tk["sample"].top_k_race
    V = 8232
    x = torch.zeros(1, V)
    x[0, 8192:] = -14.0                                   # each weighs 914275 units: 2^53 + it rounds up
    noise = torch.ones(1, V)
    noise[0, 8192], noise[0, 8193] = 1e-12, 1e-13
    for top_p in (1.0, torch.tensor([[1.0]]), INF, None):
        assert race(x, noise, [8193], top_p, None).item() == 8192, top_p


@pytest.mark.parametrize("scale", ["1e4", "1e-4", "+100", "-100", "subnormal"])
def test_extreme_scales(tk, scale):
    """Temperature-scaled extremes (x 1e4: the weights underflow past a few tokens; x 1e-4: all weigh ~1), far
    offsets, and subnormal logits mixed with ±0 (one value): the reference's draws and the order's k-th
    token."""
    race = tk["sample"].top_k_race
    g = torch.Generator().manual_seed(23)
    V = 2100
    base = torch.randn(3, V, generator=g)
    x = {"1e4": base * 1e4, "1e-4": base * 1e-4, "+100": base.bfloat16().float() + 100,
         "-100": base.bfloat16().float() - 100,
         "subnormal": torch.randint(-3, 4, (3, V), generator=g).float() * 1e-40}[scale]
    if scale == "subnormal":
        x = torch.where(torch.rand(3, V, generator=g) < 0.3, torch.tensor(-0.0), x)
        assert (x.abs() < TINY).all() and (x != 0).any()
    top_k = [1, 1000, V - 1]
    noise = probe(x)
    order = _order(x)
    if scale in ("1e-4", "subnormal", "+100", "-100"):   # every weight positive: the k-th token of the order
        check(race, x, noise, top_k, None, None, [int(order[r, k - 1]) for r, k in enumerate(top_k)])
    check(race, x, noise, top_k, None, None)
    for top_p, min_p in ((0.9, None), (torch.tensor([[0.3], [INF], [0.99]]), 0.5)):
        check(race, x, noise, top_k, top_p, min_p, boundary_draws(x, top_k, top_p, min_p))
        check(race, x, exp_noise(x, g), [5, 5, 5], top_p, min_p)


def test_histogram_copies_wrap_past_the_chunks(tk):
    """22 rows (2 histogram copies a row) of 3 chunks: the third chunk adds to copy 0 again; each row its own
    k (none for some) and top-p: the reference's draws and boundaries."""
    race = tk["sample"].top_k_race
    g = torch.Generator().manual_seed(22)
    S, V = 22, 4200
    x = (torch.randn(S, V, generator=g) * (1 + torch.arange(S)[:, None] % 4)).bfloat16().float()
    top_k = [[0, 1, 5, 600, 2050, 4100, V + 1][r % 7] for r in range(S)]
    top_p = torch.tensor([[[0.5, INF, 0.9][r % 3]] for r in range(S)])
    check(race, x, probe(x), top_k, top_p, None, boundary_draws(x, top_k, top_p, None))
    check(race, x, exp_noise(x, g), top_k, None, 0.02)


def test_rows_with_and_without_each_filter(tk):
    """One call with rows of neither, top-k only, top-p only (k none) and both, min-p on some: each row's
    boundary as if alone."""
    race = tk["sample"].top_k_race
    g = torch.Generator().manual_seed(31)
    V = 2600
    x = (torch.randn(5, V, generator=g) * 2).bfloat16().float()
    top_k = [0, 30, 0, 30, 2500]
    top_p = torch.tensor([[INF], [INF], [0.6], [0.6], [0.95]])
    min_p = torch.tensor([[0.0], [0.0], [0.0], [0.2], [0.001]])
    noise = probe(x)
    want = boundary_draws(x, top_k, top_p, min_p)
    got = check(race, x, noise, top_k, top_p, min_p, want)
    for r in range(5):
        alone = race(x[r:r + 1], noise[r:r + 1], [top_k[r]], float(top_p[r]), float(min_p[r]))
        assert alone.item() == got[r].item(), r


def test_equal_ratios_take_the_lowest_id(tk):
    """All logits equal and the noise all ones across three chunks: every ratio ties, the lowest kept id wins;
    a better ratio at id 2500 wins exactly while k keeps it (k = 2501: ids 0..2500), also under top-p inf."""
    race = tk["sample"].top_k_race
    V = 4500
    x = torch.zeros(2, V)
    noise = torch.ones(2, V)
    assert race(x, noise, [3000, 7], None, None).tolist() == [0, 0]
    noise[:, 2500] = 0.5
    for k, want in ((3000, 2500), (2501, 2500), (2500, 0), (1, 0)):
        assert race(x, noise, [k, k], None, None).tolist() == [want, want], k
        assert race(x, noise, [k, k], INF, None).tolist() == [want, want], k
        assert reference.top_k_race(x, noise, [k, k], None, None).tolist() == [want, want]
    assert race(x, noise, [2501, 2500], None, None).tolist() == [2500, 0]


def _divergence(x, noise, k, p, mp, got, want) -> bool:
    """A documented divergence: (2) equal w / noise (the lower id), or (1) the reference's fp32 cumsum keeping
    or dropping a token whose float64 mass above lies within 1e-6 of the top-p cut."""
    w = torch.exp(x - x.max())
    if w[got] / noise[got] == w[want] / noise[want]:
        return True
    return p is not None and kept_prefix(x, k, p, mp) is None


def test_fuzz_against_the_reference(tk):
    """Random rows (bf16 ties, masks, integer logits), k, top-p and min-p per row or shared, exp or probe
    noise: ids in range, and every draw the reference's but for the documented divergences."""
    race = tk["sample"].top_k_race
    g = torch.Generator().manual_seed(65)
    checked = diverged = 0
    for case in range(24):
        S, V = [(3, 2049), (2, 700), (4, 2500), (1, 4097)][case % 4]
        x = torch.randn(S, V, generator=g) * (1 + case % 5)
        x = torch.round(x) if case % 6 == 5 else x.bfloat16().float()
        if case % 3 == 0:
            x = x.masked_fill(torch.rand(S, V, generator=g) < 0.8, -INF)
            x[:, case] = 1.0
        ks = [[1, 2, 17, V - 1, 0, V, 300, 2048][int(i)] for i in torch.randint(8, (S,), generator=g)]
        ks = ks if case % 2 else [ks[0]] * S
        top_p = [None, 0.9, torch.tensor([[0.5], [INF], [0.999], [0.2]])[:S]][case % 3 if case % 4 else 1]
        min_p = [None, 0.05, torch.rand(S, 1, generator=g) * 0.3][case % 5 % 3]
        noise = probe(x) if case % 4 == 1 else exp_noise(x, g)
        got = race(x, noise, ks, top_p, min_p)
        want = reference.top_k_race(x, noise, ks, top_p, min_p)
        assert ((got >= 0) & (got < V)).all(), (case, got)
        for r in range(S):
            checked += 1
            if got[r] != want[r]:
                diverged += 1
                assert _divergence(x[r], noise[r], ks[r], _row(top_p, r), _row(min_p, r), int(got[r]),
                                   int(want[r])), (case, r, int(got[r]), int(want[r]))
    assert checked >= 50 and diverged <= checked // 10
