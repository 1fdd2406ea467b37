"""vLLM PR #39253 / sglang #11888: tool-call argument deltas malformed or lost when several tokens arrive in one event
(speculative decoding commits several tokens a step). The real Engine at k = 0..4 drafts, and 300 random splits of the
ordinary-token runs (each special token still starts an event, as Engine._emit guarantees): the whole response and the
joined streamed deltas must equal the one-token-per-event reference, and the arguments must be the expected JSON.
Exits non-zero on any difference."""
import json
import random

from _harness import (
    EOS,
    SP,
    call,
    enc,
    engine_events,
    events_of,
    formatted,
    hand_events,
    random_groups,
    whole_view,
)

STRINGS = {"write_file": {"path", "content"}, "get_weather": {"city"}}
script = (enc("Need two calls.") + [SP["</think>"]] + enc("Sure — 好的.")
          + call("write_file", ("path", "/tmp/a b.txt"), ("content", 'line1\n"quoted" \\ tab\t 🙂 end'),
                 ("mode", "0644"), ("opts", '{"append": true, "n": [1, 2.5, null]}'))
          + call("get_weather", ("city", "São Paulo"), ("days", "3"), ("units", "metric"))
          + enc("\n") + [EOS])
expected_calls = [
    {"name": "write_file", "arguments": {"path": "/tmp/a b.txt", "content": 'line1\n"quoted" \\ tab\t 🙂 end',
                                         "mode": "0644", "opts": {"append": True, "n": [1, 2.5, None]}}},
    {"name": "get_weather", "arguments": {"city": "São Paulo", "days": 3, "units": "metric"}},
]
# ("0644" is no JSON number and "metric" no JSON: untyped, they stay text)

ref_w, ref_s, _ = formatted(hand_events(script, per_token=True), string_args=STRINGS)
ref = whole_view(ref_w[0])
print("reference (one token per event):", json.dumps(ref, ensure_ascii=False))
failed = []
if ref != ref_s[0]:
    failed.append(f"per-token: streamed != whole: {ref_s[0]}")
got = [{"name": c["name"], "arguments": json.loads(c["arguments"])} for c in ref["calls"]]
print("parsed arguments:", got)
if got != expected_calls:
    failed.append(f"reference arguments differ from the expected: {got}")

variants = {f"engine k={k}": engine_events(script, k) for k in range(5)}
variants["hand runs"] = hand_events(script)
rng = random.Random(55)
for i in range(300):
    variants[f"random split {i}"] = events_of(random_groups(script, rng, max_run=rng.choice([2, 3, 5, 8])))
multi = 0
for name, evs in variants.items():
    multi += any(len(e.token_ids) > 1 for e in evs)
    w, s, raw = formatted(evs, string_args=STRINGS)
    wv = whole_view(w[0])
    if wv != ref:
        failed.append(f"{name}: whole differs: {wv}")
    if s[0] != ref:
        failed.append(f"{name}: streamed differs: {s[0]}")
    for c in raw:                     # every streamed tool_calls delta well formed
        for ch in c["choices"]:
            for d in ch["delta"].get("tool_calls", []):
                if not isinstance(d.get("index"), int) or not isinstance(d["function"].get("arguments"), str):
                    failed.append(f"{name}: malformed delta {d}")
print(f"{len(variants)} variants, {multi} with multi-token events")
print("\n".join(failed[:20]) or "OK: every split gives the reference, whole and streamed")
assert not failed
