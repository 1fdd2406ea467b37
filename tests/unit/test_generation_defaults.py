"""The model's sampling defaults (``generation_config.json``): a request that leaves a field out takes the model's
value, as vLLM's ``--generation-config auto`` and SGLang's servers do; one it sets keeps its own."""

from __future__ import annotations

import asyncio
import json

import pytest

from cluster.local import sampling_defaults
from cluster.protocol import ChatCompletionRequest, CompletionRequest


def test_the_files_differences_from_transformers_defaults_are_the_models_defaults(tmp_path):
    assert sampling_defaults(tmp_path) == {}                     # no file: none
    (tmp_path / "generation_config.json").write_text(json.dumps({
        "temperature": 0.6, "top_p": 0.95, "top_k": 50, "repetition_penalty": 1.0, "max_new_tokens": 512,
        "do_sample": True, "eos_token_id": [1, 2]}))
    # top_k 50 and repetition_penalty 1.0 are transformers' own defaults: not the model's choice (as vLLM reads it)
    assert sampling_defaults(tmp_path) == {"temperature": 0.6, "top_p": 0.95, "max_new_tokens": 512}
    for bad in ({"top_p": 0}, {"temperature": "hot"}, {"top_k": 2.5}, {"max_new_tokens": 0}):
        (tmp_path / "generation_config.json").write_text(json.dumps(bad))
        with pytest.raises(ValueError, match=f"generation_config.json field '{next(iter(bad))}'"):
            sampling_defaults(tmp_path)


def test_a_request_keeps_what_it_sets_and_takes_the_rest():
    defaults = {"temperature": 0.6, "top_p": 0.95, "top_k": 40, "max_new_tokens": 512}
    chat = ChatCompletionRequest.model_validate({"model": "m", "messages": [{"role": "user", "content": "hi"}],
                                                 "temperature": 0.0})
    got = chat.with_defaults(defaults)
    assert (got.temperature, got.top_p, got.top_k, got.max_tokens) == (0.0, 0.95, 40, None)
    assert CompletionRequest.model_validate({"model": "m", "prompt": "a"}).with_defaults({}).top_p == 1.0


def test_messages_and_responses_leave_unset_sampling_fields_unset():
    """Their own defaults (1.0) were copied into the chat request as if the client had sent them: the model's
    defaults could never apply."""
    from cluster.anthropic import MessagesRequest
    from cluster.responses import ResponsesRequest

    msgs = MessagesRequest.model_validate({"model": "m", "max_tokens": 8,
                                           "messages": [{"role": "user", "content": "hi"}]}).to_chat()
    resp = ResponsesRequest.model_validate({"model": "m", "input": "hi", "top_p": 0.5}).to_chat()
    assert not {"temperature", "top_p", "top_k"} & msgs.model_fields_set
    assert {"temperature", "top_p"} & resp.model_fields_set == {"top_p"}
    assert msgs.with_defaults({"top_p": 0.9}).top_p == 0.9 and resp.with_defaults({"top_p": 0.9}).top_p == 0.5


def test_the_ingress_samples_with_the_models_defaults():
    """End to end through the ingress's ``_start``: the engine gets the model's temperature / top_p where the request
    left them out, and a max_tokens left out is at most the model's max_new_tokens."""
    import types

    from cluster.config import EngineConfig
    from cluster.engine import TokenEvent
    from cluster.serve import OpenAIIngress

    sent = []

    async def opened(ids, params, req_id):
        sent.append(params)
        yield TokenEvent(req_id, [5], "a", finished=True, finish_reason="stop")

    ingress = types.SimpleNamespace(max_model_len=64, think_start=None, think_end=None, tokenizer=None, model_name="m",
                                    tool_ids=None, _open=opened, turn_ids=set(), cfg=EngineConfig(),
                                    sampling_defaults={"temperature": 0.6, "top_p": 0.95, "max_new_tokens": 20})

    async def answer(body):
        fmt, merged = await OpenAIIngress._start(ingress, body, [[1, 2, 3]], None, chat=True)
        await fmt.whole(merged, body.n)

    messages = [{"role": "user", "content": "hi"}]
    asyncio.run(answer(ChatCompletionRequest.model_validate({"model": "m", "messages": messages})))
    asyncio.run(answer(ChatCompletionRequest.model_validate({"model": "m", "messages": messages, "top_p": 0.5,
                                                             "max_tokens": 30})))
    assert [(p.temperature, p.top_p, p.max_tokens) for p in sent] == [(0.6, 0.95, 20), (0.6, 0.5, 30)]


def test_the_ingress_reads_the_model_folders_files(tmp_path):
    """The wiring from the engine config to the files: the ingress of a model folder with a generation_config.json and
    a chat_template.jinja samples with the one and renders with the other; ``generation_config: none`` and a
    ``chat_template`` file of the operator's override them."""
    import shutil

    from cluster.config import DEFAULT_MODEL
    from cluster.serve import OpenAIIngress

    for name in ("config.json", "tokenizer.json", "tokenizer_config.json"):
        shutil.copy(f"{DEFAULT_MODEL}/{name}", tmp_path / name)
    (tmp_path / "generation_config.json").write_text(json.dumps({"temperature": 0.6, "top_p": 0.95}))
    (tmp_path / "chat_template.jinja").write_text("{% for m in messages %}[{{ m.role }}]{{ m.content }}{% endfor %}")
    (tmp_path / "operator.jinja").write_text("{% for m in messages %}<{{ m.content }}>{% endfor %}")
    base = OpenAIIngress.__mro__[1]            # the class under Serve's ASGI wrapper
    hi = [{"role": "user", "content": "hi"}]
    for extra, defaults, prompt in (({}, {"temperature": 0.6, "top_p": 0.95}, "[user]hi"),
                                    ({"generation_config": "none", "chat_template": str(tmp_path / "operator.jinja")},
                                     {}, "<hi>")):
        ingress = base.__new__(base)
        base.__init__(ingress, None, {"model": str(tmp_path), "kv_cache_tokens": 4096, "max_model_len": 1024, **extra})
        assert ingress.sampling_defaults == defaults and ingress.tokenizer.apply_chat_template(hi) == prompt
