"""Sampler: greedy, temperature, filters, penalties, seeding and logprobs on small hand-made logits."""

from __future__ import annotations

import math

import pytest
import torch

from scheduler.request import SamplingParams
from workers.sampler import (
    TokenCounts,
    apply_penalties,
    history_counts,
    probs_for_rows,
    row_logprobs,
    sample,
    sample_on_device,
    with_drafts,
)

V = 8


def _counts(logits, histories, num_prompt):
    """The rows' token counts from host histories (None: no history given)."""
    return None if histories is None else history_counts(histories, num_prompt, logits.shape[1], logits.device)


def _sample(logits, params, histories=None, num_prompt=None, num_generated=None):
    rows = logits.shape[0]
    num_generated = num_generated if num_generated is not None else [0] * rows
    return sample(logits, params, _counts(logits, histories, num_prompt), num_generated)


def _draw_many(logits_row, params, num_draws):
    """Draw num_draws tokens for one row in a single batch of identical rows; returns counts [V]."""
    logits = logits_row.expand(num_draws, -1).contiguous()  # [N, V]
    out = _sample(logits, [params] * num_draws)
    return torch.bincount(torch.tensor(out.token_ids), minlength=logits.shape[1])


def test_greedy_is_argmax_and_ties_take_lowest_id():
    torch.manual_seed(0)
    logits = torch.randn(5, V)
    logits[4] = torch.tensor([0.0, 3.0, 1.0, 3.0, 3.0, -1.0, 0.0, 2.0])
    out = _sample(logits, [SamplingParams(temperature=0.0)] * 5)
    assert out.token_ids[:4] == logits[:4].argmax(-1).tolist()
    assert out.token_ids[4] == 1
    assert out.logprobs == [None] * 5 and out.top_logprobs == [None] * 5


def test_top_k_one_is_greedy_even_with_temperature():
    logits = torch.tensor([[0.0, 1.0, 5.0, 4.9, 0.0, 0.0, 0.0, 0.0]])
    for seed in range(10):
        assert _sample(logits, [SamplingParams(temperature=2.0, top_k=1, seed=seed)]).token_ids == [2]


def test_tiny_temperature_is_greedy():
    """A temperature that is 0 or denormal in float32 would divide the logits to inf and draw from NaNs (token 0)."""
    logits = torch.tensor([[0.0, 1.0, 5.0, 4.9, 0.0, 0.0, 0.0, 0.0]])
    for temperature in (1e-45, 1e-50, 1e-6):
        params = SamplingParams(temperature=temperature, seed=0)
        assert params.is_greedy and _sample(logits, [params]).token_ids == [2]


def test_temperature_frequencies_match_softmax():
    torch.manual_seed(1234)
    logits_row = torch.tensor([1.0, 0.5, 0.0, -0.5, 2.0, -1.0, 0.2, 1.5])
    num_draws = 20_000
    for temperature in (0.7, 1.5):
        counts = _draw_many(logits_row, SamplingParams(temperature=temperature), num_draws).double()
        expected = torch.softmax(logits_row.double() / temperature, -1) * num_draws
        chi2 = float(((counts - expected) ** 2 / expected).sum())
        assert chi2 < 30.0, chi2  # 7 dof: P(chi2 > 30) ~ 1e-4


def test_filters_never_emit_filtered_tokens():
    torch.manual_seed(7)
    logits_row = torch.tensor([3.0, 2.5, 2.0, 1.0, 0.0, -1.0, -2.0, 2.9])
    probs = torch.softmax(logits_row, -1)
    order = probs.argsort(descending=True).tolist()  # [0, 7, 1, 2, 3, 4, 5, 6]
    cases = {
        "top_k": (SamplingParams(top_k=3), set(order[:3])),
        # mass above token 2 (rank 3) is p0 + p7 + p1 ~ 0.81 < 0.85, so it stays; token 3 goes
        "top_p": (SamplingParams(top_p=0.85), set(order[:4])),
        "min_p": (SamplingParams(min_p=0.3), {t for t in range(V) if probs[t] >= 0.3 * probs.max()}),
        "all": (SamplingParams(top_k=3, top_p=0.5, min_p=0.1), set(order[:2])),
    }
    for name, (params, allowed) in cases.items():
        counts = _draw_many(logits_row, params, 4000)
        emitted = set(torch.nonzero(counts).flatten().tolist())
        assert emitted == allowed, name  # every allowed token shows up, nothing else
    assert 0.8 < float(probs[order[:3]].sum()) < 0.85 < float(probs[order[:4]].sum())


