"""Responses request → chat request (ResponsesRequest.to_chat), the shapes Codex / the OpenAI Agents SDK send, and the
reasoning round trip (a streamed reasoning item with include reasoning.encrypted_content, sent back as input).
Every check here is expected to pass. Exits 1 on any failure."""
import asyncio

from _h2 import ApiError, _feed, check, done, resp_req

from cluster.responses import ResponseEvents

F = {"type": "function", "name": "shell", "strict": False,
     "parameters": {"type": "object", "properties": {"command": {"type": "array", "items": {"type": "string"}}}}}


def chat(**b):
    return resp_req(**b).to_chat()


def err(**b):
    try:
        resp_req(**b).to_chat()
    except ApiError as e:
        return e
    except Exception as e:  # noqa: BLE001  (pydantic's, a 400 in serve)
        return e
    return None


check(chat(input="hi").template_messages() == [{"role": "user", "content": "hi"}], "input string → one user message")
check(chat(input="hi", instructions="I").template_messages()[0] == {"role": "system", "content": "I"},
      "instructions → system message first")
# a reasoning item streamed with include=[reasoning.encrypted_content], then sent back as Codex sends it (content null)
req = resp_req(include=["reasoning.encrypted_content"], stream=True)
out = asyncio.run(ResponseEvents(req, "m").whole(_feed([
    {"choices": [{"index": 0, "delta": {"role": "assistant", "reasoning_content": "I should list."}, "finish_reason": None}]},
    {"choices": [{"index": 0, "delta": {"tool_calls": [{"index": 0, "id": "call_1", "type": "function", "function": {
        "name": "shell", "arguments": "{\"command\": [\"ls\"]}"}}]}, "finish_reason": "tool_calls"}]},
    {"choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": 5, "total_tokens": 8,
                              "prompt_tokens_details": {"cached_tokens": 0},
                              "completion_tokens_details": {"reasoning_tokens": 3}}}])))
rs, fc = out["output"]
back = [{"type": "message", "role": "developer", "content": [{"type": "input_text", "text": "<perm/>"}]},
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "ls"}]},
        {"type": "reasoning", "id": rs["id"], "summary": [], "content": None, "encrypted_content": rs["encrypted_content"]},
        {k: fc[k] for k in ("type", "id", "call_id", "name", "arguments")},
        {"type": "function_call_output", "call_id": fc["call_id"], "output": "a.txt"},
        {"type": "reasoning", "id": "rs_x", "summary": [{"type": "summary_text", "text": "done"}]},
        {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Done."}]},
        {"type": "function_call", "call_id": "c2", "name": "shell", "arguments": ""},
        {"type": "function_call_output", "call_id": "c2", "output": [{"type": "input_text", "text": "x"},
                                                                     {"type": "input_text", "text": "y"}]},
        {"role": "user", "content": "thanks"}]
m = chat(input=back, tools=[F], include=["reasoning.encrypted_content"], store=False).template_messages()
check(m == [{"role": "system", "content": "<perm/>"}, {"role": "user", "content": "ls"},
            {"role": "assistant", "reasoning_content": "I should list.", "tool_calls": [
                {"id": fc["call_id"], "type": "function", "function": {"name": "shell", "arguments": {"command": ["ls"]}}}]},
            {"role": "tool", "content": "a.txt"},
            {"role": "assistant", "content": "Done.", "reasoning_content": "done",
             "tool_calls": [{"id": "c2", "type": "function", "function": {"name": "shell", "arguments": {}}}]},
            {"role": "tool", "content": "xy"}, {"role": "user", "content": "thanks"}],
      f"Codex-shaped items → turns (encrypted reasoning read back; summary as reasoning; '' arguments → {{}})\n        {m}")
c = chat(tools=[F], tool_choice="required", parallel_tool_calls=False)
check((c.tool_choice, c.parallel_tool_calls, c.tools[0]["function"]["name"]) == ("required", False, "shell"),
      "tools (flat function) → chat tools; tool_choice; parallel_tool_calls")
check(chat(tools=[F], tool_choice={"type": "function", "name": "shell"}).forced_function == "shell", "named tool_choice")
c = chat(text={"format": {"type": "json_schema", "name": "x", "strict": True,
                          "schema": {"type": "object", "properties": {"a": {"type": "string"}}}}})
check(c.response_format == {"type": "json_schema", "json_schema": {"name": "x", "strict": True, "schema": {
    "type": "object", "properties": {"a": {"type": "string"}}}}}, "text.format json_schema → response_format")
check(chat(max_output_tokens=50).max_tokens == 50, "max_output_tokens → max_tokens")
check(chat(reasoning={"effort": "none"}).template_kwargs().get("enable_thinking") is False, "reasoning.effort none → off")
check(chat(store=True) is not None and chat(metadata={"a": "b"}) is not None, "store true / metadata accepted")
for what, body, param in [
        ("previous_response_id", dict(previous_response_id="resp_1"), "previous_response_id"),
        ("custom tool", dict(tools=[{"type": "custom", "name": "apply_patch"}]), "tools[0]"),
        ("input_image", dict(input=[{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]),
         "input[0].content[0]"),
        ("function_call_output before its call", dict(input=[{"type": "function_call_output", "call_id": "c",
                                                              "output": "x"}]), "input[0].call_id"),
        ("item_reference", dict(input=[{"type": "item_reference", "id": "x"}]), "input[0].type"),
        ("conversation", dict(conversation="conv_1"), "conversation")]:
    e = err(**body)
    check(isinstance(e, ApiError) and e.status == 400 and e.param == param, f"400 for {what} ({getattr(e, 'param', e)})")
done()
