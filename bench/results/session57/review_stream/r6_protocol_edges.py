"""r6: streamed-output request fields and framing edges, through the real ingress (tiny-model engine, or a scripted one):
  a. vLLM's `skip_special_tokens: false` (the answer keeps special tokens' text) — taken and silently not applied
  b. `stream_options` on a request that does not stream (OpenAI and vLLM: a 400)
  c. an engine error mid-stream (n = 2): one error event, then one [DONE], no usage chunk after it
  d. continuous_usage_stats: each chunk's usage is its choice's prompt and tokens so far; the last usage chunk the sum
  e. echo with max_tokens 0, streamed == whole; stop_reason streamed == whole
Exits 1 when (a) or (b) is present (c-e are checks that passed when this was written)."""
import sys

sys.path.insert(0, __import__("os").path.dirname(__file__))
from _hs import (SP, TOK, ScriptedExecutor, call, check, done, engine, ingress, joined, parse_sse,  # noqa: E402
                 validate_chunk)

eng = engine()
ing = ingress(eng)

# a. skip_special_tokens false
think_end = SP["</think>"]
body = {"prompt": "Hello", "max_tokens": 3, "temperature": 0, "logit_bias": {str(think_end): 100},
        "skip_special_tokens": False, "return_token_ids": True}
st, whole = call(ing, "completions", body)
ch = whole["choices"][0] if st == 200 else {"token_ids": None, "text": whole}   # (after the fix: a 400's body)
print(f"a. skip_special_tokens false: status {st}, token_ids {ch['token_ids']}, text {ch['text']!r}")
check(st == 400 or ch["text"] == TOK.decode(ch["token_ids"], skip_special_tokens=False),
      "a. skip_special_tokens false: the text keeps the special tokens (vLLM) or the field is refused (400) — "
      f"got {st} and {ch['text']!r}")

# b. stream_options without stream
st, resp = call(ing, "completions", {"prompt": "Hello", "max_tokens": 2, "stream_options": {"include_usage": True}})
print(f"b. stream_options without stream: status {st}")
check(st == 400, f"b. stream_options on a non-streamed request is a 400 as OpenAI's and vLLM's (got {st})")


# c. an engine error mid-stream
class Failing(ScriptedExecutor):
    def execute(self, steps):
        self.calls = getattr(self, "calls", 0) + 1
        if self.calls == 4:
            raise RuntimeError("boom")
        return super().execute(steps)


from cluster.engine import Engine  # noqa: E402
from scheduler.scheduler import SchedulerConfig  # noqa: E402

cfg = SchedulerConfig(num_blocks=256, block_size=16, max_model_len=2048, vocab_size=TOK.vocab_size,
                      eos_token_ids=TOK.eos_token_ids)
for chat in (False, True):
    f_eng = Engine(Failing(TOK.encode(" hello") * 40), cfg, lambda ids: TOK.decode(ids, skip_special_tokens=True),
                   special_ids=TOK.special_ids)
    f_ing = ingress(f_eng)
    req = {"messages": [{"role": "user", "content": "hi"}]} if chat else {"prompt": [5, 6, 7]}
    st, raw = call(f_ing, "chat" if chat else "completions",
                   {**req, "max_tokens": 20, "n": 2, "stream": True, "stream_options": {"include_usage": True}})
    chunks, problems = parse_sse(raw)
    errors = [c for c in chunks if c != "[DONE]" and "error" in c]
    usage = [c for c in chunks if c != "[DONE]" and "error" not in c and not c["choices"]]
    print(f"c. {'chat' if chat else 'completions'} error mid-stream: {len(chunks)} events, errors {errors}, "
          f"framing problems {problems}")
    check(len(errors) == 1 and chunks[-2] is errors[0] and not problems and not usage,
          "c. one error event, then [DONE], no usage chunk")
    f_ing.aeng.shutdown()

# d. continuous usage
for endpoint in ("completions", "chat"):
    req = {"messages": [{"role": "user", "content": "hi"}]} if endpoint == "chat" else {"prompt": ["Hello", "Hi there"]}
    st, raw = call(ing, endpoint, {**req, "max_tokens": 6, "n": 2, "temperature": 0, "stream": True,
                                   "stream_options": {"include_usage": True, "continuous_usage_stats": True},
                                   "ignore_eos": True})
    chunks, problems = parse_sse(raw)
    data = [c for c in chunks if c != "[DONE]"]
    bad = [validate_chunk(c, endpoint == "chat") for c in data if validate_chunk(c, endpoint == "chat")]
    last = {}
    for c in data[:-1]:
        i = c["choices"][0]["index"]
        u = c["usage"]
        if i in last and u["completion_tokens"] < last[i]["completion_tokens"]:
            bad.append(f"choice {i} usage went down {last[i]} -> {u}")
        last[i] = u
    total = data[-1]["usage"]
    want = sum(u["completion_tokens"] for u in last.values())
    print(f"d. {endpoint}: per-choice last usage {last}; final {total}")
    check(not bad and not problems and total["completion_tokens"] == want
          and total["prompt_tokens"] == sum(u["prompt_tokens"] for k, u in last.items() if k % 2 == 0),
          f"d. {endpoint}: continuous usage per choice, final usage the sum {bad[:2]}")

# e. echo with max_tokens 0; stop_reason streamed == whole
body = {"prompt": "Hello \u4e2d\u6587", "max_tokens": 0, "echo": True, "logprobs": 2}
st, whole = call(ing, "completions", body)
st, raw = call(ing, "completions", {**body, "stream": True})
chunks, problems = parse_sse(raw)
acc = joined(chunks, False, 1)[0]
check(acc["text"] == whole["choices"][0]["text"] and not problems,
      f"e. echo, max_tokens 0: streamed text == whole ({acc['text']!r} vs {whole['choices'][0]['text']!r})")
body = {"prompt": "Hello", "max_tokens": 30, "temperature": 0, "stop": [" the", "LORD"]}
st, whole = call(ing, "completions", body)
st, raw = call(ing, "completions", {**body, "stream": True})
chunks, _ = parse_sse(raw)
s_stop = [c["choices"][0].get("stop_reason") for c in chunks if c != "[DONE]" and c["choices"]
          and c["choices"][0]["finish_reason"]]
check(s_stop == [whole["choices"][0]["stop_reason"]] and whole["choices"][0]["stop_reason"] is not None,
      f"e. stop_reason streamed {s_stop} == whole {whole['choices'][0]['stop_reason']!r}")
ing.aeng.shutdown()
done()
