"""Beyond parity (transformers and vLLM do the same): glmserve encodes a user's, system's or tool's text that holds a
special token's text as plain text (models/tokenizer.py chat_pieces), but not the assistant's own history. A coding
agent that wrote a file holding "<|user|>" (editing a GLM chat template, or this repository's cluster/serve.py _TURNS)
generated those characters as ordinary tokens; replayed in the next request, the tool call's argument (and the
assistant's content) is encoded as the special tokens: a turn boundary and a tool-result marker appear inside the
model's own call, and the prompt no longer holds the tokens the model wrote."""
import json

import _h

ing = _h.ingress()
tok = ing.tokenizer
sp = tok.special_ids_by_token()
code = 'TURNS = ("<|system|>", "<|user|>", "<|assistant|>", "<|observation|>")  # </think> <tool_call>'
TOOLS = [{"type": "function", "function": {"name": "write_file", "parameters": {"type": "object", "properties": {
    "path": {"type": "string"}, "content": {"type": "string"}}}}}]


def conv(text):
    return [{"role": "user", "content": "add the turn tokens to roles.py"},
            {"role": "assistant", "content": None, "tool_calls": [{"id": "c1", "type": "function", "function": {
                "name": "write_file", "arguments": json.dumps({"path": "roles.py", "content": text})}}]},
            {"role": "tool", "tool_call_id": "c1", "content": "wrote roles.py: " + text}]


def specials(text):
    ids, err = _h.chat_ids(ing, {"messages": conv(text), "tools": TOOLS})
    assert ids, err
    return [tok.decode([t], skip_special_tokens=False) for t in ids if t in tok.special_ids]


base = specials("TURNS = ()")
withcode = specials(code)
extra = list(withcode)
for t in base:
    extra.remove(t)
print("special tokens the conversation's structure has:", len(base))
print("special tokens added by the code text (in the call's argument and the tool result):", extra)
as_text = tok.encode_pieces([(code, True)])
_h.check(not any(t in tok.special_ids for t in as_text), "the model can write the code as ordinary tokens")
_h.check(not extra, "no special token comes from the text of the code (tool result: encoded as text; "
         "the assistant's replayed call: as the model wrote it)")
_h.done()
