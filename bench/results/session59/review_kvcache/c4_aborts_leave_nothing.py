"""Checked and right: aborting a request at any point leaves nothing behind and poisons no cached prefix.

A long shared prompt, chunked (budget 16, block 8), on an engine with MTP drafts or look-ahead graph steps, FP8 or not,
a host tier: aborts mid-prefill (after 1..4 chunks), mid-decode, while queued behind a full pool, while waiting for
another request's prefill of the same head (the in-flight wait), and *while its step runs* (from inside the executor,
as the async engine's abort can). After each: the pool is idle (no held block, ref, keep), the runner has forgotten
the request, and a fresh copy of the prompt — which takes whatever blocks the aborted one registered — gives the
tokens of an engine without the cache."""
from __future__ import annotations

import _h
from _h import check, greedy, make_engine

P = _h.ids(75, 31)
REF = {fp8: _h.run(make_engine(caching=False, fp8=fp8), {"x": (P, greedy(10))})["x"] for fp8 in (False, True)}


class AbortInStep:
    def __init__(self, inner, eng):
        self.inner, self.eng, self.at = inner, eng, None

    def execute(self, steps):
        if self.at is not None and any(s.req_id == self.at for s in steps[0].seqs):
            self.eng.abort(self.at)
            self.at = None
        return self.inner.execute(steps)

    def recover(self):
        self.inner.recover()

    @property
    def runner(self):
        return self.inner.runner


def drive(eng, rid, when, max_steps=400):
    """Step until ``when(eng, rid, step)`` says abort, abort, then step to idle."""
    for step in range(max_steps):
        if eng.scheduler.get(rid) is not None and when(eng, rid, step):
            eng.abort(rid)
        if not eng.has_work():
            return
        eng.step()
    raise RuntimeError("no drain")


def computed(n):
    return lambda eng, rid, step: eng.scheduler.get(rid).num_computed_tokens >= n


cases = {
    "mid-prefill after 1 chunk": ({}, computed(16)),
    "mid-prefill after 3 chunks": ({}, computed(48)),
    "mid-prefill after 4 chunks": ({}, computed(64)),
    "mid-decode": ({}, lambda eng, rid, step: len(eng.scheduler.get(rid).output_ids) >= 3),
    "first step": ({}, lambda eng, rid, step: step == 0),
}
n_bad = 0
for k, graphs, fp8, host in [(0, False, False, 0), (2, False, False, 24), (0, True, True, 24), (3, False, True, 0)]:
    tag = f"k={k} graphs={graphs} fp8={fp8} host={host}"
    for name, (_, when) in cases.items():
        eng = make_engine(caching=True, k=k, graphs=graphs, fp8=fp8, host=host, bs=8, blocks=16, budget=16, seqs=2)
        eng.add_request(P, greedy(10), "x")
        drive(eng, "x", when)
        idle = _h.pool_idle(eng) + ([f"runner holds {list(eng.executor.runner.requests)}"]
                                    if eng.executor.runner.requests else [])
        out = _h.run(eng, {"y": (P, greedy(10))})["y"]
        ok = check(not idle and out == REF[fp8], f"{tag}: abort {name}: idle {idle or 'yes'}, copy after == alone")
        n_bad += not ok
    # queued behind a full pool, and waiting for another's prefill of the same head
    eng = make_engine(caching=True, k=k, graphs=graphs, fp8=fp8, host=host, bs=8, blocks=16, budget=16, seqs=2)
    eng.add_request(P, greedy(10), "a")
    eng.add_request(P, greedy(10), "b")     # waits for a's chunks (the in-flight wait)
    eng.step()
    check(eng.scheduler.get("b").status.name == "WAITING", f"{tag}: b waits for a's prefill")
    eng.abort("b")
    eng.add_request(_h.ids(60, 32), greedy(30), "c")    # 60 + 30 tokens: queued behind a (pool of 16 blocks of 8)
    for _ in range(3):
        eng.step()
    c_state = eng.scheduler.get("c").status.name if eng.scheduler.get("c") else "gone"
    eng.abort("c")
    outs = {"a": []}
    while eng.has_work():
        for ev in eng.step():
            outs.setdefault(ev.req_id, []).extend(ev.token_ids)
    check(outs["a"] == REF[fp8] and not _h.pool_idle(eng),
          f"{tag}: aborts of a waiter (c was {c_state}) and an in-flight waiter: a == alone, pool idle")
    # abort from inside the executor while the request's step runs (chunk 2 of its prefill, then a decode step)
    for at_chunk in (True, False):
        eng = make_engine(caching=True, k=k, graphs=graphs, fp8=fp8, host=host, bs=8, blocks=16, budget=16, seqs=2)
        eng.executor = AbortInStep(eng.executor, eng)
        eng.add_request(P, greedy(10), "x")
        for _ in range(1 if at_chunk else 6):
            eng.step()
        eng.executor.at = "x"
        while eng.has_work():
            eng.step()
        idle = _h.pool_idle(eng) + ([f"runner holds {list(eng.executor.runner.requests)}"]
                                    if eng.executor.runner.requests else [])
        out = _h.run(eng, {"y": (P, greedy(10))})["y"]
        check(not idle and out == REF[fp8], f"{tag}: abort while its {'chunk' if at_chunk else 'decode'} step runs: "
                                             f"idle {idle or 'yes'}, copy after == alone")
_h.done()
