"""Q1 with a GLM-5-like template (glm5_like.jinja: GLM-5.x's tool-result ordering by tool_call_id, reasoning_effort,
clear_thinking): glmserve's pydantic ChatMessage keeps no `tool_call_id` (cluster/protocol.py ChatMessage, extra=
"ignore"), so a template that reads it (GLM-5.x's puts parallel results in the calls' order by it) renders otherwise
than transformers. Also checks the template's other kwargs reach it as transformers passes them."""
import json
import os

import _h

TEMPLATE = open(os.path.join(_h.HERE, "glm5_like.jinja")).read()
MODEL = _h.model_dir(template=TEMPLATE)
ing = _h.ingress(MODEL)
TOOLS = [{"type": "function", "function": {"name": "read_file", "parameters": {"type": "object", "properties": {
    "path": {"type": "string"}}}}},
         {"type": "function", "function": {"name": "grep", "parameters": {"type": "object", "properties": {
             "pattern": {"type": "string"}}}}}]


def call(cid, name, args):
    return {"id": cid, "type": "function", "function": {"name": name, "arguments": json.dumps(args)}}


head = [{"role": "system", "content": "coding agent"}, {"role": "user", "content": "where is f defined?"},
        {"role": "assistant", "content": None, "reasoning_content": "search in parallel",
         "tool_calls": [call("call_a", "grep", {"pattern": "def f"}), call("call_b", "read_file", {"path": "README"})]}]
in_order = head + [{"role": "tool", "tool_call_id": "call_a", "content": "src/f.py:1"},
                   {"role": "tool", "tool_call_id": "call_b", "content": "# readme"}]
out_of_order = head + [{"role": "tool", "tool_call_id": "call_b", "content": "# readme"},
                       {"role": "tool", "tool_call_id": "call_a", "content": "src/f.py:1"}]
later = in_order + [{"role": "assistant", "content": "In src/f.py.", "reasoning_content": "found"},
                    {"role": "user", "content": "thanks"}]

_h.compare(ing, "results in the calls' order", {"messages": in_order, "tools": TOOLS}, in_order, MODEL)
_h.compare(ing, "parallel results out of the calls' order (the template orders them by tool_call_id)",
           {"messages": out_of_order, "tools": TOOLS}, out_of_order, MODEL)
_h.compare(ing, "reasoning_effort high reaches the template", {"messages": in_order, "tools": TOOLS,
           "reasoning_effort": "high"}, in_order, MODEL, reasoning_effort="high")
_h.compare(ing, "chat_template_kwargs clear_thinking false keeps earlier reasoning",
           {"messages": later, "tools": TOOLS, "chat_template_kwargs": {"clear_thinking": False}}, later, MODEL,
           clear_thinking=False)
_h.compare(ing, "chat_template_kwargs enable_thinking false", {"messages": later, "chat_template_kwargs": {
    "enable_thinking": False}}, later, MODEL, enable_thinking=False)
_h.done()
