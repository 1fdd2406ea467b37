"""The engine's look-ahead decisions (``Engine._may_look_ahead`` / ``_advanced``), over a fake executor that records
the steps it is given: when a graph step may be launched ahead, and when the next step is the one launched."""

from __future__ import annotations

from itertools import pairwise

import pytest

from cluster.engine import Engine
from scheduler.request import SamplingParams
from scheduler.scheduler import SchedulerConfig
from tests.conftest import RecordingExecutor

BS = 16


def _engine(max_num_seqs=4, k=0, ranks=1):
    cfg = SchedulerConfig(num_blocks=64, block_size=BS, max_model_len=512, vocab_size=64, max_num_seqs=max_num_seqs,
                          max_num_batched_tokens=64)
    rec = RecordingExecutor()
    return Engine(rec, cfg, num_ranks=ranks, speculative_tokens=k, graphs=True), rec


def _drain(engine):
    while engine.has_unfinished():
        engine.step()


def test_a_greedy_solo_request_looks_ahead_at_every_step_but_its_last():
    """Its blocks reach one position past each step (the scheduler's slack): a block edge drops the launched step
    only where the graph key's width grows (widths round to eighths of a power of two: rarely at long contexts); a
    plan whose table has grown a block after the launched one's is still the launched step. The slack is from free
    blocks only (tests/unit/test_scheduler.py)."""
    engine, rec = _engine()
    engine.add_request(list(range(1, 11)), SamplingParams(max_tokens=200, temperature=0.0), "r")  # 10-token prompt
    _drain(engine)
    prefill, *decode = [st[0] for st in rec.steps]
    assert prefill.graph is None                 # 10 rows: beyond the buckets 4 requests' decode steps fill (eager)
    assert len(decode) == 199 and all(st.graph is not None for st in decode)
    for prev, st in pairwise(decode):                       # every step launched ahead was the next one but where
        assert st.use_ahead == (prev.lookahead and st.graph == prev.graph)     # the key's width grew
    for st in decode:
        s = st.seqs[0]
        assert len(s.block_ids) * BS > s.end_pos            # the next position's slot is the request's
        assert st.lookahead == (s.num_generated + 1 < 200), (s.start_pos, s.num_generated)
    widths = [st.graph[1] for st in decode]
    grew = sum(a != b for a, b in pairwise(widths))         # a table of 1 … 14 blocks: a few widths
    assert 0 < grew == len(set(widths)) - 1 <= 10
    assert engine.stats["ahead_steps"] == sum(st.use_ahead for st in decode) == 198 - grew
    assert any(len(st.seqs[0].block_ids) > len(prev.seqs[0].block_ids) and st.use_ahead
               for prev, st in pairwise(decode))


def test_no_look_ahead_while_a_prompt_waits_or_with_speculation():
    engine, rec = _engine(max_num_seqs=1)
    engine.add_request([1, 2, 3], SamplingParams(max_tokens=6, temperature=0.0), "a")
    engine.add_request([4, 5, 6], SamplingParams(max_tokens=6, temperature=0.0), "b")   # waits for a's seat
    engine.step()
    engine.step()                                          # a decodes while b waits
    assert rec.steps[-1][0].graph is not None and not rec.steps[-1][0].lookahead
    _drain(engine)
    assert any(st[0].lookahead for st in rec.steps)        # b alone looks ahead
    for params in (SamplingParams(max_tokens=6, temperature=0.7, top_p=0.9, seed=1),   # drawn rows, logprobs and
                   SamplingParams(max_tokens=6, temperature=0.7, logprobs=1),         # penalties come from the
                   SamplingParams(max_tokens=6, temperature=0.7, presence_penalty=0.5),   # device as greedy ones
                   SamplingParams(max_tokens=6, temperature=0.0, repetition_penalty=1.2)):
        engine, rec = _engine()
        engine.add_request([1, 2, 3], params, "r")
        _drain(engine)
        assert any(st[0].lookahead for st in rec.steps)
    engine, rec = _engine(k=2)                             # speculation: the MTP work follows every step
    engine.add_request([1, 2, 3], SamplingParams(max_tokens=6, temperature=0.0), "r")
    _drain(engine)
    assert not any(st[0].lookahead for st in rec.steps)


