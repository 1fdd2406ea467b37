"""The periodic stats line (``stats_line`` over two ``Coordinator.info()`` readings, as ``_log_stats`` and
``glmserve serve`` take them). (a) A higher-priority request displacing a queued one in an interval: the prompt rate
goes negative. (b) Six prompts queued at once behind max_num_seqs 1: every prompt token is counted in the interval
they were admitted, none in the intervals their prefills actually ran. Exit 1 if either is observed."""
import asyncio
import time

from _m import check, consume, coordinator, done, greedy, prompt

from cluster.coordinator import stats_line


async def reading(c):
    return time.monotonic(), await c.info()


async def part_a():
    c = coordinator(kv_cache_tokens=16 * 64, max_num_seqs=1, max_waiting=1, scheduling_policy="priority")
    running = asyncio.create_task(consume(c, prompt(20, 1), greedy(400, priority=0), "run"))
    await asyncio.sleep(0.3)
    low = asyncio.create_task(consume(c, prompt(200, 2), greedy(4, priority=5), "low-long"))
    await asyncio.sleep(0.3)
    t0, i0 = await reading(c)
    before = (t0, i0["stats"])
    await asyncio.sleep(0.5)
    high = asyncio.create_task(consume(c, prompt(10, 3), greedy(4, priority=0), "high-short"))
    await asyncio.sleep(0.5)
    t1, i1 = await reading(c)
    line = stats_line(before, t1, i1)
    print("(a) interval line:", line)
    print("    low-long's end:", (await low) if low.done() else "still waiting")
    rate = float(line.split("prompt ")[1].split(" tokens/s")[0])
    check(rate >= 0, f"(a) prompt rate over an interval is not negative: {rate}")
    c.aengine.abort("run")
    await asyncio.gather(running, high, low, return_exceptions=True)
    c.aengine.shutdown()


async def part_b():
    c = coordinator(kv_cache_tokens=16 * 64, max_num_seqs=1, max_waiting=8)
    t, info = await reading(c)
    before, lines = (t, info["stats"]), []
    prefilled_at = {}

    async def one(i):
        gen = c.generate(prompt(60, 10 + i), greedy(40), f"q{i}")
        async for ev in gen:
            if ev.token_ids and i not in prefilled_at:
                prefilled_at[i] = len(lines)        # the interval its prompt was computed in
    tasks = [asyncio.create_task(one(i)) for i in range(6)]
    while not all(t.done() for t in tasks):
        await asyncio.sleep(0.4)
        t, info = await reading(c)
        line = stats_line(before, t, info)
        lines.append(line)
        before = (t, info["stats"])
    for k, ln in enumerate(lines):
        print(f"(b) interval {k}: {ln}")
    print("(b) interval in which each prompt got its first token:", prefilled_at)
    later = [k for k in prefilled_at.values() if k > 0]
    zero_then = [k for k in later if lines[k] and lines[k].startswith("prompt 0.0 tokens/s")]
    check(not zero_then, f"(b) intervals where queued prompts were computed but the line says 'prompt 0.0 "
                         f"tokens/s': {sorted(set(zero_then))}")
    c.aengine.shutdown()


asyncio.run(part_a())
asyncio.run(part_b())
done()
