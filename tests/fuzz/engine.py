"""The Engine (cluster/engine.py) over a fake paged executor: ranks, moves, speculation, look-ahead, aborts (also
while a step runs), failed steps and lost groups, priority displacement, max_waiting / max_waiting_tokens."""

from __future__ import annotations

import random
from collections import Counter
from dataclasses import dataclass

import numpy as np

from cluster.disagg import KVBundle, KVTransferError, exported_blocks
from cluster.engine import Engine, GroupFailure
from scheduler import AdmissionError, SamplingParams, SchedulerConfig
from scheduler.request import FinishReason
from scheduler.shapes import rank_seqs
from tests.fuzz.scheduler import (
    VOCAB,
    Fail,
    PagedModel,
    Track,
    check_sched,
    expected_output,
    make_drafts,
    rand_len,
)
from workers.runner import StepResult


class StepError(RuntimeError):
    pass


class FakeGroup:
    """One PagedModel per rank. ``hook(steps)`` may abort requests while the step runs; ``fail`` makes the step raise
    (after it wrote part of its rows) — a plain error (the step's requests fail) or a GroupFailure (all do; recover
    wipes every rank's KV)."""

    def __init__(self, ranks, bs, rng, p_good):
        self.models = [PagedModel(bs) for _ in range(ranks)]
        self.rng, self.p_good = rng, p_good
        self.fail = None
        self.hook = None
        self.ids = {}           # req_id -> all ids at plan time (set by the fuzzer before the step)
        self.log = []
        self.sent = [() for _ in range(ranks)]      # imported rows sent after the last step's work

    def execute(self, steps):
        results = []
        if self.hook:
            self.hook(steps)
        for r, st in enumerate(steps):
            m = self.models[r]
            m.copies(st.kv_saves, st.kv_loads)
            res = StepResult(st.step_id)
            for i, s in enumerate(st.seqs):
                if self.fail and i == len(st.seqs) // 2 and r == len(steps) - 1:
                    kind, self.fail = self.fail, None
                    raise GroupFailure("fuzz: group lost") if kind == "group" else StepError("fuzz: step failed")
                out = m.run_seq(s, self.is_cached[r], self.ids.get(s.req_id))
                if out is not None:
                    res.sampled[s.req_id] = out
                    if st.num_drafts:
                        res.drafts[s.req_id] = make_drafts(self.rng, self.ids[s.req_id][:s.end_pos - s.num_drafts]
                                                           + out, st.num_drafts, self.p_good)
                if st.lookahead and s.sample and len(s.block_ids) * m.bs > s.end_pos:
                    m.kv[m.slot(s.block_ids, s.end_pos)] = VOCAB + 1       # the step launched ahead's write
            for rid, blocks in st.kv_exports:
                rows = [(m.kv.get(b * m.bs + i, 255), m.after.get(b * m.bs + i, 255)) for b in blocks
                        for i in range(m.bs)]
                res.kv[rid] = (np.array(rows, dtype=np.uint8).reshape(len(rows), 2),)
            if st.kv_land:          # the rows the last step sent land in their blocks after this step's work
                for blocks, rows in self.sent[r]:
                    for j, b in enumerate(blocks):
                        for i in range(m.bs):
                            tok, aft = rows[0][j * m.bs + i]
                            m.kv[b * m.bs + i], m.after[b * m.bs + i] = int(tok), int(aft)
            self.sent[r] = st.kv_imports
            results.append(res)
        if self.fail:
            kind, self.fail = self.fail, None
            raise GroupFailure("fuzz: group lost") if kind == "group" else StepError("fuzz: step failed")
        return results

    def recover(self):
        self.sent = [() for _ in self.models]
        for m in self.models:
            m.kv.clear()
            m.after.clear()
            m.host.clear()


@dataclass
class T(Track):
    error: str | None = None
    refused: bool = False
    export: bool = False
    kv: object = None


