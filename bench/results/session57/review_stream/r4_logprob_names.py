"""r4: logprobs' token names where a token is no whole UTF-8 character (the tiny model's tokenizer is byte-level BPE:
every byte 0x80-0xff is a token of its own), through the real ingress over the real tiny-model engine.

Completions' top_logprobs is a dict keyed by the token's name. Every partial-UTF-8 token is named "\ufffd" (its
single-id decode), so distinct tokens collide: the dict holds fewer than `logprobs` entries, and the sampled token's
own entry (OpenAI: always present, with its logprob) shows another token's logprob. OpenAI names such tokens by their
bytes ("bytes:\\xe4\\xb8"), which keeps them apart.

Also checked (fine unless marked): chat's `bytes` are the token's real bytes and their concatenation is the content's
UTF-8; chat's top_logprobs has exactly top_logprobs entries; whole == streamed logprobs.
Exits 1 when a completions position lists fewer alternatives than asked or misreports the sampled token's logprob."""
import sys

sys.path.insert(0, __import__("os").path.dirname(__file__))
from _hs import TOK, byte_id, call, check, done, engine, ingress, joined, parse_sse, scripted_ingress  # noqa: E402

eng = engine()
ing = ingress(eng)
MB = [byte_id(b) for b in b"\xe4\xb8\xad\xc3\xbc\xf0\x9f\x99\x82"]

# -- completions: top_logprobs dict collisions -----------------------------------------------------------------------
body = {"prompt": "\u4e2d\u6587\u5b57\u7b26 \u00fc \U0001f642 \u65e5\u672c\u8a9e", "max_tokens": 16, "temperature": 0,
        "logprobs": 5, "allowed_token_ids": MB, "return_token_ids": True}
st, whole = call(ing, "completions", body)
ch = whole["choices"][0]
lp = ch["logprobs"]
short = [i for i, top in enumerate(lp["top_logprobs"]) if len(top) < 5]
wrong = [i for i, (t, v, top) in enumerate(zip(lp["tokens"], lp["token_logprobs"], lp["top_logprobs"]))
         if top.get(t) != v]
print(f"raw top-5 at position 0 is five distinct byte tokens (see the log's probe below); named: "
      f"{[TOK.decode([t], skip_special_tokens=False) for t in (145, 259, 255, 141, 200)]}")
print(f"text {ch['text']!r}\ntokens {lp['tokens']}\nids {ch['token_ids']}")
for i in range(3):
    print(f"  position {i}: token {lp['tokens'][i]!r} logprob {lp['token_logprobs'][i]:.4f} top {lp['top_logprobs'][i]}")
check(not short, f"completions logprobs=5: every position lists >= 5 alternatives ({len(short)} of {len(lp['tokens'])} "
      f"list fewer: names collide, e.g. position {short[:1]} -> {lp['top_logprobs'][short[0]] if short else ''})")
check(not wrong, f"completions: top_logprobs[i][tokens[i]] == token_logprobs[i] ({len(wrong)} positions differ: the "
      "sampled token's name is another token's key)")
names = set(lp["tokens"])
ids = set(ch["token_ids"])
check(len(names) == len(ids), f"completions: distinct tokens get distinct names ({len(ids)} ids -> {len(names)} names "
      f"{sorted(names)})")

st, raw = call(ing, "completions", {**body, "stream": True})
chunks, _ = parse_sse(raw)
s_lp = {k: [x for part in joined(chunks, False, 1)[0]["lp"] for x in part[k]] for k in lp}


def close(a, b) -> bool:
    """Equal, floats within 1e-4 (a second run's logits differ in the last bits)."""
    if isinstance(a, float) and isinstance(b, float):
        return abs(a - b) < 1e-4
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(close(a[k], b[k]) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(close(x, y) for x, y in zip(a, b))
    return a == b


check(close(s_lp, lp), "completions: streamed logprobs == whole (floats within 1e-4)")

# -- the same without allowed_token_ids: a scripted model samples its most likely token, E4 (the first byte of 中),
# at logprob -1, with B8 and AD (-2, -3) next: all three are named "\ufffd", the dict keeps the last one written
E4, B8, AD = (byte_id(b) for b in b"\xe4\xb8\xad")
s_eng, s_ing = scripted_ingress([E4, B8, AD], 0, alts=(B8, AD))
st, sw = call(s_ing, "completions", {"prompt": [5, 6, 7], "max_tokens": 3, "temperature": 0, "logprobs": 3,
                                     "ignore_eos": True})
s_ing.aeng.shutdown()
slp = sw["choices"][0]["logprobs"]
print(f"scripted: text {sw['choices'][0]['text']!r} token_logprobs {slp['token_logprobs']} top_logprobs {slp['top_logprobs']}")
check(slp["top_logprobs"][0].get(slp["tokens"][0]) == slp["token_logprobs"][0],
      f"completions, the sampled token the most likely: its top_logprobs entry is its own logprob "
      f"(got {slp['top_logprobs'][0]} for a token sampled at -1.0)")

# -- chat: bytes and the top_logprobs count ---------------------------------------------------------------------------
for top_n in (0, 3):
    body = {"messages": [{"role": "user", "content": "Hello"}], "max_tokens": 16, "temperature": 0, "logprobs": True,
            "top_logprobs": top_n, "ignore_eos": True}
    st, whole = call(ing, "chat", body)
    c = whole["choices"][0]
    content = c["logprobs"]["content"]
    joined_bytes = b"".join(bytes(x["bytes"]) for x in content)
    check(joined_bytes == c["message"]["content"].encode(),
          f"chat top_logprobs={top_n}: concatenated bytes == content's UTF-8 ({c['message']['content']!r})")
    check(all(len(x["top_logprobs"]) == top_n for x in content), f"chat: every token lists {top_n} top_logprobs")
    st, raw = call(ing, "chat", {**body, "stream": True})
    chunks, _ = parse_sse(raw)
    s_content = [x for part in joined(chunks, True, 1)[0]["lp"] for x in part["content"]]
    check(close(s_content, content), f"chat top_logprobs={top_n}: streamed logprobs == whole")

# chat with split characters: names and bytes
body = {"messages": [{"role": "user", "content": "\u4e2d"}], "max_tokens": 12, "temperature": 0, "logprobs": True,
        "top_logprobs": 2, "allowed_token_ids": MB}
st, whole = call(ing, "chat", body)
content = whole["choices"][0]["logprobs"]["content"]
print("chat, byte tokens:", [(x["token"], x["bytes"]) for x in content[:6]])
check(all(len(x["bytes"]) == 1 for x in content), "chat: a byte token's `bytes` is its one byte (OpenAI's, not vLLM's "
      "UTF-8 of U+FFFD)")
done()
