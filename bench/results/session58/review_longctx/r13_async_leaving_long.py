"""AsyncEngine (the HTTP path's engine loop) with long prompts (200..1900 tokens at max_model_len 2048, a 2048-token
pool + 2048-token host tier: preemptions and host loads), MTP k = 2, clients that read to the end or leave after 0 / 1
/ 3 events (mid-prefill or decoding): in 4 waves of 30 concurrent clients; after each, settled: the async engine's
queues, the engine's per-request maps, the runner's requests empty; all blocks free; live torch tensors and RSS do not
grow wave over wave after the first. Exit 1 on a leak / left-over / error."""
import asyncio
import gc
import random
import sys
sys.path.insert(0, __import__("os").path.dirname(__file__))
from common import *  # noqa
from cluster.async_engine import AsyncEngine
from scheduler.scheduler import AdmissionError


def rss_mb():
    return next(int(l.split()[1]) for l in open("/proc/self/status") if l.startswith("VmRSS")) / 1024


def tensors():
    gc.collect()
    import warnings
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return sum(1 for o in gc.get_objects() if isinstance(o, torch.Tensor))


eng, tok = engine(max_model_len=2048, kv_cache_tokens=2048, host_kv_cache_tokens=2048, speculative_tokens=2,
                  max_num_seqs=8, max_num_batched_tokens=256)
aeng = AsyncEngine(eng)
rng = random.Random(13)
shared = text_prompt(tok, 1024, 2)
bad, rows, errors = [], [], []
stats = {"read": 0, "left": 0, "refused": 0}


async def client(i):
    n = rng.randint(200, 1900)
    ids = shared + prompt_ids(n - 1024, i) if n > 1024 and rng.random() < 0.5 else prompt_ids(n, i)
    mt = min(rng.choice([1, 16, 48]), 2048 - len(ids))
    leave = rng.choice([None, None, 0, 1, 3])
    got = 0
    try:
        stream = aeng.generate(ids, SamplingParams(max_tokens=mt, temperature=0.0, ignore_eos=True), f"c{i}")
        try:
            async for ev in stream:
                if ev.error:
                    errors.append((i, ev.error))
                got += 1
                if leave is not None and got >= leave:
                    break
        finally:
            await stream.aclose()
        stats["left" if leave is not None else "read"] += 1
    except AdmissionError:
        stats["refused"] += 1


async def wave(w):
    await asyncio.gather(*(client(w * 30 + i) for i in range(30)))


try:
    for w in range(4):
        asyncio.run(wave(w))
        for _ in range(200):
            if not eng.has_work() and not aeng._queues:
                break
            time.sleep(0.05)
        sch, runner = eng.scheduler, eng.executor.runner
        row = dict(wave=w, rss=round(rss_mb(), 1), tensors=tensors(), queues=len(aeng._queues),
                   streams=len(eng._streams), rank_of=len(eng._rank_of), unsent=len(eng._unsent),
                   forget=sum(map(len, eng._forget)), runner=len(runner.requests), live=len(sch.live_ids()),
                   free=sch.pool.num_free, blocks=sch.pool.num_blocks, nodes=len(sch.pool._nodes),
                   preempt=eng.stats["preemptions"], host_loads=sch.host_loads, **stats)
        rows.append(row)
        log(row)
        if any(row[k] for k in ("queues", "streams", "rank_of", "unsent", "forget", "runner", "live")) or \
                row["free"] != row["blocks"]:
            bad.append(("left over", w))
        if time.time() - T0 > 170:
            break
finally:
    aeng.shutdown()
if len(rows) >= 3 and (rows[-1]["tensors"] - rows[1]["tensors"] > 20 or rows[-1]["rss"] - rows[1]["rss"] > 50):
    bad.append(("growth", rows[1]["tensors"], rows[-1]["tensors"], rows[1]["rss"], rows[-1]["rss"]))
if errors:
    bad.append(("errors", errors[:3]))
finish(not bad, f"{bad}")
