"""A batch of prompts × n: choice p*n + i is prompt p's i-th (each equal to the same prompt asked alone with the same
seed); a seed reproduces; the n choices of a seeded request differ from each other; unseeded choices differ; usage
counts (prompt tokens once per prompt, completion tokens over every choice); the streamed answer, joined, equals the
whole one for the same seed (text, logprobs, finish reasons, usage), with echo + logprobs and with plain text."""
import sys, os
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _h import *  # noqa: F401,F403

eng = engine()
ing = ingress(eng)
P = ["The old man said", "In the beginning God created", "And the earth was", "Blessed are the"]
BASE = {"max_tokens": 12, "temperature": 1.0, "seed": 1234, "n": 3, "logprobs": 2, "return_token_ids": True}

st, whole = call(ing, "completions", {**BASE, "prompt": P})
check(st == 200, f"batch status {st}")
ch = whole["choices"]
check([c["index"] for c in ch] == list(range(12)), f"indices in order 0..11: {[c['index'] for c in ch]}")
by = {c["index"]: c for c in ch}
check(all(by[k]["prompt_token_ids"] == TOK.encode(P[k // 3]) for k in range(12)), "choice p*n+i answers prompt p")

# each prompt alone, same seed: the same choices
for k, prompt in enumerate(P):
    st, alone = call(ing, "completions", {**BASE, "prompt": prompt})
    same = all(alone["choices"][i]["token_ids"] == by[k * 3 + i]["token_ids"] for i in range(3))
    check(same, f"prompt {k} alone == its choices {k * 3}..{k * 3 + 2} in the batch")
# reproducible
st, again = call(ing, "completions", {**BASE, "prompt": P})
check([c["token_ids"] for c in again["choices"]] == [c["token_ids"] for c in ch], "the same seeded batch repeats")
# a seeded request's n choices differ from each other
for k in range(4):
    outs = [tuple(by[k * 3 + i]["token_ids"]) for i in range(3)]
    check(len(set(outs)) == 3, f"prompt {k}: its 3 seeded choices differ ({[o[:4] for o in outs]})")
# unseeded: n choices differ, two runs differ
st, u1 = call(ing, "completions", {**BASE, "prompt": P[0], "seed": None})
st, u2 = call(ing, "completions", {**BASE, "prompt": P[0], "seed": None})
o1 = [tuple(c["token_ids"]) for c in u1["choices"]]
o2 = [tuple(c["token_ids"]) for c in u2["choices"]]
check(len(set(o1)) == 3 and o1 != o2, "unseeded: the 3 choices differ and two requests differ")
# note (vLLM's too): choice i of seed s is choice 0 of seed s+i
st, s1 = call(ing, "completions", {**BASE, "prompt": P[0], "seed": 1235, "n": 1})
print("note: seed 1235's choice 0 == seed 1234's choice 1:", s1["choices"][0]["token_ids"] == by[1]["token_ids"])

# usage
nt = [len(TOK.encode(x)) for x in P]
comp = sum(len(c["token_ids"]) for c in ch)
u = whole["usage"]
check(u["prompt_tokens"] == sum(nt) and u["completion_tokens"] == comp and u["total_tokens"] == sum(nt) + comp,
      f"usage {u} vs prompts {sum(nt)} (once per prompt), completion {comp}")

# streamed == whole, same seed, echo + logprobs, include_usage
for extra in ({}, {"echo": True}, {"echo": True, "max_tokens": 0}, {"logprobs": None, "stop": [" the", "\n"]}):
    body = {**BASE, "prompt": P, **extra}
    st, w = call(ing, "completions", body)
    st, raw = call(ing, "completions", {**body, "stream": True, "stream_options": {"include_usage": True}})
    chunks, probs = parse_sse(raw)
    check(not probs, f"{extra}: SSE framing {probs}")
    acc = joined(chunks, False, 12)
    wc = {c["index"]: c for c in w["choices"]}
    text_ok = all(acc[i]["text"] == wc[i]["text"] for i in range(12))
    fin_ok = all(acc[i]["finish"] == [wc[i]["finish_reason"]] for i in range(12))
    lp_ok = True
    if body.get("logprobs") is not None:
        for i in range(12):
            j = {k: [x for p_ in acc[i]["lp"] for x in p_[k]] for k in ("tokens", "token_logprobs", "top_logprobs",
                                                                        "text_offset")}
            lp_ok &= j == wc[i]["logprobs"]
    ids_ok = all([t for c in chunks if c != "[DONE]" for x in c["choices"] if x["index"] == i
                  for t in x.get("token_ids") or []] == wc[i]["token_ids"] for i in range(12))
    usage = [c for c in chunks if c != "[DONE]" and c.get("usage")]
    check(text_ok and fin_ok and lp_ok and ids_ok, f"{extra}: stream == whole (text {text_ok}, finish {fin_ok}, "
          f"logprobs {lp_ok}, token_ids {ids_ok})")
    check(len(usage) == 1 and usage[0]["usage"] == w["usage"], f"{extra}: streamed usage == whole "
          f"{usage[-1]['usage'] if usage else None} vs {w['usage']}")
done()
