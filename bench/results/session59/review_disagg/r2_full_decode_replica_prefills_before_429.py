"""A decode replica that is full (``max_num_seqs`` running + ``max_waiting`` waiting) still sends every new long
prompt to the prefill tier, waits for its whole prefill and KV hand-off, and only then refuses it (429 queue_full).

Drivers: the real ``Coordinator`` code in-process (``harness.py``: decode replica + prefill replica on the tiny
model, the prefill in 16-token chunks), and a plain single-replica ``Coordinator`` with the same bounds for comparison.

Part 1: one request runs on the decode replica (max_num_seqs 1, max_waiting 0); a second request with a ~290-token
prompt arrives. A plain replica refuses it at once, computing nothing. The disaggregated app has the prefill tier
compute its whole prompt first (``kv_exported_tokens``), then refuses it.
Part 2 (the burst): the decode replica holds 1 running + 1 waiting; 6 more long prompts arrive together. Each is
prefilled on the prefill tier and then refused; the prefill tier's capacity goes to requests that can never run.

Exit 1 while the decode replica asks the prefill tier for requests it then refuses as full; 0 once it refuses them
before asking (as a plain replica does)."""

from __future__ import annotations

import asyncio
import sys
import time

sys.path.insert(0, "/work/main/bench/results/session59/review_disagg")
from harness import DEFAULT_MODEL, collect, counters, make_pair, plain, shutdown, tokens  # noqa: E402

from cluster.local import load_tokenizer  # noqa: E402
from scheduler.request import SamplingParams  # noqa: E402

TK = load_tokenizer(DEFAULT_MODEL)
STORY = "Once upon a time, in a quiet village by the sea, there lived a fisherman and his wife. "
RUNNING = SamplingParams(max_tokens=400, temperature=0.0, ignore_eos=True)
ASK = SamplingParams(max_tokens=8, temperature=0.0)


async def occupy(coord, n: int):
    """Start ``n`` long-running requests (short prompts: computed on the decode replica) and wait until they are in."""
    tasks = [asyncio.ensure_future(collect(coord, TK.encode(f"The old man {i}"), RUNNING, f"busy{i}"))
             for i in range(n)]
    for _ in range(200):
        c = counters(coord)
        if c["running"] + c["waiting"] >= n:
            break
        await asyncio.sleep(0.02)
    return tasks


async def one(coord, ids, rid, t0):
    evs = await collect(coord, ids, ASK, rid)
    last = evs[-1]
    what = f"refused ({last.refused.reason})" if last.refused is not None else f"{len(tokens(evs))} tokens"
    return what, time.monotonic() - t0


async def part1(coord, pre=None, tier=None):
    busy = await occupy(coord, 1)
    ids = TK.encode("[late] " + STORY * 4)
    before = pre.engine.stats["kv_exported_tokens"] if pre else 0
    t0 = time.monotonic()
    what, dt = await one(coord, ids, "late", t0)
    exported = (pre.engine.stats["kv_exported_tokens"] - before) if pre else 0
    asked = [c for c in tier.calls if c[0] == "late"] if tier else []
    for t in busy:
        t.cancel()
    await asyncio.gather(*busy, return_exceptions=True)
    return len(ids), what, dt, asked, exported


async def part2(coord, pre, tier):
    busy = await occupy(coord, 2)           # 1 running + 1 waiting: the replica is full
    before = pre.engine.stats["kv_exported_tokens"]
    t0 = time.monotonic()
    res = await asyncio.gather(*[one(coord, TK.encode(f"[burst {i}] " + STORY * 4), f"burst{i}", t0)
                                 for i in range(6)])
    exported = pre.engine.stats["kv_exported_tokens"] - before
    asked = [c for c in tier.calls if c[0].startswith("burst")]
    for t in busy:
        t.cancel()
    await asyncio.gather(*busy, return_exceptions=True)
    return res, asked, exported


def main() -> int:
    bounds = {"max_num_seqs": 1, "max_waiting": 0}
    ref = plain(bounds)
    n, what, dt, _, _ = asyncio.run(part1(ref))
    print(f"plain replica, full: a {n}-token prompt is {what} after {dt * 1e3:.0f} ms, nothing computed")
    shutdown(ref)

    dec, pre, tier = make_pair(decode=bounds, prefill={"max_num_batched_tokens": 16, "max_num_seqs": 16,
                                                       "max_waiting": 16})
    n, what, dt, asked, exported = asyncio.run(part1(dec, pre, tier))
    print(f"disaggregated, decode replica full: a {n}-token prompt is {what} after {dt * 1e3:.0f} ms; prefill tier "
          f"asked {len(asked)}x, computed and exported {exported} tokens of KV for it")
    wasted = bool(asked) or exported > 0
    shutdown(dec, pre)

    dec, pre, tier = make_pair(decode={"max_num_seqs": 1, "max_waiting": 1},
                               prefill={"max_num_batched_tokens": 16, "max_num_seqs": 16, "max_waiting": 16})
    res, asked, exported = asyncio.run(part2(dec, pre, tier))
    for i, (w, t) in enumerate(res):
        print(f"  burst{i}: {w} after {t * 1e3:.0f} ms")
    refused = sum(w.startswith("refused") for w, _ in res)
    print(f"burst of 6 at a full decode replica: {refused} refused; the prefill tier was asked {len(asked)}x and "
          f"exported {exported} tokens of KV for them")
    wasted = wasted or exported > 0
    print("decode replica counters after:", counters(dec), "prefill:", counters(pre))
    shutdown(dec, pre)
    print("RESULT:", "DEFECT: prompts of requests the full decode replica refuses are computed on the prefill tier "
          "first (their 429 waits for it)" if wasted else "ok: refused before asking the prefill tier")
    return 1 if wasted else 0


if __name__ == "__main__":
    sys.exit(main())