def test_top_p_applies_after_top_k_renormalisation():
    logits = torch.tensor([[2.0, 1.0, 0.0, -5.0, -5.0, -5.0, -5.0, -5.0]])
    probs = probs_for_rows(logits, [SamplingParams(top_k=2, top_p=0.7)])
    # after top-k the two tokens hold ~0.73 / 0.27, so top_p 0.7 keeps only token 0
    assert torch.equal(probs, torch.tensor([[1.0] + [0.0] * (V - 1)]))


def test_probs_for_rows_matches_filters_and_greedy_is_one_hot():
    logits = torch.tensor([[1.0, 2.0, 3.0, 0.0, 0.0, 0.0, 0.0, 0.0]] * 3)
    params = [SamplingParams(temperature=0.0), SamplingParams(temperature=0.5, top_k=2), SamplingParams()]
    probs = probs_for_rows(logits, params)
    assert torch.equal(probs[0], torch.eye(V)[2])
    expected = torch.softmax(torch.tensor([2.0, 3.0]) / 0.5, -1)
    assert torch.allclose(probs[1, 1:3], expected) and probs[1].sum().item() == pytest.approx(1.0)
    assert probs[1, [0, 3, 4, 5, 6, 7]].eq(0).all()
    assert torch.allclose(probs[2], torch.softmax(logits[2], -1))


def _sorted_filter_reference(logits: torch.Tensor, p: SamplingParams) -> torch.Tensor:
    """One row's filtered distribution the plain way: the whole row sorted, softmax, top-k, softmax again, top-p on
    the cumulative mass, min-p against the top token, softmax of what is kept."""
    vals, idx = (logits / p.temperature).sort(descending=True)
    if p.top_k:
        vals[p.top_k:] = float("-inf")
    probs = torch.softmax(vals, -1)
    drop = (probs.cumsum(-1) - probs >= p.top_p) if p.top_p < 1.0 else torch.zeros_like(probs, dtype=torch.bool)
    drop |= probs < p.min_p * probs[0]
    return torch.zeros_like(probs).scatter_(0, idx, torch.softmax(vals.masked_fill(drop, float("-inf")), -1))


@pytest.mark.parametrize("vocab", [50, 300, 5000])
def test_filtered_distribution_equals_the_sorted_reference(vocab):
    """Every combination of filters, at a vocabulary the selected top-k covers (50, 300: under ``TOPK_SELECT``)
    and one it does not (5000 with top-k off or 4500: the row sorted; the two-level cumsum over 20 chunks): the
    kept set is the reference's exactly, the probabilities within 1e-6 — also when a batch's rows all have a small
    top-k (selected) or none has top-k or top-p (vocabulary order)."""
    torch.manual_seed(vocab)
    cases = [SamplingParams(temperature=t, top_k=k, top_p=tp, min_p=mp) for t in (0.6, 1.3) for k in (0, 7, 4500)
             for tp in (1.0, 0.9, 0.3) for mp in (0.0, 0.02)]
    logits = torch.randn(len(cases), vocab) * 3
    got = probs_for_rows(logits, cases)
    for row, p in enumerate(cases):
        want = _sorted_filter_reference(logits[row], p)
        assert torch.equal(got[row] > 0, want > 0), p
        assert torch.allclose(got[row], want, atol=1e-6, rtol=1e-5), p
    sevens = [row for row, p in enumerate(cases) if p.top_k == 7]   # a batch of top-k 7 alone: selected, not sorted
    alone = probs_for_rows(logits[sevens], [cases[r] for r in sevens])
    assert torch.equal(alone > 0, got[sevens] > 0) and torch.allclose(alone, got[sevens], atol=1e-7)
    plain = [row for row, p in enumerate(cases) if p.top_k == 0 and p.top_p == 1.0]   # min-p or nothing: no order
    alone = probs_for_rows(logits[plain], [cases[r] for r in plain])
    assert torch.equal(alone > 0, got[plain] > 0) and torch.allclose(alone, got[plain], atol=1e-7)


