"""Probe (no pass/fail): prints what the surface answers; evidence for review.md."""
import sys; sys.path.insert(0, "bench/results/session58/review_completions")
from _h import *
eng = engine(); ing = ingress(eng)
p = TOK.encode("The old man said unto him")
allowed = [p[1], p[3], 11, 13]
for extra in ({"allowed_token_ids": allowed}, {"logit_bias": {str(p[2]): 100}}, {"logit_bias": {str(p[2]): -100}},
              {"guided_choice": ["yes", "no"]}, {"presence_penalty": 2.0}, {"repetition_penalty": 1.5}):
    st, b = call(ing, "completions", {"prompt": p, "max_tokens": 3, "logprobs": 2, "echo": True, "temperature": 0,
                                      "return_token_ids": True, **extra})
    print(extra, st)
    if st != 200: print(b); continue
    c = b["choices"][0]; ids = p + c["token_ids"]
    ref = ref_logprobs(ids)
    print("  out", c["token_ids"], repr(c["text"]))
    print("  got ", [None if x is None else round(x, 3) for x in c["logprobs"]["token_logprobs"]])
    print("  ref ", [None] + [round(ref[j-1, ids[j]].item(), 3) for j in range(1, len(ids))])
    print("  tops", c["logprobs"]["top_logprobs"][-2:])
