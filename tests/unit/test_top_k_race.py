"""``ops.top_k_race``'s Triton form (a radix select by count, then top-p's by mass) against the reference — the top-k
selection and sort the sampler took before — on the CPU through Triton's interpreter at small vocabularies that
straddle the pass's 2048-token block. GLM's vocabulary on the GPU: tests/gpu/test_sample_gpu.py."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton", reason="triton is not installed (it is in the 'gpu' extra)")   # (the kernels: `tk`)

from glmkernels import ops, reference
from scheduler.request import SamplingParams
from workers.sampler import _filtered_weights, fill_seeded_noise, sample

INF = float("inf")
V = 2500


def _noise(x: torch.Tensor, g: torch.Generator) -> torch.Tensor:
    return torch.empty_like(x).exponential_(generator=g).clamp_(min=torch.finfo(torch.float32).tiny)


def _order(x: torch.Tensor) -> torch.Tensor:
    return x.sort(dim=-1, descending=True, stable=True).indices


def _probe(x: torch.Tensor) -> torch.Tensor:
    """Noise under which w / noise falls along the order (value, then the lower id): the last kept token wins."""
    S, n = x.shape
    rank_from_end = torch.empty_like(_order(x)).scatter_(1, _order(x), torch.arange(n - 1, -1, -1).expand(S, -1))
    return torch.exp(x - x.amax(dim=-1, keepdim=True)) * (1 + 1e-4 * rank_from_end)


@pytest.mark.parametrize("top_k", [[50] * 4, [1, 7, 300, 0], [3000, 5, 5, V - 1], [V] * 4])
def test_draws_as_the_reference(tk, top_k):
    """bf16-valued logits (ties), a top-k for every row or one each (0 and ≥ V: none), with no top-p, one for every
    row or one each (inf: none), and min-p or none."""
    race = tk["sample"].top_k_race
    g = torch.Generator().manual_seed(sum(top_k))
    per_row_p = torch.tensor([[0.5], [0.9], [0.99], [INF]])
    for trial in range(3):
        x = (torch.randn(4, V, generator=g) * (1 + trial)).bfloat16().float() / 0.7
        noise = _noise(x, g)
        for top_p in (None, 0.9, per_row_p):
            for min_p in (None, 0.05):
                want = reference.top_k_race(x, noise, top_k, top_p, min_p)
                assert torch.equal(race(x, noise, top_k, top_p, min_p), want), (trial, top_p, min_p)


@pytest.mark.parametrize("bf16", [False, True])
def test_finds_the_boundary(tk, bf16):
    """Under noise that lets the last kept token win, the draw is the k-th token in the order (value, then id) — every
    bit of the boundary decided at each level — and with a top-p the reference's boundary inside the top-k."""
    race = tk["sample"].top_k_race
    g = torch.Generator().manual_seed(5)
    for trial in range(2):
        x = torch.randn(2, V, generator=g) * (1.5 + trial)
        x = x.bfloat16().float() if bf16 else x / 0.7
        noise, order = _probe(x), _order(x)
        for k in (1, 2, 37, 700, 2047, 2049):
            assert torch.equal(race(x, noise, [k, k], None, None), order[:, k - 1]), (trial, k)
            for top_p in (0.3, 0.9):
                want = reference.top_k_race(x, noise, [k, k], top_p, None)
                assert torch.equal(race(x, noise, [k, k], top_p, None), want), (trial, k, top_p)


def test_splits_a_tie_by_id_across_chunks(tk):
    """A top-k that cuts a tie of 40 tokens spread over the first chunk's end keeps the lowest ids; a top-p that cuts
    the same tie keeps as few as either allows; one that cuts above it keeps the top token alone."""
    race = tk["sample"].top_k_race
    x = torch.full((1, V), -30.0)
    x[0, 7] = 2.0                                           # weight 1; the ties weigh e^-1 each
    ties = list(range(2030, 2070))
    x[0, ties] = 1.0
    w_tie = float(torch.exp(torch.tensor(-1.0)))
    for k, top_p in ((11, None), (30, None), (30, 0.5), (11, 0.9), (20, 0.1)):
        kept_k = k - 1
        mass = 1 + kept_k * w_tie
        kept_p = kept_k if top_p is None else sum(1 + i * w_tie < top_p * mass for i in range(kept_k))
        for probe in (ties[kept_p - 1] if kept_p else 7, ties[kept_p]):
            noise = torch.ones(1, V)
            noise[0, probe] = 1e-6
            want = probe if probe in ties[:kept_p] else 7
            got = race(x, noise, [k], top_p, None).item()
            assert got == want == reference.top_k_race(x, noise, [k], top_p, None).item(), (k, top_p, probe)


