"""Many long requests at once in a small pool: every request finishes (no livelock), preemption's recompute gives the
same greedy tokens as alone, the pool is whole after; without / with prefix caching (a shared prefix), with a host
tier, with speculative decoding on (drafts ride when one request is left)."""
import random

from _h3 import check, done, engine, greedy, prompt, run

rng = random.Random(1)
shared = prompt(48, seed=999)
reqs = {}
for i in range(14):
    plen = rng.randrange(50, 100)
    ids = (shared + prompt(plen - 48, seed=i)) if i % 2 else prompt(plen, seed=i)
    reqs[f"r{i}"] = (ids, greedy(rng.randrange(8, 128 - plen + 1)))

ref, _ = engine(kv_cache_tokens=4096, max_model_len=128, prefix_caching=False)
alone = {rid: run(ref, {rid: r})[0][rid] for rid, r in reqs.items()}

for name, kw in [("no prefix cache", dict(prefix_caching=False)),
                 ("prefix cache", dict(prefix_caching=True)),
                 ("prefix cache + host tier", dict(prefix_caching=True, host_kv_cache_tokens=256)),
                 ("prefix cache, max_num_seqs 2, budget 16", dict(prefix_caching=True, max_num_seqs=2,
                                                                    max_num_batched_tokens=16)),
                 ("speculative 2", dict(prefix_caching=True, speculative_tokens=2)),
                 ("priority policy", dict(prefix_caching=True, scheduling_policy="priority"))]:
    eng, _ = engine(kv_cache_tokens=160, max_model_len=128, max_num_batched_tokens=kw.pop("max_num_batched_tokens", 64),
                    max_num_seqs=kw.pop("max_num_seqs", 8), **kw)
    try:
        out, ends, steps = run(eng, reqs, max_steps=4000)
    except Exception as e:  # noqa: BLE001
        check(False, f"{name}: {type(e).__name__}: {e}")
        continue
    diff = [r for r in reqs if out[r] != alone[r]]
    check(not diff, f"{name}: {len(reqs)} requests finished in {steps} steps, {eng.stats['preemptions']} preemptions, "
                    f"{eng.stats['moves']} moves; outputs differing from alone: {diff}")
    check(all(e == ("length", None) for e in ends.values()), f"{name}: every request ended by length")
    check(eng.stats["preemptions"] > 0, f"{name}: the pool was small enough to preempt")
    sch = eng.scheduler
    check(sch.pool.num_free == sch.pool.num_blocks and not eng.has_unfinished(), f"{name}: pool whole after")
done()
