"""Anthropic's Messages API (``POST /v1/messages``, as Claude Code and the anthropic SDK speak it) over the chat
machinery, as ``cluster/responses.py`` puts OpenAI's Responses API on it.

The request becomes a chat completion's (``MessagesRequest.to_chat``): ``system`` a system message; a user message's
``tool_result`` blocks tool messages, its text one user message; an assistant message's ``thinking``, text and
``tool_use`` blocks one assistant turn (its reasoning, content and calls) — a last assistant message is a prefill the
answer continues; ``tools``' ``input_schema`` the chat tools' ``parameters``; ``tool_choice`` auto / any / tool / none
→ auto / required / a named function / none; ``thinking`` enabled (or adaptive) → the chat template's thinking, else
``reasoning_effort: none`` (Anthropic's default: no thinking unless asked); ``stop_sequences`` → ``stop``. A
``max_tokens`` past what the context leaves is cut to it (``stop_reason: model_context_window_exceeded`` where the
answer fills it, as Anthropic's newer models answer); a prompt that fills it is Anthropic's "prompt is too long".
The chat's stream of chunks becomes Anthropic's events (``MessageEvents``): ``message_start``, then per thinking, text
or tool_use block ``content_block_start`` / ``_delta`` / ``_stop``, then ``message_delta`` (the stop reason, the
usage: ``input_tokens`` those not read from the prefix cache, as Anthropic counts) and ``message_stop`` — or the
message they end with.
Errors are Anthropic's bodies (``{"type": "error", "error": {"type", "message"}}``). Text only: images and documents
are 400s naming the block; server tools too. Thinking blocks carry an empty ``signature``: nothing signs them here.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import AsyncIterator
from typing import Any

from fastapi.responses import JSONResponse
from pydantic import ConfigDict, Field

from cluster.protocol import ApiError, ChatCompletionRequest, OpenAIBody, chat_request, delta_pieces

# chat fields → the Messages fields a client sent them as (errors name what the client wrote)
_PARAMS = {"max_completion_tokens": "max_tokens", "stop": "stop_sequences", "reasoning_effort": "thinking",
           "parallel_tool_calls": "tool_choice", "thinking_token_budget": "thinking.budget_tokens"}
_ERROR_TYPES = {400: "invalid_request_error", 404: "not_found_error", 413: "request_too_large",
                429: "rate_limit_error", 503: "overloaded_error"}
_STOP_REASONS = {"stop": "end_turn", "tool_calls": "tool_use", "length": "max_tokens"}
THINKING = ("enabled", "adaptive", "between_tools")     # thinking types that think (the chat template's thinking)


class MessagesRequest(OpenAIBody):
    model_config = ConfigDict(extra="ignore", allow_inf_nan=False, strict=True)

    model: str
    max_tokens: int = Field(ge=1)
    messages: list[dict[str, Any]] = Field(min_length=1)
    system: str | list[dict[str, Any]] | None = None
    stop_sequences: list[str] | None = None
    stream: bool = False
    temperature: float = Field(default=1.0, ge=0.0, le=1.0)
    top_p: float = Field(default=1.0, gt=0.0, le=1.0)
    top_k: int = Field(default=0, ge=0)
    metadata: dict[str, Any] | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: dict[str, Any] | None = None
    thinking: dict[str, Any] | None = None
    priority: int = Field(default=0, ge=-2**31, le=2**31 - 1)      # as the chat's (vLLM's extra field)
    cache_salt: str | None = Field(default=None, min_length=1, max_length=1024)      # as the chat's (vLLM's)

    def check_supported(self) -> None:
        """Refuse (400, naming the field) what the chat machinery cannot do as asked."""
        kind = (self.thinking or {}).get("type", "disabled")
        if kind not in (*THINKING, "disabled"):
            raise ApiError(400, f"thinking.type must be one of {[*THINKING, 'disabled']}, got {kind!r}",
                           "thinking.type")
        if kind == "enabled":                   # as Anthropic's: a budget of at least 1024 tokens, below max_tokens
            budget = self.thinking.get("budget_tokens")
            if not isinstance(budget, int) or isinstance(budget, bool) or budget < 1024:
                raise ApiError(400, f"thinking.budget_tokens must be an integer >= 1024, got {budget!r}",
                               "thinking.budget_tokens")
            if self.max_tokens is not None and budget >= self.max_tokens:
                raise ApiError(400, f"max_tokens ({self.max_tokens}) must be greater than thinking.budget_tokens "
                               f"({budget})", "max_tokens")
        choice = (self.tool_choice or {}).get("type", "auto")
        if choice not in ("auto", "any", "tool", "none"):
            raise ApiError(400, f"tool_choice.type must be auto, any, tool or none, got {choice!r}", "tool_choice.type")
        if choice in ("any", "tool") and kind in THINKING:       # as Anthropic: a forced call comes first
            raise ApiError(400, "thinking may not be enabled when tool_choice forces tool use", "tool_choice")

    def to_chat(self) -> ChatCompletionRequest:
        """The chat completion this request asks for; a field the chat refuses is a 400 naming the Messages field."""
        messages = self._messages()
        body: dict[str, Any] = {"model": self.model, "messages": messages, "stream": self.stream,
                                "max_completion_tokens": self.max_tokens, "priority": self.priority,
                                "cache_salt": self.cache_salt}
        body.update({k: getattr(self, k) for k in ("temperature", "top_p", "top_k") if k in self.model_fields_set})
        if messages[-1]["role"] == "assistant":         # a prefill: the answer continues it
            body.update(add_generation_prompt=False, continue_final_message=True)
        if self.stop_sequences:
            body["stop"] = self.stop_sequences
        if self.tools:
            body["tools"] = [_chat_tool(t, i) for i, t in enumerate(self.tools)]
        choice = self.tool_choice or {}
        kind = choice.get("type", "auto")
        if kind == "tool":
            names = [t.get("name") for t in self.tools or ()]
            if choice.get("name") not in names:
                raise ApiError(400, f"tool_choice.name must be one of the tools' names {names}, got "
                               f"{choice.get('name')!r}", "tool_choice.name")
            body["tool_choice"] = {"type": "function", "function": {"name": choice.get("name")}}
        elif self.tools or kind != "auto":
            body["tool_choice"] = {"any": "required"}.get(kind, kind)
        if choice.get("disable_parallel_tool_use"):
            body["parallel_tool_calls"] = False
        if (self.thinking or {}).get("type") not in THINKING:
            body["reasoning_effort"] = "none"
        elif self.thinking.get("type") == "enabled":    # the budget is held: </think> comes by then
            body["thinking_token_budget"] = self.thinking["budget_tokens"]
        return chat_request(body, messages_param)

    def _messages(self) -> list[dict[str, Any]]:
        out = [{"role": "system", "content": _text(self.system, "system")}] if self.system is not None else []
        calls: set[str] = set()             # the tool_use ids given so far
        for i, m in enumerate(self.messages):
            where, content = f"messages[{i}]", m.get("content")
            if m.get("role") not in ("user", "assistant"):
                raise ApiError(400, f"{where}.role must be user or assistant, got {m.get('role')!r}", f"{where}.role")
            blocks = [{"type": "text", "text": content}] if isinstance(content, str) else content
            if not isinstance(blocks, list) or not all(isinstance(b, dict) for b in blocks):
                raise ApiError(400, f"{where}.content must be a string or a list of content blocks", f"{where}.content")
            if m["role"] == "assistant":
                out.append(_assistant_turn(blocks, where, calls))
                continue
            text = []
            for j, b in enumerate(blocks):
                if b.get("type") == "tool_result":
                    if b.get("tool_use_id") not in calls:
                        raise ApiError(400, f"{where}.content[{j}].tool_use_id must be the id of a tool_use block "
                                       f"before it, got {b.get('tool_use_id')!r}", f"{where}.content[{j}].tool_use_id")
                    result = b.get("content", "")
                    result = result if isinstance(result, str) else _text(result, f"{where}.content[{j}].content")
                    if b.get("is_error") is True:       # (a failed or refused tool run: the chat has no field for it)
                        result = f"Error: {result}" if result else "Error"
                    out.append({"role": "tool", "tool_call_id": b["tool_use_id"], "content": result})
                elif b.get("type") == "text" and isinstance(b.get("text"), str):
                    text.append(b["text"])
                else:
                    raise ApiError(400, f"{where}.content[{j}] (type {b.get('type')!r}) must be a text block with its "
                                   "text or a tool_result block (this model reads no images or documents)",
                                   f"{where}.content[{j}]")
            if text or not any(b.get("type") == "tool_result" for b in blocks):
                out.append({"role": "user", "content": "".join(text)})
        return out


class CountTokensRequest(MessagesRequest):
    """``POST /v1/messages/count_tokens``: a message's fields, ``max_tokens`` not needed (nor held above a thinking
    budget: no answer is made)."""

    max_tokens: int | None = Field(default=None, ge=1)


def _assistant_turn(blocks: list[dict], where: str, calls: set[str]) -> dict:
    """An assistant message's blocks as one chat turn: its thinking the reasoning, its text the content, its tool_use
    blocks the calls (``calls`` gets their ids)."""
    turn: dict[str, Any] = {"role": "assistant", "content": None}
    for j, b in enumerate(blocks):
        kind = b.get("type")
        if kind == "text" and isinstance(b.get("text"), str):
            turn["content"] = (turn["content"] or "") + b["text"]
        elif kind == "thinking" and isinstance(b.get("thinking"), str):
            turn["reasoning_content"] = turn.get("reasoning_content", "") + b["thinking"]
        elif kind == "redacted_thinking":
            pass                            # another server's sealed reasoning: nothing to read
        elif kind == "tool_use" and isinstance(b.get("id"), str) and isinstance(b.get("name"), str) \
                and isinstance(b.get("input", {}), dict):
            turn.setdefault("tool_calls", []).append({"id": b["id"], "type": "function", "function": {
                "name": b["name"], "arguments": json.dumps(b.get("input", {}))}})
            calls.add(b["id"])
        else:
            raise ApiError(400, f"{where}.content[{j}] must be a text, thinking or tool_use block (with its id, name "
                           "and input object)", f"{where}.content[{j}]")
    return turn


def _text(content: Any, where: str) -> str:
    """``system`` or a tool_result's content: a string, or text blocks."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list) or not all(isinstance(b, dict) and b.get("type") == "text"
                                                and isinstance(b.get("text"), str) for b in content):
        raise ApiError(400, f"{where} must be a string or a list of text blocks (this model reads no images or "
                       "documents)", where)
    return "".join(b["text"] for b in content)