def test_a_change_in_the_step_drops_the_launched_one_on_every_rank():
    """A request joining (prefill) or a changed graph key: the next step is not the launched one; one finished or
    aborted: it is, less that request's row — the same verdict on every rank."""
    engine, rec = _engine(max_num_seqs=8, ranks=2)
    for i, rid in enumerate("abefgh"):
        engine.add_request([1 + i, 2, 3], SamplingParams(max_tokens=20, temperature=0.0), rid)
    for _ in range(4):
        engine.step()
    assert {st.lookahead for st in rec.steps[-1]} == {True}
    engine.add_request([8, 9], SamplingParams(max_tokens=3, temperature=0.0), "c")
    engine.step()                                          # c's prefill: not the step launched ahead
    assert {st.use_ahead for st in rec.steps[-1]} == {False}
    engine.step()                                          # seven decode: 4 + 3 rows, bucket 4 a rank
    assert {st.lookahead for st in rec.steps[-1]} == {True} and rec.steps[-1][0].graph[0] == 4
    engine.step()                                          # the one launched; c's last token by length
    assert {(st.use_ahead, st.lookahead) for st in rec.steps[-1]} == {(True, True)}
    engine.step()                                          # six, bucket 4: the launched step less c's row
    assert {(st.use_ahead, st.lookahead) for st in rec.steps[-1]} == {(True, True)}
    assert "c" not in {s.req_id for st in rec.steps[-1] for s in st.seqs}
    engine.abort("a")
    engine.step()                                          # five, less a's row
    assert {st.use_ahead for st in rec.steps[-1]} == {True}
    for rid in "befg":
        engine.abort(rid)
    engine.step()                                          # h alone: bucket 1, another graph key
    assert {st.use_ahead for st in rec.steps[-1]} == {False} and rec.steps[-1][0].graph[0] == 1
    _drain(engine)


def test_the_last_request_ending_stops_looking_ahead():
    engine, rec = _engine(ranks=2)
    engine.add_request([1, 2, 3], SamplingParams(max_tokens=5, temperature=0.0), "a")
    engine.add_request([4, 5, 6], SamplingParams(max_tokens=5, temperature=0.0), "b")
    _drain(engine)
    last = [st for st in rec.steps if st[0].graph is not None][-1]
    assert {st.lookahead for st in last} == {False}        # both end by length in it: nothing to launch


def test_warm_up_prompts_run_eagerly():
    """The warm-up's short prompts compile the eager path's kernels (a short prompt still runs eagerly alone in a
    span step, with drafts, or beside a longer chunk), so they do not ride graph steps; the engine's choice is back
    after it, and a short prompt among decoding requests then rides one."""
    engine, rec = _engine(max_num_seqs=32)
    engine.warm_up(64)
    served = [st[0] for st in rec.steps if st[0].warm is None]
    assert served and all(st.graph is None for st in served if any(len(s.token_ids) > 1 for s in st.seqs))
    assert engine.graph_prefill
    engine.add_request([1, 2, 3, 4], SamplingParams(max_tokens=8, temperature=0.0), "a")
    engine.step()
    engine.step()
    engine.add_request([5, 6, 7, 8, 9], SamplingParams(max_tokens=4, temperature=0.0), "b")
    engine.step()                                          # a's decode row beside b's whole prompt
    assert [len(s.token_ids) for s in rec.steps[-1][0].seqs] == [1, 5] and rec.steps[-1][0].graph == (8, 1, False)
    _drain(engine)


def test_warm_up_draws_by_each_of_the_samplers_paths(monkeypatch):
    """The warm-up's requests draw plainly, with a top-p, a top-k and both (the sort-free selects' kernel variants), so
    the first user's drawn request compiles none of them."""
    engine, _ = _engine(max_num_seqs=32)
    sent = []
    add = engine.add_request
    monkeypatch.setattr(engine, "add_request", lambda ids, params, rid: sent.append(params) or add(ids, params, rid))
    engine.warm_up(64)
    assert {(p.top_p < 1, p.top_k > 0) for p in sent} == {(False, False), (True, False), (False, True), (True, True)}
    assert all(not p.is_greedy for p in sent)


