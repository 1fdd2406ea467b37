"""vLLM #49248 / PR #49249: under load GLM skips the opening <arg_value> tag:
    <tool_call>get_weather<arg_key>city</arg_key>Paris</arg_value></tool_call>
Expected (graceful): the text between </arg_key> and </arg_value> is the value -> {"city": "Paris"}; at the least no
crash and no text lost silently. Also the other dropped tags: a missing </arg_value> (value left open until the next
<arg_key> / </tool_call>) and a missing </arg_key>. Exits non-zero if a value is lost."""
import json

from _harness import EOS, SP, enc, parity_failures, run_variants, show

S = {"get_weather": {"city", "units"}}
K, KE, V, VE, C, CE = (SP[n] for n in ("<arg_key>", "</arg_key>", "<arg_value>", "</arg_value>", "<tool_call>",
                                      "</tool_call>"))
head = [SP["</think>"], C, *enc("get_weather")]
cases = {
    "missing <arg_value> (one arg)": head + [K, *enc("city"), KE, *enc("Paris"), VE, CE, EOS],
    "missing <arg_value> (2nd of two args)": head + [K, *enc("city"), KE, V, *enc("Paris"), VE,
                                                      K, *enc("days"), KE, *enc("3"), VE, CE, EOS],
    "missing </arg_value> (left open)": head + [K, *enc("city"), KE, V, *enc("Paris"), K, *enc("days"), KE, V,
                                                 *enc("3"), CE, EOS],
    "missing </arg_key>": head + [K, *enc("city"), V, *enc("Paris"), VE, CE, EOS],
}
want = {"missing <arg_value> (one arg)": {"city": "Paris"},
        "missing <arg_value> (2nd of two args)": {"city": "Paris", "days": 3},
        "missing </arg_value> (left open)": {"city": "Paris", "days": 3},
        "missing </arg_key>": {"city": "Paris"}}
failed = []
for name, script in cases.items():
    try:
        out = run_variants(script, string_args=S)
    except Exception as e:  # noqa: BLE001
        failed.append(f"{name}: CRASH {type(e).__name__}: {e}")
        continue
    print(f"=== {name}"); show(out)
    for v, (w, s) in out.items():
        for label, view in (("whole", w), ("streamed", s)):
            got = [json.loads(c["arguments"]) for c in view["calls"]]
            if got != [want[name]]:
                failed.append(f"{name} / {v} / {label}: arguments {got}, content {view['content']!r}; "
                              f"want {want[name]}")
    failed += [f"{name}: {p}" for p in parity_failures(out)]
print("\n".join(failed) or "OK")
assert not failed
