"""Check (right): the agent loop over the Messages API (as Claude Code sends it: system blocks with cache_control, tool_use
sent back, tool_result blocks in a user message; tool_choice forcing a call, thinking off) and over the Responses API
(as Codex sends it: developer message, output items sent back verbatim, function_call_output items; store false,
include reasoning.encrypted_content) reuses each turn's prompt: turn N+1's cached tokens (cache_read_input_tokens /
input_tokens_details.cached_tokens) cover turn N's whole prompt in whole 16-token blocks. The Messages usage also adds up
to count_tokens of the same request. Streamed with the SDKs' helpers (messages.stream, responses.stream)."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from _server import MODEL, server  # noqa: E402

BLOCK = 16


def messages_loop(url: str, bad: list) -> None:
    import anthropic
    a = anthropic.Anthropic(base_url=url, api_key="x", max_retries=0)
    tools = [{"name": "list_dir", "description": "List the directory", "input_schema": {"type": "object", "properties": {}}}]
    system = [{"type": "text", "text": "You are Claude Code (r3).", "cache_control": {"type": "ephemeral"}}]
    msgs = [{"role": "user", "content": [{"type": "text", "text": "What is in this directory?"}]}]
    prev = None
    for turn in range(4):
        with a.messages.stream(model=MODEL, max_tokens=24, messages=msgs, tools=tools, system=system,
                               tool_choice={"type": "tool", "name": "list_dir"}, extra_body={"temperature": 0}) as s:
            for _ in s:
                pass
            msg = s.get_final_message()
        u = msg.usage
        prompt = u.input_tokens + (u.cache_read_input_tokens or 0)
        count = a.messages.count_tokens(model=MODEL, messages=msgs, tools=tools, system=system).input_tokens
        need = prev // BLOCK * BLOCK if prev else 0
        print(f"messages turn {turn}: prompt {prompt} (count_tokens {count}), cache_read {u.cache_read_input_tokens}, "
              f"previous prompt {prev} -> at least {need}; stop {msg.stop_reason}, blocks {[b.type for b in msg.content]}")
        if (u.cache_read_input_tokens or 0) < need or count != prompt:
            bad.append(f"messages turn {turn}")
        prev = prompt
        msgs.append({"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in msg.content]})
        uses = [b for b in msg.content if b.type == "tool_use"]
        msgs.append({"role": "user", "content": [{"type": "tool_result", "tool_use_id": b.id, "content": "a.py b.py"}
                                                 for b in uses] or "go on"})


def responses_loop(url: str, bad: list) -> None:
    from openai import OpenAI
    c = OpenAI(base_url=url + "/v1", api_key="x", max_retries=0)
    tools = [{"type": "function", "name": "read_file", "description": "Read a file", "strict": True,
              "parameters": {"type": "object", "properties": {"path": {"type": "string", "enum": ["main.py", "util.py"]}},
                             "required": ["path"], "additionalProperties": False}}]
    inp = [{"type": "message", "role": "developer", "content": [{"type": "input_text", "text": "You are Codex (r3)."}]},
           {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Read main.py."}]}]
    prev = None
    for turn in range(4):
        with c.responses.stream(model=MODEL, input=inp, tools=tools, tool_choice="required", max_output_tokens=60,
                                temperature=0, include=["reasoning.encrypted_content"], reasoning={"effort": "none"},
                                store=False, parallel_tool_calls=False) as s:
            for _ in s:
                pass
            final = s.get_final_response()
        u = final.usage
        cached = u.input_tokens_details.cached_tokens
        need = prev // BLOCK * BLOCK if prev else 0
        print(f"responses turn {turn}: prompt {u.input_tokens}, cached {cached}, previous prompt {prev} -> at least "
              f"{need}; status {final.status}, items {[o.type for o in final.output]}")
        if cached < need:
            bad.append(f"responses turn {turn}")
        prev = u.input_tokens
        for item in final.output:
            inp.append(item.model_dump(exclude_none=True))
            if item.type == "function_call":
                inp.append({"type": "function_call_output", "call_id": item.call_id, "output": "print('hi')"})


def main() -> int:
    bad: list[str] = []
    with server() as url:
        messages_loop(url, bad)
        responses_loop(url, bad)
    print("FAILED: " + ", ".join(bad) if bad else "ok: each turn reused the previous prompt")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
