"""r1: with two Coordinator replicas, prompts sharing a long head (a system prompt) all go to one replica once Serve's
cached queue length of the other has gone stale (10 s without a request there): PrefixAffinity's imbalance bound
(routing.py IMBALANCE = 8) never trips, and the second replica idles while the first holds every request.

Exit 1 while a burst of 32 concurrent requests sharing a 281-token head, sent after 12 s without traffic, lands on
one replica; 0 when the load spreads (the other replica takes some, as deploy/README.md promises: "unless that replica
holds 8 more requests than the least busy")."""
import asyncio
import collections
import sys
import time

import _common as c

HEAD = ("And it came to pass in those days, that there went out a decree from Caesar Augustus, that all the world "
        "should be taxed. ") * 8          # 281 tokens: two 128-token spans the router knows the prompt by
N = 32


async def burst(base: str, tag: str) -> collections.Counter:
    import openai

    client = openai.AsyncOpenAI(base_url=base + "/v1", api_key="none", max_retries=0, timeout=300)
    outs = await asyncio.gather(*[client.completions.create(model="tiny", prompt=HEAD + f" {tag} question {i}:",
                                                            max_tokens=48, temperature=0) for i in range(N)])
    await client.close()
    return collections.Counter(o.system_fingerprint for o in outs)


def main() -> int:
    ray, serve, base = c.start_ray()
    try:
        from cluster.serve import build_app

        serve.run(build_app({"device": "cpu", "kv_cache_tokens": 8192, "num_replicas": 2, "max_num_seqs": 64,
                             "max_num_batched_tokens": 512}),
                  name="op", route_prefix="/", logging_config={"enable_access_log": False, "log_level": "WARNING"})
        c.wait_ready(base)
        # the head once (it is now cached on one replica and the router remembers where)
        status, body = c.post(base, "/v1/completions", {"model": "tiny", "prompt": HEAD + " first:", "max_tokens": 2})
        print("first request served by", body.get("system_fingerprint"), status)
        time.sleep(12)      # a lull: Serve's queue-length cache entries are 10 s fresh (RAY_SERVE_QUEUE_LENGTH_CACHE_TIMEOUT_S)
        t0 = time.time()
        served = asyncio.run(burst(base, "A"))
        print(f"burst of {N} concurrent requests sharing the head, after 12 s idle: by replica {dict(served)} "
              f"({time.time() - t0:.1f} s)")
        ok = len(served) == 2 and min(served.values()) >= 1
        # control: short prompts (no prefix key: Serve's two random choices, which probe both replicas and refresh the
        # cache), then at once the same kind of burst — the bound now trips and the load spreads
        async def refresh():
            import openai

            client = openai.AsyncOpenAI(base_url=base + "/v1", api_key="none", max_retries=0, timeout=300)
            await asyncio.gather(*[client.completions.create(model="tiny", prompt=f"p{i}", max_tokens=1)
                                   for i in range(8)])
            await client.close()

        asyncio.run(refresh())
        control = asyncio.run(burst(base, "B"))
        print(f"control — the same burst right after 8 short requests probed both replicas: by replica {dict(control)}")
        print("spread over both replicas" if ok else
              "DEFECT: every request went to one replica; the other stayed idle")
        return 0 if ok else 1
    finally:
        c.stop_ray()


if __name__ == "__main__":
    sys.exit(main())
