"""Found by r10's fuzz: the whitespace held after tool calls (parsers.ToolCalls.feed: "the newline a model writes after
its calls is no content") is held only when an event holds nothing but whitespace. A speculative step that commits
"Done.\\n" in one event keeps the trailing newline as content; a plain decode, whose "\\n" comes in an event of its own,
drops it. So the same tokens give different `content` with and without speculation (whole and streamed alike).
Input: </think> + call + "Done.\\n" + EOS, through the real Engine at k = 0 and k = 3.
Exits non-zero when the content differs between k = 0 and k > 0."""
from _harness import EOS, SP, call, enc, run_variants, show

script = [SP["</think>"]] + call("now") + enc("Done.\n") + [EOS]
print("tokens after the call:", [enc("Done.\n")])
out = run_variants(script, ks=(0, 2, 3))
show(out)
contents = {v: (w["content"], s["content"]) for v, (w, s) in out.items()}
print("content (whole, streamed) per variant:", contents)
ref = contents["engine k=0"]
failed = [f"{v}: {c!r} != k=0's {ref!r}" for v, c in contents.items() if c != ref]
print("\n".join(failed) or "OK: content independent of the split")
assert not failed
