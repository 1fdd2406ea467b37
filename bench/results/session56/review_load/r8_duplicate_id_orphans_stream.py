"""AsyncEngine.generate with a request id that is already in flight: the engine refuses it ('duplicate'), but
generate registered the new caller's queue under that id before asking, and drops it on the refusal -- so the live
request's stream loses its queue: its client never gets another event (it hangs) while the request runs on."""
import asyncio

from cluster.async_engine import AsyncEngine
from _hl import AdmissionError, check, done, engine, greedy, leftovers, prompt

eng, _ = engine(kv_cache_tokens=1024, max_model_len=512, max_num_seqs=4, max_num_batched_tokens=32)
aeng = AsyncEngine(eng)


async def main():
    first = aeng.generate(prompt(64, seed=1), greedy(40), "x")
    ev = await first.__anext__()
    got = list(ev.token_ids)
    try:
        second = aeng.generate(prompt(8, seed=2), greedy(4), "x")
        await second.__anext__()
        dup = None
    except AdmissionError as e:
        dup = e.reason
    check(dup == "duplicate", f"the second 'x' is refused: {dup}")
    try:
        async def rest():
            async for ev in first:
                got.extend(ev.token_ids)
                if ev.finished:
                    return ev.finish_reason
        reason = await asyncio.wait_for(rest(), 20)
    except asyncio.TimeoutError:
        reason = "hung"
        await first.aclose()
    check(reason == "length" and len(got) == 40, f"the first 'x' stream still ends: {reason}, {len(got)} of 40 tokens "
          f"(the engine generated {eng.stats['generated_tokens']})")

asyncio.run(main())
for _ in range(60):
    if not eng.has_work():
        break
    asyncio.run(asyncio.sleep(0.05))
aeng.shutdown()
check(not leftovers(eng) and not aeng._queues, f"nothing left {leftovers(eng)}, queues {list(aeng._queues)}")
done()