def test_penalties_hand_computed():
    logits = torch.tensor([[2.0, -1.0, 0.5, 1.0, -2.0, 0.0, 3.0, 1.0]])
    params = SamplingParams(repetition_penalty=2.0, presence_penalty=0.5, frequency_penalty=0.25)
    history = [0, 1, 2, 2, 1, 3]  # prompt [0, 1, 2]; generated [2, 1, 3]
    out = apply_penalties(logits, [params], _counts(logits, [history], [3]))
    expected = [
        2.0 / 2,  # prompt only: repetition only
        -1.0 * 2 - 0.5 - 0.25,  # negative logit multiplied; generated once
        0.5 / 2 - 0.5 - 0.25,  # prompt + generated once (frequency counts generated only)
        1.0 / 2 - 0.5 - 0.25,  # generated once
        -2.0,
        0.0,
        3.0,
        1.0,
    ]
    assert torch.allclose(out, torch.tensor([expected]))
    # frequency scales with the generated count
    out = apply_penalties(logits, [SamplingParams(frequency_penalty=1.0)], _counts(logits, [[3, 3, 3]], [0]))
    assert out[0, 3].item() == pytest.approx(1.0 - 3.0)
    assert logits[0, 0].item() == 2.0  # input untouched


def test_logit_bias_adds_after_the_penalties_per_row_and_keeps_masked_ids_out():
    logits = torch.tensor([[2.0, -1.0, 0.5, 1.0, -2.0, 0.0, 3.0, 1.0],
                           [0.0, 0.0, 0.0, float("-inf"), 0.0, 0.0, 0.0, 0.0]])
    params = [SamplingParams(temperature=0.0, presence_penalty=0.5, logit_bias={6: -100, 4: 2.5}),
              SamplingParams(temperature=0.0, logit_bias={3: 100, 1: 1.0})]
    out = apply_penalties(logits, params, _counts(logits, [[2, 4], []], [0, 0]))
    expected = logits.clone()
    expected[0, [2, 4]] -= 0.5                          # the penalty first ...
    expected[0, 6] += -100
    expected[0, 4] += 2.5                               # ... then the bias, on its own row only
    expected[1, 1] += 1.0                               # a masked (-inf) id stays out whatever its bias
    assert torch.equal(out, expected) and out[1, 3].item() == float("-inf")
    assert logits[0, 6].item() == 3.0                   # the input untouched
    assert _sample(logits, params, [[2, 4], []], [0, 0]).token_ids == [0, 1]    # 6 banned; 3 masked, not forced
    assert probs_for_rows(logits[:1], [SamplingParams(logit_bias={5: 100})])[0, 5].item() == 1.0 and \
        apply_penalties(logits, [SamplingParams()] * 2, None) is logits


def test_min_tokens_bans_the_stop_ids_until_that_many_are_out():
    """A row sampling token i < min_tokens may not sample its ``min_tokens_ban`` ids (logprobs stay the raw
    logits'); from token min_tokens on it may; a row whose other tokens are all masked keeps them."""
    logits = torch.tensor([[1.0, 5.0, 4.0, 0.0], [1.0, 5.0, 4.0, 0.0], [float("-inf"), 5.0, float("-inf"), 0.0]])
    p = SamplingParams(temperature=0.0, min_tokens=3, min_tokens_ban=(1, 3), logprobs=0)
    out = sample(logits, [p] * 3, None, [2, 3, 0])
    assert out.token_ids == [2, 1, 1]                   # banned at token 2; free at token 3; nothing else left
    assert out.logprobs[0] == pytest.approx(torch.log_softmax(logits[0], -1)[2].item())
    assert probs_for_rows(logits[:1], [p], None, [0])[0, 1].item() == 0.0
    assert probs_for_rows(logits[:1], [p])[0, 1].item() == 1.0       # no positions given: no ban
    with pytest.raises(ValueError, match="min_tokens"):
        SamplingParams(max_tokens=2, min_tokens=3)


