"""Speculative decoding: lossless greedy, seeded sampling bit-identical to plain, lossless unseeded sampling,
rollback, index sharing, suppression."""

from __future__ import annotations

import math

import pytest
import torch

from cluster.engine import Engine, LocalExecutor
from models.loader import load_model
from scheduler.request import SamplingParams
from scheduler.scheduler import SchedulerConfig
from tests.conftest import run_engine
from workers.runner import ModelRunner
from workers.sampler import history_counts
from workers.speculative import pick_draft, verify

K = 3


@pytest.fixture(scope="module")
def model(text_ckpt):
    return load_model(text_ckpt, dtype=torch.float32, progress=False)


def make_engine(model, k: int, index_share: bool | None = None) -> Engine:
    runner = ModelRunner(model, 96, 16, torch.float32, speculative=k > 0)
    if index_share is not None and runner.drafter is not None:
        runner.drafter.share_index = index_share
    cfg = SchedulerConfig(num_blocks=96, block_size=16, max_model_len=1536, vocab_size=model.config.vocab_size,
                          eos_token_ids=())
    return Engine(LocalExecutor(runner), cfg, speculative_tokens=k)


def run(engine: Engine, reqs: dict) -> dict[str, list[int]]:
    out = run_engine(engine, reqs)
    assert engine.num_free_blocks() == 96
    return out


def prompts(n: int, vocab: int, seed: int = 0) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(40, vocab, (int(torch.randint(4, 60, (1,), generator=g)),), generator=g).tolist()
            for _ in range(n)]


def test_greedy_speculation_is_bit_identical_to_plain(model):
    """≥ 20 prompts, one at a time (drafts ride only for a solo request)."""
    greedy = SamplingParams(max_tokens=24, temperature=0.0)
    plain, spec = make_engine(model, 0), make_engine(model, K)
    for i, ids in enumerate(prompts(20, model.config.vocab_size)):
        assert run(spec, {"r": (ids, greedy)}) == run(plain, {"r": (ids, greedy)}), f"prompt {i}"
    m = spec.spec_metrics()
    assert m["rounds"] > 0 and m["proposed"] > 0
    print("spec metrics:", m)


class OracleDrafter:
    """Proposes the true greedy continuation for the first ``good`` drafts, then wrong tokens: exercises
    multi-token acceptance and rejection at every position, independent of how good the MTP head is."""

    def __init__(self, inner, truth: list[int], prompt_len: int, good: int):
        self.inner, self.truth, self.prompt_len, self.good = inner, truth, prompt_len, good

    def extend(self, *a):
        self.inner.extend(*a)

    def propose(self, rows, requests, k, world):
        out = []
        for r in requests:
            done = r.num_generated
            nxt = self.truth[done:done + k]
            drafts = [t if i < self.good else (t + 1) % 1000 + 40 for i, t in enumerate(nxt)]
            out.append((drafts + [41] * (k - len(drafts)), None))
        return out


def test_verified_tokens_logprobs_equal_plain(model):
    """logprobs (top 2) on drafted tokens: each accepted draft's and the bonus token's, from the verify rows, as plain
    decoding gives them (to 1e-4: other row sets, other last bits), the same top ids; a rejected round's rows past the
    replacement are not read."""
    prompt = [5, 9, 2, 77, 31, 8]
    reqs = {"r": (prompt, SamplingParams(max_tokens=24, temperature=0.0, logprobs=2))}
    spec = make_engine(model, K)
    got, want = run_engine(spec, reqs, logprobs=True)["r"], run_engine(make_engine(model, 0), reqs, logprobs=True)["r"]
    assert spec.stats["drafts_accepted"] > 0 and len(got) == len(want) == 24
    for (t, lp, top), (t2, lp2, top2) in zip(got, want):
        assert t == t2 and abs(lp - lp2) < 1e-4 and [i for i, _ in top] == [i for i, _ in top2], (got, want)


@pytest.mark.parametrize("penalized", [False, True])
@pytest.mark.parametrize("good", [0, 1, 2, 3])
def test_accept_and_rollback_paths_equal_plain(model, good, penalized):
    """Rounds where 0..k drafts are right: every acceptance length and rollback gives plain decode's tokens — also with
    penalties, read from the device-side counts (how verification counts the drafts is pinned by
    ``test_verify_and_drafts_count_the_drafts_before_each_position_for_penalties``)."""
    ids = prompts(1, model.config.vocab_size, seed=3)[0]
    greedy = SamplingParams(max_tokens=20, temperature=0.0, **(
        {"repetition_penalty": 1.3, "presence_penalty": 0.5, "frequency_penalty": 0.3} if penalized else {}))
    truth = run(make_engine(model, 0), {"p": (ids, greedy)})["p"]
    spec = make_engine(model, K)
    runner = spec.executor.runner
    runner.drafter = OracleDrafter(runner.drafter, truth, len(ids), good)
    assert run(spec, {"s": (ids, greedy)})["s"] == truth
    m = spec.spec_metrics()
    assert m["accepted"] <= good * m["rounds"] and (m["accepted"] > 0) == (good > 0)
    if good == K:
        assert m["mean_accepted_length"] > 2.5


