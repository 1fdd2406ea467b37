"""Checked and right: ``cache_salt`` keeps tenants' cached prefixes apart — on the device, in the host tier, for prompts
arriving together (the in-flight wait), and for the stats. A prompt cached under salt "a" gives 0 cached tokens to the
same prompt unsalted or under salt "b", and > 0 under "a" again (also after eviction to the host tier); a salted
prompt does not wait for another tenant's prefill of the same head; the outputs equal alone; the pool is idle after."""
from __future__ import annotations

import _h
from _h import check, greedy, make_engine, run

P = _h.ids(70, 21)
ref = run(make_engine(caching=False), {"x": (P, greedy(8))})["x"]

for host in (0, 40):
    eng = make_engine(caching=True, host=host, blocks=8 if host else 32, bs=16, mml=128)
    tag = f"host={host}"
    out, c = run(eng, {"a1": (P, greedy(8, cache_salt="a"))}, usage=True)
    check(out["a1"] == ref and c["a1"] == 0, f"{tag}: tenant a's first: cached {c['a1']}")
    if host:      # evict tenant a's blocks from the device: another tenant's long prompt fills the pool
        run(eng, {"z": (_h.ids(100, 22), greedy(8, cache_salt="z"))})
    for rid, salt in (("none", None), ("b", "b")):
        out, c = run(eng, {rid: (P, greedy(8, cache_salt=salt))}, usage=True)
        check(out[rid] == ref and c[rid] == 0, f"{tag}: salt {salt!r} after tenant a: cached {c[rid]} (want 0)")
    if host:
        run(eng, {"z2": (_h.ids(100, 23), greedy(8, cache_salt="z"))})
    loads = eng.scheduler.host_loads
    out, c = run(eng, {"a2": (P, greedy(8, cache_salt="a"))}, usage=True)
    check(out["a2"] == ref and c["a2"] == 64, f"{tag}: tenant a again: cached {c['a2']} (want 64)"
          + (f", host loads {eng.scheduler.host_loads - loads}" if host else ""))
    check(not _h.pool_idle(eng), f"{tag}: pool idle ({_h.pool_idle(eng)})")

# arriving together: a long shared prompt, chunked (budget 16): tenant a's second copy waits for the first's chunks and
# takes them; tenant b's copy computes its own at once (it may not take a's blocks, so it must not wait for them)
eng = make_engine(caching=True, budget=16, bs=16, blocks=32)
reqs = {"a1": (P, greedy(4, cache_salt="a")), "a2": (P, greedy(4, cache_salt="a")),
        "b1": (P, greedy(4, cache_salt="b"))}
first = {}
for rid, (p, params) in reqs.items():
    eng.add_request(p, params, rid)
step, out, cached = 0, {r: [] for r in reqs}, {}
while eng.has_unfinished():
    for ev in eng.step():
        if ev.token_ids and ev.req_id not in first:
            first[ev.req_id] = step
        out[ev.req_id] += ev.token_ids
        if ev.finished:
            cached[ev.req_id] = ev.num_cached_tokens
    step += 1
check(all(out[r] == ref[:4] for r in reqs), "together: every copy's tokens == alone")
check(cached == {"a1": 0, "a2": 64, "b1": 0}, f"together: cached tokens {cached} (a2 took a1's blocks)")
print("first token at step", first)
check(not _h.pool_idle(eng), "together: pool idle")
_h.done()
