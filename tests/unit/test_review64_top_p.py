"""Review of ``ops.top_p_race``'s Triton form (session 64): adversarial rows against the reference, in the interpreter.

Shapes stay small (the interpreter); vocabularies straddle the pass's 2048-token block. Where the reference's fp32
scan is not to be trusted (a top-p within rounding of 1) the nucleus is checked against the mass above in float64.
"""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton", reason="triton is not installed (it is in the 'gpu' extra)")   # (the kernels: `tk`)

from glmkernels import reference

INF = float("inf")
TINY = torch.finfo(torch.float32).tiny


def _order(x: torch.Tensor) -> torch.Tensor:
    return x.sort(dim=-1, descending=True, stable=True).indices


def probe(x: torch.Tensor) -> torch.Tensor:
    """Noise under which w / noise falls along the order (value, then the lower id): the last kept token wins, so the
    draw is the nucleus's boundary."""
    S, V = x.shape
    rank_from_end = torch.empty_like(_order(x)).scatter_(1, _order(x), torch.arange(V - 1, -1, -1).expand(S, -1))
    return torch.exp(x - x.amax(dim=-1, keepdim=True)).clamp(min=TINY) * (1 + 1e-4 * rank_from_end)


def exp_noise(x: torch.Tensor, g: torch.Generator) -> torch.Tensor:
    return torch.empty_like(x).exponential_(generator=g).clamp_(min=TINY)


def same(race, x, noise, top_p, min_p):
    got = race(x, noise, top_p, min_p)
    want = reference.top_p_race(x, noise, top_p, min_p)
    assert got.dtype == torch.int64 and got.shape == (x.shape[0],)
    assert ((got >= 0) & (got < x.shape[1])).all(), got
    assert torch.equal(got, want), (got, want)
    return got


@pytest.mark.parametrize("V", [1, 2, 100, 2047, 2048, 2049, 4097])
def test_vocab_sizes_around_the_pass_block(tk, V):
    """Vocabularies below, at and past the 2048-token block (the last chunk partly padded): the reference's draws and
    boundaries (probe noise), with top-p per row (one row inf: keep all) or shared, min-p per row or none, and ids
    always inside the vocabulary."""
    race = tk["sample"].top_p_race
    g = torch.Generator().manual_seed(64 + V)
    x = torch.randn(3, V, generator=g) * 3
    rows_p = torch.tensor([[0.3], [INF], [0.9]])
    rows_m = torch.tensor([[0.0], [0.1], [0.02]])
    for noise in (exp_noise(x, g), probe(x)):
        for top_p, min_p in ((rows_p, None), (0.7, None), (rows_p, rows_m), (0.05, 0.2)):
            same(race, x, noise, top_p, min_p)
    bf = (x * 2).bfloat16().float()                      # ties
    same(race, bf, probe(bf), rows_p, None)


@pytest.mark.parametrize("V", [100, 2049])
def test_negative_logits_with_a_padded_block(tk, V):
    """Every logit far below 0 (-130..-100) in a vocabulary that pads its last block: the padding must not raise the
    max (the weights are relative to the row's own max, whose weight is exactly 1 — min-p 1 keeps it alone), and the
    boundary is the reference's."""
    race = tk["sample"].top_p_race
    g = torch.Generator().manual_seed(7)
    x = -100 - 30 * torch.rand(2, V, generator=g)
    for top_p in (0.2, 0.6, 0.95):
        same(race, x, probe(x), top_p, None)
    same(race, x, exp_noise(x, g), torch.tensor([[0.5], [INF]]), torch.tensor([[0.3], [0.05]]))
    assert torch.equal(race(x, probe(x), INF, 1.0), x.argmax(dim=-1))
    assert torch.equal(race(x, probe(x), 0.9, 1.0), x.argmax(dim=-1))


def test_signed_zeros_are_one_value(tk):
    """+0.0 and -0.0 are one value (the reference's stable sort ranks them by id alone): a cut inside a tie of
    mixed-sign zeros keeps its lowest ids, whatever their sign."""
    race = tk["sample"].top_p_race
    g = torch.Generator().manual_seed(5)
    V = 2100
    x = torch.where(torch.rand(2, V, generator=g) < 0.5, 0.0, -0.0)
    x[:, 3] = 1.0
    x[1, 2048:] = -1.0                                   # row 1: the tie ends before the last chunk
    for top_p in (0.1, 0.35, 0.5, 0.8, 0.97):
        same(race, x, probe(x), top_p, None)


def test_masked_tokens(tk):
    """-inf logits (structured output's masks), at least one finite per row: a row with one finite token draws it
    for any top-p (inf included), the finite one in the last, padded chunk too; mostly masked rows match the
    reference."""
    race = tk["sample"].top_p_race
    g = torch.Generator().manual_seed(9)
    V = 4097
    x = torch.full((3, V), -INF)
    x[0, 0], x[1, V - 1], x[2, 2048] = -5.0, 3.0, 0.0
    for top_p in (1e-6, 0.5, INF, torch.tensor([[0.2], [INF], [0.99]])):
        for noise in (exp_noise(x, g), torch.ones(3, V)):
            assert race(x, noise, top_p, None).tolist() == [0, V - 1, 2048]
            assert race(x, noise, top_p, 0.5).tolist() == [0, V - 1, 2048]
    y = (torch.randn(3, V, generator=g) * 2).masked_fill(torch.rand(3, V, generator=g) < 0.9, -INF)
    for top_p in (0.3, INF, torch.tensor([[0.6], [INF], [0.9]])):
        same(race, y, probe(y), top_p, None)
        same(race, y, exp_noise(y, g), top_p, 0.01)


