"""formatter.py says "a tool call's delta holds no content (OpenAI's: the client reads it as a call, not text)", and
tests/unit/test_protocol.py::test_glm_tool_calls_whole_and_stream asserts no chunk carries both — with one token per
event. A speculative step that commits "</tool_call>" and the text after it ("</tool_call> Done.") gives one event,
and its chunk carries both the call's last argument piece and the content. A client that reads a chunk as either a call
or text (if delta.tool_calls: ... elif delta.content: ...) loses " Done.".
Input: </think> + get_weather(city=Paris) + " Done." + EOS, the real Engine at k = 0 and k = 3.
Exits non-zero when some chunk holds both `content` and `tool_calls`."""
from _harness import EOS, SP, call, enc, engine_events, formatted

script = [SP["</think>"]] + call("get_weather", ("city", "Paris")) + enc(" Done.") + [EOS]
failed = []
for k in (0, 3):
    evs = engine_events(script, k)
    _, _, raw = formatted(evs, string_args={"get_weather": {"city"}})
    for c in raw:
        for ch in c["choices"]:
            if "tool_calls" in ch["delta"] and ch["delta"].get("content"):
                failed.append(f"k={k}: one chunk holds both: {ch['delta']}")
    print(f"k={k}: deltas", [ch["delta"] for c in raw for ch in c["choices"]])
print("\n".join(failed) or "OK: no chunk holds both content and tool_calls")
assert not failed
