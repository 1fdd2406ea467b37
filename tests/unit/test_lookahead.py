"""The engine's look-ahead decisions (``Engine._may_look_ahead`` / ``_advanced``), over a fake executor that records
the steps it is given: when a graph step may be launched ahead, and when the next step is the one launched."""

from __future__ import annotations

from itertools import pairwise

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


def test_a_greedy_solo_request_looks_ahead_except_at_block_edges_and_its_last_step():
    engine, rec = _engine()
    engine.add_request(list(range(1, 11)), SamplingParams(max_tokens=30, temperature=0.0), "r")   # 10-token prompt
    _drain(engine)
    decode = [st[0] for st in rec.steps if st[0].graph is not None]
    assert len(decode) == 29
    for prev, st in pairwise(decode):
        assert st.use_ahead == prev.lookahead               # every step launched ahead was the next one
    for st in decode:
        s = st.seqs[0]
        edge = s.end_pos % BS == 0                          # position end_pos opens a new block
        last = s.num_generated + 1 == 30
        assert st.lookahead == (not edge and not last), (s.start_pos, s.num_generated)
    assert engine.stats["ahead_steps"] == sum(st.use_ahead for st in decode)


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
    """A request joining (prefill), aborted or finished: the next step is not the launched one; the same verdict
    goes to every rank."""
    engine, rec = _engine(ranks=2)
    engine.add_request([1, 2, 3], SamplingParams(max_tokens=20, temperature=0.0), "a")
    engine.add_request([4, 5, 6, 7], SamplingParams(max_tokens=20, temperature=0.0), "b")
    for _ in range(4):
        engine.step()
    assert rec.steps[-1][0].lookahead and {st.lookahead for st in rec.steps[-1]} == {True}
    engine.add_request([8, 9], SamplingParams(max_tokens=3, temperature=0.0), "c")
    engine.step()                                          # c's prefill: not the step launched ahead
    assert {st.use_ahead for st in rec.steps[-1]} == {False}
    engine.step()                                          # a, b, c decode
    assert {st.lookahead for st in rec.steps[-1]} == {True}
    engine.step()                                          # the one launched; c's last token by length: no more
    assert {(st.use_ahead, st.lookahead) for st in rec.steps[-1]} == {(True, False)}
    engine.step()                                          # a and b, without c
    assert {(st.use_ahead, st.lookahead) for st in rec.steps[-1]} == {(False, True)}
    engine.abort("a")
    engine.step()
    assert {st.use_ahead for st in rec.steps[-1]} == {False}
    _drain(engine)
