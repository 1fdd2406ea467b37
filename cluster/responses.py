"""OpenAI's Responses API (``POST /v1/responses``) over the chat machinery: the request becomes a chat completion's
(``ResponsesRequest.to_chat``: ``instructions`` and ``input`` items → messages, flat function tools → chat tools,
``text.format`` → ``response_format``, ``max_output_tokens`` → ``max_completion_tokens``), and the chat's answer or
its stream of chunks becomes the stream of typed events, or the Response they end with (``ResponseEvents``).

Not kept on the server: a response is not stored (``store`` is answered false); ``previous_response_id``,
``conversation`` and stored ``prompt`` templates are refused — a client sends the whole conversation as ``input``. A
run of reasoning, assistant message and function_call items is one assistant turn, its reasoning kept (the template
writes it for the turns after the last user message); ``include: ["reasoning.encrypted_content"]`` gives each reasoning
item an ``encrypted_content`` that carries its text back (base64, not encrypted: nothing is kept here to decrypt with).
Text only: other input or tool types are 400s naming the field.
"""

from __future__ import annotations

import base64
import binascii
import json
import re
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any, Literal

from pydantic import ConfigDict, Field, field_validator

from cluster.protocol import ApiError, ChatCompletionRequest, OpenAIBody, chat_request, delta_pieces

# chat fields → the Responses fields a client sent them as (errors name what the client wrote)
_PARAMS = {"max_completion_tokens": "max_output_tokens", "response_format": "text.format",
           "reasoning_effort": "reasoning.effort"}
EFFORTS = ("none", "minimal", "low", "medium", "high", "xhigh", "max")     # the chat's reasoning_effort
ENCRYPTED = "reasoning.encrypted_content"       # the ``include`` value that fills reasoning items' encrypted_content
# ``include`` values that add data to items this server never writes (built-in tools' calls, input images): accepted
UNWRITTEN = ("file_search_call.results", "web_search_call.results", "web_search_call.action.sources",
             "message.input_image.image_url", "computer_call_output.output.image_url", "code_interpreter_call.outputs")
_SEALED = "glmserve-reasoning:"                  # what our encrypted_content starts with


