"""End-to-end HTTP benchmark: time to first token and tokens/s for 1 and 16 concurrent streaming clients.

    python bench/serve_cpu.py [--url http://127.0.0.1:8000]   # against a running `glmserve serve`
    python bench/serve_cpu.py --start [--num-workers 1] [--step-channel socket|ray]   # starts `glmserve serve`

Uses the official openai client (streaming completions, greedy, ignore_eos).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path


async def one(client, model: str, prompt: str, max_tokens: int) -> tuple[float, int, float]:
    t0 = time.perf_counter()
    ttft, n = None, 0
    stream = await client.completions.create(model=model, prompt=prompt, max_tokens=max_tokens, temperature=0,
                                             stream=True, extra_body={"ignore_eos": True})
    async for c in stream:
        if c.choices and c.choices[0].text and ttft is None:
            ttft = time.perf_counter() - t0
        n += 1 if c.choices and c.choices[0].text is not None else 0
    return ttft or 0.0, n, time.perf_counter() - t0


async def bench(url: str, concurrency: int, max_tokens: int) -> dict:
    import openai

    async with openai.AsyncOpenAI(base_url=url + "/v1", api_key="none", timeout=600, max_retries=0) as client:
        model = (await client.models.list()).data[0].id
        t0 = time.perf_counter()
        res = await asyncio.gather(*[one(client, model, f"Story {i}: the old man said", max_tokens)
                                     for i in range(concurrency)])
        wall = time.perf_counter() - t0
    toks = sum(n for _, n, _ in res)
    return {"c": concurrency, "ttft_ms": 1000 * sum(t for t, _, _ in res) / len(res), "tok_s": toks / wall,
            "per_client_tok_s": sum(n / d for _, n, d in res) / len(res)}


def wait_ready(url: str, timeout: float = 600) -> None:
    deadline = time.time() + timeout
    while time.time() < deadline:
        try:
            urllib.request.urlopen(url + "/v1/models", timeout=5)
            return
        except OSError:
            time.sleep(2)
    raise TimeoutError(f"{url} not ready after {timeout} s")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--url", default="http://127.0.0.1:8000")
    ap.add_argument("--start", action="store_true")
    ap.add_argument("--num-workers", type=int, default=1)
    ap.add_argument("--max-tokens", type=int, default=48)
    ap.add_argument("--step-channel", default="socket", choices=["socket", "ray"])
    ap.add_argument("--out", default=None, help="report file (default bench/results/serve_cpu.md, or "
                    "serve_cpu_<N>workers.md for N > 1 workers)")
    a = ap.parse_args()
    proc = None
    if a.start:
        port = a.url.rsplit(":", 1)[1]
        proc = subprocess.Popen([os.path.join(os.path.dirname(sys.executable), "glmserve"), "serve", "--port", port,
                                 "--num-workers", str(a.num_workers), "--step-channel", a.step_channel],
                                start_new_session=True)
    try:
        wait_ready(a.url)
        asyncio.run(bench(a.url, 1, 4))           # warm-up
        rows = [asyncio.run(bench(a.url, c, a.max_tokens)) for c in (1, 16)]
    finally:
        if proc:
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(120)
    lines = ["| concurrent clients | mean TTFT (ms) | total tokens/s | tokens/s per client |", "|---|---|---|---|"]
    lines += [f"| {r['c']} | {r['ttft_ms']:.0f} | {r['tok_s']:.1f} | {r['per_client_tok_s']:.1f} |" for r in rows]
    text = "\n".join(lines) + (f"\n\n{a.max_tokens} tokens per request, greedy, streaming, workers={a.num_workers}, "
                               f"step channel {a.step_channel}; "
                               f"{time.strftime('%Y-%m-%d %H:%M')}")
    print(text)
    out = Path(a.out or f"bench/results/serve_cpu{'' if a.num_workers == 1 else f'_{a.num_workers}workers'}.md")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(f"# HTTP serving on CPU (tiny model)\n\n`python bench/serve_cpu.py --start "
                           f"--num-workers {a.num_workers}`\n\n{text}\n")


if __name__ == "__main__":
    main()
