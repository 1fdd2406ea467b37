"""Argument values with special characters and JSON types, odd keys, and a tool name not in the request's tools.
Asserted: every call's arguments are valid strict JSON (no NaN / Infinity), whole == streamed for every split, no
crash. Printed (informational): what each value parses to, and what a call to an unknown tool becomes."""
import json

from _harness import EOS, SP, call, parity_failures, run_variants

S = {"f": {"s_raw", "s_json", "s_ws", "s_empty"}}      # the string-typed parameters (raw text)
vals = [("s_raw", 'He said "hi" \\ \t</x> {not json}'), ("s_json", '"quoted"'), ("s_ws", "  two  spaces\n"),
        ("s_empty", ""), ("n_int", "42"), ("n_float", "-1.5e3"), ("n_big", "1e999"), ("n_nan", "NaN"),
        ("b_true", "true"), ("b_py", "True"), ("nul", "null"), ("py_none", "None"), ("obj", '{"a": [1, {"b": null}]}'),
        ("arr", "[1, 2, 3]"), ("lead0", "007"), ("ws_num", " 5\n"), ("empty", ""), ("quoted_key \"k\" ✓", "v"),
        ("dup", "1"), ("dup", "2"), ("emoji", "🙂🙂")]
script = [SP["</think>"]] + call("f", *vals) + call("no_such_tool", ("x", "1")) + [EOS]
failed = []
out = run_variants(script, string_args=S)
failed += parity_failures(out)
w = out["engine k=0"][0]
for c in w["calls"]:
    try:
        args = json.loads(c["arguments"], parse_constant=lambda x: (_ for _ in ()).throw(ValueError(x)))
    except ValueError as e:
        failed.append(f"{c['name']}: arguments not strict JSON: {e}: {c['arguments']}")
        continue
    print(f"call {c['name']!r}:")
    if c["name"] == "f":
        pairs = json.loads(c["arguments"], object_pairs_hook=list)
        for k, v in pairs:
            print(f"   {k!r:24} -> {v!r}")
    else:
        print(f"   {args}  (a tool the request did not offer; finish_reason {w['finish_reason']})")
print(f"raw arguments of f: {w['calls'][0]['arguments']}")
print("\n".join(failed) or "OK: strict JSON, whole == streamed")
assert not failed
