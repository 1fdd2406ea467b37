"""Disaggregated prefill, in-process: a decode Coordinator whose prefill tier is a real prefill Coordinator
(``exports=True``; its ``prefill`` stream handed over as a Serve handle would, bundles passed without Ray). Both
replicas' texts are merged as the app's /metrics merges them (``metrics_hub.merge``; both kinds of replica leave their
text with the same app hub). Workload: 3 requests (60-token prompts, 5 tokens each), then one refused because the
prefill replica is full (the client's one 429). Compared with the truth, summed over the app's series (as a
dashboard's ``sum()`` does). Exit 1 if a series sums to more than the truth."""
import asyncio
import types

from _m import check, consume, coordinator, done, families, greedy, prompt, sample

from cluster.metrics_hub import merge


class Tier:
    """``prefill_tier.options(stream=True).prefill.remote(...)`` over a Coordinator in this process."""

    def __init__(self, coord):
        self.coord = coord

    def options(self, **_):
        return self

    @property
    def prefill(self):
        coord = self.coord

        def remote(*a):
            gen = coord.prefill(*a)
            return types.SimpleNamespace(__anext__=gen.__anext__, cancel=lambda: None, _gen=gen)
        return types.SimpleNamespace(remote=remote)


class Stream:
    def __init__(self, gen):
        self.gen = gen

    def __anext__(self):
        return self.gen.__anext__()

    def cancel(self):
        pass


Tier.prefill = property(lambda self: types.SimpleNamespace(remote=lambda *a: Stream(self.coord.prefill(*a))))


async def main():
    p = coordinator(kv_cache_tokens=16 * 64, max_num_seqs=1, max_waiting=0, ckw={"exports": True})
    d = coordinator(kv_cache_tokens=16 * 64, ckw={"prefill": Tier(p), "min_prefill_tokens": 16, "prefill_block": 16})
    p.replica_id, d.replica_id = "prefill-0", "decode-0"
    tokens = 0
    for i in range(3):
        toks, last = await consume(d, prompt(60, i), greedy(5), f"ok-{i}")
        assert last.finish_reason == "length" and not last.error, last
        tokens += len(toks)
    print("3 requests served; decode imported", d.engine.stats["kv_imported_tokens"], "prompt tokens' KV")
    # the prefill replica is full: one long prompt holds its only seat, the decode replica's request is refused
    import threading
    gate, orig = threading.Event(), p.engine.step
    p.engine.step = lambda: (gate.wait(), orig())[1]       # the prefill replica's loop pauses before its next step
    hold = asyncio.create_task(consume(p, prompt(200, 77), greedy(1), "p-hold"))
    await asyncio.sleep(0.2)
    evs = [ev async for ev in d.generate(prompt(60, 50), greedy(5), "refused")]
    print("the 4th request:", evs[-1].finish_reason, evs[-1].refused and evs[-1].refused.reason)
    gate.set()
    await hold
    text = merge({p.replica_id: p.metrics.text(), d.replica_id: d.metrics.text()})
    families(text)      # parses
    by = {}
    for f in families(text).values():
        for s in f.samples:
            by.setdefault(s.name, {}).setdefault(s.labels.get("replica"), 0.0)
            by[s.name][s.labels.get("replica")] += s.value
    for n in ("glmserve_refused_requests_total", "glmserve_prompt_tokens", "glmserve_requests_total",
              "glmserve_generated_tokens_total", "glmserve_prefix_cache_queried_tokens_total",
              "glmserve_prefix_cache_hit_tokens_total", "glmserve_kv_exported_tokens_total",
              "glmserve_kv_imported_tokens_total", "glmserve_time_to_first_token_seconds_count"):
        print(f"  {n}: {by.get(n)}")
    refused = sample(text, "glmserve_refused_requests_total")
    check(refused == 1, f"refused_requests_total summed over the app {refused} == 1 (one client 429)")
    pt = sample(text, "glmserve_prompt_tokens")
    truth = 3 * 60 + 200
    check(pt <= truth, f"prompt_tokens summed over the app {pt} <= prompts sent {truth} (the 3 served, the held one)")
    q = sample(text, "glmserve_prefix_cache_queried_tokens_total")
    check(q <= truth, f"prefix_cache_queried_tokens summed {q} <= {truth}")
    hit = sample(text, "glmserve_prefix_cache_hit_tokens_total")
    print(f"prefix cache 'hit' tokens {hit} for 4 distinct prompts (all imported KV counted as hits)")
    check(hit == 0, f"prefix cache hits {hit} == 0: no prompt repeated (the imported KV is counted as the cache's hits)")
    for c in (p, d):
        c.aengine.shutdown()


asyncio.run(main())
done()