def test_allowed_token_ids_leave_only_those_ids_unless_none_of_them_is_left():
    """vLLM's allowed_token_ids: -inf at every other id (after the bias), per row; a row whose allowed ids are all
    masked already (a grammar's) keeps what it had; logprobs stay the raw logits'."""
    logits = torch.tensor([[1.0, 5.0, 4.0, 0.0, 2.0], [1.0, 5.0, 4.0, 0.0, 2.0],
                           [float("-inf"), 5.0, float("-inf"), float("-inf"), 2.0]])
    params = [SamplingParams(temperature=0.0, allowed_token_ids=[3, 0], logit_bias={3: 2.0}, logprobs=0),
              SamplingParams(temperature=0.0, logprobs=0),
              SamplingParams(temperature=0.0, allowed_token_ids=[0, 2], logprobs=0)]
    out = apply_penalties(logits, params, None)
    assert out[0].tolist() == [1.0, float("-inf"), float("-inf"), 2.0, float("-inf")]
    assert torch.equal(out[1:], logits[1:])
    result = sample(logits, params, None, [0, 0, 0])
    assert result.token_ids == [3, 1, 1]
    assert result.logprobs[0] == pytest.approx(torch.log_softmax(logits[0], -1)[3].item())
    drawn = SamplingParams(temperature=1.0, seed=5, allowed_token_ids=(2, 4))
    assert {sample(logits[:1], [drawn], None, [i]).token_ids[0] for i in range(40)} == {2, 4}
    assert params[0].allowed_token_ids == (0, 3)
    with pytest.raises(ValueError, match="allowed_token_ids"):
        SamplingParams(allowed_token_ids=(-1,))


def test_penalties_are_per_row_and_steer_greedy():
    logits = torch.tensor([[5.0, 4.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0]] * 2)
    params = [SamplingParams(temperature=0.0, presence_penalty=2.0), SamplingParams(temperature=0.0)]
    out = _sample(logits, params, histories=[[0], [0]], num_prompt=[0, 0])
    assert out.token_ids == [1, 0]


def test_seeded_row_repeats_alone_and_in_any_batch():
    torch.manual_seed(3)
    logits = torch.randn(6, 50)
    seeded = SamplingParams(temperature=1.0, seed=42)
    alone = [_sample(logits[:1], [seeded], num_generated=[step]).token_ids[0] for step in range(20)]
    others = [SamplingParams(), SamplingParams(temperature=0.0), SamplingParams(seed=7, top_p=0.9)]
    for step in range(20):
        batch = torch.cat([logits[3:4], logits[1:3], logits[:1]])
        params = [others[0], others[1], others[2], seeded]
        out = _sample(batch, params, num_generated=[5, 9, step, step])
        assert out.token_ids[3] == alone[step]
    assert len(set(alone)) > 5  # the seed depends on the step, not a constant draw
    other_seed = [_sample(logits[:1], [SamplingParams(seed=43)], num_generated=[s]).token_ids[0]
                  for s in range(20)]
    assert other_seed != alone