def test_weights_under_the_fixed_point(tk):
    """Tokens 29..40 below the max weigh under 2^-41 (0 in the kernel's fixed point) but not 0 in fp32: a top-p of
    inf keeps them all (the probe draws the lowest of them, as the reference), a top-p below 1 drops them."""
    race = tk["sample"].top_p_race
    g = torch.Generator().manual_seed(11)
    V = 2049
    x = -29.0 - 11.0 * torch.rand(2, V, generator=g)
    x[:, ::97] = torch.randn(2, len(range(0, V, 97)), generator=g)
    noise = probe(x)
    got = same(race, x, noise, INF, None)
    assert torch.equal(got, _order(x)[:, -1])           # the least likely token is kept
    for top_p in (0.5, 0.99):
        same(race, x, noise, top_p, None)


def test_equal_ratios_take_the_lowest_id(tk):
    """All logits equal and the noise all ones, over three chunks: every ratio ties, the lowest id wins (as the
    reference's stable order), for any top-p — including one that keeps a single token and one that keeps all."""
    race = tk["sample"].top_p_race
    V = 4097
    x = torch.zeros(2, V)
    x[1] = 0.5
    noise = torch.ones(2, V)
    for top_p in (1e-6, 0.5, 0.9, INF, torch.tensor([[0.01], [INF]])):
        assert race(x, noise, top_p, None).tolist() == [0, 0]
    noise[:, 100:] = 0.5                                 # the kept ties' best ratios: the lowest id among them
    assert race(x, noise, 0.5, None).tolist() == [100, 100]
    assert race(x, noise, 100 / V / 2, None).tolist() == [0, 0]     # (50 ties kept: none of 100..)


def test_extreme_rows(tk):
    """Peaked (one token holds all), flat (x 1e-3), steep (x 1000), large positive (+100) rows, top-p from 1e-6 up,
    the reference's draws with both noises; tiny top-p keeps the most likely token alone (its lowest id on a tie)."""
    race = tk["sample"].top_p_race
    g = torch.Generator().manual_seed(13)
    V = 2100
    base = torch.randn(3, V, generator=g)
    peaked = base.clone()
    peaked[:, 1000] = 60.0
    tied_top = (base * 3).bfloat16().float()
    tied_top[:, [5, 2050]] = tied_top.amax(dim=-1, keepdim=True) + 1
    for x in (peaked, base * 1e-3, base * 1000, base.abs() + 100, tied_top):
        for top_p in (1e-6, 0.3, torch.tensor([[0.8], [INF], [0.95]])):
            same(race, x, probe(x), top_p, None)
            same(race, x, exp_noise(x, g), top_p, torch.tensor([[0.0], [0.5], [1e-4]]))
    assert race(tied_top, probe(tied_top), 1e-6, None).tolist() == [5, 5, 5]


def test_top_p_near_one_is_the_exact_nucleus(tk):
    """A top-p of 0.999999 (fp32: 1 - 1.01e-6): the reference's fp32 scan may drop tail tokens whose mass above is
    within its rounding of the cut, so the kernel's boundary is checked against the float64 mass above the fp32
    weights instead (rows whose cut lies within 1e-8 of the total of a token are skipped: the fixed point's reach)."""
    race = tk["sample"].top_p_race
    g = torch.Generator().manual_seed(17)
    V = 4097
    x = torch.randn(3, V, generator=g) * 2
    p = float(torch.tensor(0.999999, dtype=torch.float32))
    got = race(x, probe(x), p, None)
    top, order = x.sort(dim=-1, descending=True, stable=True)
    w = torch.exp(top - top[:, :1]).double()
    total = w.sum(dim=-1, keepdim=True)
    gap = (w.cumsum(dim=-1) - w - p * total) / total    # < 0: kept
    checked = 0
    for r in range(3):
        k = int((gap[r] < 0).sum())
        if gap[r, k - 1].abs() > 1e-8 and (k == V or gap[r, k].abs() > 1e-8):
            assert got[r].item() == order[r, k - 1].item(), (r, k)
            checked += 1
    assert checked >= 2


def test_a_ratio_one_ulp_higher_beats_a_lower_id(tk):
    """The race packs the ratio's full 32 bits above the id: a ratio one ulp above another (1 + 2^-23 against 1) wins
    over every lower id, in another chunk too; only exactly equal ratios fall to the lower id."""
    race = tk["sample"].top_p_race
    V = 2100
    x = torch.zeros(2, V)
    noise = torch.ones(2, V)
    noise[0, V - 1] = float(torch.tensor(1.0).nextafter(torch.tensor(0.0)))      # 1 / (1 - 2^-24) → 1 + 2^-23
    noise[1, 1500] = noise[0, V - 1]
    assert (1 / noise[0, V - 1]).view(torch.int32).item() == torch.tensor(1.0).view(torch.int32).item() + 1
    for top_p in (0.9999, INF):
        assert race(x, noise, top_p, None).tolist() == [V - 1, 1500]
        assert reference.top_p_race(x, noise, top_p, None).tolist() == [V - 1, 1500]
    assert race(x, noise, 0.5, None).tolist() == [0, 0]              # (kept: ids below 1050 only)