def _chat_tool(tool: dict, i: int) -> dict:
    if tool.get("type", "custom") != "custom" or not isinstance(tool.get("name"), str):
        raise ApiError(400, f"tools[{i}] must be a custom tool with a name and an input_schema (server tools such as "
                       f"{tool.get('type')!r} are not supported)", f"tools[{i}]")
    fn = {"name": tool["name"], "parameters": tool.get("input_schema", {"type": "object"})}
    if tool.get("description") is not None:
        fn["description"] = tool["description"]
    return {"type": "function", "function": fn}


def messages_param(e: ApiError) -> ApiError:
    """A chat field's error renamed to the Messages field the client sent (``tools[i].function.parameters`` →
    ``tools[i].input_schema``, ``max_completion_tokens`` → ``max_tokens`` ...)."""
    if e.param and e.param.startswith("tools["):
        e.param = e.param.replace(".function.parameters", ".input_schema").replace(".function.", ".")
        e.message = e.message.replace(".function.parameters", ".input_schema").replace(".function.", ".")
    elif e.param:
        head, dot, rest = e.param.partition(".")
        e.param = _PARAMS.get(head, head) + dot + rest
    for chat, ours in _PARAMS.items():
        e.message = e.message.replace(f"'{chat}'", f"'{ours}'").replace(f"{chat} (", f"{ours} (")
    if e.param and e.param.startswith("tool_choice"):       # the chat's word for Anthropic's choice
        e.message = e.message.replace("'required'", "'any'")
    return e