def test_sample_on_device_draws_what_sample_draws():
    """Rows — greedy, drawn, filtered, seeded or not — get ``sample``'s tokens, as a tensor left on the device; a row
    with penalties is refused without its token counts, and given them gets ``sample``'s token too."""
    torch.manual_seed(4)
    logits = torch.randn(5, 50, dtype=torch.bfloat16)
    params = [SamplingParams(temperature=0.0), SamplingParams(temperature=0.8, seed=1),
              SamplingParams(temperature=1.2, top_k=5, top_p=0.8, seed=2), SamplingParams(min_p=0.1, seed=3),
              SamplingParams(temperature=0.0, max_tokens=4)]
    for step in range(8):
        got = sample_on_device(logits, params, [step] * 5)
        assert got.dtype == torch.long and got.shape == (5,)
        assert got.tolist() == _sample(logits, params, num_generated=[step] * 5).token_ids
    for extra in (SamplingParams(repetition_penalty=1.1, seed=2), SamplingParams(frequency_penalty=0.3, seed=4)):
        with pytest.raises(AssertionError, match="need their token counts"):
            sample_on_device(logits[:1], [extra], [0])
        hist = [[3, 7, 7, 11]]
        assert sample_on_device(logits[:1], [extra], [2], _counts(logits, hist, [1])).tolist() == _sample(
            logits[:1], [extra], hist, [1], [2]).token_ids
    asking = [SamplingParams(temperature=0.0, logprobs=3), SamplingParams(), SamplingParams(seed=8, logprobs=0)]
    # logprobs come from the device too
    tokens = sample_on_device(logits[:3], asking, [0, 0, 0])
    got = row_logprobs(logits[:3].float(), asking, tokens).to_host().read(asking)
    want = _sample(logits[:3], asking)
    assert tokens[0] == want.token_ids[0] and tokens[2] == want.token_ids[2]
    assert got[0][0] == want.logprobs[0] and got[1][0] == want.top_logprobs[0] and got[0][1] is None
    assert got[1][2] == [] and got[0][2] == pytest.approx(float(torch.log_softmax(logits[2].float(), -1)[tokens[2]]))


def test_no_rows_draw_no_tokens():
    """A step of no rows (a rank without rows in a group's step; session 64's CI caught its UnboundLocalError) gives
    an empty tensor, by ``sample`` and ``sample_on_device``."""
    empty = torch.empty(0, 50)
    assert sample_on_device(empty, [], []).shape == (0,) and _sample(empty, []).token_ids == []


def test_logprobs_are_raw_log_softmax():
    torch.manual_seed(5)
    logits = torch.randn(3, V)
    params = [
        SamplingParams(temperature=0.5, repetition_penalty=1.5, logprobs=0),
        SamplingParams(temperature=0.0, logprobs=3),
        SamplingParams(),
    ]
    out = _sample(logits.to(torch.bfloat16), params, histories=[[0, 1], [], []], num_prompt=[2, 0, 0])
    logp = torch.log_softmax(logits.to(torch.bfloat16).float(), -1)
    assert out.logprobs[0] == pytest.approx(logp[0, out.token_ids[0]].item(), abs=1e-6)
    assert out.top_logprobs[0] == []
    assert out.logprobs[1] == pytest.approx(logp[1].max().item(), abs=1e-6)
    top = out.top_logprobs[1]
    assert [t for t, _ in top] == logp[1].argsort(descending=True)[:3].tolist()
    assert [lp for _, lp in top] == sorted((lp for _, lp in top), reverse=True)
    assert all(lp == pytest.approx(logp[1, t].item(), abs=1e-6) for t, lp in top)
    assert out.logprobs[2] is None and out.top_logprobs[2] is None
    assert all(math.isfinite(lp) for lp in out.logprobs[:2])


def test_bad_shapes_assert():
    params = [SamplingParams()] * 2
    with pytest.raises(AssertionError):
        sample(torch.zeros(2, 3, V), params, None, [0, 0])
    with pytest.raises(AssertionError):
        sample(torch.zeros(3, V), params, None, [0, 0])
    with pytest.raises(AssertionError):  # counts of one row for two
        sample(torch.zeros(2, V), params, torch.zeros(1, 2, V, dtype=torch.int32), [0, 0])
    with pytest.raises(AssertionError):
        sample(torch.zeros(2, V), params, None, [0])
    with pytest.raises(AssertionError):
        sample(torch.zeros(2, V, dtype=torch.long), params, None, [0, 0])
    with pytest.raises(AssertionError, match="outside the vocab"):
        _sample(torch.zeros(2, V), [SamplingParams(presence_penalty=1.0)] * 2, [[V], []], [0, 0])


