"""lm-eval-harness' local-completions loglikelihood recipe (lm_eval/models/openai_completions.py, 0.4.x): a batch of
token-id prompts context + continuation, {"temperature": 0, "max_tokens": 1, "logprobs": 1, "seed": 1234, "echo":
true}; per choice (sorted by index, zipped with the batch's ctxlens) loglikelihood = sum(token_logprobs[ctxlen:-1])
and is_greedy = every continuation token's logprob == max(top_logprobs' values). Checked against the reference
forward (fp32 log-softmax, argmax) over bench/lm_eval/mc.jsonl's 10 items × 4 choices, batch size 8; and the same with
max_tokens 0 (where [ctxlen:] is the continuation)."""
import sys, os
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _h import *  # noqa: F401,F403
from operator import itemgetter

eng = engine()
ing = ingress(eng)
items = [json.loads(x) for x in open(os.path.join(ROOT, "bench/lm_eval/mc.jsonl"))]
reqs = []
for it in items:
    for c in it["choices"]:
        whole = TOK.encode(it["question"] + " " + c)      # lm-eval: encode the pair, split at the context's length
        ctx = TOK.encode(it["question"])
        n = len(ctx)
        if whole[:n] != ctx:                               # (lm-eval moves the context's last token over then)
            n = len(ctx) - 1
        reqs.append((whole, n))

for it in items[:6]:                                   # and continuations that are the model's own greedy tokens
    w = TOK.encode(it["question"])
    n = len(w)
    for _ in range(3):
        w = w + [int(ref_logprobs(w)[-1].argmax())]
    reqs.append((w, n))

worst, greedy_bad, order_bad = 0.0, [], 0
for mt in (1, 0):
    for s in range(0, len(reqs), 8):
        chunk = reqs[s:s + 8]
        st, b = call(ing, "completions", {"prompt": [w for w, _ in chunk], "temperature": 0, "max_tokens": mt,
                                          "logprobs": 1, "seed": 1234, "echo": True})
        assert st == 200, b
        choices = sorted(b["choices"], key=itemgetter("index"))
        order_bad += [c["index"] for c in b["choices"]] != list(range(len(chunk)))
        for choice, (whole, ctxlen) in zip(choices, chunk):
            lps = choice["logprobs"]["token_logprobs"][ctxlen:-1 if mt else None]
            tops = choice["logprobs"]["top_logprobs"][ctxlen:-1 if mt else None]
            ll = sum(lps)
            is_greedy = all(tok == max(top.values()) for tok, top in zip(lps, tops))
            ref = ref_logprobs(whole)
            rll = sum(ref[j - 1, whole[j]].item() for j in range(ctxlen, len(whole)))
            rg = all(int(ref[j - 1].argmax()) == whole[j] for j in range(ctxlen, len(whole)))
            worst = max(worst, abs(ll - rll))
            if is_greedy != rg:
                greedy_bad.append((mt, TOK.decode(whole), is_greedy, rg))
            if len(lps) != len(whole) - ctxlen:
                greedy_bad.append((mt, "length", len(lps), len(whole) - ctxlen))
    check(worst < 5e-4, f"max_tokens {mt}: max |loglikelihood - reference| = {worst:.2e} over {len(reqs)} requests")
check(not greedy_bad, f"is_greedy == the reference's argmax: {len(greedy_bad)} differ {greedy_bad[:3]}")
check(order_bad == 0, f"choices in the batch's order: {order_bad} batches out of order")
print("greedy continuations:", sum(1 for w, n in reqs
                                   if all(int(ref_logprobs(w)[j - 1].argmax()) == w[j] for j in range(n, len(w)))))
done()
