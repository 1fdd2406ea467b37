"""Scoring and sampled completions at once on an engine that chunks prompts (max_num_batched_tokens 24) in a small KV
pool (kv_cache_tokens 192: preemptions where they come), with prefix caching on and a cached prefix present: each concurrent answer
equals the same request alone (seeded), and every echoed prompt logprob equals the reference forward."""
import sys, os
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _h import *  # noqa: F401,F403

TEXT = ("In the beginning God created the heaven and the earth. And the earth was without form, and void; and "
        "darkness was upon the face of the deep. And the Spirit of God moved upon the face of the waters.")
eng = engine(max_num_batched_tokens=24, kv_cache_tokens=192, max_num_seqs=8)
ing = ingress(eng)
p = TOK.encode(TEXT)
REQS = [
    {"prompt": [p, p[5:30], p[:12]], "max_tokens": 0, "echo": True, "logprobs": 3},
    {"prompt": TEXT, "max_tokens": 16, "n": 3, "seed": 9, "logprobs": 2, "echo": True, "return_token_ids": True},
    {"prompt": p[:40], "max_tokens": 24, "temperature": 0, "logprobs": 1, "return_token_ids": True},
    {"prompt": [p[:20], p[10:45]], "max_tokens": 8, "n": 2, "seed": 4, "return_token_ids": True},
    {"prompt": p, "max_tokens": 0, "echo": True, "logprobs": 1, "prompt_logprobs": 2},
]
call(ing, "completions", {"prompt": p[:33], "max_tokens": 1})         # a cached prefix of the prompts above
alone = [call(ing, "completions", r)[1] for r in REQS]


async def together():
    return await asyncio.gather(*[acall(ing, "completions", r) for r in REQS])


both = [b for _, b in asyncio.run(together())]
for k, (a, b) in enumerate(zip(alone, both)):
    strip = lambda x: [{kk: v for kk, v in c.items()} for c in x["choices"]]
    same = strip(a) == strip(b)
    if not same:    # logprobs may differ in the last bits between batchings: compare tokens, and logprobs to 1e-4
        ta = [(c["text"], c.get("token_ids")) for c in a["choices"]]
        tb = [(c["text"], c.get("token_ids")) for c in b["choices"]]
        la = [x for c in a["choices"] if c["logprobs"] for x in c["logprobs"]["token_logprobs"] if x is not None]
        lb = [x for c in b["choices"] if c["logprobs"] for x in c["logprobs"]["token_logprobs"] if x is not None]
        same = ta == tb and len(la) == len(lb) and all(abs(x - y) < 1e-4 for x, y in zip(la, lb))
    check(same, f"request {k}: concurrent == alone")
    check(a["usage"]["prompt_tokens"] == b["usage"]["prompt_tokens"] and
          a["usage"]["completion_tokens"] == b["usage"]["completion_tokens"], f"request {k}: usage equal")
for k in (0, 4):
    for c in both[k]["choices"]:
        ids = REQS[k]["prompt"][c["index"]] if k == 0 else p
        ref = ref_logprobs(ids)
        got = c["logprobs"]["token_logprobs"]
        worst = max(abs(got[j] - ref[j - 1, ids[j]].item()) for j in range(1, len(ids)))
        check(worst < 2e-4, f"request {k} choice {c['index']}: echoed logprobs vs reference {worst:.1e}")
st = eng.stats if isinstance(eng.stats, dict) else {}
print("engine stats:", {k: v for k, v in st.items() if "preempt" in k or "cache" in k})
done()
