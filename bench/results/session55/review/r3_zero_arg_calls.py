"""vLLM #44326: inline zero-argument tool calls (<tool_call>name</tool_call>) dropped in streaming. Also GLM-4.5's
newline style (<tool_call>name\\n<arg_key>…</arg_key>\\n<arg_value>…</arg_value>\\n</tool_call>) and a zero-arg call that
is the whole answer. Exits non-zero if a call is missing or the streamed and whole answers differ."""
from _harness import EOS, SP, call, enc, parity_failures, run_variants, show

nl = enc("\n")
cases = {
    "only a zero-arg call": ([SP["</think>"]] + call("now") + [EOS],
                             [{"name": "now", "arguments": "{}"}]),
    "zero-arg call in a thought (no </think>)": (enc("hmm") + call("now") + [EOS], [{"name": "now", "arguments": "{}"}]),
    "two zero-arg calls": ([SP["</think>"]] + call("now") + call("list_files") + [EOS],
                           [{"name": "now", "arguments": "{}"}, {"name": "list_files", "arguments": "{}"}]),
    "zero-arg then with-arg": ([SP["</think>"]] + enc("ok") + call("now") + call("get_weather", ("city", "Oslo"))
                               + [EOS], [{"name": "now", "arguments": "{}"},
                                         {"name": "get_weather", "arguments": '{"city": "Oslo"}'}]),
    "zero-arg with a trailing newline": ([SP["</think>"], SP["<tool_call>"], *enc("now\n"), SP["</tool_call>"], EOS],
                                         [{"name": "now", "arguments": "{}"}]),
    "GLM-4.5 newline style": ([SP["</think>"], SP["<tool_call>"], *enc("get_weather\n"), SP["<arg_key>"], *enc("city"),
                               SP["</arg_key>"], *nl, SP["<arg_value>"], *enc("Oslo"), SP["</arg_value>"], *nl,
                               SP["</tool_call>"], EOS], [{"name": "get_weather", "arguments": '{"city": "Oslo"}'}]),
}
failed = []
for name, (script, want) in cases.items():
    out = run_variants(script, string_args={"get_weather": {"city"}})
    print(f"=== {name}"); show(out)
    for v, (w, s) in out.items():
        for label, view in (("whole", w), ("streamed", s)):
            if view["calls"] != want or view["finish_reason"] != "tool_calls":
                failed.append(f"{name} / {v} / {label}: {view['calls']} {view['finish_reason']}")
    failed += [f"{name}: {p}" for p in parity_failures(out)]
print("\n".join(failed) or "OK: zero-argument calls come out, whole and streamed")
assert not failed
