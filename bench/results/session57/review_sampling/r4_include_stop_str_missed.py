"""include_stop_str_in_output=True: a stop string that spans several text deltas is never matched when the text so
far is shorter than the longest stop string less one (StopStringMatcher keeps the wrong tail: buf[len(buf) - max_hold:]
with a negative start). Shown on the matcher and end to end on the engine (plain decode; greedy tiny model): the same
request stops with include_stop_str_in_output=False, runs to the end with True. Exit 1 when the stop is missed."""
import sys
sys.path.insert(0, __file__.rsplit("/", 1)[0])
from common import SamplingParams, collect, engine, prompts  # noqa: E402
from cluster.detok import StopStringMatcher  # noqa: E402

bad = []
for keep in (False, True):
    m = StopStringMatcher(["abcdefg"], keep=keep)
    out = [m.feed(d) for d in ("xab", "cd", "efg")]
    print(f"matcher keep={keep}: feeds 'xab','cd','efg' -> {out} matched={m.matched!r}")
    if not m.stopped:
        bad.append(f"matcher keep={keep}: 'abcdefg' across 'xab'+'cd'+'efg' not matched")

eng, tok = engine()
ids = prompts(1)[0]
for keep in (False, True):
    p = SamplingParams(max_tokens=40, temperature=0.0, stop=("0.0.0.0",), include_stop_str_in_output=keep)
    r = collect(eng, {"a": (ids, p)})["a"]
    print(f"engine include_stop_str_in_output={keep}: {len(r['tokens'])} tokens, reason {r['reason']}, "
          f"stop_str {r['stop_str']!r}, text {r['text']!r}")
    if "0.0.0.0" in r["text"] and r["stop_str"] is None:
        bad.append(f"engine keep={keep}: text {r['text']!r} holds the stop string, output not stopped")
print("\n".join(bad) or "ok")
sys.exit(1 if bad else 0)
