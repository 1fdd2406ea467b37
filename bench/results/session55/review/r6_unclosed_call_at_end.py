"""An unclosed <tool_call> at the output's end: cut by max_tokens (finish_reason length) at each place in the call, and
ended by EOS without </tool_call>. Expected (NOTES.md, parsers.ToolCalls): a call cut after its name ends there with
its last value as far as it got and finish_reason length; cut before its name is complete it is content, as written;
EOS inside a call ends the call (finish_reason tool_calls). Whole == streamed in every case, no crash.
Exits non-zero on a crash or a whole/streamed difference, or when a case departs from that contract."""
from _harness import EOS, SP, call, enc, parity_failures, run_variants, show

S = {"get_weather": {"city"}}
full = [SP["</think>"]] + enc("Checking.") + call("get_weather", ("city", "São Paulo"), ("days", "3"))
failed = []
# every prefix ending inside the call: a max_tokens cut
start = full.index(SP["<tool_call>"])
for cut in range(start + 1, len(full)):
    script = full[:cut]
    try:
        out = run_variants(script, string_args=S)
    except Exception as e:  # noqa: BLE001
        failed.append(f"cut at {cut}: CRASH {type(e).__name__}: {e}")
        continue
    failed += [f"cut at {cut}: {p}" for p in parity_failures(out)]
    w = out["engine k=0"][0]
    print(f"cut after {cut - start:2d} ids of the call: content={w['content']!r} calls={w['calls']} "
          f"finish={w['finish_reason']}")
    if w["finish_reason"] != "length":
        failed.append(f"cut at {cut}: finish_reason {w['finish_reason']}")
    if not w["calls"] and "<tool_call>" not in w["content"]:
        failed.append(f"cut at {cut}: neither a call nor its text: {w}")

out = run_variants(full + [EOS], string_args=S)          # EOS before </tool_call>
print("=== EOS inside an unclosed call"); show(out)
failed += [f"EOS inside: {p}" for p in parity_failures(out)]
w = out["engine k=0"][0]
if w["calls"] != [{"name": "get_weather", "arguments": '{"city": "São Paulo", "days": 3}'}] or \
        w["finish_reason"] != "tool_calls":
    failed.append(f"EOS inside: {w}")
print("\n".join(failed) or "OK: cut calls end as documented, whole == streamed")
assert not failed
