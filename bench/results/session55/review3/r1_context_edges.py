"""Context edges at the engine: prompts of max_model_len-1 / max_model_len / +1, max_tokens past the context, a pool
exactly max_model_len with MTP drafts at the last positions, a token budget smaller than the drafts' rows."""
from _h3 import AdmissionError, check, done, engine, greedy, prompt, run

e, _ = engine(kv_cache_tokens=256, max_model_len=128, max_num_batched_tokens=64)
for n, mt, ok in [(127, 1, True), (128, 1, False), (129, 1, False), (127, 2, False), (1, 127, True), (1, 128, False)]:
    try:
        out, ends, _ = run(e, {"r": (prompt(n), greedy(mt))})
        check(ok and len(out["r"]) == mt and ends["r"] == ("length", None), f"prompt {n} + max_tokens {mt}: ran, {len(out['r'])} tokens {ends['r']}")
    except AdmissionError as err:
        check(not ok and err.reason == "too_long", f"prompt {n} + max_tokens {mt}: refused {err.reason}/{err.field}")
check(e.scheduler.pool.num_free == e.scheduler.pool.num_blocks, "all blocks free after the edge requests")

# the pool holds exactly max_model_len (8 blocks of 16): the last positions with drafts, and without
ref, _ = engine(kv_cache_tokens=128, max_num_batched_tokens=64)
spec, _ = engine(kv_cache_tokens=128, max_num_batched_tokens=64, speculative_tokens=3)
check(spec.config.max_model_len == 128, f"max_model_len defaults to the pool: {spec.config.max_model_len}")
for n, mt in [(100, 28), (127, 1), (97, 31), (113, 15)]:
    a, _, _ = run(ref, {"r": (prompt(n, seed=n), greedy(mt))})
    try:
        b, ends, _ = run(spec, {"r": (prompt(n, seed=n), greedy(mt))})
        check(a == b and len(b["r"]) == mt, f"spec 3, prompt {n} + {mt} = 128 in an 8-block pool: equal to k=0 ({ends['r']})")
    except Exception as err:  # noqa: BLE001
        check(False, f"spec 3, prompt {n} + {mt}: {type(err).__name__}: {err}")
print("draft rounds:", spec.stats["draft_rounds"], "accepted:", spec.stats["drafts_accepted"])
check(spec.scheduler.pool.num_free == 8, "spec engine: all blocks free")

# a token budget smaller than the drafts' rows (and than a block), one running request
small, _ = engine(kv_cache_tokens=256, max_num_batched_tokens=2, max_num_seqs=1, speculative_tokens=3)
ref2, _ = engine(kv_cache_tokens=256, max_num_batched_tokens=64, max_num_seqs=1)
for n, mt in [(20, 10), (32, 5)]:
    a, _, _ = run(ref2, {"r": (prompt(n, seed=n), greedy(mt))})
    b, _, steps = run(small, {"r": (prompt(n, seed=n), greedy(mt))})
    check(a == b, f"budget 2 < drafts (3), prompt {n}: equal to budget 64 ({steps} steps)")
done()
