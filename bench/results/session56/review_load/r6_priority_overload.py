"""The priority policy under overload, through AsyncEngine: 150 clients of random priorities (0..4) in waves against
max_num_seqs 4 + max_waiting 8 (and max_waiting_tokens), a pool small enough to preempt. Every client must end --
served with its greedy tokens alone, or refused queue_full (at admission or displaced before any output) -- nothing
hangs, the engine never holds more than 12, and everything ends empty."""
import asyncio
import random

from cluster.async_engine import AsyncEngine
from _hl import AdmissionError, check, done, engine, greedy, leftovers, prompt, run

ref, _ = engine(kv_cache_tokens=4096, max_model_len=512, prefix_caching=False)
rng = random.Random(3)
REQS = [(prompt(rng.randint(10, 200), seed=500 + i), rng.randint(2, 24), rng.randint(0, 4)) for i in range(150)]
REF = {}

eng, _ = engine(kv_cache_tokens=640, max_model_len=512, max_num_seqs=4, max_waiting=8, max_waiting_tokens=1024,
                max_num_batched_tokens=32, scheduling_policy="priority", prefix_caching=True)
peak = [0]
orig = eng.step


def step():
    sch = eng.scheduler
    peak[0] = max(peak[0], sch.num_running + sch.num_waiting)
    return orig()


eng.step = step
aeng = AsyncEngine(eng)
served, refused, displaced, other = {}, 0, 0, []


async def client(i):
    global refused, displaced
    ids, n, prio = REQS[i]
    toks = []
    try:
        async for ev in aeng.generate(ids, greedy(n, priority=prio), f"c{i}"):
            toks += ev.token_ids
            if ev.finished:
                served[i] = (toks, ev.finish_reason, ev.error)
    except AdmissionError as e:
        if e.reason != "queue_full":
            other.append((i, e.reason))
        elif "higher priority" in str(e):
            displaced += 1
        else:
            refused += 1


async def main():
    for w in range(0, 150, 30):
        tasks = []
        for i in range(w, w + 30):
            tasks.append(asyncio.create_task(client(i)))
            await asyncio.sleep(rng.choice([0, 0, 0.005, 0.02]))
        await asyncio.wait_for(asyncio.gather(*tasks), 60)

try:
    asyncio.run(main())
    hung = False
except asyncio.TimeoutError:
    hung = True
check(not hung, "no client hung (every wave ended within 60 s)")
for _ in range(100):
    if not eng.has_work() and not aeng._queues:
        break
    asyncio.run(asyncio.sleep(0.05))
aeng.shutdown()
for i in served:
    REF[i] = run(ref, {"r": (REQS[i][0], greedy(REQS[i][1]))})[0]["r"]
wrong = [i for i, (t, reason, err) in served.items() if t != REF[i] or reason != "length" or err]
by_prio = {p: sum(1 for i in served if REQS[i][2] == p) for p in range(5)}
print(f"   served {len(served)} (by priority {by_prio}), refused {refused}, displaced {displaced}, other {other}, "
      f"peak live {peak[0]}, preemptions {eng.stats['preemptions']}")
check(len(served) + refused + displaced == 150 and not other, "every client ended: served or queue_full")
check(not wrong, f"served tokens equal alone ({wrong[:6]} differ)")
check(peak[0] <= 12, f"never more than 12 live ({peak[0]})")
check(not leftovers(eng) and not aeng._queues, f"nothing left {leftovers(eng)}, queues {len(aeng._queues)}")
done()
