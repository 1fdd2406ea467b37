"""Stop strings against the markers and the calls (real Engine._emit with the parsers' text_breaks).
  A. stop strings that never occur: the answer is unchanged (speculative or not).
  B. a stop string that occurs only INSIDE a tool call's argument (stop=["\\n\\n"], a file's content with a blank
     line): the request ends in the middle of the call. Observed vs expected: the call is cut, so the response must
     not claim a complete call: finish_reason should not be "tool_calls" with truncated arguments (as a max_tokens cut
     keeps "length"), or (better) the stop string should not apply inside a call.
  C. a stop string completed by the call's NAME (stop=["get_weather"]).
Exits non-zero when B or C returns a truncated call under finish_reason "tool_calls"."""
import json

from _harness import EOS, SP, call, enc, run_variants, show

S = {"write_file": {"path", "content"}, "get_weather": {"city"}}
script = ([SP["</think>"]] + enc("Writing it.") + call("write_file", ("path", "a.md"), ("content", "# T\n\nbody\n"))
          + [EOS])
failed = []

base = run_variants(script, string_args=S, ks=(0, 3))
a = run_variants(script, string_args=S, ks=(0, 3), stop=["never", "STOP"])
print("=== A. stops that never occur"); show(a)
if {k: v for k, v in a.items()} != {k: v for k, v in base.items() if k in a}:
    failed.append("A: a stop string that never occurs changed the answer")

b = run_variants(script, string_args=S, ks=(0, 3), stop=["\n\n"])
print('=== B. stop=["\\n\\n"], the blank line only inside the content argument'); show(b)
for v, (w, s) in b.items():
    for label, view in (("whole", w), ("streamed", s)):
        args = json.loads(view["calls"][0]["arguments"]) if view["calls"] else None
        if view["finish_reason"] == "tool_calls" and args != {"path": "a.md", "content": "# T\n\nbody\n"}:
            failed.append(f"B / {v} / {label}: finish_reason tool_calls with truncated arguments {args}")

c_script = [SP["</think>"]] + call("get_weather", ("city", "Paris")) + [EOS]
c = run_variants(c_script, string_args=S, ks=(0, 3), stop=["get_weather"])
print('=== C. stop=["get_weather"] (the tool\'s own name)'); show(c)
for v, (w, s) in c.items():
    for label, view in (("whole", w), ("streamed", s)):
        if view["finish_reason"] == "tool_calls" and view["calls"] != [
                {"name": "get_weather", "arguments": '{"city": "Paris"}'}]:
            failed.append(f"C / {v} / {label}: finish_reason tool_calls with a truncated call {view['calls']}")
print("\n".join(failed) or "OK")
assert not failed
