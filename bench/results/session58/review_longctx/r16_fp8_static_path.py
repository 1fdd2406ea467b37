"""(r4 on the static path, cuda_graphs: eager) kv_cache_dtype fp8 at long contexts (max_model_len 2048, prompts to the limit), chunked (512 / 33), with MTP k = 3
and with prefix caching + a host tier: the engine's tokens == the model's own greedy loop whose cache store rounds its
MLA rows and indexer keys as the packed FP8 rows hold them (tests/integration/test_kv_fp8_engine.py's rounded store),
and != the unrounded model on at least one request (fp8 really on). Exit 1 on any mismatch / error."""
import sys
sys.path.insert(0, __import__("os").path.dirname(__file__))
from common import *  # noqa
from glmkernels import ops, reference
from glmkernels.reference import kv_fp8_pack, kv_fp8_unpack

m = ref_model()
rkv, idd = m.config.kv_lora_rank, m.config.index_head_dim


def store(x, weight, bias, eps, n_norm, cos, sin, rope_at, interleaved, cache, slots, also=()):
    reference.norm_rope_store(x, weight, bias, eps, n_norm, cos, sin, rope_at, interleaved, cache, slots, also)
    keys = [r.cache for r in also if r.at_slots]
    for c, n in [(cache, rkv)] + [(k, idd) for k in keys]:
        rows = c[slots]
        c[slots] = kv_fp8_unpack(kv_fp8_pack(rows, n), n, rows.shape[1] - n, rows.dtype)


bad = []
eng0, tok = engine()
prefix = text_prompt(tok, 1500, 3)
cases = {"a": (text_prompt(tok, 2047, 1), 1), "b": (prompt_ids(2016, 2), 32), "c": (text_prompt(tok, 1990, 4), 58),
         "d": (prefix + prompt_ids(300, 8), 40), "e": (prompt_ids(1900, 9), 20), "f": (prefix + prompt_ids(17, 10), 64)}
plain = {r: ref_greedy(p, n) for r, (p, n) in cases.items()}
ops.configure("reference", "cpu", {})
saved = ops._active["norm_rope_store"]
ops._active["norm_rope_store"] = store
rounded = {r: ref_greedy(p, n) for r, (p, n) in cases.items()}
ops._active["norm_rope_store"] = saved
log("refs:", {r: sum(a != b for a, b in zip(plain[r], rounded[r])) for r in cases}, "positions differ fp32 vs rounded")
for k, budget in ((0, 512), (0, 33), (3, 512)):
    eng, _ = engine(max_model_len=2048, kv_cache_tokens=2048, host_kv_cache_tokens=4096, kv_cache_dtype="fp8",
                    speculative_tokens=k, max_num_batched_tokens=budget, max_num_seqs=min(budget, 64), cuda_graphs="eager")
    assert ops._active["norm_rope_store"] is saved
    t = time.time()
    for rid, (p, n) in cases.items():
        out, reasons, errors = run(eng, {rid: (p, SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True))})
        if out[rid] != rounded[rid] or errors:
            bad.append((k, budget, rid, errors))
            log(f"MISMATCH k={k} budget={budget} {rid}: first diff at "
                f"{next((i for i, (a, b) in enumerate(zip(out[rid], rounded[rid])) if a != b), None)} {errors}")
    sch = eng.scheduler
    log(f"k={k} budget={budget}: {time.time() - t:.1f}s host_loads {sch.host_loads} hits {eng.prefix_cache_tokens()} "
        f"accepted {eng.stats['drafts_accepted']} free {sch.pool.num_free}/{sch.pool.num_blocks} "
        f"cache dtype {eng.executor.runner.cache.kv[0].dtype}")
    if sch.pool.num_free != sch.pool.num_blocks:
        bad.append((k, budget, "blocks"))
if plain == rounded:
    bad.append("fp8 rounding changed no token: the test does not separate")
finish(not bad, f"{bad}")
