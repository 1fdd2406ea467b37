"""Probe (no pass/fail): prints what the surface answers; evidence for review.md."""
import sys; sys.path.insert(0, "bench/results/session58/review_completions")
from _h import *
from cluster.protocol import ApiError
eng = engine(); ing = ingress(eng)
def ep(name, body):
    try:
        return asyncio.run(getattr(ing, name)(FakeRequest({"model": "tiny", **body})))
    except ApiError as e:
        return e.status, e.body()
T = "Hello wörld 😀 <|user|> [gMASK]"
r = ep("tokenize", {"prompt": T}); print(r)
print(ep("detokenize", {"tokens": r["tokens"]}))
st, b = call(ing, "completions", {"prompt": T, "max_tokens": 1, "return_token_ids": True})
print(b["usage"]["prompt_tokens"], b["choices"][0]["prompt_token_ids"] == r["tokens"])
print(ep("tokenize", {"messages": [{"role": "user", "content": "hi"}]}))
print(ep("detokenize", {"tokens": [6144]}))
print(ep("detokenize", {"tokens": []}))
print(ep("tokenize", {"prompt": ""}))
print(ep("tokenize", {"prompt": "a", "add_special_tokens": False}))
print(ep("detokenize", {"tokens": [0xe4]}))
print(ep("tokenize", {"prompt": "x", "return_token_strs": True}))
