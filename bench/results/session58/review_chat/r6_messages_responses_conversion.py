"""Q2: /v1/messages (Anthropic) and /v1/responses input → the chat prompt. Each converted prompt's ids (the real
ingress: _parse, to_chat, _chat_ids) must equal transformers' rendering of the equivalent OpenAI chat request; images,
documents and orphan tool results must be 400s naming the block."""
import json

import _h

ing = _h.ingress()
A_TOOLS = [{"name": "Read", "description": "Read a file", "input_schema": {"type": "object", "properties": {
    "file_path": {"type": "string"}}, "required": ["file_path"]}},
           {"name": "Bash", "input_schema": {"type": "object", "properties": {"command": {"type": "string"},
                                                                                "timeout": {"type": "number"}}}}]
C_TOOLS = [{"type": "function", "function": {"name": t["name"], "parameters": t["input_schema"],
                                             **({"description": t["description"]} if "description" in t else {})}}
           for t in A_TOOLS]


def tc(cid, name, args):
    return {"id": cid, "type": "function", "function": {"name": name, "arguments": args}}


# ---- Anthropic: a Claude Code-like turn ------------------------------------------------------------------------
a_body = {"max_tokens": 1024, "tools": A_TOOLS,
          "system": [{"type": "text", "text": "You are Claude Code. "}, {"type": "text", "text": "Be brief.",
                                                                         "cache_control": {"type": "ephemeral"}}],
          "messages": [
              {"role": "user", "content": [{"type": "text", "text": "<system-reminder>ctx</system-reminder>"},
                                           {"type": "text", "text": "fix the bug in a.py"}]},
              {"role": "assistant", "content": [
                  {"type": "thinking", "thinking": "read it and run tests", "signature": "sig"},
                  {"type": "text", "text": "Let me look."},
                  {"type": "tool_use", "id": "toolu_1", "name": "Read", "input": {"file_path": "/r/a.py"}},
                  {"type": "tool_use", "id": "toolu_2", "name": "Bash", "input": {"command": "pytest", "timeout": 60}}]},
              {"role": "user", "content": [
                  {"type": "tool_result", "tool_use_id": "toolu_1", "content": [{"type": "text", "text": "x = 1"}]},
                  {"type": "tool_result", "tool_use_id": "toolu_2", "content": "1 failed", "is_error": True}]}]}
a_chat = [{"role": "system", "content": "You are Claude Code. Be brief."},
          {"role": "user", "content": "<system-reminder>ctx</system-reminder>fix the bug in a.py"},
          {"role": "assistant", "content": "Let me look.", "reasoning_content": "read it and run tests",
           "tool_calls": [tc("toolu_1", "Read", {"file_path": "/r/a.py"}),
                          tc("toolu_2", "Bash", {"command": "pytest", "timeout": 60})]},
          {"role": "tool", "tool_call_id": "toolu_1", "content": "x = 1"},
          {"role": "tool", "tool_call_id": "toolu_2", "content": "Error: 1 failed"}]
for thinking, kw in ((None, {"enable_thinking": False}), ({"type": "enabled", "budget_tokens": 1024}, {})):
    body = dict(a_body, **({"thinking": thinking, "max_tokens": 2048} if thinking else {}))
    ids, err = _h.messages_ids(ing, body)
    ref, text = _h.hf_ids(_h.args_as_dicts(a_chat), tools=C_TOOLS, **kw)
    _h.check(ids == ref, f"messages: Claude Code-like turn, thinking {thinking and thinking['type']}: "
             f"{'same ids' if ids == ref else 'DIFFER'}")
    if ids != ref:
        print("    glmserve:    ", err or repr(_h.text_of(ids)))
        print("    transformers:", repr(text))

bad_a = [
    ("image block in user content", [{"role": "user", "content": [{"type": "image", "source": {
        "type": "base64", "media_type": "image/png", "data": "iVBORw0KGgo="}}]}], "messages[0].content[0]"),
    ("image inside a tool_result", [
        {"role": "user", "content": "look"},
        {"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "Read", "input": {"file_path": "x"}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "content": [
            {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "AA=="}}]}]}],
     "messages[2].content[0].content"),
    ("document block", [{"role": "user", "content": [{"type": "document", "source": {
        "type": "text", "media_type": "text/plain", "data": "x"}}]}], "messages[0].content[0]"),
    ("tool_result without a tool_use before it", [{"role": "user", "content": [
        {"type": "tool_result", "tool_use_id": "nope", "content": "x"}]}], "messages[0].content[0].tool_use_id"),
    ("role system inside messages", [{"role": "system", "content": "x"}], "messages[0].role"),
]
for name, msgs, param in bad_a:
    ids, err = _h.messages_ids(ing, {"max_tokens": 16, "tools": A_TOOLS, "messages": msgs})
    _h.check(err is not None and err[0] == 400 and err[1] == param, f"messages: {name} -> {err}")

