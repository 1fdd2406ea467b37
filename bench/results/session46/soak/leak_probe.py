"""Follow-up to the soak: does the server processes' RSS grow with the request count? Phases of one request kind,
RSS of each process sampled every --every requests.

    python leak_probe.py --server-pid PID > leak_probe.log
"""

import argparse
import asyncio
import json
import random
import time

import aiohttp
import psutil

from soak import BASE, KEY_PROCS, parse_metrics, proc_label

BODIES = {
    "completion_1tok": ("/v1/completions", lambda: {"model": "tiny", "prompt": f"Number {random.randint(0, 10**9)} is",
                                                    "max_tokens": 1}),
    "chat_8tok": ("/v1/chat/completions", lambda: {"model": "tiny", "max_tokens": 8, "reasoning_effort": "none",
                                                   "messages": [{"role": "user", "content": f"hi {random.random()}"}]}),
    "bad_400": ("/v1/completions", lambda: {"model": "tiny", "prompt": "hi", "max_tokens": -1}),
    "disconnect": ("/v1/chat/completions", lambda: {"model": "tiny", "max_tokens": 64, "stream": True,
                                                    "ignore_eos": True,
                                                    "messages": [{"role": "user", "content": f"x {random.random()}"}]}),
}


def rss(pid):
    main = psutil.Process(pid)
    out = {}
    for p in [main] + main.children(recursive=True):
        try:
            lab = proc_label(p)
            out[lab] = out.get(lab, 0) + p.memory_info().rss / 2**20
        except psutil.Error:
            pass
    return out


async def one(sess, kind):
    ep, mk = BODIES[kind]
    async with sess.post(BASE + ep, json=mk(), timeout=aiohttp.ClientTimeout(total=60)) as r:
        if kind == "disconnect" and r.status == 200:
            async for _ in r.content:
                break
            r.close()
            return "disconnected"
        await r.read()
        return r.status


async def phase(sess, pid, kind, total, every, conc, log):
    done, statuses = 0, {}
    t0 = time.monotonic()
    while done < total:
        res = await asyncio.gather(*[one(sess, kind) for _ in range(min(every, total - done))][:every],
                                   return_exceptions=True) if conc >= every else None
        if res is None:
            sem = asyncio.Semaphore(conc)

            async def guarded():
                async with sem:
                    return await one(sess, kind)
            res = await asyncio.gather(*[guarded() for _ in range(min(every, total - done))], return_exceptions=True)
        for s in res:
            k = str(s) if not isinstance(s, BaseException) else type(s).__name__
            statuses[k] = statuses.get(k, 0) + 1
        done += len(res)
        async with sess.get(BASE + "/metrics") as r:
            m = parse_metrics(await r.text())
        row = {"phase": kind, "done": done, "t": round(time.monotonic() - t0, 1), "statuses": dict(statuses),
               "running": m.get("glmserve_running_requests"), "waiting": m.get("glmserve_queue_depth"),
               "rss": {k: round(v, 1) for k, v in rss(pid).items() if k in KEY_PROCS}}
        row["rss_total"] = round(sum(rss(pid).values()), 1)
        print(json.dumps(row), flush=True)
        log.append(row)


async def main(args):
    log = []
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as sess:
        for kind, total in [("completion_1tok", args.n), ("disconnect", args.n // 2), ("bad_400", args.n),
                            ("chat_8tok", args.n // 2), ("completion_1tok", args.n)]:
            await phase(sess, args.server_pid, kind, total, args.every, args.conc, log)
    with open(args.out, "w") as f:
        json.dump(log, f, indent=0)


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--server-pid", type=int, required=True)
    ap.add_argument("--n", type=int, default=3000)
    ap.add_argument("--every", type=int, default=500)
    ap.add_argument("--conc", type=int, default=8)
    ap.add_argument("--out", default="leak_probe.json")
    asyncio.run(main(ap.parse_args()))