def test_token_counts_grow_with_the_history_and_count_a_device_token_once():
    """``TokenCounts`` fed a history in pieces, and a generated id on the device before the host has it, equal the
    counts of the whole history at every point (``history_counts``); ``with_drafts`` adds drafts position by
    position."""
    prompt, out = [3, 5, 5, 0], [7, 5, 2, 7]
    counts = TokenCounts(len(prompt), V, torch.device("cpu"))
    history = list(prompt)
    assert torch.equal(counts.of(history), history_counts([history], [4], V, "cpu")[0])
    for t in out[:2]:
        history.append(t)
        assert torch.equal(counts.of(history), history_counts([history], [4], V, "cpu")[0])
    counts.add(torch.tensor([out[2]]))                     # sampled on the device, not yet read back
    history.append(out[2])
    assert torch.equal(counts.of(history), history_counts([history], [4], V, "cpu")[0])     # counted once
    history.append(out[3])
    whole = history_counts([history], [4], V, "cpu")[0]
    assert torch.equal(counts.of(history), whole) and whole[1].tolist() == [0, 0, 1, 0, 0, 1, 0, 2]
    assert whole[0].tolist() == [1, 0, 1, 1, 0, 3, 0, 2]
    drafts = [6, 6, 1]
    per_position = with_drafts(whole, torch.tensor(drafts))
    assert per_position.shape == (4, 2, V)
    for i in range(4):
        assert torch.equal(per_position[i], history_counts([history + drafts[:i]], [4], V, "cpu")[0]), i



def test_runner_row_pick_is_a_view_for_a_run_and_an_index_otherwise():
    """``_take_rows``: the rows sampling reads — a run of consecutive rows (decode steps) is a view of the hidden
    rows (no index copy, so nothing waits for the forward), any other set the same rows as a list index."""
    from workers.runner import _take_rows

    hidden = torch.randn(9, 4)
    run = _take_rows(hidden, [3, 4, 5])
    assert run.data_ptr() == hidden[3].data_ptr() and torch.equal(run, hidden[[3, 4, 5]])
    for rows in ([8, 2, 5], [0, 2], [7]):
        assert torch.equal(_take_rows(hidden, rows), hidden[rows])


@pytest.mark.parametrize("top_k", [0, 1500])          # 0: the sorted vocabulary; 1500: the top-k selection
def test_filtering_orders_tied_logits_by_id(top_k):
    """bf16 logits tie often: a top-p cut inside a tie must keep the same ids whatever else the batch holds, so the
    filter orders tied tokens by id (torch's sort and topk leave ties in no set order)."""
    from workers.sampler import _filtered_weights

    logits = torch.randint(0, 5, (3, 5000), generator=torch.Generator().manual_seed(0)).float()
    _, order = _filtered_weights(logits, [SamplingParams(top_k=top_k, top_p=0.9, seed=1)] * 3)
    values = logits.gather(1, order)
    assert (values.diff(dim=-1) <= 0).all()
    for r in range(3):
        for v in values[r].unique():
            assert (order[r][values[r] == v].diff() > 0).all(), (r, float(v))


def test_every_int64_seed_draws_its_own_noise():
    """Seeds were masked to 63 bits: -1 and 2**63 - 1 drew the same tokens (session 58's completions review). Every
    int64 seed maps to its own generator (the API refuses seeds outside int64)."""
    from workers.sampler import fill_seeded_noise

    draws = [fill_seeded_noise(torch.empty(64), s, 0) for s in (-1, 2**63 - 1, 0, -2**63)]
    assert all(not torch.equal(a, b) for i, a in enumerate(draws) for b in draws[i + 1:])
    assert torch.equal(fill_seeded_noise(torch.empty(64), 5, 3), fill_seeded_noise(torch.empty(64), 5, 3))
