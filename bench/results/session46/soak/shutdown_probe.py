"""End of the soak: SIGINT with streams in flight — they must finish whole, new requests get 503, the process exits."""
import asyncio, json, os, signal, sys, time
import aiohttp, psutil

BASE = "http://127.0.0.1:8011"
pid = int(sys.argv[1])
tree = [p.pid for p in [psutil.Process(pid)] + psutil.Process(pid).children(recursive=True)]

async def stream(sess, i):
    body = {"model": "tiny", "max_tokens": 200, "ignore_eos": True, "stream": True,
            "stream_options": {"include_usage": True}, "messages": [{"role": "user", "content": f"story {i}"}],
            "reasoning_effort": "none"}
    t0 = time.monotonic()
    async with sess.post(BASE + "/v1/chat/completions", json=body) as r:
        datas = [l.decode().strip()[6:] async for l in r.content if l.startswith(b"data: ")]
    usage = json.loads(datas[-2]).get("usage") if len(datas) > 1 and datas[-1] == "[DONE]" else None
    return {"i": i, "status": r.status, "done": datas[-1:] == ["[DONE]"], "usage": usage,
            "last": datas[-2][:200] if len(datas) > 1 else datas, "s": round(time.monotonic() - t0, 2)}

async def main():
    async with aiohttp.ClientSession() as sess:
        tasks = [asyncio.create_task(stream(sess, i)) for i in range(6)]
        await asyncio.sleep(1.0)
        os.kill(pid, signal.SIGINT)
        t_sig = time.monotonic()
        await asyncio.sleep(1.0)
        try:
            async with sess.get(BASE + "/health") as r:
                print("health after SIGINT:", r.status, (await r.text())[:200])
            async with sess.post(BASE + "/v1/completions", json={"model": "tiny", "prompt": "x", "max_tokens": 2}) as r:
                print("new request after SIGINT:", r.status, r.headers.get("Retry-After"), (await r.text())[:200])
        except Exception as e:
            print("probe after SIGINT failed:", type(e).__name__, e)
        for res in await asyncio.gather(*tasks, return_exceptions=True):
            print("in-flight stream:", res if not isinstance(res, BaseException) else repr(res))
    for _ in range(120):
        if not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE:
            break
        time.sleep(0.5)
    print(f"main process gone {time.monotonic() - t_sig:.1f} s after SIGINT:", not psutil.pid_exists(pid))
    time.sleep(3)
    left = [p for p in tree if psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE]
    print("processes of the server's tree still alive:", [(p, " ".join(psutil.Process(p).cmdline())[:80]) for p in left])

asyncio.run(main())
