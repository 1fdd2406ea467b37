"""Messages request → chat request (MessagesRequest.to_chat), the shapes Claude Code and the anthropic SDK send.
Every check here is expected to pass (the findings r3, r5, r6 have their own scripts). Exits 1 on any failure."""
from _h2 import ApiError, anth_req, check, done

W = {"name": "weather", "description": "d", "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}},
     "cache_control": {"type": "ephemeral"}}
TU = {"role": "assistant", "content": [{"type": "thinking", "thinking": "look", "signature": ""},
                                       {"type": "text", "text": "Checking."},
                                       {"type": "tool_use", "id": "toolu_1", "name": "weather", "input": {"city": "P"}},
                                       {"type": "tool_use", "id": "toolu_2", "name": "weather", "input": {}}]}


def chat(**b):
    return anth_req(**b).to_chat()


def err(**b):
    try:
        anth_req(**b).to_chat()
    except ApiError as e:
        return e
    return None


# system: a string or text blocks (cache_control ignored)
check(chat(system="S").template_messages()[0] == {"role": "system", "content": "S"}, "system string")
check(chat(system=[{"type": "text", "text": "A", "cache_control": {"type": "ephemeral"}}, {"type": "text", "text": "B"}]
           ).template_messages()[0] == {"role": "system", "content": "AB"},
      "system blocks joined (as the GLM template joins a message's text parts)")
# tool_use in an assistant turn, tool_result (string / text blocks / none), text after results
m = chat(tools=[W], messages=[{"role": "user", "content": "go"}, TU, {"role": "user", "content": [
    {"type": "tool_result", "tool_use_id": "toolu_1", "content": "sunny"},
    {"type": "tool_result", "tool_use_id": "toolu_2", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]},
    {"type": "text", "text": "<system-reminder>x</system-reminder>"}]}]).template_messages()
check(m[1] == {"role": "assistant", "content": "Checking.", "reasoning_content": "look", "tool_calls": [
    {"id": "toolu_1", "type": "function", "function": {"name": "weather", "arguments": {"city": "P"}}},
    {"id": "toolu_2", "type": "function", "function": {"name": "weather", "arguments": {}}}]},
    "assistant thinking + text + 2 tool_use → one turn (reasoning, content, calls; zero-arg input {})")
check(m[2:] == [{"role": "tool", "content": "sunny"}, {"role": "tool", "content": "ab"},
                {"role": "user", "content": "<system-reminder>x</system-reminder>"}],
      "tool_result string / text blocks → tool messages in order, then the user's text")
m = chat(tools=[W], messages=[{"role": "user", "content": "go"}, TU, {"role": "user", "content": [
    {"type": "tool_result", "tool_use_id": "toolu_1"}, {"type": "tool_result", "tool_use_id": "toolu_2", "content": []}]}]
         ).template_messages()
check(m[2:] == [{"role": "tool", "content": ""}, {"role": "tool", "content": ""}] and m[-1]["role"] == "tool",
      "tool_result without content → empty tool message, no empty user message after results")
# refusals: images / documents / server tools / unknown tool_use_id, each a 400 naming the block
img = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "AA=="}}
for what, body, param in [
        ("image in user content", dict(messages=[{"role": "user", "content": [img]}]), "messages[0].content[0]"),
        ("document", dict(messages=[{"role": "user", "content": [{"type": "document", "source": {}}]}]),
         "messages[0].content[0]"),
        ("image in tool_result", dict(tools=[W], messages=[{"role": "user", "content": "go"}, TU, {"role": "user",
         "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": [img]}]}]),
         "messages[2].content[0].content"),
        ("server tool", dict(tools=[{"type": "web_search_20250305", "name": "web_search"}]), "tools[0]"),
        ("tool_result for no tool_use", dict(messages=[{"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": "x", "content": "r"}]}]), "messages[0].content[0].tool_use_id"),
        ("tool_choice any without tools", dict(tool_choice={"type": "any"}), "tool_choice"),
        ("tool_choice unknown name", dict(tools=[W], tool_choice={"type": "tool", "name": "nope"}), "tool_choice.name")]:
    e = err(**body)
    check(e is not None and e.status == 400 and (e.param or "").startswith(param) and "function" not in e.message,
          f"400 for {what}: {e.param if e else None}: {e.message[:90] if e else None}")
# redacted_thinking is skipped; cache_control / metadata / citations ignored
check(chat(messages=[{"role": "user", "content": "a"}, {"role": "assistant", "content": [
    {"type": "redacted_thinking", "data": "xx"}, {"type": "text", "text": "b"}]}, {"role": "user", "content": "c"}],
    metadata={"user_id": "u"}).template_messages()[1] == {"role": "assistant", "content": "b"},
    "redacted_thinking skipped; metadata accepted")
# thinking
check(chat().template_kwargs().get("enable_thinking") is False, "no thinking field → thinking off (Anthropic's default)")
check(chat(thinking={"type": "disabled"}).template_kwargs().get("enable_thinking") is False, "thinking disabled → off")
c = chat(thinking={"type": "enabled", "budget_tokens": 2048}, max_tokens=4096)
check("enable_thinking" not in c.template_kwargs() and c.thinking_token_budget == 2048, "thinking enabled → on + budget")
c = chat(thinking={"type": "adaptive"})
check("enable_thinking" not in c.template_kwargs() and c.thinking_token_budget is None, "thinking adaptive → on, no budget")
e = err(thinking={"type": "enabled", "budget_tokens": 1024}, max_tokens=2048, tools=[W], tool_choice={"type": "any"})
check(e is not None and e.status == 400, "thinking + forced tool → 400 (as Anthropic)")
# tool_choice
check(chat(tools=[W]).tool_choice == "auto", "tools, no tool_choice → auto")
check(chat(tools=[W], tool_choice={"type": "any"}).tool_choice == "required", "any → required")
check(chat(tools=[W], tool_choice={"type": "tool", "name": "weather"}).forced_function == "weather", "tool → named")
check(chat(tools=[W], tool_choice={"type": "none"}).tool_choice == "none", "none → none")
check(chat(tools=[W], tool_choice={"type": "auto", "disable_parallel_tool_use": True}).parallel_tool_calls is False,
      "disable_parallel_tool_use → parallel_tool_calls false")
check(chat(tools=[W]).tools[0] == {"type": "function", "function": {"name": "weather", "parameters": W["input_schema"],
                                                                    "description": "d"}}, "input_schema → parameters")
# stop_sequences, max_tokens, sampling, prefill
c = chat(stop_sequences=["END"], max_tokens=77, temperature=0.2, top_p=0.9, top_k=5)
check((c.stop, c.max_tokens, c.temperature, c.top_p, c.top_k) == (["END"], 77, 0.2, 0.9, 5),
      "stop_sequences → stop; max_tokens; temperature / top_p / top_k")
c = chat(messages=[{"role": "user", "content": "Say"}, {"role": "assistant", "content": "Hello"}])
check(c.continue_final_message and not c.add_generation_prompt, "last assistant message → prefill (continued)")
done()
