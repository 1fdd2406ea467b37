"""r8: with include_stop_str_in_output, a stop string of 4+ characters that arrives a character (or less) per token is
never matched: the output runs on past it to max_tokens. Through the real Engine._emit (a scripted executor), the real
ingress and Formatter, whole and streamed; the same requests without include_stop_str_in_output stop (shown beside).

Cause (read, then checked here by the matcher alone): StopStringMatcher.feed's keep branch keeps
``buf[len(buf) - self._max_hold:]``; when the buffer is shorter than ``_max_hold`` the index is negative and keeps only
its last ``_max_hold - len(buf)`` characters, so the held tail stays short and a stop spanning several small deltas
is lost. Exits 1 when a stop string present in the output did not stop it."""
import sys

sys.path.insert(0, __import__("os").path.dirname(__file__))
from _hs import TOK, call, check, done, joined, parse_sse, scripted_ingress  # noqa: E402

from cluster.detok import StopStringMatcher  # noqa: E402

# the matcher alone: "abcd" fed one character at a time
for keep in (False, True):
    m = StopStringMatcher(["abcd"], keep)
    out = [m.feed(c) for c in "xxabcdyy"]
    print(f"matcher keep={keep}: {out}")
    check(any(s for _, s in out), f"matcher, include_stop_str_in_output={keep}: 'abcd' fed a char at a time stops")

CASES = [
    ("ASCII, one char per token", "xyabcdxyzxyz", ["abcd"]),
    ("CJK, 3 byte tokens per char (2 of 3 add no text)", "\u4e00\u4e2d\u6587\u5b57\u7b26\u4e00\u4e00", ["\u4e2d\u6587\u5b57\u7b26"]),
    ("words, a stop of 5 chars split 1+1+1+2", "go stop now", ["stop "]),
]
for what, text, stops in CASES:
    # one token per character: ASCII chars are single tokens; a CJK char its 3 byte tokens
    script = [t for ch in text for t in TOK.encode(ch)]
    if what.startswith("words"):
        script = TOK.encode("go ") + TOK.encode("s") + TOK.encode("t") + TOK.encode("o") + TOK.encode("p ") + \
            TOK.encode("now")
    assert TOK.decode(script) == text, (TOK.decode(script), text)
    for keep in (False, True):
        body = {"prompt": [5, 6, 7], "max_tokens": len(script), "ignore_eos": True, "stop": stops,
                "include_stop_str_in_output": keep}
        eng, ing = scripted_ingress(script, 0)
        st, whole = call(ing, "completions", body)
        ing.aeng.shutdown()
        eng, ing = scripted_ingress(script, 0)
        st, raw = call(ing, "completions", {**body, "stream": True})
        ing.aeng.shutdown()
        ch = whole["choices"][0]
        s = joined(parse_sse(raw)[0], False, 1)[0]
        cut = text.index(stops[0]) + (len(stops[0]) if keep else 0)
        print(f"{what}, include_stop_str_in_output={keep}: whole {ch['text']!r} ({ch['finish_reason']}, "
              f"stop_reason {ch['stop_reason']!r}); streamed {s['text']!r}; want {text[:cut]!r}")
        check(ch["text"] == text[:cut] and ch["finish_reason"] == "stop" and s["text"] == text[:cut],
              f"{what}, include_stop_str_in_output={keep}: stops at {stops[0]!r}")
done()
