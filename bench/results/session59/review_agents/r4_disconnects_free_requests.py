"""Check (right): a client that goes away frees its request at once — a stream closed mid-answer on each endpoint (chat,
Messages, Responses), a non-streamed request whose SDK timeout fires, 30 streams over the three endpoints cut at random
points (some run to the end), 24 requests cut before their first byte (inside their prefill). After each: /metrics shows
no running or waiting request, every KV block free, and nothing generated after the disconnect beyond a step or two."""

import asyncio
import random
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from _server import MODEL, metrics, server  # noqa: E402

import httpx2 as httpx  # noqa: E402

ROUTES = ("/v1/chat/completions", "/v1/messages", "/v1/responses")


def long_body(route: str, stream: bool, text: str = "hi", max_tokens: int = 1500) -> dict:
    if route == "/v1/responses":
        b = {"model": MODEL, "input": text, "max_output_tokens": max_tokens, "reasoning": {"effort": "none"}}
    else:
        b = {"model": MODEL, "messages": [{"role": "user", "content": text}], "max_tokens": max_tokens}
    return {**b, "stream": stream, "ignore_eos": True, "temperature": 0}


def settle(url: str, total_blocks: float, what: str, bad: list, gen0: float | None = None) -> None:
    t0 = time.time()
    while True:
        m = metrics(url)
        if (m["glmserve_running_requests"], m["glmserve_queue_depth"]) == (0, 0) or time.time() - t0 > 10:
            break
        time.sleep(0.1)
    waited = time.time() - t0
    time.sleep(1.0)
    m = metrics(url)
    state = (m["glmserve_running_requests"], m["glmserve_queue_depth"], m["glmserve_kv_free_blocks"])
    extra = "" if gen0 is None else f", generated {m['glmserve_generated_tokens_total'] - gen0:.0f} tokens in all"
    print(f"{what}: freed in {waited:.2f} s; running / waiting / free blocks {state} (total {total_blocks:.0f}){extra}")
    if state != (0, 0, total_blocks) or waited > 3:
        bad.append(what)


def main() -> int:
    bad: list[str] = []
    with server() as url:
        total = metrics(url)["glmserve_kv_free_blocks"]
        for route in ROUTES:                       # a stream closed after 5 events
            gen0 = metrics(url)["glmserve_generated_tokens_total"]
            with httpx.stream("POST", url + route, json=long_body(route, True), timeout=60) as r:
                n = 0
                for line in r.iter_lines():
                    n += line.startswith("data:")
                    if n >= 5:
                        break
            settle(url, total, f"{route} stream closed after 5 events", bad, gen0)
            if metrics(url)["glmserve_generated_tokens_total"] - gen0 > 100:
                bad.append(f"{route}: generation went on after the disconnect")
        from openai import APITimeoutError, OpenAI
        c = OpenAI(base_url=url + "/v1", api_key="x", max_retries=0, timeout=2.0)
        gen0 = metrics(url)["glmserve_generated_tokens_total"]
        try:
            c.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=1500,
                                      extra_body={"ignore_eos": True})
            bad.append("the 1500-token answer came within the 2 s timeout")
        except APITimeoutError:
            pass
        settle(url, total, "non-streamed chat, the SDK's 2 s timeout", bad, gen0)

        rng = random.Random(7)

        async def cut_stream(cl, i):
            route = ROUTES[i % 3]
            b = long_body(route, True, f"Request {i}: " + "word " * rng.randint(1, 60), rng.randint(20, 120))
            b.pop("ignore_eos")
            cut = None if rng.random() < 0.3 else rng.randint(1, 40)
            n = 0
            async with cl.stream("POST", url + route, json=b) as r:
                async for line in r.aiter_lines():
                    n += line.startswith("data:")
                    if cut is not None and n >= cut:
                        return "cut"
            return "done"

        async def cut_early(cl, i, delay):
            b = long_body(ROUTES[0], i % 2 == 0, f"{i} " + "long text " * 300, 200)
            try:
                await asyncio.wait_for(cl.post(url + ROUTES[0], json=b), delay)
                return "answered"
            except asyncio.TimeoutError:
                return "cut"

        async def bursts():
            async with httpx.AsyncClient(timeout=120) as cl:
                a = await asyncio.gather(*[cut_stream(cl, i) for i in range(30)])
            print(f"30 streams: {a.count('cut')} cut, {a.count('done')} to the end")
            settle(url, total, "30 streams cut at random", bad)
            async with httpx.AsyncClient(timeout=120) as cl:
                b = await asyncio.gather(*[cut_early(cl, i, rng.uniform(0.05, 1.5)) for i in range(24)])
            print(f"24 requests cut before their first byte: {b.count('cut')} cut, {b.count('answered')} answered")
            settle(url, total, "24 requests cut inside their prefill", bad)

        asyncio.run(bursts())
    print("FAILED: " + "; ".join(bad) if bad else "ok: every disconnect freed its request")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