def error_response(e: ApiError) -> JSONResponse:
    """An error as Anthropic writes it."""
    body = {"type": "error", "error": {"type": _ERROR_TYPES.get(e.status, "api_error"), "message": e.message}}
    return JSONResponse(body, status_code=e.status, headers=e.headers)


# ---- the answer ---------------------------------------------------------------------------------------------------
class MessageEvents:
    """A chat stream's chunks as the Messages API's events: a content block opens when its kind of delta first comes
    (thinking, text, each tool_use) and closes when another opens or the stream ends, in the order the model wrote
    them; ``whole`` gives the message they make instead (where the model skipped its thought, the chat's
    ``reasoning_skipped``: its text as the answer alone — streamed, a thinking block went out before it)."""

    def __init__(self, req: MessagesRequest, model: str, input_tokens: int, clamped: bool = False):
        """``clamped``: ``max_tokens`` was cut to what the context leaves (an answer cut there filled the window)."""
        self.req, self.input_tokens, self.clamped = req, input_tokens, clamped
        self.message = {"id": f"msg_{uuid.uuid4().hex[:24]}", "type": "message", "role": "assistant", "model": model,
                        "content": [], "stop_reason": None, "stop_sequence": None,
                        "usage": {"input_tokens": input_tokens, "output_tokens": 0}}
        self.open: dict | None = None       # the block being streamed: it, and a tool_use's JSON text so far
        self.failure: ApiError | None = None
        self.skipped = False                # the thought was the answer (``Formatter.chunks``' reasoning_skipped)

    @staticmethod
    def _event(kind: str, **fields) -> dict:
        return {"type": kind, **fields}

    async def sse(self, chunks: AsyncIterator[dict]) -> AsyncIterator[str]:
        async for event in self.events(chunks):
            yield f"event: {event['type']}\ndata: {json.dumps(event, ensure_ascii=False)}\n\n"

    async def whole(self, chunks: AsyncIterator[dict]) -> dict:
        """The message the stream ends with (a failed one raises its error)."""
        async for _ in self.events(chunks):
            pass
        if self.failure is not None:
            raise self.failure
        if self.skipped:
            self.message["content"] = [b for b in self.message["content"] if b["type"] != "thinking"]
        return self.message

    async def events(self, chunks: AsyncIterator[dict]) -> AsyncIterator[dict]:
        yield self._event("message_start", message={**self.message, "content": []})
        finish, stop = None, None
        async for chunk in chunks:
            if "error" in chunk:
                for out in self._close():
                    yield out
                err = chunk["error"]
                self.failure = ApiError(getattr(chunk, "status", 500), err["message"], None,
                                        err.get("type") or "server_error")
                yield self._event("error", error={"type": _ERROR_TYPES.get(self.failure.status, "api_error"),
                                                  "message": err["message"]})
                return
            if not chunk["choices"]:        # the last chunk: the usage
                for out in self._close():
                    yield out
                usage, cached = chunk["usage"], chunk["usage"]["prompt_tokens_details"]["cached_tokens"]
                self.message["usage"] = {"input_tokens": usage["prompt_tokens"] - cached,    # Anthropic's: uncached
                                         "output_tokens": usage["completion_tokens"],
                                         "cache_read_input_tokens": cached, "cache_creation_input_tokens": None}
                self.message["stop_reason"] = "stop_sequence" if stop else "model_context_window_exceeded" \
                    if finish == "length" and self.clamped else _STOP_REASONS.get(finish, "end_turn")
                self.message["stop_sequence"] = stop
                yield self._event("message_delta", delta={"stop_reason": self.message["stop_reason"],
                                                          "stop_sequence": stop}, usage=self.message["usage"])
                yield self._event("message_stop")
                return
            choice = chunk["choices"][0]
            finish, stop = choice["finish_reason"] or finish, choice.get("stop_reason") or stop
            self.skipped |= choice.get("reasoning_skipped", False)
            for kind, piece in delta_pieces(choice["delta"]):
                for out in self._call(piece) if kind == "call" else self._text(
                        "thinking" if kind == "reasoning" else "text", piece):
                    yield out

    def _start(self, block: dict) -> list[dict]:
        out = self._close()
        self.open = {"block": block, "json": ""}
        out.append(self._event("content_block_start", index=len(self.message["content"]), content_block=dict(block)))
        return out

    def _text(self, kind: str, text: str) -> list[dict]:
        out = []
        if self.open is None or self.open["block"]["type"] != kind:
            out += self._start({"type": "text", "text": ""} if kind == "text" else
                               {"type": "thinking", "thinking": "", "signature": ""})
        self.open["block"][kind] += text
        out.append(self._event("content_block_delta", index=len(self.message["content"]),
                               delta={"type": f"{kind}_delta", kind: text}))
        return out

    def _call(self, call: dict) -> list[dict]:
        out = []
        if "id" in call:                    # a call's first delta: its id and name
            out += self._start({"type": "tool_use", "id": call["id"], "name": call["function"]["name"], "input": {}})
        piece = call["function"].get("arguments", "")
        if piece:
            self.open["json"] += piece
            out.append(self._event("content_block_delta", index=len(self.message["content"]),
                                   delta={"type": "input_json_delta", "partial_json": piece}))
        return out

    def _close(self) -> list[dict]:
        if self.open is None:
            return []
        block, text = self.open["block"], self.open["json"]
        self.open = None
        if block["type"] == "tool_use":
            try:
                block = {**block, "input": json.loads(text or "{}")}
            except ValueError:              # a call cut by max_tokens: what was read
                block = {**block, "input": {}}
        self.message["content"].append(block)
        return [self._event("content_block_stop", index=len(self.message["content"]) - 1)]
