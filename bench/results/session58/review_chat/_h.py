"""Shared helpers for the session 58 chat-input review: the real OpenAIIngress methods that turn a request into prompt
ids (_parse, _chat_ids, messages, responses, count_tokens) driven without Ray or an engine, and transformers'
AutoTokenizer.apply_chat_template over the same model folder as the reference."""
from __future__ import annotations

import asyncio
import json
import os
import shutil
import sys
import tempfile
import time

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "../../../.."))
HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, ROOT)
os.chdir(ROOT)
os.environ.setdefault("RAY_AUTH_MODE", "disabled")
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

TINY = os.path.join(ROOT, "models/tiny")
FAILS: list[str] = []
T0 = time.time()


def check(cond: bool, what: str) -> bool:
    print(("ok   " if cond else "FAIL ") + what, flush=True)
    if not cond:
        FAILS.append(what)
    return cond


def done() -> None:
    print(f"\n{len(FAILS)} failure(s) in {time.time() - T0:.1f} s")
    for f in FAILS:
        print("  -", f)
    sys.exit(1 if FAILS else 0)


def model_dir(template: str | None = None, jinja_file: str | None = None, keep_config_template: bool = True) -> str:
    """A copy of the tiny model's folder (config + tokenizer, no weights) with ``template`` in tokenizer_config.json
    and/or ``jinja_file`` as chat_template.jinja."""
    d = tempfile.mkdtemp(prefix="review_chat_")
    for f in ("config.json", "tokenizer.json"):
        shutil.copy(os.path.join(TINY, f), d)
    cfg = json.load(open(os.path.join(TINY, "tokenizer_config.json")))
    if template is not None:
        cfg["chat_template"] = template
    if not keep_config_template:
        cfg.pop("chat_template", None)
    json.dump(cfg, open(os.path.join(d, "tokenizer_config.json"), "w"))
    if jinja_file is not None:
        open(os.path.join(d, "chat_template.jinja"), "w").write(jinja_file)
    return d


class FakeRequest:
    def __init__(self, body: dict):
        self._data = json.dumps(body).encode()

    async def body(self) -> bytes:
        return self._data


def ingress(model: str = TINY, max_model_len: int = 4096):
    """The real OpenAIIngress methods on an object without Ray (no coordinator: nothing is generated)."""
    from cluster.serve import OpenAIIngress

    class Ing:
        pass

    for name in ("__init__", "_set_limits", "_limits", "_chat_ids", "_parse", "_tokenizer", "_max_chars",
                 "_truncated", "_check_ids", "messages", "count_tokens", "responses", "tokenize"):
        setattr(Ing, name, OpenAIIngress.__mro__[1].__dict__[name])
    ing = Ing(None, {"device": "cpu", "warmup_tokens": 0, "model": model, "max_model_len": max_model_len})
    return ing


def chat_ids(ing, body: dict):
    """(ids, None) or (None, (status, param, message)) for a chat completion body's prompt."""
    from cluster.protocol import ApiError, ChatCompletionRequest

    async def go():
        b = await ing._parse(FakeRequest({"model": ing.model_name, **body}), ChatCompletionRequest)
        return ing._truncated(b, await ing._chat_ids(b))
    try:
        return asyncio.run(go()), None
    except ApiError as e:
        return None, (e.status, e.param, e.message)


def messages_ids(ing, body: dict):
    """Anthropic Messages body → (ids, None) or (None, (status, type, message)) via the ingress's count_tokens path
    (the same conversion and _chat_ids as /v1/messages)."""
    from cluster.anthropic import CountTokensRequest
    from cluster.protocol import ApiError

    async def go():
        b = await ing._parse(FakeRequest({"model": ing.model_name, **body}), CountTokensRequest)
        return await ing._chat_ids(b.to_chat())
    try:
        return asyncio.run(go()), None
    except ApiError as e:
        return None, (e.status, e.param, e.message)


def responses_ids(ing, body: dict):
    from cluster.protocol import ApiError
    from cluster.responses import ResponsesRequest, responses_param

    async def go():
        b = await ing._parse(FakeRequest({"model": ing.model_name, **body}), ResponsesRequest)
        chat = b.to_chat()
        try:
            return await ing._chat_ids(chat)
        except ApiError as e:
            raise responses_param(e) from None
    try:
        return asyncio.run(go()), None
    except ApiError as e:
        return None, (e.status, e.param, e.message)


_HF = {}


def hf_tok(model: str = TINY):
    if model not in _HF:
        from transformers import AutoTokenizer
        _HF[model] = AutoTokenizer.from_pretrained(model)
    return _HF[model]


def hf_ids(messages: list[dict], tools=None, model: str = TINY, add_generation_prompt: bool = True, **kw):
    """transformers' own rendering and ids (what vLLM feeds the model: the text, encoded without added specials)."""
    tok = hf_tok(model)
    text = tok.apply_chat_template(messages, tools=tools, add_generation_prompt=add_generation_prompt,
                                   tokenize=False, **kw)
    return tok.encode(text, add_special_tokens=False), text


def args_as_dicts(messages: list[dict]) -> list[dict]:
    """vLLM's _postprocess_messages: assistant tool_calls' JSON-string arguments parsed to dicts before the template."""
    out = json.loads(json.dumps(messages))
    for m in out:
        for tc in m.get("tool_calls") or ():
            if isinstance(tc.get("function", {}).get("arguments"), str):
                tc["function"]["arguments"] = json.loads(tc["function"]["arguments"])
    return out


def text_of(ids, model: str = TINY) -> str:
    return hf_tok(model).decode(ids, skip_special_tokens=False)


def compare(ing, name: str, body: dict, ref_msgs: list[dict], model: str = TINY, **kw) -> bool:
    """glmserve's chat prompt ids for ``body`` == transformers' for ``ref_msgs`` (+ body's tools, ``kw``)."""
    ids, err = chat_ids(ing, body)
    agp = kw.pop("_agp", True)
    cfm = kw.pop("_cfm", False)
    try:
        tok = hf_tok(model)
        text = tok.apply_chat_template(args_as_dicts(ref_msgs), tools=body.get("tools"), add_generation_prompt=agp,
                                       continue_final_message=cfm, tokenize=False, **kw)
        ref = tok.encode(text, add_special_tokens=False)
    except Exception as e:  # noqa: BLE001
        ref, text = None, f"transformers raised {type(e).__name__}: {e}"
    same = ids == ref
    check(same, f"{name}: {'same ids' if same else 'DIFFER'} ({len(ids or [])} vs {len(ref or [])} tokens)")
    if not same:
        print("    glmserve:    ", err if err else repr(text_of(ids, model)))
        print("    transformers:", repr(text))
    return same
