"""A tool_result block with `is_error: true` (Claude Code sends it for a failed or refused tool run) becomes a chat tool
message holding only the content: nothing in the prompt the model reads says the tool failed (anthropic.py:129-133
reads tool_use_id and content, never is_error). Where the content itself does not say so (an empty result, a bare
exit code, "permission denied" vs. a real file holding that text), the model cannot tell failure from output.
Exits 1 while the rendered prompt is the same with is_error true and false."""
from _h2 import TOK, anth_req, check, done

tu = {"role": "assistant", "content": [{"type": "tool_use", "id": "toolu_1", "name": "run", "input": {"cmd": "make"}}]}
W = {"name": "run", "input_schema": {"type": "object", "properties": {"cmd": {"type": "string"}}}}


def prompt(is_error):
    res = {"type": "tool_result", "tool_use_id": "toolu_1", "content": "exit status 2"}
    if is_error is not None:
        res["is_error"] = is_error
    chat = anth_req(tools=[W], messages=[{"role": "user", "content": "build it"}, tu,
                                         {"role": "user", "content": [res]}]).to_chat()
    msgs = chat.template_messages()
    text = TOK.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True, **chat.template_kwargs()) \
        if hasattr(TOK, "apply_chat_template") else None
    return msgs, text


ok_msgs, ok_text = prompt(False)
err_msgs, err_text = prompt(True)
print("is_error false → tool message:", ok_msgs[-1])
print("is_error true  → tool message:", err_msgs[-1])
if err_text is not None:
    print("rendered tail (is_error true):", repr(err_text[-80:]))
check(err_msgs != ok_msgs, "is_error: true leaves a trace in the chat messages (e.g. the content marked as an error)")
done()