def run_engine_workload(seed: int, wl: int, steps: int) -> Counter:
    rng = random.Random(seed * 7_000_003 + wl)
    bs = rng.choice([1, 2, 4, 8, 16])
    mml = rng.choice([16, 24, 33, 64, 100])
    ranks = rng.choice([1, 1, 2, 2, 3, 4])
    seqs = rng.choice([1, 2, 3, 4, 8])
    nb = rng.randrange(max(2, mml // bs // 2), max(3, 3 * mml // bs + 4))
    mbt = max(seqs, rng.choice([4, 7, 16, 33, 64, mml, mml + 1]))
    pc = rng.random() < 0.6
    policy = rng.choice(["fcfs", "priority"])
    mwt = rng.choice([0, 0, mml, 2 * mml, 5 * mml])
    cfg = SchedulerConfig(num_blocks=nb, block_size=bs, max_model_len=mml, vocab_size=VOCAB,
                          eos_token_ids=tuple(rng.sample(range(VOCAB), rng.choice([0, 1, 2]))), max_num_seqs=seqs,
                          max_num_batched_tokens=mbt, max_waiting=rng.choice([0, 1, 4, 64]),
                          max_waiting_tokens=mwt, prefix_caching=pc,
                          host_blocks=rng.choice([0, 2, 8, 40]) if pc else 0, policy=policy)
    k = rng.choice([0, 0, 1, 2, 3])
    graphs = rng.random() < 0.5
    lookahead = graphs and rng.random() < 0.8
    p_good = rng.random()
    group = FakeGroup(ranks, bs, rng, p_good)
    decode = (lambda ids: "".join(chr(97 + t % 26) for t in ids)) if rng.random() < 0.5 else None
    disagg = pc and rng.random() < 0.5
    eng = Engine(group, cfg, decode, num_ranks=ranks, span=rng.random() < 0.7, speculative_tokens=k, graphs=graphs,
                 lookahead=lookahead, kv_layout=((2, "uint8"),) if disagg else None)
    group.is_cached = [s.pool.is_cached for s in eng.schedulers]
    shares = rank_seqs(seqs, ranks)
    ctx = dict(seed=seed, wl=wl, ranks=ranks, cfg=cfg, k=k, graphs=graphs, lookahead=lookahead)
    reqs: dict[str, T] = {}
    bases = [[rng.randrange(VOCAB) for _ in range(mml + 2)] for _ in range(2)]
    p_arrive, p_abort, p_mid, p_fail = rng.random() * 0.7, rng.random() * 0.1, rng.random() * 0.1, \
        rng.choice([0, 0, 0.01, 0.03])
    counts = Counter()
    nid = 0
    plans_seen = []

    def mid_abort(steps_):
        ids = [s.req_id for st in steps_ for s in st.seqs]
        if ids and rng.random() < p_mid:
            rid = rng.choice(ids)
            ev = eng.abort(rid)
            if ev is not None:
                take(ev)
                counts["abort_midstep"] += 1
        plans_seen.append(steps_)

    group.hook = mid_abort

    def take(ev):
        t = reqs.get(ev.req_id)
        assert t is not None, f"event for unknown {ev.req_id}"
        assert t.ended is None, f"{ev.req_id}: event after its end ({t.ended}): {ev}"
        t.out += ev.token_ids
        if ev.finished:
            t.ended = ev.finish_reason or "?"
            t.error = ev.error
            t.refused = ev.refused is not None
            t.kv = ev.kv
            if ev.refused is not None:
                assert ev.refused.reason == "queue_full" and not t.out
                counts["displaced"] += 1

    step = 0
    limit = steps + 3000
    while step < limit:
        if step >= steps and not eng.has_work():
            break
        while step < steps and rng.random() < p_arrive:
            mt = rng.choice([1, 2, 3, 5, 8, 16, mml // 2, mml - 1])
            n = max(1, min(rand_len(rng, cfg, mt), mml + 1))
            if rng.random() < 0.4:
                sh = rng.randrange(0, n + 1)
                ids = rng.choice(bases)[:sh] + [rng.randrange(VOCAB) for _ in range(n - sh)]
            else:
                ids = [rng.randrange(VOCAB) for _ in range(n)]
            prio = rng.choice([-1, 0, 0, 3]) if policy == "priority" else 0
            stop = tuple(rng.sample("abcdefghijklmnopqrstuvwxyz", 1)) if decode and rng.random() < 0.2 else ()
            params = SamplingParams(max_tokens=mt, priority=prio, ignore_eos=rng.random() < 0.3, stop=stop)
            for _ in range(rng.choice([1, 1, 1, 2, 3])):
                rid = f"r{nid}"
                nid += 1
                kw = {}
                if disagg and rng.random() < 0.4:
                    nblk = exported_blocks(len(ids), bs)
                    held = eng.hold_prefix(ids, None) if rng.random() < 0.5 else None
                    start = held.start if held is not None else 0
                    if nblk * bs >= start and nblk:
                        toks = tuple(ids[:nblk * bs + 1])
                        rows = np.array([(toks[i], toks[i + 1]) for i in range(start, nblk * bs)], dtype=np.uint8)
                        kw["kv"] = KVBundle(toks, ((2, "uint8"),), k > 0, (rows.reshape(-1, 2),), start)
                        counts["kv_in"] += 1
                    elif held is not None:
                        held.release()
                        held = None
                elif disagg and rng.random() < 0.3:
                    kw["export_kv"] = True
                    params = SamplingParams(max_tokens=1, ignore_eos=True, priority=prio)
                    held = None
                else:
                    held = None
                try:
                    nref = len(eng._refused)
                    try:
                        eng.add_request(ids, params, rid, **kw)
                        for v in eng._refused[nref:]:
                            vt = reqs[v.req_id]
                            assert vt.params.priority > params.priority and not vt.out, \
                                f"{rid} (priority {params.priority}) displaced {v.req_id} ({vt.params.priority}, " \
                                f"{len(vt.out)} tokens out)"
                            assert v.refused is not None and v.refused.reason == "queue_full" and v.error
                    finally:
                        if held is not None:
                            held.admitted()
                            held.release()
                    reqs[rid] = T(list(ids), params, export=bool(kw.get("export_kv")))
                    counts["admitted"] += 1
                    assert n + params.max_tokens <= mml, f"admitted {rid} too long"
                    if mwt:
                        q = eng.queued_tokens()
                        assert q < mwt + mml, f"queued tokens {q} >= max_waiting_tokens {mwt} + max_model_len"
                except KVTransferError as e:
                    counts["kv_refused"] += 1
                    raise Fail(f"{rid}: bundle refused: {e}")
                except AdmissionError as e:
                    assert e.reason and e.field and str(e), e
                    counts["refused_" + e.reason] += 1
                    if e.reason == "too_long":
                        assert n + params.max_tokens > mml
        if eng.has_unfinished() and rng.random() < p_abort:
            live = [rid for s in eng.schedulers for rid in s.live_ids()]
            rid = rng.choice(live)
            ev = eng.abort(rid)
            assert ev is not None and ev.finished
            take(ev)
            counts["abort"] += 1
        if rng.random() < p_fail:
            group.fail = rng.choice(["step", "group"])
            counts["fail_" + group.fail] += 1
        group.ids = {rid: sch.get(rid).all_ids for sch in eng.schedulers for rid in sch.live_ids()}
        before = eng.stats["preemptions"]
        try:
            events = eng.step()
        except AssertionError:
            raise
        for ev in events:
            take(ev)
        try:
            for r, sch in enumerate(eng.schedulers):
                imp = eng._imports[r]
                extra = [b for item in imp.queue for b in item[1]] + \
                    [b for _, blocks, _ in (*imp.writing, *imp.landing) for b in blocks]
                check_sched(sch, f"step {step} rank {r}", extra)
                assert sch.num_running <= shares[r], f"rank {r}: {sch.num_running} running > share {shares[r]}"
            total = sum(s.num_running + s.num_waiting for s in eng.schedulers)
            assert total <= eng._admits, f"{total} live > admits {eng._admits}"
            if plans_seen:
                st = plans_seen[-1]
                shape = st[0].shape
                rows = [sum(len(s.token_ids) for s in x.seqs) for x in st]
                for x in st:
                    assert sum(len(s.token_ids) for s in x.seqs) <= mbt, "budget"
                    assert x.shape == shape and x.graph == st[0].graph and x.num_drafts == st[0].num_drafts
                if shape.is_span:
                    assert sum(1 for n in rows if n) == 1 and rows[shape.owner] <= shape.total_rows
                else:
                    assert max(rows) <= shape.rows_per_rank, (rows, shape)
                plans_seen.clear()
            # every live request known to the engine's maps
            live = {rid for s in eng.schedulers for rid in s.live_ids()}
            assert live == set(eng._rank_of) == set(eng._streams), (live, set(eng._rank_of), set(eng._streams))
            for rid in live:
                assert eng.schedulers[eng._rank_of[rid]].get(rid) is not None
        except AssertionError as e:
            raise Fail(f"{ctx} step {step}: {e}") from e
        counts["preempted"] += eng.stats["preemptions"] - before
        step += 1
    else:
        live = [(r, [(q.req_id, q.status.name, q.num_tokens) for q in s._live.values()])
                for r, s in enumerate(eng.schedulers)]
        raise Fail(f"{ctx}: did not drain in {limit} steps: {live}")
    try:
        for r, sch in enumerate(eng.schedulers):
            assert sch.pool.num_free == sch.pool.num_blocks, f"rank {r} leaked blocks"
        assert not eng._streams and not eng._rank_of and not eng._unsent, "engine maps not empty"
        gen = 0
        for rid, t in reqs.items():
            assert t.ended is not None, f"{rid} never ended"
            gen += len(t.out)
            exp = expected_output(t.prompt, len(t.out))
            assert t.out == exp, f"{rid}: output {t.out} != expected {exp}"
            assert len(t.out) <= t.params.max_tokens
            if t.ended == FinishReason.LENGTH:
                assert len(t.out) == t.params.max_tokens, (rid, t)
            if t.error:
                counts["errored"] += 1
            if t.kv is not None:
                counts["kv_out"] += 1
                b = t.kv
                n = exported_blocks(len(t.prompt), bs)
                assert b.token_ids == tuple(t.prompt[:n * bs + 1]), f"{rid}: exported tokens"
                want = [(t.prompt[i], t.prompt[i + 1]) for i in range(b.start, b.num_tokens)]
                got = [tuple(map(int, row)) for row in b.rows[0]]
                assert got == want, f"{rid}: exported rows {got} != {want}"
            elif t.export and t.ended in (FinishReason.LENGTH, FinishReason.STOP) and not t.error \
                    and exported_blocks(len(t.prompt), bs):
                counts["export_missing"] += 1
        assert eng.stats["drafts_accepted"] <= eng.stats["drafts_proposed"]
        assert eng.stats["generated_tokens"] == gen, (eng.stats["generated_tokens"], gen)
    except AssertionError as e:
        raise Fail(f"{ctx} at the end: {e}") from e
    counts["steps"] += step
    counts["moves"] += eng.stats["moves"]
    counts["span_steps"] += eng.stats["span_steps"]
    counts["graph_steps"] += eng.stats["graph_steps"]
    counts["ahead_steps"] += eng.stats["ahead_steps"]
    counts["draft_rounds"] += eng.stats["draft_rounds"]
    return counts
