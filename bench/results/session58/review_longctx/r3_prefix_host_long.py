"""Prefix caching + a host tier reusing a long prefix at max_model_len 2048: a device pool of 2048 tokens cannot keep a
1600-token prefix while another long prompt runs, so its blocks go to host memory and come back. Prompts sharing the
prefix (tails of 0 / +-1 around block boundaries, a prompt equal to a previous prompt + output: a multi-turn reuse up to
the context end) must give the model's own greedy tokens, with cache hits and host loads, at budgets 512 and 33, with
and without MTP (k = 2). Exit 1 on a mismatch, an error, no host loads, or blocks not free."""
import sys
sys.path.insert(0, __import__("os").path.dirname(__file__))
from common import *  # noqa

bad = []
eng0, tok = engine()
prefix = text_prompt(tok, 1600, 5)
other = prompt_ids(1900, 6)
seq = []   # (rid, prompt, max_tokens) in order
for i, extra in enumerate([200, 0, 1, 15, 16, 17, 447 - 1]):
    tail = prompt_ids(extra, 100 + i) if extra else []
    p = prefix + tail
    m = min(32, 2048 - len(p))
    seq.append((f"a{i}_{extra}", p, m))
    seq.append((f"o{i}", other[: 1800 + i], 8))          # evicts the prefix from the device pool
refs = {rid: ref_greedy(p, m) for rid, p, m in seq}
# a later turn: the first request's prompt + output + new text, up to the context end
first = seq[0]
turn = first[1] + refs[first[0]] + prompt_ids(2047 - len(first[1]) - len(refs[first[0]]), 77)
refs["turn"] = ref_greedy(turn, 1)
refs["turn0"] = refs["turn"]
seq.append(("turn", turn, 1))
seq.insert(2, ("turn0", turn, 1))      # right after o0: the first request's whole prompt + output is in the tiers
log("refs done", len(turn))
for k, budget in ((0, 512), (0, 33), (2, 512)):
    eng, _ = engine(max_model_len=2048, kv_cache_tokens=2048, host_kv_cache_tokens=4096, speculative_tokens=k,
                    max_num_batched_tokens=budget, max_num_seqs=min(budget, 64))
    cached = {}
    t = time.time()
    for rid, p, m in seq:
        eng.add_request(p, SamplingParams(max_tokens=m, temperature=0.0, ignore_eos=True), rid)
        out, err = [], None
        while eng.has_work():
            for ev in eng.step():
                out += ev.token_ids
                err = err or ev.error
                if ev.finished:
                    cached[rid] = ev.num_cached_tokens
        if out != refs[rid] or err:
            bad.append((k, budget, rid, err))
            log(f"MISMATCH k={k} budget={budget} {rid}: {out} vs {refs[rid]} err={err}")
    sch = eng.scheduler
    q, h = eng.prefix_cache_tokens()
    log(f"k={k} budget={budget}: {time.time() - t:.1f}s cached tokens {cached} host_loads {sch.host_loads} "
        f"queried {q} hits {h} free {sch.pool.num_free}/{sch.pool.num_blocks}")
    if sch.host_loads == 0 or cached.get("a1_0", 0) < 1584 or cached.get("turn", 0) < 1584 \
            or cached.get("turn0", 0) < 1824:
        bad.append((k, budget, "no host reuse", sch.host_loads, cached))
    if sch.pool.num_free != sch.pool.num_blocks:
        bad.append((k, budget, "blocks", sch.pool.num_free))
finish(not bad, f"{bad}")
