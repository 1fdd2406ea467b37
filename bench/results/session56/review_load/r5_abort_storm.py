"""Abort storms through AsyncEngine: 96 clients, most cancelled at random moments (before admission returns, while
waiting or preempted, during prompt chunks, while decoding) or leaving after a few events, beside 'keeper' clients
that read to the end. A pool small enough to preempt, a 32-token budget (chunked prefill), prefix cache + host tier;
then a speculative engine (k=3) whose lone requests are cancelled mid-draft. The keepers' tokens must equal alone,
every stream must end, and the engine, the runner and AsyncEngine's queues must end empty."""
import asyncio
import random

from cluster.async_engine import AsyncEngine
from _hl import check, done, engine, greedy, leftovers, prompt, run

ref, _ = engine(kv_cache_tokens=4096, max_model_len=512, prefix_caching=False)
SHARED = prompt(96, seed=5)
rng = random.Random(7)
REQS = []
for i in range(96):
    ids = (SHARED + prompt(rng.randint(4, 120), seed=300 + i)) if i % 3 == 0 else prompt(rng.randint(20, 300), seed=300 + i)
    REQS.append((ids, rng.randint(4, 40)))
KEEP = set(range(0, 96, 6))
REF = {i: run(ref, {"r": (REQS[i][0], greedy(REQS[i][1]))})[0]["r"] for i in KEEP}


async def storm(aeng, label, idx, width):
    got, ends, cancelled = {}, {}, 0

    async def client(i):
        ids, n = REQS[i]
        toks = got.setdefault(i, [])
        async for ev in aeng.generate(ids, greedy(n), f"{label}-{i}"):
            toks += ev.token_ids
            if ev.finished:
                ends[i] = (ev.finish_reason, ev.error)

    async def wave(batch):
        nonlocal cancelled
        tasks = {i: asyncio.create_task(client(i)) for i in batch}
        await asyncio.sleep(0)
        for i in batch:
            if i not in KEEP:
                await asyncio.sleep(rng.choice([0, 0, 0.001, 0.01, 0.05, 0.2]))
                if not tasks[i].done():
                    tasks[i].cancel()
                    cancelled += 1
        res = await asyncio.wait_for(asyncio.gather(*tasks.values(), return_exceptions=True), 120)
        for i, r in zip(batch, res):
            if isinstance(r, BaseException) and not isinstance(r, asyncio.CancelledError):
                check(False, f"{label}: client {i} raised {type(r).__name__}: {r}")

    for k in range(0, len(idx), width):
        await wave(idx[k:k + width])
    return got, ends, cancelled


def settle(eng, aeng):
    for _ in range(100):
        if not eng.has_work() and not aeng._queues:
            return
        asyncio.run(asyncio.sleep(0.05))


# (1) a crowded engine: waves of 24 clients, 18 cancelled at random moments
eng, _ = engine(kv_cache_tokens=560, max_model_len=512, max_num_seqs=6, max_waiting=32, max_num_batched_tokens=32,
                prefix_caching=True, host_kv_cache_tokens=512)
aeng = AsyncEngine(eng)
got, ends, cancelled = asyncio.run(storm(aeng, "crowded", list(range(96)), 24))
settle(eng, aeng)
wrong = [i for i in KEEP if got.get(i) != REF[i] or ends.get(i) != ("length", None)]
print(f"   crowded: {cancelled} cancelled, preemptions {eng.stats['preemptions']}, keepers {len(KEEP)}")
check(cancelled > 40, f"crowded: many cancellations ({cancelled})")
check(not wrong, f"crowded: keepers' tokens equal alone ({wrong} differ)")
check(not leftovers(eng) and not aeng._queues, f"crowded: nothing left {leftovers(eng)}, queues {len(aeng._queues)}")
aeng.shutdown()

# (2) speculative engine: one client at a time (drafts ride only for a lone request), cancelled mid-stream
spec, _ = engine(kv_cache_tokens=1024, max_model_len=512, max_num_seqs=4, max_num_batched_tokens=32,
                 speculative_tokens=3, prefix_caching=True)
aeng = AsyncEngine(spec)
got, ends, cancelled = asyncio.run(storm(aeng, "spec", list(range(0, 96, 2)), 1))
settle(spec, aeng)
wrong = [i for i in KEEP if i % 2 == 0 and (got.get(i) != REF[i] or ends.get(i) != ("length", None))]
print(f"   spec: {cancelled} cancelled, draft rounds {spec.stats['draft_rounds']}")
check(spec.stats["draft_rounds"] > 0, "spec: drafts rode")
check(not wrong, f"spec: keepers' tokens equal alone ({wrong} differ)")
check(not leftovers(spec) and not aeng._queues, f"spec: nothing left {leftovers(spec)}, queues {len(aeng._queues)}")
aeng.shutdown()
done()