# ---- Responses --------------------------------------------------------------------------------------------------
R_TOOLS = [{"type": "function", "name": t["name"], "parameters": t["input_schema"]} for t in A_TOOLS]
RC_TOOLS = [{"type": "function", "function": {"name": t["name"], "parameters": t["input_schema"]}} for t in A_TOOLS]
r_body = {"instructions": "You are Codex.", "tools": R_TOOLS, "input": [
    {"type": "message", "role": "developer", "content": [{"type": "input_text", "text": "sandbox: read-only"}]},
    {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "why does "},
                                                    {"type": "input_text", "text": "the test fail?"}]},
    {"type": "reasoning", "id": "rs_1", "summary": [], "content": [{"type": "reasoning_text", "text": "check a.py"}]},
    {"type": "function_call", "call_id": "fc_1", "name": "Read", "arguments": json.dumps({"file_path": "a.py"})},
    {"type": "function_call", "call_id": "fc_2", "name": "Bash", "arguments": json.dumps({"command": "pytest"})},
    {"type": "function_call_output", "call_id": "fc_1", "output": "x = 1"},
    {"type": "function_call_output", "call_id": "fc_2", "output": [{"type": "input_text", "text": "1 failed"}]},
    {"type": "reasoning", "id": "rs_2", "summary": [{"type": "summary_text", "text": "x should be 2"}]},
    {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "x should be 2."}]},
    {"type": "message", "role": "user", "content": "fix it"}]}
r_chat = [{"role": "system", "content": "You are Codex."}, {"role": "system", "content": "sandbox: read-only"},
          {"role": "user", "content": "why does the test fail?"},
          {"role": "assistant", "content": None, "reasoning_content": "check a.py",
           "tool_calls": [tc("fc_1", "Read", {"file_path": "a.py"}), tc("fc_2", "Bash", {"command": "pytest"})]},
          {"role": "tool", "tool_call_id": "fc_1", "content": "x = 1"},
          {"role": "tool", "tool_call_id": "fc_2", "content": "1 failed"},
          {"role": "assistant", "content": "x should be 2.", "reasoning_content": "x should be 2"},
          {"role": "user", "content": "fix it"}]
ids, err = _h.responses_ids(ing, r_body)
ref, text = _h.hf_ids(r_chat, tools=RC_TOOLS)
_h.check(ids == ref, f"responses: Codex-like input: {'same ids' if ids == ref else 'DIFFER'}")
if ids != ref:
    print("    glmserve:    ", err or repr(_h.text_of(ids)))
    print("    transformers:", repr(text))
ids2, err2 = _h.responses_ids(ing, dict(r_body, reasoning={"effort": "none"}))
ref2, _ = _h.hf_ids(r_chat, tools=RC_TOOLS, enable_thinking=False)
_h.check(ids2 == ref2, "responses: reasoning.effort none -> enable_thinking false")

bad_r = [
    ("input_image part", [{"type": "message", "role": "user", "content": [
        {"type": "input_image", "image_url": "data:image/png;base64,AA=="}]}], "input[0].content[0]"),
    ("function_call_output without its call", [{"type": "function_call_output", "call_id": "x", "output": "y"}],
     "input[0].call_id"),
    ("function_call with non-JSON arguments", [{"type": "function_call", "call_id": "c", "name": "Read",
                                                "arguments": "{oops"}], "input[0].arguments"),
    ("function_call with a JSON array as arguments", [{"type": "function_call", "call_id": "c", "name": "Read",
                                                       "arguments": "[1]"}], "input[0].arguments"),
    ("unknown item type", [{"type": "item_reference", "id": "x"}], "input[0].type"),
    ("unknown role", [{"type": "message", "role": "critic", "content": "x"}], "input[0].role"),
]
for name, inp, param in bad_r:
    ids, err = _h.responses_ids(ing, {"tools": R_TOOLS, "input": inp})
    _h.check(err is not None and err[0] == 400 and err[1] == param, f"responses: {name} -> {err}")
_h.done()
