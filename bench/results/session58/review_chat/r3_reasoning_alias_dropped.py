"""Q1: an assistant message's reasoning sent back under `reasoning` (vLLM's newer response field name, OpenRouter's)
or `thinking`: transformers' apply_chat_template aliases both to `reasoning_content` (_alias_reasoning_fields), and so
does glmserve's own Tokenizer.apply_chat_template (models/tokenizer.py _REASONING_FIELDS) — but the chat endpoint's
pydantic ChatMessage (cluster/protocol.py, extra="ignore", only reasoning_content declared) drops them before the
tokenizer sees them: the tool loop's reasoning vanishes from the prompt."""
import json

import _h

ing = _h.ingress()
base = [{"role": "user", "content": "list the repo"},
        {"role": "assistant", "content": None, "tool_calls": [{"id": "c1", "type": "function", "function": {
            "name": "run", "arguments": json.dumps({"cmd": "ls"})}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "a.py"}]
TOOLS = [{"type": "function", "function": {"name": "run", "parameters": {"type": "object", "properties": {
    "cmd": {"type": "string"}}}}}]
for key in ("reasoning_content", "reasoning", "thinking"):
    msgs = json.loads(json.dumps(base))
    msgs[1][key] = "I will list the files first."
    _h.compare(ing, f"assistant reasoning under '{key}'", {"messages": msgs, "tools": TOOLS}, msgs)
_h.done()
