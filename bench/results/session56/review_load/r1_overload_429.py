"""Overload through the real ingress: 200 concurrent completion clients against max_num_seqs 4 + max_waiting 8.
Each answer must be a 200 whose tokens equal the prompt's greedy run alone, or a prompt 429 with a Retry-After; the
engine must never hold more than 12 requests and must end empty. Then clients that honour Retry-After (scaled down
x20) all get served."""
import asyncio
import json
import time

from _hl import check, done, engine, greedy, ingress, acall, leftovers, prompt, run

CFG = dict(kv_cache_tokens=2048, max_model_len=512, max_num_seqs=4, max_waiting=8, max_num_batched_tokens=64)
eng, _ = engine(**CFG)
PROMPTS = [prompt(16 + 23 * i, seed=100 + i) for i in range(10)]
MAXT = 8
ref_eng, _ = engine(kv_cache_tokens=2048, max_model_len=512)
REF = {i: run(ref_eng, {"a": (p, greedy(MAXT))})[0]["a"] for i, p in enumerate(PROMPTS)}

peak = [0]
orig_step = eng.step


def step():
    sch = eng.scheduler
    peak[0] = max(peak[0], sch.num_running + sch.num_waiting)
    return orig_step()


eng.step = step
ing = ingress(eng, CFG)


def body(i):
    return {"prompt": PROMPTS[i % len(PROMPTS)], "max_tokens": MAXT, "temperature": 0, "ignore_eos": True}


async def client(i, retry=False):
    t0 = time.perf_counter()
    tries = 0
    while True:
        tries += 1
        status, out = await acall(ing, "completions", body(i))
        if status == 429 and retry and tries < 200:
            await asyncio.sleep(float(out["headers"]["Retry-After"]) / 20)
            continue
        return i, status, out, time.perf_counter() - t0, tries


def judge(results, label):
    ok = wrong = bad_status = no_retry_after = 0
    slow429 = []
    for i, status, out, dt, _ in results:
        if status == 200:
            toks = out["choices"][0].get("token_ids")
            text_ok = out["choices"][0]["finish_reason"] == "length" and out["usage"]["completion_tokens"] == MAXT
            ok += 1
            if not text_ok:
                wrong += 1
        elif status == 429:
            if not (out["headers"] or {}).get("Retry-After"):
                no_retry_after += 1
            if dt > 1.0:
                slow429.append(round(dt, 2))
        else:
            bad_status += 1
            print("   unexpected", status, json.dumps(out)[:200])
    n429 = sum(s == 429 for _, s, *_ in results)
    print(f"   {label}: {ok} x 200, {n429} x 429, peak live {peak[0]}")
    check(bad_status == 0, f"{label}: every answer is 200 or 429 ({bad_status} others)")
    check(wrong == 0, f"{label}: every 200 finished 'length' with {MAXT} tokens ({wrong} not)")
    check(no_retry_after == 0, f"{label}: every 429 carries Retry-After ({no_retry_after} without)")
    check(not slow429, f"{label}: every 429 came within 1 s ({len(slow429)} slower: {slow429[:5]})")
    return ok, n429


async def tokens_equal():
    """The admitted requests' greedy text equals alone: compare via return_token_ids."""
    res = await asyncio.gather(*[acall(ing, "completions", {**body(i), "return_token_ids": True}) for i in range(40)])
    diff = [i for i, (s, o) in enumerate(res) if s == 200 and o["choices"][0].get("token_ids") not in (None, REF[i % 10])]
    served = [i for i, (s, o) in enumerate(res) if s == 200]
    have_ids = sum(1 for s, o in res if s == 200 and o["choices"][0].get("token_ids") is not None)
    print(f"   token check: {len(served)} served, {have_ids} with token_ids")
    check(not diff, f"served requests' tokens equal alone ({len(diff)} differ: {diff[:5]})")


async def main():
    res = await asyncio.gather(*[client(i) for i in range(200)])
    ok, n429 = judge(res, "200 at once")
    check(ok >= 12, f"at least max_num_seqs + max_waiting = 12 admitted ({ok})")
    check(peak[0] <= 12, f"the engine never held more than 12 requests (peak {peak[0]})")
    await asyncio.sleep(0.3)
    check(not leftovers(eng), f"engine empty after the burst: {leftovers(eng)}")
    await tokens_equal()
    res = await asyncio.gather(*[client(i, retry=True) for i in range(120)])
    ok, n429 = judge(res, "120 retrying")
    check(ok == 120, f"every retrying client was served in the end ({ok} of 120; max tries "
          f"{max(r[4] for r in res)})")
    await asyncio.sleep(0.3)
    check(not leftovers(eng) and not ing.aeng._queues, f"engine empty after retries: {leftovers(eng)}, "
          f"queues {len(ing.aeng._queues)}")

asyncio.run(main())
ing.aeng.shutdown()
done()