class ResponsesRequest(OpenAIBody):
    model_config = ConfigDict(extra="ignore", allow_inf_nan=False, strict=True)

    model: str
    input: Any
    instructions: str | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: Literal["none", "auto", "required"] | dict[str, Any] | None = None
    parallel_tool_calls: bool = True
    max_output_tokens: int | None = Field(default=None, ge=1)
    temperature: float = Field(default=1.0, ge=0.0, le=2.0)
    top_p: float = Field(default=1.0, gt=0.0, le=1.0)
    stream: bool = False
    text: dict[str, Any] | None = None
    reasoning: dict[str, Any] | None = None
    store: bool | None = None
    previous_response_id: str | None = None
    metadata: dict[str, str] | None = None
    user: str | None = None
    truncation: Literal["disabled"] | None = None
    top_logprobs: int | None = None
    include: list[str] | None = None
    background: bool | None = None
    conversation: Any = None
    prompt: Any = None
    max_tool_calls: int | None = None
    priority: int = Field(default=0, ge=-2**31, le=2**31 - 1)      # as the chat's (vLLM's extra field)
    cache_salt: str | None = Field(default=None, min_length=1, max_length=1024)      # as the chat's (vLLM's)

    @field_validator("input")
    @classmethod
    def _input(cls, v):
        if isinstance(v, str) or (isinstance(v, list) and all(isinstance(item, dict) for item in v)):
            return v
        raise ValueError("input must be a string or a list of input items (objects)")

    @field_validator("metadata")
    @classmethod
    def _metadata(cls, v):
        if v is not None and (len(v) > 16 or any(len(k) > 64 or len(x) > 512 for k, x in v.items())):
            raise ValueError("metadata holds at most 16 pairs, keys of at most 64 characters, values of at most 512")
        return v

    def check_supported(self) -> None:
        if self.background:
            raise ApiError(400, "background is not supported: responses are answered (or streamed) at once",
                           "background")
        if (summary := (self.reasoning or {}).get("summary")) not in (None, "auto", "concise", "detailed"):
            raise ApiError(400, f"reasoning.summary must be auto, concise or detailed, got {summary!r} (no summary is "
                           "written: the reasoning's own text is in each reasoning item)", "reasoning.summary")
        if (effort := (self.reasoning or {}).get("effort")) is not None and effort not in EFFORTS:
            raise ApiError(400, f"reasoning.effort must be one of {list(EFFORTS)}, got {effort!r}",
                           "reasoning.effort")
        if self.previous_response_id is not None:
            raise ApiError(400, "previous_response_id is not supported: responses are not stored, send the whole "
                           "conversation as input", "previous_response_id")
        if self.top_logprobs:
            raise ApiError(400, "top_logprobs is not supported on /v1/responses", "top_logprobs")
        for field in ("conversation", "prompt", "max_tool_calls"):
            if getattr(self, field) is not None:
                raise ApiError(400, f"{field} is not supported: " + (
                    "responses are not stored, send the whole conversation as input" if field == "conversation" else
                    "stored prompts are not kept here, send instructions and input" if field == "prompt" else
                    "tool calls are not capped here"), field)
        for i, value in enumerate(self.include or ()):
            if value != ENCRYPTED and value not in UNWRITTEN:
                raise ApiError(400, f"include[{i}] {value!r} is not supported (supported: {[ENCRYPTED, *UNWRITTEN]})",
                               f"include[{i}]")

    @property
    def sealed(self) -> bool:
        """Whether reasoning items carry ``encrypted_content``."""
        return ENCRYPTED in (self.include or ())

    def to_chat(self) -> ChatCompletionRequest:
        """The chat completion this request asks for; a field the chat refuses is a 400 naming the Responses field."""
        body: dict[str, Any] = {"model": self.model, "messages": self._messages(), "stream": self.stream,
                                "parallel_tool_calls": self.parallel_tool_calls, "priority": self.priority,
                                "cache_salt": self.cache_salt}
        body.update({k: getattr(self, k) for k in ("temperature", "top_p") if k in self.model_fields_set})
        if self.max_output_tokens is not None:
            body["max_completion_tokens"] = self.max_output_tokens
        if self.tools:
            body["tools"] = [_chat_tool(t, i) for i, t in enumerate(self.tools)]
        if isinstance(self.tool_choice, dict):
            names = [t.get("name") for t in self.tools or ()]
            if self.tool_choice.get("type") != "function" or self.tool_choice.get("name") not in names:
                raise ApiError(400, "tool_choice must be 'none', 'auto', 'required' or {'type': 'function', 'name': "
                               f"one of {names}}}, not {self.tool_choice!r}", "tool_choice")
            body["tool_choice"] = {"type": "function", "function": {"name": self.tool_choice["name"]}}
        elif self.tool_choice is not None:
            body["tool_choice"] = self.tool_choice
        if (fmt := (self.text or {}).get("format")) is not None:
            body["response_format"] = _response_format(fmt)
        if (effort := (self.reasoning or {}).get("effort")) is not None:
            body["reasoning_effort"] = effort
        return chat_request(body, responses_param)

    def _messages(self) -> list[dict[str, Any]]:
        """The chat's messages: ``instructions`` a system message; each run of reasoning, assistant message and
        function_call items one assistant turn (as the model wrote it), the other items one message each."""
        messages = [{"role": "system", "content": self.instructions}] if self.instructions is not None else []
        items = [{"type": "message", "role": "user", "content": self.input}] if isinstance(self.input, str) \
            else self.input
        turn: dict[str, Any] | None = None      # the assistant turn the items since the last other item build
        calls: set[str] = set()                 # the call ids the input has given so far
        for i, item in enumerate(items):
            kind = item.get("type", "message")
            if kind == "reasoning":
                if turn is None or turn["content"] is not None or turn["tool_calls"]:
                    turn = _new_turn(messages)  # a reasoning item after the turn's answer starts another turn
                if text := _reasoning_text(item, i):
                    turn["reasoning_content"] = turn.get("reasoning_content", "") + text
            elif kind == "message" and item.get("role") == "assistant":     # (text after a call: the chat's order)
                turn = turn or _new_turn(messages)
                turn["content"] = (turn["content"] or "") + _text(item.get("content"), i)
            elif kind == "message":
                if item.get("role") not in ("user", "system", "developer"):
                    raise ApiError(400, f"input[{i}] has role {item.get('role')!r}", f"input[{i}].role")
                messages.append({"role": item["role"], "content": _text(item.get("content"), i)})
                turn = None
            elif kind == "function_call":
                _check_call(item, i)
                turn = turn or _new_turn(messages)
                turn["tool_calls"].append({"id": item["call_id"], "type": "function", "function": {
                    "name": item["name"], "arguments": item.get("arguments") or "{}"}})
                calls.add(item["call_id"])
            elif kind == "function_call_output":
                if not isinstance(item.get("call_id"), str) or item["call_id"] not in calls:
                    raise ApiError(400, f"input[{i}].call_id must be the call_id of a function_call item before it, "
                                   f"got {item.get('call_id')!r}", f"input[{i}].call_id")
                output = item.get("output")
                text = _text(output, i, "output") if isinstance(output, list) else \
                    output if isinstance(output, str) else json.dumps(output)
                messages.append({"role": "tool", "tool_call_id": item["call_id"], "content": text})
                turn = None
            else:
                raise ApiError(400, f"input[{i}] has type {kind!r}: message, function_call, function_call_output "
                               "and reasoning items are supported", f"input[{i}].type")
        out = []
        for m in messages:                      # a turn without calls is a plain assistant message; one of reasoning
            if m.get("tool_calls") == []:       # alone (or of another server's opaque item) is none
                del m["tool_calls"]
                if m["content"] is None:
                    continue
            out.append(m)
        return out


