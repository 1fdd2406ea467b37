"""Completions' logprobs against an independent reference: the tiny model's fp32 forward + log-softmax (models/loader,
no engine code). Echo's prompt logprobs == a forward over the prompt; each generated token's logprob and top-n == a
forward over prompt + output; top_logprobs' sets == the reference's top-n; a batch of prompts, scoring (max_tokens 0),
sampled (temperature != 1: logprobs stay the raw model's, as vLLM's default), logprobs 0, a token-id prompt with
special tokens. Exits 1 on any mismatch."""
import sys, os
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _h import *  # noqa: F401,F403

TOL = 2e-4
TEXT = ("In the beginning God created the heaven and the earth. And the earth was without form, and void; and "
        "darkness was upon the face of the deep. And the Spirit of God moved upon the face of the waters. And God said, "
        "Let there be light: and there was light. And God saw the light, that it was good: and God divided")
eng = engine()
ing = ingress(eng)


def compare(label, ids, choice, n_prompt, k, gen_ids=None):
    """choice's logprobs (echo: prompt first) against ref over ids (prompt + generated)."""
    lp = choice["logprobs"]
    ref = ref_logprobs(ids)
    toks = ids if gen_ids is None else ids
    check(len(lp["token_logprobs"]) == len(ids), f"{label}: {len(lp['token_logprobs'])} logprob entries for {len(ids)} tokens")
    check(lp["token_logprobs"][0] is None and lp["top_logprobs"][0] is None, f"{label}: first prompt token null")
    worst, set_bad = 0.0, []
    for j in range(1, len(ids)):
        r = ref[j - 1]
        want = r[ids[j]].item()
        got = lp["token_logprobs"][j]
        worst = max(worst, abs(got - want))
        top = lp["top_logprobs"][j]
        rv, ri = r.topk(k) if k else (r[:0], [])
        ref_top = {name_of(int(i)): float(v) for i, v in zip(ri, rv)}
        ref_top[name_of(ids[j])] = want
        if set(top) != set(ref_top):
            set_bad.append((j, sorted(top), sorted(ref_top)))
        else:
            worst = max(worst, max(abs(top[n] - ref_top[n]) for n in top))
    check(worst < TOL, f"{label}: max |logprob - reference| = {worst:.2e} over {len(ids) - 1} tokens (k={k})")
    check(not set_bad, f"{label}: top_logprobs' tokens == the reference's top {k} (+ the token): {len(set_bad)} differ "
          f"{set_bad[:2]}")


# (a) greedy, echo + logprobs 5 + 8 generated tokens over a 40+-token prompt (past index_topk: DSA selects)
p = TOK.encode(TEXT)
print("prompt tokens", len(p), "(the tiny model's index_topk is 32: past it DSA selects)")
st, b = call(ing, "completions", {"prompt": TEXT, "max_tokens": 8, "logprobs": 5, "echo": True, "temperature": 0,
                                  "return_token_ids": True})
c = b["choices"][0]
gen = c["token_ids"]
compare("greedy echo+gen", p + gen, c, len(p), 5)
ref = ref_logprobs(p + gen)
check(all(int(ref[len(p) - 1 + j].argmax()) == g for j, g in enumerate(gen)), "greedy tokens == reference argmax")

# (b) sampled at temperature 0.7 / top_p 0.9, seeded: the logprobs are the raw model's (vLLM's default raw_logprobs)
st, b = call(ing, "completions", {"prompt": TEXT, "max_tokens": 8, "logprobs": 3, "echo": True, "temperature": 0.7,
                                  "top_p": 0.9, "seed": 11, "return_token_ids": True})
c = b["choices"][0]
compare("sampled T=0.7 echo+gen", p + c["token_ids"], c, len(p), 3)

# (c) a batch of 3 prompts (ids), scoring: echo + max_tokens 0 + logprobs 5
batch = [p[:7], p[3:40], p[:70]]
st, b = call(ing, "completions", {"prompt": batch, "max_tokens": 0, "logprobs": 5, "echo": True})
check(st == 200 and len(b["choices"]) == 3, f"batch scoring: status {st}, {len(b.get('choices', []))} choices")
for ch in sorted(b["choices"], key=lambda x: x["index"]):
    compare(f"batch scoring prompt {ch['index']}", batch[ch["index"]], ch, len(batch[ch["index"]]), 5)
    check(ch["text"] == TOK.decode(batch[ch["index"]]), f"batch scoring prompt {ch['index']}: echo text == decode(ids)")
check(b["usage"] == {**b["usage"], "prompt_tokens": sum(map(len, batch)), "completion_tokens": 0},
      f"scoring usage {b['usage']}")

# (d) logprobs 0: each token's own logprob only
st, b = call(ing, "completions", {"prompt": TEXT, "max_tokens": 4, "logprobs": 0, "echo": True, "temperature": 0,
                                  "return_token_ids": True})
c = b["choices"][0]
compare("logprobs 0", p + c["token_ids"], c, len(p), 0)

# (e) a token-id prompt opening with the special tokens [gMASK]<sop>
sp = [SP["[gMASK]"], SP["<sop>"]] + p[:20]
st, b = call(ing, "completions", {"prompt": sp, "max_tokens": 3, "logprobs": 2, "echo": True, "temperature": 0,
                                  "return_token_ids": True})
c = b["choices"][0]
compare("special-token id prompt", sp + c["token_ids"], c, len(sp), 2)

# (f) prompt_logprobs 4 (vLLM's) == the reference, with ranks
st, b = call(ing, "completions", {"prompt": p[:30], "max_tokens": 1, "prompt_logprobs": 4, "temperature": 0})
pl = b["choices"][0]["prompt_logprobs"]
ref = ref_logprobs(p[:30])
worst, rank_bad = 0.0, 0
for j in range(1, 30):
    e = pl[j][str(p[j])]
    worst = max(worst, abs(e["logprob"] - ref[j - 1, p[j]].item()))
    rank = int((ref[j - 1] > ref[j - 1, p[j]]).sum()) + 1
    rank_bad += e["rank"] != rank
    tv, ti = ref[j - 1].topk(4)
    for r, (v, i) in enumerate(zip(tv, ti)):
        q = pl[j].get(str(int(i)))
        if q is None or q["rank"] != r + 1 and int(i) != p[j]:
            rank_bad += 1
        else:
            worst = max(worst, abs(q["logprob"] - float(v)))
check(pl[0] is None and worst < TOL and rank_bad == 0, f"prompt_logprobs: max diff {worst:.2e}, {rank_bad} rank/top mismatches")
done()