@pytest.mark.parametrize("ranks", [1, 2])
def test_warm_up_prefills_a_long_prompt_in_chunks_and_each_prompt_again_from_the_prefix_cache(monkeypatch, ranks):
    """Past the short prompts, the warm-up serves (contexts allowing) a prompt whose chunks start past 0 — and then
    every prompt again, whose prefill starts past its cached blocks (a prefix hit): both compile kernel variants a
    first long prompt or a first hit would otherwise compile while serving (session 66: 4.1 s and 1.8 s on an H100).
    Without prefix caching, no prompt is served twice."""
    for caching in (True, False):
        cfg = SchedulerConfig(num_blocks=160, block_size=BS, max_model_len=512, vocab_size=64, max_num_seqs=4,
                              max_num_batched_tokens=64, prefix_caching=caching)
        rec = RecordingExecutor()
        engine = Engine(rec, cfg, num_ranks=ranks, graphs=True)
        sent, hits = [], []
        add, reset = engine.add_request, engine._reset_stats
        monkeypatch.setattr(engine, "add_request", lambda ids, params, rid: sent.append(ids) or add(ids, params, rid))
        monkeypatch.setattr(engine, "_reset_stats",
                            lambda: hits.append(sum(s.prefix_hits for s in engine.schedulers)) or reset())
        done = engine.warm_up(512)
        lengths = done["prompt_lengths"]
        assert lengths[0] == 448 + 37 and {2 * BS + 1, 1} <= set(lengths)   # the long prompt; a tail of one row; 1
        chunks = [s for st in rec.steps for w in st if w.warm is None for s in w.seqs if len(s.token_ids) > 1]
        assert max(s.start_pos for s in chunks) >= 6 * 64                       # its 8th chunk
        assert len(sent) == len(lengths) * ranks * (2 if caching else 1)
        assert len({tuple(ids) for ids in sent}) == len(lengths) * ranks       # (each rank its own prompts)
        assert (hits[-1] > 0) == caching


def test_look_ahead_goes_on_while_a_request_waits_for_its_imported_kv():
    """A request bringing KV (a decode replica's, disaggregated prefill) waits while its rows go over steps (3 blocks
    a step, each landing after the step after it): the other request's decode steps look ahead meanwhile, and use
    what they launched, past a block edge too (an importing request takes no free block: the scheduler's slack is
    given) — but not the step whose write lands the last rows (the request starts with the next plan, which the
    launched step would not be)."""
    from tests.unit.test_disagg import _bundle_of

    cfg = SchedulerConfig(num_blocks=64, block_size=BS, max_model_len=400, vocab_size=1000, max_num_seqs=4,
                          max_num_batched_tokens=64, prefix_caching=True)
    engine = Engine(RecordingExecutor(), cfg, graphs=True, kv_layout=((4, "uint8"),))
    rec = engine.executor
    engine._imports[0].budget = 3 * BS * 4
    engine.add_request(list(range(500, 513)), SamplingParams(max_tokens=60, temperature=0.0), "x")
    engine.step()
    engine.step()                                  # x decodes at 13: its next block comes during the import, as slack
    y = list(range(1, 162))
    engine.add_request(y, SamplingParams(max_tokens=2, temperature=0.0), "y", kv=_bundle_of(y, BS))
    first = len(rec.steps)
    while not any(s.req_id == "y" for s in rec.steps[-1][0].seqs):
        engine.step()
    steps = [st[0] for st in rec.steps[first:]]
    assert [sum(len(b) for b, _ in st.kv_imports) for st in steps] == [3, 3, 3, 1, 0, 0]
    assert [st.kv_land for st in steps] == [False, True, True, True, True, False]
    assert [st.lookahead for st in steps[:5]] == [True, True, True, True, False]
    assert [len(st.seqs[0].block_ids) for st in steps[:5]] == [1, 2, 2, 2, 2]       # (x at 14 … 18)
    assert [st.use_ahead for st in steps[1:6]] == [False, True, True, True, False]  # (1: the graph's width grew)
