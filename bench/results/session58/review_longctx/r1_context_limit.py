"""Requests at and near the context limit (prompt + max_tokens == max_model_len, prompts of max_model_len - 1, block
boundaries +-1) through the real engine at several prefill budgets == the tiny model's own greedy loop (no engine),
itself checked by one full recompute. Also: one past the limit is refused (not truncated). Exit 1 on any mismatch."""
import sys
sys.path.insert(0, __import__("os").path.dirname(__file__))
from common import *  # noqa
from scheduler.scheduler import AdmissionError

bad = []
SETS = {
    # max_model_len, kv_cache_tokens, cases (prompt_len, max_tokens)
    2048: (2048, [(2047, 1), (2046, 2), (2032, 16), (2031, 17), (2033, 15), (2017, 31), (2016, 32), (2015, 33)]),
    500: (512, [(499, 1), (496, 4), (480, 20), (481, 19), (479, 21), (464, 36)]),
}
BUDGETS = {2048: [512, 2048, 33, 17], 500: [512, 64, 16, 7]}
eng0, tok = engine()
for mml, (kv, cases) in SETS.items():
    prompts = {f"p{n}_{m}": ((text_prompt(tok, n, n) if i % 2 == 0 else prompt_ids(n, n)), m)
               for i, (n, m) in enumerate(cases)}
    refs = {}
    for rid, (p, m) in prompts.items():
        refs[rid] = ref_greedy(p, m)
        full, margin = full_recompute_check(p, refs[rid])
        if full != refs[rid]:
            log(f"note: reference {rid}: incremental != full recompute (margin {margin:.3g})")
        log(f"ref {rid}: {len(refs[rid])} tokens, min top1-top2 margin {margin:.3g}")
    for budget in BUDGETS[mml]:
        eng, _ = engine(max_model_len=mml, kv_cache_tokens=kv, max_num_batched_tokens=max(budget, 64) if budget >= 64
                        else budget, max_num_seqs=min(budget, 64))
        reqs = {rid: (p, SamplingParams(max_tokens=m, temperature=0.0, ignore_eos=True)) for rid, (p, m) in prompts.items()}
        t = time.time()
        out, reasons, errors = run(eng, reqs)
        sch = eng.scheduler
        for rid in reqs:
            if out[rid] != refs[rid] or errors.get(rid) or reasons[rid] != "length":
                bad.append((mml, budget, rid, reasons.get(rid), errors.get(rid)))
                log(f"MISMATCH mml={mml} budget={budget} {rid}: engine {out[rid][:8]}.. ({len(out[rid])}) vs ref "
                    f"{refs[rid][:8]}.. ({len(refs[rid])}) reason={reasons.get(rid)} err={errors.get(rid)}")
        free = sch.pool.num_free == sch.pool.num_blocks
        if not free:
            bad.append((mml, budget, "blocks", sch.pool.num_free, sch.pool.num_blocks))
        log(f"mml={mml} budget={budget}: {sum(out[r] == refs[r] for r in reqs)}/{len(reqs)} equal, "
            f"{eng.stats['steps']} steps, {time.time() - t:.1f}s, blocks free {sch.pool.num_free}/{sch.pool.num_blocks}")
        # one past the limit: refused with too_long, never truncated
        for n, m in ((mml, 1), (mml - 1, 2), (mml + 5, 1)):
            try:
                eng.add_request(prompt_ids(n, 1), SamplingParams(max_tokens=m, temperature=0.0), f"over{n}_{m}")
                bad.append((mml, budget, f"over{n}_{m}", "admitted"))
                log(f"over the limit admitted: {n}+{m}")
                eng.abort(f"over{n}_{m}")
            except AdmissionError as e:
                if e.reason != "too_long":
                    bad.append((mml, budget, f"over{n}_{m}", e.reason))
        del eng
finish(not bad, f"{bad}")