def _new_turn(messages: list[dict]) -> dict:
    messages.append({"role": "assistant", "content": None, "tool_calls": []})
    return messages[-1]


def _reasoning_text(item: dict, i: int) -> str:
    """A reasoning item's text: its content's, else its summary's, else what our ``encrypted_content`` carries (another
    server's is opaque: nothing)."""
    for key in ("content", "summary"):
        parts = item.get(key)
        if parts:
            if not isinstance(parts, list) or not all(isinstance(p, dict) and isinstance(p.get("text"), str)
                                                      for p in parts):
                raise ApiError(400, f"input[{i}].{key} must be a list of text parts", f"input[{i}].{key}")
            return "".join(p["text"] for p in parts)
    sealed = item.get("encrypted_content")
    if isinstance(sealed, str) and sealed.startswith(_SEALED):
        try:
            return base64.b64decode(sealed[len(_SEALED):], validate=True).decode()
        except (binascii.Error, UnicodeDecodeError):
            raise ApiError(400, f"input[{i}].encrypted_content is not one this server wrote",
                           f"input[{i}].encrypted_content") from None
    return ""


def _check_call(item: dict, i: int) -> None:
    """A function_call input item: its call_id and name strings, its arguments a JSON object's text."""
    for key in ("call_id", "name"):
        if not isinstance(item.get(key), str) or not item[key]:
            raise ApiError(400, f"input[{i}].{key} must be a non-empty string", f"input[{i}].{key}")
    try:
        ok = isinstance(json.loads(item.get("arguments") or "{}"), dict)
    except (TypeError, ValueError):
        ok = False
    if not ok:
        raise ApiError(400, f"input[{i}].arguments must be a JSON object's text, as the call gave it",
                       f"input[{i}].arguments")