@pytest.mark.parametrize("S", [12, 70])
def test_batches_past_eight_rows(tk, S):
    """Past 8 rows the histograms have fewer copies (one past 64): the draws stay the reference's, row by row."""
    race = tk["sample"].top_k_race
    g = torch.Generator().manual_seed(S)
    x = (torch.randn(S, V, generator=g) * 3).bfloat16().float()
    noise = _noise(x, g)
    top_k = [(7 * r) % 60 for r in range(S)]                              # (0: none)
    top_p = torch.rand(S, 1, generator=g) * 0.5 + 0.5
    assert torch.equal(race(x, noise, top_k, top_p, None), reference.top_k_race(x, noise, top_k, top_p, None))
    assert torch.equal(tk["sample"].top_p_race(x, noise, top_p, 0.01), reference.top_p_race(x, noise, top_p, 0.01))


def test_tokens_of_no_weight_count_toward_k(tk):
    """A top-k past the row's finite logits (a grammar's mask: -inf) keeps the finite ones and draws among them."""
    race = tk["sample"].top_k_race
    g = torch.Generator().manual_seed(2)
    x = torch.full((2, V), -INF)
    x[:, 100:110] = torch.randn(2, 10, generator=g)
    noise = _noise(x, g)
    for k in (5, 10, 50):
        got = race(x, noise, [k, k], None, None)
        assert torch.equal(got, reference.top_k_race(x, noise, [k, k], None, None)) and (got >= 100).all()
    assert race(x[:0], noise[:0], [], 0.9, None).shape == (0,)                   # no rows: none drawn
    assert tk["sample"].kept_weights(x[:0], [], 0.9, None).shape == (0, V)


def test_the_sampler_draws_as_before(tk, monkeypatch):
    """``sample`` with top-k rows (beside greedy, top-p-only and min-p rows) draws what the selection and race of
    ``_filtered_weights`` give — the path it took before the op — with the interpreted kernel as the op."""
    monkeypatch.setitem(ops._active, "top_k_race", tk["sample"].top_k_race)
    g = torch.Generator().manual_seed(9)
    params = [SamplingParams(temperature=0.8, top_k=40, seed=1), SamplingParams(temperature=0.0),
              SamplingParams(top_k=5, top_p=0.8, seed=2), SamplingParams(top_p=0.9, seed=3),
              SamplingParams(top_k=3000, min_p=0.1, seed=4)]
    logits = (torch.randn(5, V, generator=g) * 3).bfloat16().float()
    drawing = [0, 2, 3, 4]
    for step in range(3):
        got = sample(logits, params, None, [step] * 5).token_ids
        assert got[1] == logits[1].argmax().item()
        noise = torch.stack([fill_seeded_noise(torch.empty(V), params[i].seed, step) for i in drawing])
        weights, order = _filtered_weights(logits[drawing], [params[i] for i in drawing])
        pick = (weights / noise.clamp(min=torch.finfo(torch.float32).tiny).gather(1, order)).argmax(dim=-1)
        assert [got[i] for i in drawing] == order.gather(1, pick[:, None]).squeeze(1).tolist()


def test_kept_weights_are_the_references(tk):
    """The kept weights without a sort (speculative decoding's distributions): the same tokens kept as the reference's
    — top-k, top-p, both, per row, min-p — at weights within float32 rounding, in vocabulary order."""
    kept = tk["sample"].kept_weights
    g = torch.Generator().manual_seed(11)
    x = (torch.randn(4, V, generator=g) * 3).bfloat16().float() / 0.8
    per_row_p = torch.tensor([[0.5], [0.9], [INF], [0.99]])
    for top_k, top_p, min_p in (([0] * 4, 0.95, None), ([20] * 4, None, None), ([40, 0, 5, 2600], per_row_p, None),
                                ([0, 30, 0, 0], 0.9, 0.05), ([0] * 4, per_row_p, torch.tensor([[0.1]] * 4))):
        got, want = kept(x, top_k, top_p, min_p), reference.kept_weights(x, top_k, top_p, min_p)
        assert torch.equal(got > 0, want > 0), (top_k, top_p, min_p)
        torch.testing.assert_close(got, want, rtol=1e-6, atol=0)
