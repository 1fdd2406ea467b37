"""The look-ahead path (cuda_graphs eager on CPU: the static decode path, slack 1) at the pool's and the context's
edges under preemption; budgets below a block with prompts that are multiples of the chunk; aborts of a preempted
request and of one mid-prefill while others run."""
import random

from _h3 import check, done, engine, greedy, prompt, run

rng = random.Random(5)
reqs = {f"r{i}": (prompt(p, seed=i), greedy(128 - p - rng.randrange(0, 3)))
        for i, p in enumerate(rng.randrange(40, 110) for _ in range(10))}
ref, _ = engine(kv_cache_tokens=4096, max_model_len=128, prefix_caching=False)
alone = {rid: run(ref, {rid: r})[0][rid] for rid, r in reqs.items()}

for name, kw in [("eager graphs + look-ahead, pool 8 blocks", dict(cuda_graphs="eager", kv_cache_tokens=128)),
                 ("eager graphs + look-ahead, pool 10 blocks, prefix cache off",
                  dict(cuda_graphs="eager", kv_cache_tokens=160, prefix_caching=False)),
                 ("budget 5, max_num_seqs 1", dict(kv_cache_tokens=160, max_num_batched_tokens=5, max_num_seqs=1)),
                 ("budget 1, max_num_seqs 1", dict(kv_cache_tokens=160, max_num_batched_tokens=1, max_num_seqs=1))]:
    eng, _ = engine(max_model_len=128, max_num_seqs=kw.pop("max_num_seqs", 6),
                    max_num_batched_tokens=kw.pop("max_num_batched_tokens", 48), **kw)
    sub = reqs if "budget" not in name else {k: reqs[k] for k in list(reqs)[:3]}
    try:
        out, ends, steps = run(eng, sub, max_steps=20000)
    except Exception as e:  # noqa: BLE001
        check(False, f"{name}: {type(e).__name__}: {e}")
        continue
    diff = [r for r in sub if out[r] != alone[r]]
    check(not diff, f"{name}: {steps} steps, {eng.stats['preemptions']} preemptions, {eng.stats['ahead_steps']} "
                    f"ahead steps, differing from alone: {diff}")
    check(eng.scheduler.pool.num_free == eng.scheduler.pool.num_blocks, f"{name}: pool whole")

# prompts of 80 (a multiple of the 16-token block and of a 40 / 80 token chunk)
for budget in (40, 80, 16):
    eng, _ = engine(kv_cache_tokens=512, max_model_len=128, max_num_batched_tokens=budget, max_num_seqs=4)
    ids = prompt(80, seed=80)
    a = run(ref, {"a": (ids, greedy(8))})[0]["a"]
    b = run(eng, {"a": (ids, greedy(8)), "b": (ids, greedy(8))})[0]
    check(b["a"] == a and b["b"] == a, f"prompt 80 at budget {budget}: equal to alone (both copies)")

# abort a preempted request (waiting again), and one mid-prefill, while others run
eng, _ = engine(kv_cache_tokens=128, max_model_len=128, max_num_batched_tokens=32, max_num_seqs=4,
                prefix_caching=False)
sub = {f"p{i}": (prompt(50, seed=100 + i), greedy(60)) for i in range(3)}
for rid, (ids, p) in sub.items():
    eng.add_request(ids, p, rid)
victim = None
for _ in range(400):
    eng.step()
    if eng.stats["preemptions"] and victim is None:
        victim = next((r.req_id for r in eng.scheduler.waiting() if r.num_preemptions), None)
        if victim:
            ev = eng.abort(victim)
            check(ev is not None and ev.finish_reason == "abort", f"abort of preempted {victim}")
    if not eng.has_work():
        break
check(victim is not None and not eng.has_work() and eng.scheduler.pool.num_free == 8,
      f"after aborting the preempted request the rest finished; pool whole ({eng.scheduler.pool.num_free}/8)")
done()
