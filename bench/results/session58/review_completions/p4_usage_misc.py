"""Probe (no pass/fail): prints what the surface answers; evidence for review.md."""
import sys; sys.path.insert(0, "bench/results/session58/review_completions")
from _h import *
eng = engine(); ing = ingress(eng)
print(call(ing, "completions", {"prompt": [5], "max_tokens": 0, "echo": True, "logprobs": 2, "prompt_logprobs": 1})[1]["choices"])
st, raw = call(ing, "completions", {"prompt": ["a b c", "d"], "n": 2, "max_tokens": 3, "seed": 1, "stream": True,
    "stream_options": {"include_usage": True, "continuous_usage_stats": True}})
ch, pr = parse_sse(raw)
for c in ch[:-1]:
    print([(x["index"], repr(x["text"])) for x in c["choices"]], c.get("usage"))
st, raw = call(ing, "completions", {"prompt": "a b c", "max_tokens": 2, "stream": True})
print([c.get("usage") for c in parse_sse(raw)[0][:-1]])
# long prompt share path, n=3, echo, max_tokens 0
T = "In the beginning God created the heaven and the earth. " * 3
st, b = call(ing, "completions", {"prompt": T, "n": 3, "echo": True, "max_tokens": 0})
print(st, [c["text"] == T for c in b["choices"]], b["usage"])
st, b = call(ing, "completions", {"prompt": T, "n": 3, "max_tokens": 2, "seed": 3})
print(st, b["usage"])