def _text(content: Any, i: int, field: str = "content") -> str:
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise ApiError(400, f"input[{i}].{field} must be a string or a list of text parts", f"input[{i}].{field}")
    texts = []
    for j, part in enumerate(content):
        if not isinstance(part, dict) or part.get("type") not in ("input_text", "output_text", "text") \
                or not isinstance(part.get("text"), str):
            raise ApiError(400, f"input[{i}].{field}[{j}] must be a text part (this model takes no images, audio or "
                           "files)", f"input[{i}].{field}[{j}]")
        texts.append(part["text"])
    return "".join(texts)


def _chat_tool(tool: dict, i: int) -> dict:
    if tool.get("type") != "function" or not isinstance(tool.get("name"), str):
        raise ApiError(400, f"tools[{i}] must be a function tool with a name (built-in tools are not supported)",
                       f"tools[{i}]")
    fn = {k: tool[k] for k in ("name", "description", "parameters", "strict") if tool.get(k) is not None}
    return {"type": "function", "function": fn}


def _response_format(fmt: dict) -> dict:
    kind = fmt.get("type") if isinstance(fmt, dict) else None
    if kind == "json_schema":
        if not isinstance(fmt.get("schema"), dict):
            raise ApiError(400, "text.format.schema must be a JSON schema object", "text.format.schema")
        return {"type": "json_schema", "json_schema": {k: fmt[k] for k in ("name", "schema", "strict") if k in fmt}}
    if kind in ("json_object", "text"):
        return {"type": kind}
    raise ApiError(400, f"text.format must be text, json_object or json_schema, got {fmt!r}", "text.format")


def responses_param(e: ApiError) -> ApiError:
    """A chat field's error renamed to the Responses field the client sent (``messages`` → ``input`` ...)."""
    if e.param and e.param.startswith("tools["):        # a flat tool: tools[i].parameters, not .function.parameters
        e.param, e.message = e.param.replace(".function.", "."), e.message.replace(".function.", ".")
    elif e.param and e.param.startswith("messages"):     # the chat's messages are the input items (and instructions),
        e.param = "input"                                # not one for one: the input as a whole
        e.message = re.sub(r"'messages[^']*'", "'input'", e.message)
    elif e.param:
        head, dot, rest = e.param.partition(".")
        head, sep, index = head.partition("[")
        if head in _PARAMS:
            e.param = _PARAMS[head] + sep + index + dot + rest
    for chat, ours in _PARAMS.items():
        e.message = e.message.replace(chat, ours)
    return e


# ---- the answer ---------------------------------------------------------------------------------------------------
def _id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex[:24]}"


def _usage(chat_usage: dict) -> dict:
    return {"input_tokens": chat_usage["prompt_tokens"],
            # nothing is written to a cache on request (prefix caching keeps blocks as it goes): 0, as the Messages
            # API's cache_creation_input_tokens (the openai SDK's type requires the field)
            "input_tokens_details": {"cached_tokens": chat_usage["prompt_tokens_details"]["cached_tokens"],
                                     "cache_write_tokens": 0},
            "output_tokens": chat_usage["completion_tokens"],
            "output_tokens_details": {"reasoning_tokens":
                                      chat_usage["completion_tokens_details"]["reasoning_tokens"]},
            "total_tokens": chat_usage["total_tokens"]}


def _reasoning_item(item_id: str, text: str, status: str, sealed: bool) -> dict:
    """A reasoning item; ``sealed``: with ``encrypted_content`` (its text, for ``_reasoning_text`` to read back)."""
    return {"type": "reasoning", "id": item_id, "summary": [],
            "content": [{"type": "reasoning_text", "text": text}] if status != "in_progress" else [],
            "encrypted_content": _SEALED + base64.b64encode(text.encode()).decode()
            if sealed and status != "in_progress" else None,
            "status": status}


def _message_item(item_id: str, text: str, status: str = "completed") -> dict:
    content = [{"type": "output_text", "text": text, "annotations": [], "logprobs": []}] if status != "in_progress" \
        else []
    return {"type": "message", "id": item_id, "status": status, "role": "assistant", "content": content}


