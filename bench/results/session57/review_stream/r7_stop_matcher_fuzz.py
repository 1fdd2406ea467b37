"""r7: the real StopStringMatcher (cluster/detok.py) against a character-by-character oracle, for random texts over a
small alphabet (many overlaps), random stop sets (prefixes / suffixes of each other, overlapping, multi-byte chars),
random delta splits, include_stop_str_in_output on and off, and min_tokens-style unarmed leading deltas.

Oracle: feed the text one character at a time; the output stops at the first character that completes any stop
string (ending in an armed delta); among stops completed at that character the longest (earliest start) wins. With
multi-character deltas several stops may complete inside one delta: then any stop completed in the delta where the
oracle's first one completes is accepted (vLLM picks by list order, glmserve by earliest start).
Exits 1 on a text the oracle does not allow, or held text never released."""
import random
import sys

sys.path.insert(0, __import__("os").path.dirname(__file__))
from _hs import check, done  # noqa: E402

from cluster.detok import StopStringMatcher  # noqa: E402

rng = random.Random(7)
ALPHA = "ab\u4e2d "


def rand_str(lo, hi):
    return "".join(rng.choice(ALPHA) for _ in range(rng.randint(lo, hi)))


def run(text, stops, keep, deltas, armed_from):
    m = StopStringMatcher(stops, keep)
    out, at = "", 0
    for j, k in enumerate(deltas):
        piece, at = text[at:at + k], at + k
        got, stopped = m.feed(piece, armed=j >= armed_from)
        out += got
        if stopped:
            return out, m.matched, j
    return out + m.flush(), None, None


def allowed(text, stops, keep, deltas, armed_from):
    """The set of (text, matched) results the oracle allows."""
    ends, at = [], 0                     # the char index where each delta ends
    for k in deltas:
        at += k
        ends.append(at)
    armed_at = 0 if not armed_from else ends[armed_from - 1] if armed_from <= len(ends) else len(text)
    for d, e_hi in enumerate(ends):
        lo = max(ends[d - 1] if d else 0, armed_at)
        res = set()
        for s in stops:                 # each stop's first occurrence ending inside delta d, past the armed point
            for e in range(lo + 1, e_hi + 1):
                if e >= len(s) and text[e - len(s):e] == s:
                    res.add((text[:e - len(s) + (len(s) if keep else 0)], s))
                    break
        if res:
            # the oracle's own pick, char by char: the first end, the longest stop there
            first = min(e for e in range(lo + 1, e_hi + 1) if any(text[:e].endswith(s) for s in stops))
            return res, max((s for s in stops if text[:first].endswith(s)), key=len)
    return {(text, None)}, None


bad = []
for trial in range(20000):
    stops = list({rand_str(1, 4) for _ in range(rng.randint(1, 4))})
    if rng.random() < 0.3:      # prefixes of each other
        s = rand_str(2, 4)
        stops = list({s, s[:rng.randint(1, len(s) - 1)]} | set(stops[:2]))
    text = rand_str(0, 24)
    keep = rng.random() < 0.5
    deltas, left = [], len(text)
    while left > 0:
        k = min(left, rng.choice([1, 1, 2, 3, 5]))
        deltas.append(k)
        left -= k
    if not deltas:
        deltas = [0]
    armed_from = rng.choice([0, 0, 0, 1, 2])
    got = run(text, stops, keep, deltas, armed_from)
    ok, char_pick = allowed(text, stops, keep, deltas, armed_from)
    if (got[0], got[1]) not in ok:
        bad.append((text, stops, keep, deltas, armed_from, got, ok))
print(f"{len(bad)} of 20000 random cases outside the oracle")
for b in bad[:8]:
    print(f"  text {b[0]!r} stops {b[1]} keep {b[2]} deltas {b[3]} armed from delta {b[4]}\n     got {b[5][:2]} "
          f"allowed {sorted(b[6], key=str)[:4]}")
print(f"  by include_stop_str_in_output: keep {sum(b[2] for b in bad)}, not keep {sum(not b[2] for b in bad)}; all with an "
      f"unarmed (min_tokens) delta first: {all(b[4] > 0 for b in bad)}")
check(not bad, "StopStringMatcher == character-by-character oracle")

# the same through the real Engine._emit (scripted executor) and the real ingress: min_tokens 1, stops ["a", "a b c"],
# the model writes "a", " ", "x", ...: the "a" is the first token's (no stop may end there: min_tokens), yet it stops
# the output two tokens later, cutting it to "" — inside the min_tokens region (vLLM: "a x x x ...", length)
from _hs import TOK, call, scripted_ingress  # noqa: E402

for keep in (False, True):
    script = TOK.encode("a") + TOK.encode(" ") + TOK.encode("x") * 6
    eng, ing = scripted_ingress(script, 0)
    st, whole = call(ing, "completions", {"prompt": [5, 6, 7], "max_tokens": 8, "min_tokens": 1, "ignore_eos": True,
                                          "stop": ["a", "a b c"], "include_stop_str_in_output": keep,
                                          "return_token_ids": True})
    ing.aeng.shutdown()
    ch = whole["choices"][0]
    print(f"engine, keep={keep}: text {ch['text']!r} finish {ch['finish_reason']} stop_reason {ch['stop_reason']!r} "
          f"tokens {len(ch['token_ids'])}")
    check(ch["finish_reason"] == "length" and ch["text"] == TOK.decode(script),
          f"engine, include_stop_str_in_output={keep}: a stop string that ended inside min_tokens does not stop the "
          f"output later (got {ch['text']!r}, {ch['finish_reason']}, stop_reason {ch['stop_reason']!r})")
done()
