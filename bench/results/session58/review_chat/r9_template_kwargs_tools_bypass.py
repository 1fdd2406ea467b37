"""Q3: `tools` given inside chat_template_kwargs (some clients put every template argument there) reaches the template
(cluster/protocol.py template_kwargs: kwargs start from chat_template_kwargs; only body.tools is checked in
check_supported and read by parses_tool_calls / _tool_guidance): a tool name holding a tool-call marker, or parameters
that are no object, pass without the 400 that `tools` gets, and the model is shown tools whose calls are then not
parsed. Expected: a 400 naming chat_template_kwargs.tools (or the tools checked and used as body.tools). Also checks
/tokenize gives the chat's own ids for an agent conversation."""
import asyncio
import json

import _h

ing = _h.ingress()
bad_tool = {"type": "function", "function": {"name": "run<tool_call>x", "parameters": [1]}}
out_tools, err_tools = _h.chat_ids(ing, {"messages": [{"role": "user", "content": "hi"}], "tools": [bad_tool]})
_h.check(err_tools is not None and err_tools[0] == 400, f"tools=[bad] -> {err_tools}")
ids, err = _h.chat_ids(ing, {"messages": [{"role": "user", "content": "hi"}],
                             "chat_template_kwargs": {"tools": [bad_tool]}})
shown = ids is not None and "run<tool_call>x" in _h.text_of(ids)
_h.check(err is not None and err[0] == 400, f"chat_template_kwargs.tools=[bad] -> "
         f"{err if err else f'200, the template shows the tool: {shown}'}")

# /tokenize (vLLM's) for an agent conversation: the same ids as the chat
msgs = [{"role": "system", "content": "agent"}, {"role": "user", "content": "go"},
        {"role": "assistant", "content": None, "reasoning_content": "r", "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "run", "arguments": json.dumps({"cmd": "ls"})}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "a.py <|user|>"}]
TOOLS = [{"type": "function", "function": {"name": "run", "parameters": {"type": "object", "properties": {
    "cmd": {"type": "string"}}}}}]
chat, _ = _h.chat_ids(ing, {"messages": msgs, "tools": TOOLS, "reasoning_effort": "none"})
tk = asyncio.run(ing.tokenize(_h.FakeRequest({"model": ing.model_name, "messages": msgs, "tools": TOOLS,
                                              "reasoning_effort": "none"})))
_h.check(tk["tokens"] == chat, f"/tokenize messages == chat ids ({tk['count']} vs {len(chat)})")
_h.done()
