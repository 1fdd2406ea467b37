"""A skipped thought (thinking on: the prompt opens <think>; the model answers and stops, never writing </think>) is
the answer (cluster/parsers.py ReasoningSplit.skipped): the chat's whole answer has it as `content` only, and its stream
sends it as reasoning deltas and then once more as content (formatter.py chunks). The Messages / Responses converters
build their answers from that stream, whole (non-streamed) answers included — so both carry the answer twice: a
thinking block + a text block, a reasoning item + a message. Checked for the real Engine._emit at k = 0 and 3.
Exits 1 while the Messages / Responses whole answers differ from the chat's whole answer."""
import json

from _h2 import EOS, anth_sdk_final, anth_sse, anth_whole, chat_whole, check, chunks_of, done, enc, engine_events, \
    resp_whole

script = [*enc("Paris is the capital of France."), EOS]
for k in (0, 3):
    print(f"--- engine k={k}: thinking on, output {'Paris is the capital of France.'!r} + EOS, no </think>")
    evs = engine_events(script, k)
    chat = chat_whole(evs)["choices"][0]["message"]
    ch = chunks_of(evs)
    anth = anth_whole(ch)
    resp = resp_whole(ch)
    print("  chat whole message:     ", json.dumps(chat))
    print("  Messages whole content: ", json.dumps(anth["content"]))
    print("  Responses whole output: ", json.dumps([{k2: v for k2, v in i.items() if k2 in ("type", "content")}
                                                   for i in resp["output"]]))
    sdk = anth_sdk_final(anth_sse(ch))
    print("  anthropic SDK (stream): ", [b.to_dict() for b in sdk.content])
    check(chat.get("reasoning_content") is None and chat["content"] == "Paris is the capital of France.",
          "chat whole: the answer is content, no reasoning (the documented behaviour)")
    check([b["type"] for b in anth["content"]] == ["text"],
          "Messages whole: one text block, as the chat's whole answer (no thinking block repeating it)")
    check([i["type"] for i in resp["output"]] == ["message"],
          "Responses whole: one message item, as the chat's whole answer (no reasoning item repeating it)")
    print("  Responses usage reasoning_tokens:", resp["usage"]["output_tokens_details"]["reasoning_tokens"],
          "(0, beside a reasoning item)")
done()
