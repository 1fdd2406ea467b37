"""The static-shape path (``cuda_graphs: eager`` on CPU: graph-shaped decode / verify steps with padded block-table
widths, per-layer pieces for prompt chunks, look-ahead steps that write one position on) at the context limit:
max_model_len 2048 = max_position_embeddings, a pool of exactly 2048 tokens; requests ending exactly at the limit, at
block boundaries +-1, batched and alone, k = 0 and k = 1..3, budgets 512 / 33. Tokens == the model's own greedy loop;
all blocks free. Exit 1 on a mismatch / error / crash."""
import sys
import traceback
sys.path.insert(0, __import__("os").path.dirname(__file__))
from common import *  # noqa

bad = []
eng0, tok = engine()
cases = [(2047, 1), (2046, 2), (2032, 16), (2031, 17), (2033, 15), (2016, 32), (1985, 63)]
prompts = {f"p{n}_{m}": ((text_prompt(tok, n, 3 * n) if i % 2 == 0 else prompt_ids(n, 3 * n)), m)
           for i, (n, m) in enumerate(cases)}
refs = {rid: ref_greedy(p, m) for rid, (p, m) in prompts.items()}
# a batch of shorter ones that fill the pool together (look-ahead over several rows)
batch = {f"b{i}": (prompt_ids(480 + i, 50 + i), 32 - i) for i in range(4)}
brefs = {rid: ref_greedy(p, m) for rid, (p, m) in batch.items()}
log("refs done")
for k, budget in ((0, 512), (0, 33), (1, 512), (3, 512), (3, 33)):
    try:
        eng, _ = engine(max_model_len=2048, kv_cache_tokens=2048, speculative_tokens=k, max_num_batched_tokens=budget,
                        max_num_seqs=min(budget, 16), cuda_graphs="eager")
        t = time.time()
        for rid, (p, m) in prompts.items():
            out, reasons, errors = run(eng, {rid: (p, SamplingParams(max_tokens=m, temperature=0.0, ignore_eos=True))})
            if out[rid] != refs[rid] or errors or reasons[rid] != "length":
                bad.append((k, budget, rid, errors))
                log(f"MISMATCH k={k} budget={budget} {rid}: {out[rid][:6]}.. vs {refs[rid][:6]}.. {reasons} {errors}")
        out, reasons, errors = run(eng, {r: (p, SamplingParams(max_tokens=m, temperature=0.0, ignore_eos=True))
                                         for r, (p, m) in batch.items()})
        for r in batch:
            if out[r] != brefs[r] or r in errors:
                bad.append((k, budget, r, errors.get(r)))
                log(f"MISMATCH batch k={k} budget={budget} {r}")
        sch, st = eng.scheduler, eng.stats
        log(f"k={k} budget={budget}: {time.time() - t:.1f}s steps {st['steps']} graph_steps {st['graph_steps']} "
            f"ahead {st['ahead_steps']} accepted {st['drafts_accepted']} free {sch.pool.num_free}/{sch.pool.num_blocks}")
        if sch.pool.num_free != sch.pool.num_blocks or not st["graph_steps"]:
            bad.append((k, budget, "blocks/graph steps", sch.pool.num_free, st["graph_steps"]))
    except Exception as e:  # noqa: BLE001
        traceback.print_exc()
        bad.append((k, budget, "crash", repr(e)[:200]))
finish(not bad, f"{bad}")
