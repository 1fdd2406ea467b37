"""Speculative decoding (MTP, speculative_tokens 1..3) on requests that end exactly at max_model_len (= the model's
max_position_embeddings, 2048) with a KV pool of exactly max_model_len tokens: drafts proposed in the last rounds
reach past the context end. Tokens must equal the model's own greedy loop; drafts must have been proposed and
accepted; all blocks free. Exit 1 on any mismatch / error."""
import sys
sys.path.insert(0, __import__("os").path.dirname(__file__))
from common import *  # noqa

bad = []
eng0, tok = engine()
cases = [(2047, 1), (2046, 2), (2040, 8), (2030, 18), (2016, 32), (1985, 63)]
prompts = {f"p{n}_{m}": ((text_prompt(tok, n, 7 + n) if i % 2 == 0 else prompt_ids(n, 7 + n)), m)
           for i, (n, m) in enumerate(cases)}
refs = {rid: ref_greedy(p, m) for rid, (p, m) in prompts.items()}
log("refs done")
for k, budget in ((1, 512), (2, 512), (3, 512), (3, 33)):
    eng, _ = engine(max_model_len=2048, kv_cache_tokens=2048, speculative_tokens=k, max_num_batched_tokens=budget,
                    max_num_seqs=min(budget, 64))
    t = time.time()
    for rid, (p, m) in prompts.items():      # alone: drafts ride only while one request is active
        out, reasons, errors = run(eng, {rid: (p, SamplingParams(max_tokens=m, temperature=0.0, ignore_eos=True))})
        if out[rid] != refs[rid] or errors or reasons[rid] != "length":
            bad.append((k, budget, rid, errors))
            log(f"MISMATCH k={k} {rid}: {out[rid]} vs {refs[rid]} {reasons} {errors}")
    sch = eng.scheduler
    st = eng.stats
    log(f"k={k} budget={budget}: rounds {st['draft_rounds']} proposed {st['drafts_proposed']} accepted "
        f"{st['drafts_accepted']} steps {st['steps']} {time.time() - t:.1f}s free {sch.pool.num_free}/{sch.pool.num_blocks}")
    if sch.pool.num_free != sch.pool.num_blocks or st["drafts_accepted"] == 0:
        bad.append((k, "blocks or no acceptance", sch.pool.num_free, st["drafts_accepted"]))
    # also EOS-stopping requests with a longer max_tokens (drafts past an EOS): text prompts
    for n in (2000, 2024):
        p = text_prompt(tok, n, 99 + n)
        m = 2048 - n
        ref = ref_greedy(p, m, eos=set(eng.config.eos_token_ids))
        out, reasons, errors = run(eng, {"e": (p, SamplingParams(max_tokens=m, temperature=0.0))})
        if out["e"] != ref or errors:
            bad.append((k, "eos", n, errors))
            log(f"MISMATCH eos k={k} n={n}: {out['e']} vs {ref}")
    if sch.pool.num_free != sch.pool.num_blocks:
        bad.append((k, "blocks after eos", sch.pool.num_free))
finish(not bad, f"{bad}")
