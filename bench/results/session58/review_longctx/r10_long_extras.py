"""Long-context extras through the real engine (max_model_len 2048, pool 2048 tokens + host tier 4096):
(a) a 2000-token prompt aborted mid-prefill (after 3 chunks of 256), then the same prompt again: it reuses the blocks the
    aborted one computed (cached > 0) and gives the model's own greedy tokens; the same with the abort right after a
    host-tier load was planned;
(b) prompt_logprobs of a 2047-token prompt at budgets 512 and 33 == the full forward's log-softmax (|d| <= 1e-4), and
    the output's logprobs == the reference's;
(c) a seeded sampled request (T 0.8, top_p 0.9) of 1990 + 58 tokens: the tokens with MTP k = 3 == without (k = 0).
Exit 1 on a mismatch."""
import sys
sys.path.insert(0, __import__("os").path.dirname(__file__))
from common import *  # noqa

bad = []
eng0, tok = engine()
model = ref_model()
P = text_prompt(tok, 2000, 41)
ref_p = ref_greedy(P, 48)
# (a) abort mid-prefill, then again
for host_first in (False, True):
    eng, _ = engine(max_model_len=2048, kv_cache_tokens=2048, host_kv_cache_tokens=4096, max_num_batched_tokens=256)
    if host_first:     # P's first 1200 tokens computed, then evicted to the host by another long prompt
        run(eng, {"w": (P[:1200], SamplingParams(max_tokens=1, temperature=0.0))})
        run(eng, {"x": (prompt_ids(2000, 5), SamplingParams(max_tokens=1, temperature=0.0))})
    eng.add_request(P, SamplingParams(max_tokens=48, temperature=0.0, ignore_eos=True), "a1")
    for _ in range(3):
        eng.step()
    ev = eng.abort("a1")
    while eng.has_work():
        eng.step()
    got, cached = [], None
    eng.add_request(P, SamplingParams(max_tokens=48, temperature=0.0, ignore_eos=True), "a2")
    while eng.has_work():
        for e in eng.step():
            got += e.token_ids
            if e.finished:
                cached = e.num_cached_tokens
    sch = eng.scheduler
    log(f"(a) host_first={host_first}: abort event {ev.finish_reason if ev else None}; again: cached {cached}, "
        f"host_loads {sch.host_loads}, tokens equal {got == ref_p}, free {sch.pool.num_free}/{sch.pool.num_blocks}")
    if got != ref_p or not cached or sch.pool.num_free != sch.pool.num_blocks:
        bad.append(("a", host_first, cached, got == ref_p))
# (b) prompt logprobs at long context
Q = prompt_ids(2047, 42)
ids = torch.tensor(Q)
with torch.no_grad():
    cache = KVCache(model.config, 2056, torch.float32)
    lp = torch.log_softmax(model.logits(model(ids, contiguous_batch([(0, 2047)], 2056), cache)), -1)
want_prompt = lp[:-1].gather(1, ids[1:, None])[:, 0]
want_out = float(lp[-1].max())
for budget in (512, 33):
    eng, _ = engine(max_model_len=2048, kv_cache_tokens=2048, max_num_batched_tokens=budget, max_num_seqs=min(budget, 64))
    eng.add_request(Q, SamplingParams(max_tokens=1, temperature=0.0, prompt_logprobs=1, logprobs=1), "pl")
    plps, olps, out = None, [], []
    while eng.has_work():
        for e in eng.step():
            if e.prompt_logprobs is not None:
                plps = (plps or []) + list(e.prompt_logprobs)
            olps += e.logprobs
            out += e.token_ids
    got = torch.tensor([x.logprob for x in plps]) if plps else torch.zeros(0)
    d = float((got - want_prompt).abs().max()) if got.numel() == want_prompt.numel() else float("inf")
    do = abs(olps[0].logprob - want_out) if olps else float("inf")
    log(f"(b) budget={budget}: prompt logprobs {got.numel()} of {want_prompt.numel()}, max |d| {d:.2e}; output "
        f"logprob |d| {do:.2e}; token {out} vs {int(lp[-1].argmax())}")
    if d > 1e-4 or do > 1e-4 or out != [int(lp[-1].argmax())]:
        bad.append(("b", budget, d, do))
# (c) seeded sampling with and without MTP
R = text_prompt(tok, 1990, 43)
outs = {}
for k in (0, 3):
    eng, _ = engine(max_model_len=2048, kv_cache_tokens=2048, speculative_tokens=k)
    o, r, e = run(eng, {"s": (R, SamplingParams(max_tokens=58, temperature=0.8, top_p=0.9, seed=7, ignore_eos=True))})
    outs[k] = o["s"]
    log(f"(c) k={k}: {len(o['s'])} tokens, accepted {eng.stats['drafts_accepted']}, {r} {e}")
if outs[0] != outs[3]:
    bad.append(("c", "seeded k=3 != k=0", next(i for i, (a, b) in enumerate(zip(outs[0], outs[3])) if a != b)))
finish(not bad, f"{bad}")