def test_index_sharing_verifies_to_same_output(model):
    greedy = SamplingParams(max_tokens=20, temperature=0.0)
    for i, ids in enumerate(prompts(3, model.config.vocab_size, seed=5)):
        shared = run(make_engine(model, K, index_share=True), {"a": (ids, greedy)})["a"]
        unshared = run(make_engine(model, K, index_share=False), {"b": (ids, greedy)})["b"]
        assert shared == unshared


def test_drafts_suppressed_with_two_requests_and_resume(model):
    eng = make_engine(model, K)
    ids = prompts(2, model.config.vocab_size, seed=7)
    greedy = SamplingParams(max_tokens=6, temperature=0.0)
    long = SamplingParams(max_tokens=30, temperature=0.0)
    eng.add_request(ids[0], long, "long")
    eng.add_request(ids[1], greedy, "short")
    drafted_while_two = 0
    while eng.has_unfinished():
        two = sum(len(s.live_ids()) for s in eng.schedulers) == 2
        before = eng.stats["draft_rounds"]
        eng.step()
        if two:
            drafted_while_two += eng.stats["draft_rounds"] - before
    assert drafted_while_two == 0, "no verify round while two requests are active"
    assert eng.stats["draft_rounds"] > 0, "drafting resumes once the fleet drains to one request"
    plain = run(make_engine(model, 0), {"long": (ids[0], long)})["long"]
    again = make_engine(model, K)
    assert run(again, {"long": (ids[0], long)})["long"] == plain


SEEDED = [
    SamplingParams(max_tokens=24, temperature=0.8, top_k=20, seed=11),
    SamplingParams(max_tokens=24, temperature=1.0, seed=3),
    SamplingParams(max_tokens=24, temperature=0.7, top_p=0.9, min_p=0.02, seed=5),
    SamplingParams(max_tokens=24, temperature=1.2, top_k=50, top_p=0.95, repetition_penalty=1.2,
                   frequency_penalty=0.4, seed=2**40 + 7),
]


@pytest.mark.parametrize("case", range(len(SEEDED)))
def test_seeded_sampled_speculation_is_bit_identical_to_plain(model, case):
    """A seeded sampled request gives plain decoding's tokens with drafts riding — and alone or beside another request
    (drafts then suppressed): its tokens do not depend on the load. The drafts are accepted often enough that the
    comparison covers acceptance and rejection at several positions."""
    params = SEEDED[case]
    plain, spec = make_engine(model, 0), make_engine(model, K)
    for i, ids in enumerate(prompts(4, model.config.vocab_size, seed=20 + case)):
        want = run(plain, {"r": (ids, params)})["r"]
        assert run(spec, {"r": (ids, params)})["r"] == want, f"prompt {i}: alone, with drafts"
        other = prompts(1, model.config.vocab_size, seed=99)[0]
        busy = run(spec, {"r": (ids, params), "other": (other, SamplingParams(max_tokens=8, temperature=1.0))})
        assert busy["r"] == want, f"prompt {i}: beside another request"
    m = spec.spec_metrics()
    assert m["rounds"] > 0 and 0 < m["accepted"] < m["proposed"], m
    print(f"case {case} spec metrics:", m)


def test_unseeded_sampled_speculation_runs(model):
    """Unseeded sampled requests take rejection sampling (its distribution is pinned by
    ``test_verify_preserves_target_distribution``): the rounds run, drafts are accepted, every block comes back."""
    p = SamplingParams(max_tokens=24, temperature=0.8, top_k=20)
    eng = make_engine(model, K)
    for ids in prompts(3, model.config.vocab_size, seed=9):
        assert len(run(eng, {"a": (ids, p)})["a"]) == 24
    m = eng.spec_metrics()
    assert m["rounds"] > 0 and m["accepted"] > 0, m


def test_seeded_drafts_share_the_target_noise():
    """A seeded draft is drawn with the noise plain decoding draws the same position with: where the draft model's
    distribution is the target's, every draft is the target's own draw and ``verify`` keeps them all; a shifted
    draft distribution is rejected at some positions, and the emitted tokens still equal ``sample``'s draws."""
    from workers.sampler import sample

    torch.manual_seed(1)
    V, k = 50, 4
    params = SamplingParams(temperature=1.0, top_p=0.95, seed=123)
    logits = torch.randn(k + 1, V) * 2
    want = sample(logits, [params] * (k + 1), None, [7 + i for i in range(k + 1)]).token_ids
    same = [pick_draft(logits[i], params, None, 7, [torch.tensor([0])] * i) for i in range(k)]
    assert all(q is None for _, q in same), "seeded drafts carry no distribution"
    drafts = [int(t) for t, _ in same]
    assert drafts == want[:k]
    assert verify(logits, drafts, None, params, None, 7) == want
    kept = []
    for shift in range(20):
        off = logits + torch.randn(k + 1, V) * (0.5 + shift / 10)
        drafts = [int(pick_draft(off[i], params, None, 7, [torch.tensor([0])] * i)[0]) for i in range(k)]
        out = verify(logits, drafts, None, params, None, 7)
        assert out == want[:len(out)] and out[:-1] == drafts[:len(out) - 1]
        kept.append(len(out) - 1)
    assert 0 < sum(kept) < k * 20, kept


