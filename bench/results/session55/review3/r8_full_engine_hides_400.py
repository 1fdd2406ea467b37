"""A request that can never run (a token id past the vocabulary, a prompt + max_tokens past the context at the
engine) is refused for itself (400) whether or not the engine is full: a full engine answers it 429 'retry later'
instead, and a client that honours Retry-After retries a request that cannot succeed."""
from _h3 import AdmissionError, call, check, done, engine, greedy, ingress, prompt

kw = dict(kv_cache_tokens=512, max_model_len=128, max_num_seqs=1, max_waiting=1, max_num_batched_tokens=32)
eng, _ = engine(**kw)
V = eng.config.vocab_size


def reason(ids, params, rid):
    try:
        eng.add_request(ids, params, rid)
        eng.abort(rid)
        return "admitted"
    except AdmissionError as e:
        return e.reason


idle = {"bad_token": reason([5, V + 10], greedy(4), "a"), "too_long": reason(prompt(100), greedy(60), "b")}
eng.add_request(prompt(60, seed=1), greedy(60), "busy1")
eng.add_request(prompt(60, seed=2), greedy(60), "busy2")
full = {"bad_token": reason([5, V + 10], greedy(4), "c"), "too_long": reason(prompt(100), greedy(60), "d")}
print("idle engine:", idle, "\nfull engine:", full)
for k in idle:
    check(idle[k] == full[k] == k, f"{k}: idle {idle[k]}, full {full[k]}")

# at the HTTP edge: token ids past the vocabulary in /v1/completions (no echo: the ingress leaves them to the engine)
eng2, _ = engine(**kw)
ing = ingress(eng2, kw)
st_idle, r_idle = call(ing, "completions", {"prompt": [5, V + 10], "max_tokens": 2})
eng2.add_request(prompt(60, seed=1), greedy(60), "busy1")
eng2.add_request(prompt(60, seed=2), greedy(60), "busy2")
st_full, r_full = call(ing, "completions", {"prompt": [5, V + 10], "max_tokens": 2})
check(st_idle == st_full == 400, f"/v1/completions with token id {V + 10}: idle {st_idle}, full {st_full} "
                                 f"({r_full.get('message')}; headers {r_full.get('headers')})")
ing.aeng.shutdown()
done()
