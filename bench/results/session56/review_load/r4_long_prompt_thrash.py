"""Bursts of near-2048-token prompts into a pool that holds about 1.3 of them, under a stream of short requests
arriving every step: with and without the prefix cache (+ a host tier, the long prompts sharing a 1536-token
prefix). Every request must finish with the tokens it gets alone (greedy), the long ones within a bounded number of
steps (no starvation by the short stream, no livelock), and the pool must end whole."""
from _hl import check, done, engine, greedy, leftovers, prompt, run

L = 2048
ref, _ = engine(kv_cache_tokens=4096, prefix_caching=False)
SHARED = prompt(1536, seed=50)
LONGS = {f"L{i}": prompt(1880 + 40 * i, seed=10 + i) for i in range(4)}
LONGS_SHARED = {f"S{i}": SHARED + prompt(400 + 20 * i, seed=20 + i) for i in range(4)}
SHORTS = {f"q{i}": prompt(30 + 7 * (i % 9), seed=200 + i) for i in range(24)}
MAXT_LONG, MAXT_SHORT = 48, 12
REF = {}
for rid, ids in {**LONGS, **LONGS_SHARED}.items():
    REF[rid] = run(ref, {rid: (ids, greedy(MAXT_LONG))})[0][rid]
GROW = {f"G{i}": prompt(1300 + 30 * i, seed=40 + i) for i in range(4)}     # grow into each other while decoding
MAXT_GROW = 160
for rid, ids in GROW.items():
    REF[rid] = run(ref, {rid: (ids, greedy(MAXT_GROW))})[0][rid]
for rid, ids in SHORTS.items():
    REF[rid] = run(ref, {rid: (ids, greedy(MAXT_SHORT))})[0][rid]


def scenario(label, longs, maxt=MAXT_LONG, **kw):
    eng, _ = engine(kv_cache_tokens=2048 + 512, max_model_len=L, max_num_seqs=4, max_waiting=64,
                    max_num_batched_tokens=256, **kw)
    out, ends, arrived = {}, {}, {}
    pending = dict(SHORTS)
    for rid, ids in longs.items():
        eng.add_request(ids, greedy(maxt), rid)
        out[rid], arrived[rid] = [], 0
    step = 0
    finished_at = {}
    while (eng.has_work() or pending) and step < 4000:
        for _ in range(2 if step % 3 == 0 else 0):        # shorts keep arriving while the long ones run
            if pending:
                rid, ids = pending.popitem()
                eng.add_request(ids, greedy(MAXT_SHORT), rid)
                out[rid], arrived[rid] = [], step
        for ev in eng.step():
            out[ev.req_id] += ev.token_ids
            if ev.finished:
                ends[ev.req_id] = (ev.finish_reason, ev.error)
                finished_at[ev.req_id] = step
        step += 1
    wrong = [r for r in out if out[r] != REF[r]]
    unfinished = [r for r in out if ends.get(r) != ("length", None)]
    long_steps = max(finished_at.get(r, 10**9) for r in longs)
    print(f"   {label}: {step} steps, preemptions {eng.stats['preemptions']}, long ones done by step {long_steps}, "
          f"prefix hits {eng.prefix_cache_tokens()[1]}, host loads {eng.scheduler.host_loads}")
    check(step < 4000 and not unfinished, f"{label}: all {len(out)} finished 'length' ({unfinished[:5]} not)")
    check(not wrong, f"{label}: every request's tokens equal alone ({wrong[:6]} differ)")
    check(long_steps < 1500, f"{label}: the long requests finished within 1500 steps ({long_steps})")
    check(not leftovers(eng), f"{label}: nothing left {leftovers(eng)}")
    return eng


scenario("no prefix cache", LONGS, prefix_caching=False)
scenario("prefix cache", LONGS_SHARED, prefix_caching=True)
scenario("prefix cache + host tier", LONGS_SHARED, prefix_caching=True, host_kv_cache_tokens=1024)
scenario("look-ahead, no prefix cache", LONGS, prefix_caching=False, cuda_graphs="eager")
scenario("growing into each other, no prefix cache", GROW, MAXT_GROW, prefix_caching=False)
scenario("growing into each other, prefix cache + host tier", GROW, MAXT_GROW, prefix_caching=True,
         host_kv_cache_tokens=512)
done()
