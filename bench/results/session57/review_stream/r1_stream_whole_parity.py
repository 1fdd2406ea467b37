"""r1: streamed text == whole text == the tokenizer's decode of the output ids (cut at the stop string), for greedy
requests through the real OpenAIIngress completions / chat paths, across multi-byte UTF-8 split over byte tokens
(allowed_token_ids restricted to byte tokens), stop strings spanning tokens / prefixes of each other,
include_stop_str_in_output, echo, n > 1 (streams interleaved), include_usage and continuous_usage_stats.
Every chunk also validated with the openai SDK's types and the SSE framing checked.

Exits 1 on any mismatch."""
import itertools
import sys

sys.path.insert(0, __import__("os").path.dirname(__file__))
from _hs import TOK, byte_id, call, check, done, engine, ingress, joined, parse_sse, validate_chunk  # noqa: E402

eng = engine()
ing = ingress(eng)

# token sets: bytes of 中 (e4 b8 ad), ü (c3 bc), 🙂 (f0 9f 99 82), plus "a", "b", " " - the model mixes them freely,
# producing whole characters, split ones and invalid sequences
MB = [byte_id(b) for b in b"\xe4\xb8\xad\xc3\xbc\xf0\x9f\x99\x82"]
ASCII = [byte_id(b) for b in b"ab "]
SETS = {"mixed": MB + ASCII, "free": None}
STOPS = [None, ["b"], ["ab", "a"], ["a b", "b a"], ["\u00fc"], ["\u4e2d"]]

mismatch = 0
cases = 0
seen = {'stop_str': 0, 'multibyte': 0, 'fffd': 0, 'length': 0, 'eos': 0}


def oracle(ids, stop, keep, finish, stop_reason):
    """The answer's text from its token ids: decode (special tokens skipped), an EOS/stop token left out, the text cut at
    the stop string."""
    if finish == "stop" and ids and stop_reason is None and ids[-1] in TOK.eos_token_ids:
        ids = ids[:-1]
    text = TOK.decode(ids, skip_special_tokens=True)
    if finish == "stop" and isinstance(stop_reason, str):
        i = text.find(stop_reason)
        if i < 0:
            return None
        return text[:i + (len(stop_reason) if keep else 0)]
    return text


for endpoint, (sname, allowed), stop, keep, n in itertools.product(
        ("completions", "chat"), SETS.items(), STOPS, (False, True), (1, 2)):
    if stop is None and keep:
        continue
    for echo in ((False, True) if endpoint == "completions" else (False,)):
        body = {"max_tokens": 20, "temperature": 0, "n": n, "return_token_ids": True}
        if endpoint == "completions":
            body.update(prompt="Hello \u4e2d", echo=echo)
        else:
            body.update(messages=[{"role": "user", "content": "Say \u4e2d"}])
        if allowed:
            body["allowed_token_ids"] = allowed
        if stop:
            body.update(stop=stop, include_stop_str_in_output=keep)
        cases += 1
        chat = endpoint == "chat"
        st, whole = call(ing, endpoint, body)
        assert st == 200, whole
        usage_opts = {"include_usage": True, "continuous_usage_stats": cases % 2 == 0}
        st, raw = call(ing, endpoint, {**body, "stream": True, "stream_options": usage_opts})
        assert st == 200, raw
        chunks, problems = parse_sse(raw)
        acc = joined(chunks, chat, n)
        tag = f"{endpoint} set={sname} stop={stop} keep={keep} n={n} echo={echo}"
        bad = list(problems)
        for c in chunks:
            if c != "[DONE]" and (err := validate_chunk(c, chat)):
                bad.append(f"openai type: {err}")
        data = [c for c in chunks if c != "[DONE]"]
        usage_chunks = [c for c in data if not c.get("choices")]
        if len(usage_chunks) != 1 or usage_chunks[0] is not data[-1]:
            bad.append(f"{len(usage_chunks)} usage chunks (want 1, last)")
        elif usage_chunks[0]["usage"]["completion_tokens"] != whole["usage"]["completion_tokens"]:
            bad.append(f"usage {usage_chunks[0]['usage']} != whole {whole['usage']}")
        for ch in whole["choices"]:
            i = ch["index"]
            wtext = ch["message"]["content"] if chat else ch["text"]
            a = acc[i]
            if a["text"] != wtext:
                bad.append(f"choice {i}: streamed {a['text']!r} != whole {wtext!r}")
            if a["finish"] != [ch["finish_reason"]]:
                bad.append(f"choice {i}: streamed finish_reasons {a['finish']} != whole [{ch['finish_reason']!r}]")
            if chat and a["role"] != 1:
                bad.append(f"choice {i}: role sent {a['role']} times")
            seen["stop_str"] += isinstance(ch["stop_reason"], str)
            seen["length"] += ch["finish_reason"] == "length"
            seen["eos"] += ch["finish_reason"] == "stop" and ch["stop_reason"] is None
            seen["multibyte"] += any(ord(c) > 127 and c != "\ufffd" for c in wtext)
            seen["fffd"] += "\ufffd" in wtext
            want = oracle(ch["token_ids"], stop, keep, ch["finish_reason"], ch["stop_reason"])
            got = wtext[len(TOK.decode(whole["choices"][0].get("prompt_token_ids", []))) if echo else 0:]
            if want is None or got != want:
                bad.append(f"choice {i}: whole text {got!r} != decode(token_ids) cut at stop {want!r} "
                           f"(ids {ch['token_ids']}, finish {ch['finish_reason']}, stop_reason {ch['stop_reason']!r})")
        if bad:
            mismatch += 1
        check(not bad, tag + ("" if not bad else "\n      " + "\n      ".join(bad[:6])))

print(f"\n{cases} cases, {mismatch} with a mismatch; choices seen: {seen}")
done()
