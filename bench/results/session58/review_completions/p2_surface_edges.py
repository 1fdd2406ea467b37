"""Probe (no pass/fail): prints what the surface answers; evidence for review.md."""
import sys; sys.path.insert(0, "bench/results/session58/review_completions")
from _h import *
eng = engine(); ing = ingress(eng)
T = "In the beginning God created the heaven and the earth. And the earth was"
p = TOK.encode(T)
def show(label, body):
    st, b = call(ing, "completions", body)
    print("==", label, st)
    if st != 200: print("  ", b); return b
    for c in b["choices"]:
        lp = c.get("logprobs")
        print("  ", c["index"], repr(c["text"]), c["finish_reason"], c.get("stop_reason"),
              None if not lp else (lp["tokens"][:6], lp["token_logprobs"][:3], lp["text_offset"][:6], len(lp["tokens"])))
        for k in ("prompt_token_ids", "token_ids"):
            if k in c: print("    ", k, c[k])
    print("   usage", b["usage"])
    return b
show("truncate 5 echo logprobs", {"prompt": T, "truncate_prompt_tokens": 5, "echo": True, "logprobs": 1, "max_tokens": 2, "temperature": 0, "return_token_ids": True})
show("truncate 5 batch ids", {"prompt": [p, p[:3]], "truncate_prompt_tokens": 5, "echo": True, "max_tokens": 0, "prompt_logprobs": 1})
show("stop inside echo", {"prompt": T, "echo": True, "stop": ["earth"], "max_tokens": 6, "temperature": 0})
show("include_stop", {"prompt": T, "stop": [" the"], "include_stop_str_in_output": True, "max_tokens": 20, "temperature": 0})
show("as ids", {"prompt": p[:4], "echo": True, "logprobs": 1, "max_tokens": 2, "temperature": 0, "return_tokens_as_token_ids": True})
show("special ids echo", {"prompt": [SP["[gMASK]"], SP["<sop>"]] + p[:3], "echo": True, "logprobs": 1, "max_tokens": 1, "temperature": 0})
show("n2 scoring", {"prompt": p[:4], "echo": True, "logprobs": 1, "max_tokens": 0, "n": 2})
show("suffix", {"prompt": T, "suffix": "x"})
show("best_of 3 n 1", {"prompt": T, "best_of": 3})
show("best_of 2 n 2", {"prompt": T, "best_of": 2, "n": 2, "max_tokens": 2})
show("logprobs 21", {"prompt": T, "logprobs": 21})
show("logprobs 20", {"prompt": T, "logprobs": 20, "max_tokens": 1})
show("seed negative", {"prompt": T, "seed": -5, "max_tokens": 2})
show("seed huge", {"prompt": T, "seed": 2**64, "max_tokens": 2})
show("seed 2**63-1 n 3", {"prompt": T, "seed": 2**63 - 1, "max_tokens": 2, "n": 3})
show("empty string prompt", {"prompt": ""})
show("echo max_tokens 0 stream no logprobs", {"prompt": T, "echo": True, "max_tokens": 0})
