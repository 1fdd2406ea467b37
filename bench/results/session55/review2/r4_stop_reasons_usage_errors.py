"""How an answer ends, both APIs, streamed and whole, through the official SDKs (real engine events → Formatter.chunks
→ MessageEvents / ResponseEvents):
  end_turn (EOS), tool_use (a call then EOS), max_tokens (a max_tokens cut; text and mid-call), stop_sequence (a stop
  string: stop_sequence names it), model_context_window_exceeded (a cut where max_tokens was clamped to the context),
  prompt-cache usage (input_tokens uncached, cache_read_input_tokens), an error mid-stream (mid-text and mid-call).
Each: the Anthropic stream's grammar; the anthropic SDK's streamed message == the whole message; the whole message
parses as the SDK's `Message` (messages.create over a mock transport); Responses: the status / incomplete_details, the
openai SDK parses every event, the whole Response == the streamed final one (ids aside). Exits 1 on any failure."""
import json

from _h2 import (EOS, SP, anth_events, anth_grammar, anth_req, anth_sdk_final, anth_sdk_whole, anth_sse, anth_whole,
                 call, check, chunks_of, done, enc, engine_events, resp_events, resp_sdk_final, resp_sse, resp_whole)

T = SP["</think>"]


def strip_ids(x):
    if isinstance(x, dict):
        return {k: strip_ids(v) for k, v in x.items() if k not in ("id", "created_at", "call_id")}
    if isinstance(x, list):
        return [strip_ids(v) for v in x]
    return x


CASES = [  # name, script, engine kwargs, clamped, expected (anthropic stop_reason, stop_sequence, responses status)
    ("end_turn", [T, *enc("Hello."), EOS], {}, False, ("end_turn", None, "completed")),
    ("tool_use", [T, *call("get_weather", ("city", "Paris")), EOS], {}, False, ("tool_use", None, "completed")),
    ("max_tokens text", [T, *enc("one two three four five")], {"max_tokens": 3}, False, ("max_tokens", None, "incomplete")),
    ("max_tokens mid-call", [T, *call("get_weather", ("city", "Paris"), ("days", "3"))], {"max_tokens": 9}, False,
     ("max_tokens", None, "incomplete")),
    ("stop_sequence", [T, *enc("Hello END more"), EOS], {"stop": ("END",)}, False, ("stop_sequence", "END", "completed")),
    ("context window", [T, *enc("one two three four five")], {"max_tokens": 3}, True,
     ("model_context_window_exceeded", None, "incomplete")),
    ("clamped but EOS", [T, *enc("Hi"), EOS], {}, True, ("end_turn", None, "completed")),
]
for name, script, kw, clamped, (reason, seq, status) in CASES:
    for k in (0, 2):
        print(f"--- {name} (k={k})")
        ch = chunks_of(engine_events(script, k, **kw), cached=2)
        evs = anth_events(ch, clamped=clamped)
        whole = anth_whole(ch, clamped=clamped)
        sdk = anth_sdk_final(anth_sse(ch, clamped=clamped))
        print("   whole:", json.dumps({k2: whole[k2] for k2 in ("content", "stop_reason", "stop_sequence", "usage")}))
        check(not anth_grammar(evs), f"{name}: Anthropic grammar {anth_grammar(evs)}")
        check((whole["stop_reason"], whole["stop_sequence"]) == (reason, seq), f"{name}: stop_reason {reason}, {seq}")
        check(not isinstance(sdk, Exception) and strip_ids(sdk.to_dict(exclude_none=True)) ==
              strip_ids({k2: v for k2, v in whole.items() if v is not None} | {"usage": {
                  k2: v for k2, v in whole["usage"].items() if v is not None}}),
              f"{name}: anthropic SDK's streamed message == whole ({sdk if isinstance(sdk, Exception) else 'ok'})")
        typed = anth_sdk_whole(whole)
        check(typed.stop_reason == reason and typed.usage.cache_read_input_tokens == 2 and
              typed.usage.input_tokens == 1, f"{name}: whole parses as the SDK's Message; usage 1 uncached + 2 read")
        r = resp_events(ch)
        rw = resp_whole(ch)
        check(r[-1]["type"] == f"response.{status}" and rw["status"] == status and
              (rw["incomplete_details"] == ({"reason": "max_output_tokens"} if status == "incomplete" else None)),
              f"{name}: Responses {status}")
        typed_r, final = resp_sdk_final(resp_sse(ch))
        check(len(typed_r) == len(r), f"{name}: openai SDK typed every event")
        check(strip_ids(rw) == strip_ids(r[-1]["response"]), f"{name}: Responses whole == streamed final")
        check(rw["usage"]["input_tokens_details"]["cached_tokens"] == 2, f"{name}: Responses cached_tokens")

# errors mid-stream: the Anthropic stream ends with an `error` event the SDK raises; Responses ends response.failed
for name, chunks_tail in [("mid-text", [{"choices": [{"index": 0, "delta": {"content": "Hel"}, "finish_reason": None}]}]),
                          ("mid-call", [{"choices": [{"index": 0, "delta": {"tool_calls": [{"index": 0, "id": "call_1",
                              "type": "function", "function": {"name": "f", "arguments": '{"a": '}}]},
                              "finish_reason": None}]}])]:
    ch = chunks_tail + [{"error": {"message": "the model replica failed", "type": "server_error", "param": None,
                                   "code": None}}]
    evs = anth_events(ch)
    print(f"--- error {name}:", [e["type"] for e in evs], evs[-1])
    check(not anth_grammar(evs) and evs[-1]["type"] == "error" and evs[-1]["error"]["type"] == "api_error",
          f"error {name}: blocks closed, then an api_error event, last")
    sdk = anth_sdk_final(anth_sse(ch))
    check(isinstance(sdk, Exception) and "replica failed" in str(sdk), f"error {name}: anthropic SDK raises ({sdk!r})")
    r = resp_events(ch)
    typed_r, final = resp_sdk_final(resp_sse(ch))
    check(r[-1]["type"] == "response.failed" and len(typed_r) == len(r), f"error {name}: response.failed, SDK typed")
done()