def test_verify_and_drafts_count_the_drafts_before_each_position_for_penalties():
    """Greedy with a frequency penalty: every position's logits favour token 5 by 1 over token 6, and the history has
    no 5. Draft 0 (a 5) is the target's; at position 1 the first draft counts, 5 drops by 2 and 6 wins — the round
    ends there, as plain decoding would. A drawn draft's distribution counts the drafts before it the same way."""
    V = 10
    logits = torch.zeros(3, V)
    logits[:, 5], logits[:, 6] = 2.0, 1.0
    counts = history_counts([[1, 2, 3]], [2], V, "cpu")[0]
    assert verify(logits, [5, 5], None, SamplingParams(temperature=0.0, frequency_penalty=2.0), counts, 1) == [5, 6]
    assert verify(logits, [5, 5], None, SamplingParams(temperature=0.0), None, 1) == [5, 5, 5]   # no penalty
    drawn = SamplingParams(temperature=1.0, frequency_penalty=2.0)      # unseeded: the draft carries q
    _, first = pick_draft(logits[0], drawn, counts, 1, [])
    _, second = pick_draft(logits[0], drawn, counts, 1, [torch.tensor([5])])
    rest = 7 + math.exp(-2)                          # seven zeros, and the generated 3 penalized once
    assert first[5] == pytest.approx(math.exp(2) / (math.exp(2) + math.e + rest))     # 5 not yet generated
    assert second[5] == pytest.approx(1 / (1 + math.e + rest))                        # after a drafted 5


def test_verify_preserves_target_distribution():
    """``verify`` itself over many independent rounds (small vocabulary, k = 2, drafts drawn from q): the first emitted
    token is distributed as p0, and after an accepted first draft the second as p1 — whatever q is; accepting every
    draft would be visibly off."""
    torch.manual_seed(0)
    V, T = 6, 12_000
    logits = torch.randn(3, V) * 1.5                           # target rows: the committed token and two drafts
    p = torch.softmax(logits, -1)
    q = torch.softmax(torch.randn(2, V) * 1.5, -1)             # what the drafts are drawn from
    drafts = torch.multinomial(q, T, replacement=True).T.tolist()         # [T, 2]
    params = SamplingParams(temperature=1.0)
    first, second = [], []
    for t, ds in enumerate(drafts):
        out = verify(logits, ds, torch.cat([q, q[:1]]), params, None, t)     # a third proposal the plan cut
        first.append(out[0])
        if out[0] == ds[0]:
            second.append(out[1])
    for emitted, want in ((first, p[0]), (second, p[1])):
        freq = torch.bincount(torch.tensor(emitted), minlength=V).double() / len(emitted)
        chi2 = float(((freq - want.double()) ** 2 / want.double()).sum() * len(emitted))
        assert chi2 < 25.0, f"chi2 {chi2:.1f} for {V - 1} dof over {len(emitted)} rounds"   # p < 1e-3 under H0
    naive = torch.bincount(torch.tensor([ds[0] for ds in drafts]), minlength=V).double() / T
    assert float(((naive - p[0].double()) ** 2 / p[0].double()).sum() * T) > 100, "q must differ from p"


def test_a_stop_string_inside_an_accepted_run_counts_only_the_output(model, text_ckpt):
    """A stop string completed by a draft inside a run of accepted drafts: the tokens after it are dropped (plain
    decode never sampled them) — from the output and from the generated-tokens count (session 57's sampling review:
    the count took the whole round). Each token's text that is met first there ends the output in turn, so the stop
    falls at every place in a round."""
    from cluster.detok import TextOf
    from cluster.local import load_tokenizer

    text_of = TextOf(load_tokenizer(text_ckpt))
    ids = prompts(1, model.config.vocab_size, seed=3)[0]
    truth = run(make_engine(model, 0), {"p": (ids, SamplingParams(max_tokens=20, temperature=0.0))})["p"]
    text = text_of(truth)
    stops = {p: text_of(truth[:p + 1])[len(text_of(truth[:p])):] for p in range(2, 16)}
    stops = {p: s for p, s in stops.items() if s and text.find(s) == len(text_of(truth[:p]))}
    assert len(stops) >= 4, stops
    for p, stop in stops.items():
        greedy = SamplingParams(max_tokens=20, temperature=0.0, stop=(stop,))
        plain = make_engine(model, 0)
        plain.decode = text_of
        want = run(plain, {"p": (ids, greedy)})["p"]
        spec = make_engine(model, K)
        spec.decode, runner = text_of, spec.executor.runner
        runner.drafter = OracleDrafter(runner.drafter, truth, len(ids), K)
        got = run(spec, {"s": (ids, greedy)})["s"]
        assert got == want == truth[:p + 1], (p, stop)         # (the token that completes it ends the ids)
        assert spec.stats["generated_tokens"] == len(got) == plain.stats["generated_tokens"], (p, stop)
