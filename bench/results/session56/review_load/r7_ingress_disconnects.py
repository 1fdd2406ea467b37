"""Clients that go away through the real ingress under load: completions (n=1 and n=2, streamed and not) whose
handler task is cancelled at random moments -- while queued for the first token, mid-answer -- and streamed ones
whose body iterator is closed after two chunks. Their requests must be aborted (not run to the end), the clients that
stay must get their greedy tokens alone, and the engine must end empty."""
import asyncio
import random

from _hl import FakeRequest, check, done, engine, greedy, ingress, leftovers, prompt, run

CFG = dict(kv_cache_tokens=1024, max_model_len=512, max_num_seqs=4, max_waiting=64, max_num_batched_tokens=32)
eng, _ = engine(**CFG)
ing = ingress(eng, CFG)
ref, _ = engine(kv_cache_tokens=4096, max_model_len=512, prefix_caching=False)
rng = random.Random(11)
P = [prompt(rng.randint(20, 150), seed=700 + i) for i in range(40)]
MAXT = 60
STAY = set(range(0, 40, 5))
REF = {i: run(ref, {"r": (P[i], greedy(MAXT))})[0]["r"] for i in STAY}
results, gen_before = {}, eng.stats["generated_tokens"]


async def client(i):
    n = 2 if i % 4 == 1 else 1
    stream = i % 3 == 2
    body = {"model": ing.model_name, "prompt": P[i], "max_tokens": MAXT, "temperature": 0, "ignore_eos": True,
            "n": n, "stream": stream, "return_token_ids": True}
    resp = await ing.completions(FakeRequest(body))
    if hasattr(resp, "body_iterator"):
        it = resp.body_iterator
        chunks = []
        async for c in it:
            chunks.append(c)
            if i not in STAY and len(chunks) >= 2:
                await it.aclose()          # the client closed the connection mid-stream
                return "left"
        return "streamed"
    import json
    results[i] = json.loads(resp.body)
    return "whole"


async def main():
    tasks = {i: asyncio.create_task(client(i)) for i in range(40)}
    for i in range(40):
        if i not in STAY and i % 3 != 2:
            await asyncio.sleep(rng.choice([0.0, 0.01, 0.05, 0.3]))
            tasks[i].cancel()
    out = await asyncio.wait_for(asyncio.gather(*tasks.values(), return_exceptions=True), 80)
    return dict(zip(tasks, out))

out = asyncio.run(main())
errors = {i: r for i, r in out.items() if isinstance(r, BaseException) and not isinstance(r, asyncio.CancelledError)}
check(not errors, f"no client failed otherwise ({ {i: type(r).__name__ + ': ' + str(r)[:80] for i, r in errors.items()} })")
for _ in range(100):
    if not eng.has_work() and not ing.aeng._queues:
        break
    asyncio.run(asyncio.sleep(0.05))
ing.aeng.shutdown()
wrong = [i for i in STAY if i in results and any(c.get("token_ids") != REF[i] for c in results[i]["choices"])]
check(all(i in results or out[i] == "streamed" for i in STAY), "every staying client was answered")
check(not wrong, f"staying clients' tokens equal alone ({wrong} differ)")
gen = eng.stats["generated_tokens"] - gen_before
full = 40 * MAXT + sum(MAXT for i in range(40) if i % 4 == 1)
print(f"   generated {gen} tokens of {full} that running every choice to the end would take")
check(gen < 0.6 * full, f"cancelled requests were aborted rather than run to the end ({gen} of {full} tokens)")
check(not leftovers(eng) and not ing.aeng._queues, f"nothing left {leftovers(eng)}, queues {len(ing.aeng._queues)}")
done()
