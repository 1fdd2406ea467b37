"""r3: completions' logprobs.text_offset — where each token's text starts in the choice's text — through the real
Engine._emit (a scripted executor: k drafts a step, all accepted, so one event carries several tokens), the real
ingress and the real Formatter, whole and streamed.

The expected offset of token i is the number of characters the output's bytes before token i decode to (special
tokens skipped: their text is not in the answer), i.e. where the token's text starts; a token inside a split
character starts where that character does. Exits 1 when an offset differs, or whole != streamed."""
import codecs
import sys

sys.path.insert(0, __import__("os").path.dirname(__file__))
from _hs import SP, TOK, byte_id, call, check, done, parse_sse, scripted_ingress  # noqa: E402

E4, B8, AD, C80 = (byte_id(b) for b in b"\xe4\xb8\xad\x80")
X = TOK.encode("x")[0]
HELLO = TOK.encode(" hello")[0]


def expected(ids: list[int], text: str) -> list[int]:
    dec, out, at = codecs.getincrementaldecoder("utf-8")("replace"), [], 0
    for t in ids:
        out.append(min(at, len(text)))
        if t not in TOK.special_ids:
            at += len(dec.decode(TOK.token_bytes(t)))
    return out


CASES = [
    ("中 split over 3 byte tokens, then x's; 3 drafts a step", [E4, B8, AD, X, X, X, X, X], 3),
    ("中 split over 3 byte tokens, then x's; no speculation", [E4, B8, AD, X, X, X, X, X], 0),
    ("5 lone continuation bytes (each its own U+FFFD), then x's; no speculation", [C80] * 5 + [X] * 3, 0),
    ("a special token (</think>, skipped in the text) mid-step, then words; 3 drafts a step",
     [HELLO, HELLO, SP["</think>"], HELLO, HELLO, HELLO], 3),
    ("ASCII words only; 3 drafts a step", [HELLO] * 8, 3),
]

for what, script, k in CASES:
    eng, ing = scripted_ingress(script, k)
    body = {"prompt": [5, 6, 7], "max_tokens": len(script), "temperature": 0, "logprobs": 1, "ignore_eos": True,
            "return_token_ids": True}
    st, whole = call(ing, "completions", body)
    ing.aeng.shutdown()
    ch = whole["choices"][0]
    want = expected(ch["token_ids"], ch["text"])
    got = ch["logprobs"]["text_offset"]
    print(f"\n{what}\n   text {ch['text']!r}\n   tokens {ch['logprobs']['tokens']}\n   text_offset {got}\n   expected    {want}")
    check(got == want, f"{what}: text_offset")
    eng, ing = scripted_ingress(script, k)
    st, raw = call(ing, "completions", {**body, "stream": True})
    ing.aeng.shutdown()
    chunks, _ = parse_sse(raw)
    streamed = [o for c in chunks if c != "[DONE]" and c["choices"] for o in c["choices"][0]["logprobs"]["text_offset"]]
    check(streamed == got, f"{what}: streamed text_offset == whole ({streamed})")
done()
