"""vLLM #42400: a <tool_call> emitted before </think> must be parsed as a call, not swallowed as reasoning.
Exits non-zero if the call is lost (whole or streamed, with or without speculation)."""
from _harness import EOS, SP, call, enc, parity_failures, run_variants, show

cases = {
    # the call inside the open thought, no </think> at all
    "no </think>": enc("I should check the weather.") + call("get_weather", ("city", "Paris")) + [EOS],
    # the call inside the thought, </think> after the call, then an answer
    "</think> after the call": enc("Checking.") + call("get_weather", ("city", "Paris")) + [SP["</think>"]]
    + enc("Done.") + [EOS],
}
failed = []
for name, script in cases.items():
    out = run_variants(script, string_args={"get_weather": {"city"}})
    print(f"=== {name}"); show(out)
    for v, (w, s) in out.items():
        for view in (w, s):
            if view["calls"] != [{"name": "get_weather", "arguments": '{"city": "Paris"}'}] or \
                    view["finish_reason"] != "tool_calls":
                failed.append(f"{name} / {v}: call lost: {view}")
    failed += [f"{name}: {p}" for p in parity_failures(out)]
print("\n".join(failed) or "OK: the call before </think> is a call, whole and streamed, every split")
assert not failed
