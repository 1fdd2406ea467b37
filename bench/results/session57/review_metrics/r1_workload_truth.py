"""A scripted workload through the real Coordinator (in-process, one rank): finished, aborted, refused (400 / 429),
prefix-cache hits, preemption under a small pool. Then every /metrics series is compared with the truth counted here.
Exit 1 if any metric disagrees with the truth."""
import asyncio

from _m import check, consume, coordinator, done, families, greedy, prompt, sample

from scheduler.scheduler import AdmissionError

c = coordinator(kv_cache_tokens=16 * 20, block_size=16, max_num_seqs=4, max_waiting=2, max_num_batched_tokens=64,
                max_model_len=300)
eng = c.engine
truth = {"tokens": 0, "finished": {}, "ttft": 0, "itl": 0, "e2e": 0, "prompt_sum": 0, "out_sum": 0, "refused": {}}


def record(toks, last, plen, aborted=False):
    truth["tokens"] += len(toks)
    if toks:
        truth["ttft"] += 1


async def main():
    # 1) three finished requests, 40-token prompts, 8 tokens each
    for i in range(3):
        toks, last = await consume(c, prompt(40, i), greedy(8), f"fin-{i}")
        assert len(toks) == 8 and last.finish_reason == "length", (toks, last)
        truth["tokens"] += 8
        truth["finished"]["length"] = truth["finished"].get("length", 0) + 1
        truth["prompt_sum"] += 40
        truth["out_sum"] += 8
    # 2) the first prompt again: 32 of its tokens cached
    toks, last = await consume(c, prompt(40, 0), greedy(8), "hit-0")
    truth["tokens"] += 8
    truth["finished"]["length"] += 1
    truth["prompt_sum"] += 40
    truth["out_sum"] += 8
    print("hit request cached tokens:", getattr(last, "num_cached_tokens", None))
    # 3) a client that leaves after 3 tokens
    toks, last = await consume(c, prompt(30, 9), greedy(50), "abort-0", stop_after=3)
    truth["tokens"] += len(toks)
    truth["finished"]["abort"] = 1
    await asyncio.sleep(0.3)
    # 4) a 400: prompt beyond the context
    evs = [ev async for ev in c.generate(prompt(400, 5), greedy(4), "too-long")]
    print("too-long event:", evs[-1].finish_reason, evs[-1].refused and evs[-1].refused.reason)
    truth["refused"][evs[-1].refused.reason] = truth["refused"].get(evs[-1].refused.reason, 0) + 1
    # 5) 6 long requests at once (4 running + 2 waiting), a 7th refused (429); the pool (20 blocks) cannot hold 4 x
    # (40 + 60) tokens: preemption
    tasks = [asyncio.create_task(consume(c, prompt(40, 20 + i), greedy(60), f"load-{i}")) for i in range(6)]
    await asyncio.sleep(0.05)
    evs = [ev async for ev in c.generate(prompt(10, 99), greedy(4), "over")]
    print("over event:", evs[-1].finish_reason, evs[-1].refused and evs[-1].refused.reason)
    if evs[-1].refused is not None:
        truth["refused"][evs[-1].refused.reason] = truth["refused"].get(evs[-1].refused.reason, 0) + 1
    for t in tasks:
        toks, last = await t
        truth["tokens"] += len(toks)
        truth["finished"][last.finish_reason] = truth["finished"].get(last.finish_reason, 0) + 1
        if not last.error:
            truth["prompt_sum"] += 40
            truth["out_sum"] += len(toks)
    await asyncio.sleep(0.3)
    return c.metrics.text()


text = asyncio.run(main())

fam = families(text)
n_fin = sum(v for k, v in truth["finished"].items() if k != "abort")
n_all = sum(truth["finished"].values())
print("truth:", truth)
print("engine stats:", eng.stats)
check(sample(text, "glmserve_generated_tokens_total") == truth["tokens"],
      f"generated_tokens_total {sample(text, 'glmserve_generated_tokens_total')} == tokens streamed {truth['tokens']}")
check(eng.stats["generated_tokens"] == truth["tokens"],
      f"engine stats generated_tokens {eng.stats['generated_tokens']} == tokens streamed {truth['tokens']}")
for reason, n in truth["finished"].items():
    got = sample(text, "glmserve_requests_total", finish_reason=reason)
    check(got == n, f"requests_total{{finish_reason={reason}}} {got} == {n}")
for reason, n in truth["refused"].items():
    got = sample(text, "glmserve_refused_requests_total", reason=reason)
    check(got == n, f"refused_requests_total{{reason={reason}}} {got} == {n}")
ttft_n = sample(text, "glmserve_time_to_first_token_seconds_count")
check(ttft_n == n_all, f"TTFT count {ttft_n} == requests that got a first token {n_all}")
itl_n = sample(text, "glmserve_inter_token_latency_seconds_count")
check(itl_n == truth["tokens"] - n_all, f"ITL count {itl_n} == tokens - first tokens {truth['tokens'] - n_all}")
e2e_n = sample(text, "glmserve_e2e_request_latency_seconds_count")
check(e2e_n == n_fin, f"e2e count {e2e_n} == finished (not aborted) {n_fin}")
ps = sample(text, "glmserve_request_prompt_tokens_sum")
check(ps == truth["prompt_sum"], f"prompt tokens histogram sum {ps} == {truth['prompt_sum']}")
os_ = sample(text, "glmserve_request_generation_tokens_sum")
check(os_ == truth["out_sum"], f"generation tokens histogram sum {os_} == {truth['out_sum']}")
pre = sample(text, "glmserve_preemptions_total")
check(pre >= 1, f"preemptions_total {pre} >= 1 (the pool cannot hold the load)")
hit = sample(text, "glmserve_prefix_cache_hit_tokens_total")
check(hit >= 32, f"prefix_cache_hit_tokens_total {hit} >= 32")
for g in ("glmserve_queue_depth", "glmserve_running_requests", "glmserve_queued_prompt_tokens"):
    check(sample(text, g) == 0, f"{g} {sample(text, g)} == 0 when idle")
ku = sample(text, "glmserve_kv_usage")
fb = sample(text, "glmserve_kv_free_blocks")
print("idle kv_usage", ku, "free blocks", fb, "cached blocks", sample(text, "glmserve_prefix_cache_blocks"))
check(ku == 0, f"kv_usage {ku} == 0 when idle")
pt = sample(text, "glmserve_prompt_tokens")
check(pt == eng.stats["prompt_tokens"], f"prompt_tokens gauge {pt} == engine {eng.stats['prompt_tokens']}")
c.aengine.shutdown()
done()
