"""MTP speculation and aborts through the real Coordinator. (a) One request with speculative_tokens 2: the spec
counters equal the engine's rounds; the ITL histogram's count vs tokens. (b) Two aborted requests, one by the client
leaving (the ingress's generator close) and one by ``Coordinator.abort`` (the ingress's close_streams / abort call):
both are aborts, so the e2e and length histograms ("finished requests") should treat them alike.
Exit 1 if the two aborts are counted differently (or a spec counter is off)."""
import asyncio

from _m import check, consume, coordinator, done, families, greedy, prompt, sample


async def part_a():
    c = coordinator(kv_cache_tokens=16 * 64, speculative_tokens=2)
    toks, last = await consume(c, prompt(30, 1), greedy(40), "spec")
    text = c.metrics.text()
    sm = c.engine.spec_metrics()
    print("(a) spec_metrics:", sm)
    prop, acc = sample(text, "glmserve_spec_drafts_proposed_total"), sample(text, "glmserve_spec_drafts_accepted_total")
    check(prop == sm["proposed"] and acc == sm["accepted"], f"(a) spec counters {prop}/{acc} == engine's")
    check(prop == 2 * sm["rounds"], f"(a) drafts proposed {prop} == 2 x rounds {sm['rounds']}")
    mal = sample(text, "glmserve_spec_mean_accepted_length")
    check(abs(mal - (acc + sm["rounds"]) / sm["rounds"]) < 1e-9, f"(a) mean accepted length {mal}")
    itl = sample(text, "glmserve_inter_token_latency_seconds_count")
    print(f"(a) {len(toks)} tokens streamed; ITL observations {itl} (one per event, a round's accepted tokens in one)")
    rates = {s.labels["position"]: s.value for s in families(text)["glmserve_spec_acceptance_rate"].samples}
    print("(a) acceptance_rate by position:", rates)
    names = {s.name for f in families(text).values() for s in f.samples}
    print("(a) spec series exported:", sorted(n for n in names if "spec" in n))
    c.aengine.shutdown()


async def part_b():
    c = coordinator(kv_cache_tokens=16 * 64)
    # client leaves after 3 tokens
    await consume(c, prompt(30, 2), greedy(200), "left", stop_after=3)
    # the server aborts it (Coordinator.abort, as the ingress's close_streams / its finally do) after 3 tokens
    got = []

    async def aborted():
        async for ev in c.generate(prompt(30, 3), greedy(200), "aborted"):
            got.append(ev)
            if sum(len(e.token_ids) for e in got) >= 3 and not ev.finished:
                await c.abort("aborted")
    await aborted()
    print("(b) the server-aborted request's last event:", got[-1].finish_reason, repr(got[-1].error))
    await asyncio.sleep(0.2)
    text = c.metrics.text()
    ab = sample(text, "glmserve_requests_total", finish_reason="abort")
    e2e = sample(text, "glmserve_e2e_request_latency_seconds_count")
    out_n = sample(text, "glmserve_request_generation_tokens_count")
    print(f"(b) requests_total{{abort}} {ab}; e2e count {e2e}; generation-tokens histogram count {out_n}")
    check(ab == 2, "(b) both aborts counted in requests_total{finish_reason=abort}")
    check(e2e in (0, 2) and out_n in (0, 2), f"(b) e2e / length histograms treat both aborts alike: e2e count {e2e}, "
                                             f"length count {out_n} (one abort in, one out)")
    c.aengine.shutdown()


asyncio.run(part_a())
asyncio.run(part_b())
done()
