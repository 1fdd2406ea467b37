"""What a chat request's messages hand the chat template (session 58's review of the input side): the fields GLM-5.x's
templates read, the ones the server sets itself, and input no template walk survives."""

from __future__ import annotations

import asyncio

import pytest

from cluster.protocol import ApiError, ChatCompletionRequest


def _chat(messages: list[dict], **extra) -> ChatCompletionRequest:
    return ChatCompletionRequest.model_validate({"model": "m", "messages": messages, **extra})


def test_tool_call_ids_and_every_reasoning_name_reach_the_template():
    """``tool_call_id`` (GLM-5.x's template puts parallel results back in the calls' order by it) and reasoning sent
    back as vLLM's ``reasoning`` or as ``thinking`` were dropped by the request model, so the template never saw them."""
    call = {"id": "call_b", "type": "function", "function": {"name": "read", "arguments": "{}"}}
    msgs = _chat([{"role": "user", "content": "go"},
                  {"role": "assistant", "reasoning": "Read first.", "tool_calls": [call]},
                  {"role": "tool", "tool_call_id": "call_b", "content": "# readme"},
                  {"role": "assistant", "thinking": "Done.", "content": "ok"}]).template_messages()
    assert msgs[1]["reasoning"] == "Read first." and msgs[2]["tool_call_id"] == "call_b"
    assert msgs[3]["thinking"] == "Done."
    from cluster.config import DEFAULT_MODEL
    from models.tokenizer import Tokenizer

    tok = Tokenizer.from_dir(DEFAULT_MODEL)
    as_content = [dict(m) for m in msgs]
    as_content[1]["reasoning_content"] = as_content[1].pop("reasoning")
    as_content[3]["reasoning_content"] = as_content[3].pop("thinking")
    assert "Read first." in tok.apply_chat_template(msgs)
    assert tok.apply_chat_template(msgs) == tok.apply_chat_template(as_content)


def test_tools_inside_chat_template_kwargs_are_refused():
    """Tools there skipped the tools' checks and their calls were never parsed: like the messages, the server sets
    them (from the request's ``tools``)."""
    with pytest.raises(ValueError, match="tools"):
        _chat([{"role": "user", "content": "hi"}], chat_template_kwargs={"tools": [{"function": {"name": "f"}}]})


def test_messages_nested_too_deeply_to_render_are_a_400():
    """A body the JSON parser takes (~900 levels) but the template's walk over it cannot (a special token's text at the
    bottom of a tool's schema): a RecursionError, which was a 500."""
    import types

    from cluster.config import DEFAULT_MODEL
    from cluster.serve import OpenAIIngress
    from models.tokenizer import Tokenizer

    deep: dict = {"description": "<|user|>"}
    for _ in range(900):
        deep = {"type": "object", "properties": {"x": deep}}
    body = _chat([{"role": "user", "content": "hi"}], tools=[{"type": "function", "function": {
        "name": "f", "parameters": deep}}])
    ingress = types.SimpleNamespace(tokenizer=Tokenizer.from_dir(DEFAULT_MODEL))
    ingress._tokenizer = lambda: ingress.tokenizer
    with pytest.raises(ApiError) as e:
        asyncio.run(OpenAIIngress._chat_ids(ingress, body))
    assert (e.value.status, e.value.param) == (400, "messages") and "nested too deeply" in e.value.message


def test_a_chat_template_file_replaces_the_models(tmp_path):
    """``chat_template`` (``--chat-template``, vLLM's): an operator's fixed template replaces the model folder's; a
    missing file, or a template for a checkpoint without a tokenizer, is a config error naming the field."""
    from cluster.config import DEFAULT_MODEL
    from cluster.local import load_tokenizer

    f = tmp_path / "fixed.jinja"
    f.write_text("{% for m in messages %}[{{ m.role }}] {{ m.content }}{% endfor %}")
    assert load_tokenizer(DEFAULT_MODEL, str(f)).apply_chat_template([{"role": "user", "content": "hi"}]) == "[user] hi"
    with pytest.raises(ValueError, match="'chat_template': no file"):
        load_tokenizer(DEFAULT_MODEL, str(tmp_path / "missing.jinja"))
    with pytest.raises(ValueError, match="'chat_template' is set, but .* ships no tokenizer"):
        load_tokenizer(tmp_path, str(f))


def test_a_render_past_its_deadline_is_a_400(tmp_path, monkeypatch):
    """A template whose work grows with the square of the messages (GLM-5.x's orders a turn's tool results by call id,
    scanning the messages after each) held a tokenizer thread for minutes on a few megabytes of history; a render now
    stops at ``RENDER_SECONDS`` with an error naming it, and the next render has its own time."""
    import time
    import types

    import models.tokenizer as mt
    from cluster.config import DEFAULT_MODEL
    from cluster.local import load_tokenizer
    from cluster.serve import OpenAIIngress

    f = tmp_path / "square.jinja"
    f.write_text("{% for m in messages %}{% for j in range(loop.index0, messages | length) %}"
                 "{% if messages[j].role == 'x' %}!{% endif %}{% endfor %}[{{ m.role }}]{% endfor %}"
                 "{% for a in range(100) %}{% for i in range(99999) %}{% if i < 0 %}?{% endif %}{% endfor %}"
                 "{% endfor %}")
    monkeypatch.setattr(mt, "RENDER_SECONDS", 0.2)
    start = time.monotonic()
    with pytest.raises(mt.RenderTimeout, match="over 0.2 s"):     # ranges alone (no attribute read): stopped in them
        load_tokenizer(DEFAULT_MODEL, str(f)).apply_chat_template([{"role": "user", "content": "hi"}])
    assert time.monotonic() - start < 5
    f.write_text(f.read_text().split("{% for a")[0])
    tok = load_tokenizer(DEFAULT_MODEL, str(f))
    assert tok.apply_chat_template([{"role": "user", "content": "hi"}]) == "[user]"
    body = _chat([{"role": "user", "content": "hi"}] * 3000)
    ingress = types.SimpleNamespace(tokenizer=tok, _tokenizer=lambda: tok)
    with pytest.raises(ApiError) as e:
        asyncio.run(OpenAIIngress._chat_ids(ingress, body))
    assert (e.value.status, e.value.param) == (400, "messages") and "took over 0.2 s" in e.value.message
    assert tok.apply_chat_template([{"role": "user", "content": "hi"}] * 3) == "[user]" * 3   # a fresh deadline
