"""Queue bounds and aborts: max_waiting / max_waiting_tokens refuse with queue_full (429 + Retry-After at the edge) and
count right as requests are aborted (waiting, mid-prefill, preempted), finish or are preempted back; n > 1 at the
edge; unknown and duplicate ids; the prefix cache after an abort mid-prefill."""
from dataclasses import replace

from _h3 import AdmissionError, call, check, done, engine, greedy, ingress, prompt, run

P = greedy(20)


def refused(eng, rid, ids, params=P):
    try:
        eng.add_request(ids, params, rid)
        return None
    except AdmissionError as e:
        return e.reason


eng, _ = engine(kv_cache_tokens=160, max_model_len=128, max_num_seqs=2, max_waiting=2, max_num_batched_tokens=32)
for i in range(4):
    eng.add_request(prompt(60, seed=i), P, f"q{i}")
check(refused(eng, "q4", prompt(10)) == "queue_full", "5th request over max_num_seqs 2 + max_waiting 2: queue_full")
check(eng.abort("nope") is None, "abort of an unknown id: None")
check(refused(eng, "q0", prompt(10)) == "duplicate", "a duplicate live id: refused 'duplicate'")
ev = eng.abort("q3")
check(ev is not None and ev.finished and ev.finish_reason == "abort", "abort of a waiting request: an abort event")
check(eng.abort("q3") is None, "second abort of the same id: None")
check(refused(eng, "q4", prompt(10)) is None, "after a waiting request's abort a new one is admitted")
eng.step()                                  # q0 prefills its first chunk (32 of 60)
ev = eng.abort("q0")
check(ev is not None, "abort mid-prefill")
sch = eng.scheduler
for _ in range(3):
    eng.step()
check(sch.num_running + sch.num_waiting == 3, f"live after aborts: {sch.num_running} running + {sch.num_waiting} waiting")
steps = 0
pre = 0
while eng.has_work() and steps < 2000:
    eng.step()
    steps += 1
    live = sch.num_running + sch.num_waiting
    check(live <= 4, f"live {live} within 4") if live > 4 else None
    if sch.num_running < 2 and sch.num_waiting and eng.stats["preemptions"] > pre:
        pre = eng.stats["preemptions"]
        # a preempted request waits again: the queue bound still counts it once
        r = refused(eng, f"x{steps}", prompt(5), greedy(1))
        check(r in (None, "queue_full"), f"add while a preempted request waits: {r}")
        if r is None:
            eng.abort(f"x{steps}")
check(not eng.has_work() and sch.pool.num_free == sch.pool.num_blocks, f"all done in {steps} steps, pool whole")
check(refused(eng, "q0", prompt(10)) is None, "a finished (aborted) id may be used again")
run(eng, {})
eng.abort("q0")

# the prefix cache after an abort mid-prefill: the same prompt again equals alone
ref, _ = engine(kv_cache_tokens=512, max_model_len=128, prefix_caching=False)
ids = prompt(100, seed=7)
want = run(ref, {"a": (ids, greedy(10))})[0]["a"]
e2, _ = engine(kv_cache_tokens=512, max_model_len=128, max_num_batched_tokens=40, max_num_seqs=4)
e2.add_request(ids, greedy(10), "a")
e2.step()
e2.step()                                   # 80 of 100 computed
e2.abort("a")
got = run(e2, {"b": (ids, greedy(10))})[0]["b"]
check(got == want, f"prompt again after an abort at 80/100: cached {e2.scheduler.prefix_hits} tokens, equal to alone")

# max_waiting_tokens: prompt tokens still to compute, through aborts and preemption
e3, _ = engine(kv_cache_tokens=160, max_model_len=128, max_num_seqs=4, max_waiting=8, max_waiting_tokens=200,
               max_num_batched_tokens=32, prefix_caching=False)
e3.add_request(prompt(100, seed=1), P, "t1")
e3.add_request(prompt(100, seed=2), P, "t2")
check(e3.queued_tokens() == 200, f"queued {e3.queued_tokens()} == 200")
check(refused(e3, "t3", prompt(1)) == "queue_full", "one token more: queue_full")
e3.step()                                     # t1: 32 computed
check(e3.queued_tokens() == 168, f"after a chunk: {e3.queued_tokens()}")
e3.abort("t1")
check(e3.queued_tokens() == 100, f"after aborting the prefilling one: {e3.queued_tokens()}")
e3.abort("t2")
check(e3.queued_tokens() == 0, f"after aborting the waiting one: {e3.queued_tokens()}")

# the edge: 429 with Retry-After; n > 1 refused as a whole leaves nothing behind
kw = dict(kv_cache_tokens=512, max_model_len=128, max_num_seqs=2, max_waiting=2, max_num_batched_tokens=32)
e4, _ = engine(**kw)
ing = ingress(e4, kw)
for i in range(3):
    e4.add_request(prompt(60, seed=i), P, f"h{i}")
st, res = call(ing, "completions", {"prompt": prompt(10), "max_tokens": 2, "n": 2})
check(st == 429 and res["headers"] == {"Retry-After": "1"}, f"n=2 with one place left: {st} {res}")
left = set(e4.scheduler.live_ids()) - {"h0", "h1", "h2"}
check(not left, f"the choice that was admitted was aborted again (live besides h0-h2: {left})")
st, res = call(ing, "completions", {"prompt": prompt(10), "max_tokens": 2, "n": 5})
check(st == 400 and res["param"] == "n", f"n=5 > max_num_seqs + max_waiting: {st} {res['param']}")
ing.aeng.shutdown()
done()
