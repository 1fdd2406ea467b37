"""Contention for a pool that holds exactly one full-context request (2048 tokens, max_model_len 2048): three requests
of 1900 + 148 (each needs the whole pool by its end; two share a 1600-token prefix) and four short ones arrive at once;
budget 64; with and without a host tier and MTP k = 2. Every request must finish (no livelock: bounded steps) with the
model's own greedy tokens; all blocks free. Exit 1 on a hang / mismatch."""
import sys
sys.path.insert(0, __import__("os").path.dirname(__file__))
from common import *  # noqa

bad = []
eng0, tok = engine()
pre = text_prompt(tok, 1600, 61)
reqs = {"L0": (pre + prompt_ids(300, 1), 148), "L1": (prompt_ids(1900, 2), 148), "L2": (pre + prompt_ids(300, 3), 148)}
reqs.update({f"s{i}": (prompt_ids(40 + 30 * i, 10 + i), 20) for i in range(4)})
refs = {r: ref_greedy(p, m) for r, (p, m) in reqs.items()}
log("refs done")
for host, k in ((0, 0), (4096, 0), (4096, 2)):
    eng, _ = engine(max_model_len=2048, kv_cache_tokens=2048, host_kv_cache_tokens=host, speculative_tokens=k,
                    max_num_batched_tokens=64, max_num_seqs=8)
    t = time.time()
    try:
        out, reasons, errors = run(eng, {r: (p, SamplingParams(max_tokens=m, temperature=0.0, ignore_eos=True))
                                         for r, (p, m) in reqs.items()}, max_steps=6000)
    except AssertionError as e:
        bad.append((host, k, "hang", str(e)))
        log(f"host={host} k={k}: HANG {e} steps {eng.stats['steps']} preemptions {eng.stats['preemptions']}")
        continue
    wrong = [r for r in reqs if out[r] != refs[r] or r in errors]
    sch = eng.scheduler
    log(f"host={host} k={k}: {time.time() - t:.1f}s steps {eng.stats['steps']} preemptions {eng.stats['preemptions']} "
        f"host_loads {sch.host_loads} wrong {wrong} free {sch.pool.num_free}/{sch.pool.num_blocks}")
    if wrong or sch.pool.num_free != sch.pool.num_blocks:
        bad.append((host, k, wrong))
finish(not bad, f"{bad}")
