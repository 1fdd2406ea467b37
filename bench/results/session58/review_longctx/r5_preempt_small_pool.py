"""Preemption (by recompute) under a KV pool of exactly max_model_len (1024 tokens, 64 blocks) with several long
requests at once, some ending exactly at max_model_len: tokens == the model's own greedy loop, preemptions happened,
all blocks free; with and without a host tier, with MTP k = 2 (drafts ride only alone) and a small budget.
Exit 1 on a mismatch / error / no preemption / blocks not free."""
import sys
sys.path.insert(0, __import__("os").path.dirname(__file__))
from common import *  # noqa

bad = []
eng0, tok = engine()
shared = text_prompt(tok, 400, 11)
cases = {"a": (text_prompt(tok, 1000, 1), 24), "b": (prompt_ids(600, 2), 200), "c": (shared + prompt_ids(300, 3), 150),
         "d": (shared + prompt_ids(223, 4), 401), "e": (prompt_ids(1023, 5), 1), "f": (text_prompt(tok, 300, 6), 300)}
refs = {r: ref_greedy(p, n) for r, (p, n) in cases.items()}
log("refs done")
for k, budget, host in ((0, 256, 0), (0, 64, 2048), (2, 256, 2048)):
    eng, _ = engine(max_model_len=1024, kv_cache_tokens=1024, host_kv_cache_tokens=host, speculative_tokens=k,
                    max_num_batched_tokens=budget, max_num_seqs=8)
    t = time.time()
    out, reasons, errors = run(eng, {r: (p, SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True))
                                     for r, (p, n) in cases.items()})
    for r in cases:
        if out[r] != refs[r] or r in errors or reasons[r] != "length":
            bad.append((k, budget, host, r, errors.get(r)))
            log(f"MISMATCH k={k} budget={budget} host={host} {r}: len {len(out[r])} vs {len(refs[r])} first diff "
                f"{next((i for i, (a, b) in enumerate(zip(out[r], refs[r])) if a != b), None)} {errors.get(r)}")
    sch = eng.scheduler
    log(f"k={k} budget={budget} host={host}: {time.time() - t:.1f}s steps {eng.stats['steps']} preemptions "
        f"{eng.stats['preemptions']} drafts accepted {eng.stats['drafts_accepted']} host_loads {sch.host_loads} "
        f"free {sch.pool.num_free}/{sch.pool.num_blocks}")
    if eng.stats["preemptions"] == 0 or sch.pool.num_free != sch.pool.num_blocks:
        bad.append((k, budget, host, "preemptions/blocks", eng.stats["preemptions"], sch.pool.num_free))
finish(not bad, f"{bad}")
