"""n > 1: each choice has its own reasoning split and tool-call parser; events of the choices interleave (as
serve._merge yields them). Choice 0: a thought, text and two calls (speculative events, k=3); choice 1: a thought and a
plain answer (k=0); choice 2: a call before </think> (k=2). Each choice, whole and streamed, must equal that choice
alone (n=1), and its tool_calls indexes must start at 0. Exits non-zero on any difference."""
import asyncio
import copy
import json

from _harness import (
    EOS,
    SP,
    TOOL_IDS,
    _Aclose,
    _Ingress,
    call,
    enc,
    engine_events,
    formatted,
    joined,
    whole_view,
)

from cluster.formatter import Formatter

S = {"get_weather": {"city"}}
scripts = [
    (enc("Two calls.") + [SP["</think>"]] + enc("On it.") + call("get_weather", ("city", "Rome"))
     + call("now") + [EOS], 3),
    (enc("Easy.") + [SP["</think>"]] + enc("It is 4.") + [EOS], 0),
    (enc("Check first.") + call("get_weather", ("city", "Lima"), ("days", "2")) + [EOS], 2),
]
per_choice = [engine_events(s, k) for s, k in scripts]
alone = []
for evs in per_choice:
    w, s, _ = formatted(evs, string_args=S)
    alone.append((whole_view(w[0]), s[0]))

order = []                                   # round-robin interleave
queues = [list(e) for e in per_choice]
while any(queues):
    for i, q in enumerate(queues):
        if q:
            order.append((i, q.pop(0)))

mk = lambda: Formatter(_Ingress(), "c", True, [[0] * 3], None, thinking=True, n=3, tool_ids=TOOL_IDS, string_args=S)


async def src():
    for i, ev in copy.deepcopy(order):
        yield i, ev


body = asyncio.run(mk().whole(src(), 3))


async def chunks():
    return [json.loads(c[6:]) async for c in mk().sse(_Aclose(src()), True) if c != "data: [DONE]\n\n"]


raw = asyncio.run(chunks())
failed = []
for i in range(3):
    w = whole_view(body["choices"][i])
    s = joined([ch for c in raw for ch in c["choices"] if ch["index"] == i])
    print(f"choice {i}: whole {w}\n          streamed {s}")
    if w != alone[i][0] or s != alone[i][1]:
        failed.append(f"choice {i} differs from alone: {alone[i]}")
    for c in raw:
        for ch in c["choices"]:
            if ch["index"] == i:
                for d in ch["delta"].get("tool_calls", []):
                    if d["index"] >= len(w["calls"]):
                        failed.append(f"choice {i}: tool_call index {d['index']} out of range")
print("usage:", body["usage"], "| streamed:", raw[-1].get("usage"))
if body["usage"] != raw[-1].get("usage"):
    failed.append("usage differs whole vs streamed")
print("\n".join(failed) or "OK: n=3 choices each as alone, whole and streamed")
assert not failed