def _call_item(item_id: str, call_id: str, name: str, arguments: str, status: str = "completed") -> dict:
    return {"type": "function_call", "id": item_id, "call_id": call_id, "name": name, "arguments": arguments,
            "status": status}


def envelope(req: ResponsesRequest, rid: str, created: int, model: str, status: str, output: list,
             usage: dict | None, finish_reason: str | None = None, error: dict | None = None) -> dict:
    """A Response object: the request's settings, the output items and how it ended."""
    return {"id": rid, "object": "response", "created_at": created, "status": status, "error": error,
            "incomplete_details": {"reason": "max_output_tokens"} if finish_reason == "length" else None,
            "instructions": req.instructions, "max_output_tokens": req.max_output_tokens, "model": model,
            "output": output, "parallel_tool_calls": req.parallel_tool_calls, "previous_response_id": None,
            "reasoning": {k: (req.reasoning or {}).get(k) for k in ("effort", "summary")},
            "store": False, "temperature": req.temperature, "text": {"format": {"type": "text"}, **(req.text or {})},
            "tool_choice": req.tool_choice or "auto", "tools": req.tools or [], "top_p": req.top_p,
            "truncation": "disabled", "usage": usage, "user": req.user, "metadata": req.metadata or {}}


class ResponseEvents:
    """A chat stream's chunks as the Responses API's typed events: an output item opens when its kind of delta first
    comes (reasoning, each call, text) and closes when another opens or the stream ends — in the order the model wrote
    them; the last event carries the whole Response (``whole`` answers with it: one path for both). Within one chunk a
    call's pieces come before the text after it: the engine starts an event at each special token (a call's markers),
    so a chunk's text never precedes its call pieces."""

    def __init__(self, req: ResponsesRequest, model: str):
        self.req, self.model = req, model
        self.rid, self.created = _id("resp"), int(time.time())
        self.seq = 0
        self.output: list[dict] = []       # closed items
        self.open: dict | None = None      # the item being streamed: the item, its text so far (and a call's index)
        self.failure: ApiError | None = None   # how the stream failed, if it did
        self.skipped = False               # the thought was the answer (``Formatter.chunks``' reasoning_skipped)

    def _event(self, kind: str, **fields) -> dict:
        self.seq += 1
        return {"type": kind, "sequence_number": self.seq - 1, **fields}

    def _response(self, status: str, usage: dict | None = None, finish: str | None = None,
                  error: dict | None = None) -> dict:
        return envelope(self.req, self.rid, self.created, self.model, status, list(self.output), usage, finish, error)

    async def sse(self, chunks: AsyncIterator[dict]) -> AsyncIterator[str]:
        async for event in self.events(chunks):
            yield f"event: {event['type']}\ndata: {json.dumps(event, ensure_ascii=False)}\n\n"

    async def whole(self, chunks: AsyncIterator[dict]) -> dict:
        """The Response the stream ends with (a failed one raises its error: a 500 / 503 body)."""
        last = None
        async for event in self.events(chunks):
            last = event
        if last["type"] == "response.failed":
            raise self.failure
        if self.skipped:                    # the thought was the answer: the message alone (streamed, both went out)
            last["response"]["output"] = [o for o in last["response"]["output"] if o["type"] != "reasoning"]
        return last["response"]

    async def events(self, chunks: AsyncIterator[dict]) -> AsyncIterator[dict]:
        yield self._event("response.created", response=self._response("in_progress"))
        yield self._event("response.in_progress", response=self._response("in_progress"))
        finish = None
        async for chunk in chunks:
            if "error" in chunk:
                for out in self._close("incomplete"):
                    yield out
                err = chunk["error"]
                self.failure = ApiError(getattr(chunk, "status", 500), err["message"], None,
                                        err.get("type") or "server_error")
                yield self._event("response.failed", response=self._response(
                    "failed", error={"code": "server_error", "message": err["message"]}))
                return
            if not chunk["choices"]:                                # the last chunk: the usage
                status = "incomplete" if finish == "length" else "completed"
                if not self.output and self.open is None:            # no text at all: an empty message still
                    for out in self._start(_message_item(_id("msg"), "", "in_progress")):
                        yield out
                for out in self._close(status):
                    yield out
                yield self._event(f"response.{status}", response=self._response(status, _usage(chunk["usage"]),
                                                                                 finish))
                return
            choice = chunk["choices"][0]
            finish = choice["finish_reason"] or finish
            self.skipped |= choice.get("reasoning_skipped", False)
            for kind, piece in delta_pieces(choice["delta"]):
                for out in self._call(piece) if kind == "call" else self._text(
                        "reasoning" if kind == "reasoning" else "message", piece):
                    yield out

    def _reasoning_done(self, item_id: str, text: str, status: str = "completed") -> dict:
        return _reasoning_item(item_id, text, status, self.req.sealed)

    def _start(self, item: dict, index: int | None = None) -> list[dict]:
        out = self._close()
        self.open = {"item": item, "text": "", "index": index}
        out.append(self._event("response.output_item.added", output_index=len(self.output), item=item))
        if item["type"] != "function_call":
            part = {"type": "output_text", "text": "", "annotations": [], "logprobs": []} \
                if item["type"] == "message" else {"type": "reasoning_text", "text": ""}
            out.append(self._event("response.content_part.added", item_id=item["id"], output_index=len(self.output),
                                   content_index=0, part=part))
        return out

    def _text(self, kind: str, text: str) -> list[dict]:
        out = []
        if self.open is None or self.open["item"]["type"] != kind:
            item = _message_item(_id("msg"), "", "in_progress") if kind == "message" else \
                self._reasoning_done(_id("rs"), "", "in_progress")
            out += self._start(item)
        self.open["text"] += text
        extra = {"logprobs": []} if kind == "message" else {}
        name = "response.output_text.delta" if kind == "message" else "response.reasoning_text.delta"
        out.append(self._event(name, item_id=self.open["item"]["id"], output_index=len(self.output), content_index=0,
                               delta=text, **extra))
        return out

    def _call(self, call: dict) -> list[dict]:
        out = []
        if "id" in call:                                        # a call's first delta: its id and name
            out += self._start(_call_item(_id("fc"), call["id"], call["function"]["name"], "", "in_progress"),
                               call["index"])
        assert self.open is not None and self.open["index"] == call["index"], "a call's piece without its call"
        piece = call["function"].get("arguments", "")
        if piece:
            self.open["text"] += piece
            out.append(self._event("response.function_call_arguments.delta", item_id=self.open["item"]["id"],
                                   output_index=len(self.output), delta=piece))
        return out

    def _close(self, status: str = "completed") -> list[dict]:
        if self.open is None:
            return []
        item, text, index = self.open["item"], self.open["text"], len(self.output)
        self.open = None
        if item["type"] == "message":
            done = _message_item(item["id"], text, status)
            out = [self._event("response.output_text.done", item_id=item["id"], output_index=index, content_index=0,
                               text=text, logprobs=[]),
                   self._event("response.content_part.done", item_id=item["id"], output_index=index, content_index=0,
                               part=done["content"][0])]
        elif item["type"] == "reasoning":
            done = self._reasoning_done(item["id"], text, status)
            out = [self._event("response.reasoning_text.done", item_id=item["id"], output_index=index,
                               content_index=0, text=text),
                   self._event("response.content_part.done", item_id=item["id"], output_index=index, content_index=0,
                               part=done["content"][0])]
        else:
            done = _call_item(item["id"], item["call_id"], item["name"], text, status)
            out = [self._event("response.function_call_arguments.done", item_id=item["id"], output_index=index,
                               name=item["name"], arguments=text)]
        self.output.append(done)
        out.append(self._event("response.output_item.done", output_index=index, item=done))
        return out
