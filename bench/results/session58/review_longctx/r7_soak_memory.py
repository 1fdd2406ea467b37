"""A few hundred long requests (prompts 64..1000 tokens at max_model_len 1024, 40 % sharing a 512-token prefix) through
one engine whose KV pool (1536 tokens) preempts and evicts cached prefixes to a host tier (2048 tokens), with MTP k = 2
(drafts when a request runs alone), random aborts (waiting, mid-prompt, decoding) — in waves; after each wave the engine
is drained and we record RSS, live torch tensors (gc), the engine's / runner's per-request maps, the block pool's nodes,
host slots, kept/heap sizes. Exit 1 if any per-request map is non-empty after a drain, blocks are not all free, the pool's
nodes exceed device + host blocks, or live tensors / RSS grow wave over wave after the first (a leak)."""
import gc
import random
import sys
sys.path.insert(0, __import__("os").path.dirname(__file__))
from common import *  # noqa
from scheduler.scheduler import AdmissionError


def rss_mb():
    for line in open("/proc/self/status"):
        if line.startswith("VmRSS"):
            return int(line.split()[1]) / 1024


def tensors():
    gc.collect()
    return sum(1 for o in gc.get_objects() if isinstance(o, torch.Tensor))


eng, tok = engine(max_model_len=1024, kv_cache_tokens=1536, host_kv_cache_tokens=2048, speculative_tokens=2,
                  max_num_seqs=8, max_num_batched_tokens=256)
runner, sch = eng.executor.runner, eng.scheduler
pool = sch.pool
rng = random.Random(58)
shared = text_prompt(tok, 512, 1)
bad, rows = [], []
n = 0
errors = 0
counts = {'admitted': 0, 'refused': 0, 'aborted': 0, 'finished': 0, 'prompt_tokens': 0, 'out_tokens': 0}


def snapshot(wave):
    p = pool
    row = dict(wave=wave, reqs=n, rss=round(rss_mb(), 1), tensors=tensors(), streams=len(eng._streams),
               rank_of=len(eng._rank_of), unsent=len(eng._unsent), forget=sum(map(len, eng._forget)),
               guides=len(eng._guides), exports=len(eng._exports), runner_reqs=len(runner.requests),
               live=len(sch.live_ids()), free=p.num_free, blocks=p.num_blocks, nodes=len(p._nodes),
               keys=len(p._node_of_key), host_lru=len(p._host_lru), host_free=len(p._host_free), kept=len(p._kept),
               heap=len(p._kept_heap), keeps=len(p._keeps), pins=len(p._pins), idle=len(p._idle),
               preempt=eng.stats["preemptions"], drafts=eng.stats["drafts_accepted"], host_loads=sch.host_loads, **counts)
    rows.append(row)
    log(row)
    return row


WAVES, PER_WAVE = 8, 50
for wave in range(WAVES):
    live = set()
    for step in range(100000):
        if n < (wave + 1) * PER_WAVE and (step % 3 == 0 or not live) and rng.random() < 0.8:
            plen = rng.randint(64, 1000)
            ids = (shared + prompt_ids(max(1, plen - 512), n) if rng.random() < 0.4 and plen > 512
                   else text_prompt(tok, plen, n) if rng.random() < 0.5 else prompt_ids(plen, n))
            mt = min(rng.choice([1, 8, 32, 64]), 1024 - len(ids))
            params = SamplingParams(max_tokens=mt, temperature=rng.choice([0.0, 0.8]), seed=rng.choice([None, 3]),
                                    ignore_eos=rng.random() < 0.5)
            try:
                eng.add_request(ids, params, f"q{n}")
                live.add(f"q{n}")
                counts['admitted'] += 1
                counts['prompt_tokens'] += len(ids)
            except AdmissionError:
                counts['refused'] += 1
            n += 1
        if live and rng.random() < 0.06:
            rid = rng.choice(sorted(live))
            if eng.abort(rid) is not None:
                live.discard(rid)
                counts['aborted'] += 1
        for ev in eng.step():
            if ev.error:
                errors += 1
                log("error", ev.req_id, ev.error)
            counts['out_tokens'] += len(ev.token_ids)
            if ev.finished:
                live.discard(ev.req_id)
                counts['finished'] += 1
        if n >= (wave + 1) * PER_WAVE and not live and not eng.has_work():
            break
    r = snapshot(wave)
    for key in ("streams", "rank_of", "unsent", "forget", "guides", "exports", "runner_reqs", "live", "kept", "keeps",
                "pins"):
        if r[key]:
            bad.append((wave, key, r[key]))
    if r["free"] != r["blocks"] or r["nodes"] > r["blocks"] + 128 or r["nodes"] != r["keys"]:
        bad.append((wave, "pool", r["free"], r["nodes"], r["keys"]))
    if time.time() - T0 > 200:
        log("time budget reached")
        break
if len(rows) >= 3:
    t_growth = rows[-1]["tensors"] - rows[1]["tensors"]
    rss_growth = rows[-1]["rss"] - rows[1]["rss"]
    log(f"after wave 1 -> last: tensors {t_growth:+d}, RSS {rss_growth:+.1f} MB over {rows[-1]['reqs'] - rows[1]['reqs']} "
        "requests")
    if t_growth > 20:
        bad.append(("tensor growth", t_growth))
    if rss_growth > 50:
        bad.append(("rss growth MB", rss_growth))
if errors:
    bad.append(("errors", errors))
if not eng.stats["preemptions"] or not sch.host_loads:
    bad.append(("workload did not preempt / load from host", eng.stats["preemptions"], sch.host_loads))
finish(not bad, f"{bad}")
