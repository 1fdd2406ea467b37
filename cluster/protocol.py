"""OpenAI API request bodies (pydantic, at the edge only) and the OpenAI-style error body."""

from __future__ import annotations

import functools
import json
import re
from collections.abc import Callable
from typing import Any, Literal, Union

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from cluster.guided import check_schema, choice_grammar, ebnf_grammar, is_raw_string, regex_grammar, schema_of
from cluster.parsers import TOOL_MARKERS
from scheduler.request import SamplingParams

MAX_LOGIT_BIAS = 300     # tokens one request may bias (OpenAI's bound)
MAX_STOP_IDS = 300       # stop_token_ids one request may give (each is checked every step of its first min_tokens)
# vLLM's structured_outputs keys that tune rather than hold the output: taken, not applied (the JSON grammar bounds
# whitespace runs itself; additionalProperties is as the schema says)
_STRUCTURED_OPTIONS = {"disable_fallback", "disable_any_whitespace", "disable_additional_properties",
                       "whitespace_pattern", "backend"}
MAX_ALLOWED_IDS = 4096   # allowed_token_ids one request may give (a step's host side lists them for its rows)


class OpenAIBody(BaseModel):
    """A request body: a null optional field is its default (the OpenAI schema makes those fields nullable and clients
    serialise unset ones as null)."""

    @model_validator(mode="before")
    @classmethod
    def _null_is_default(cls, data):
        if isinstance(data, dict):
            return {k: v for k, v in data.items()
                    if v is not None or k not in cls.model_fields or cls.model_fields[k].is_required()}
        return data


class ApiError(Exception):
    """An error returned to the client as ``{"error": {...}}`` with an HTTP status."""

    def __init__(self, status: int, message: str, param: str | None = None,
                 type_: str = "invalid_request_error", headers: dict[str, str] | None = None, code: str | None = None):
        super().__init__(message)
        self.status, self.message, self.param, self.type, self.headers = status, message, param, type_, headers
        self.code = code                # OpenAI's machine-readable codes where it has one: model_not_found, ...

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}


class StreamOptions(BaseModel):
    model_config = ConfigDict(strict=True)          # as the request's own fields: "yes" is not a boolean

    include_usage: bool = False
    continuous_usage_stats: bool = False            # vLLM's: every chunk carries the usage so far


class _Sampling(OpenAIBody):
    """Fields shared by both endpoints. Unknown fields are ignored (OpenAI clients send extras). Types are strict, as
    OpenAI's: ``"5"``, ``5.0`` or ``true`` is not an integer, token ids are not booleans or floats."""

    model_config = ConfigDict(extra="ignore", allow_inf_nan=False, strict=True)

    model: str
    max_tokens: int | None = Field(default=None, ge=1)
    temperature: float = Field(default=1.0, ge=0.0, le=2.0)
    top_p: float = Field(default=1.0, gt=0.0, le=1.0)
    top_k: int = Field(default=0, ge=-1)  # 0 or -1 (vLLM's clients send it): off
    min_p: float = Field(default=0.0, ge=0.0, le=1.0)
    n: int = Field(default=1, ge=1, le=8)
    seed: int | None = Field(default=None, ge=-2**63, le=2**63 - 1)      # int64, as vLLM's
    stop: str | list[str] | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    skip_special_tokens: bool = True    # vLLM's: only true (the text leaves special tokens out; return_token_ids)
    presence_penalty: float = Field(default=0.0, ge=-2.0, le=2.0)
    frequency_penalty: float = Field(default=0.0, ge=-2.0, le=2.0)
    repetition_penalty: float = Field(default=1.0, gt=0.0)
    ignore_eos: bool = False
    # vLLM's: token ids that end the output as EOS does (the id is its last token)
    stop_token_ids: list[int] | None = Field(default=None, max_length=MAX_STOP_IDS)
    # vLLM's: the output's first min_tokens tokens are no stop token, and no stop string ends it before them
    min_tokens: int = Field(default=0, ge=0)
    # vLLM's: the text ends after the stop string that ended it, not before
    include_stop_str_in_output: bool = False
    # vLLM's: the only token ids the output may hold
    allowed_token_ids: list[int] | None = Field(default=None, min_length=1, max_length=MAX_ALLOWED_IDS)
    # vLLM's: a prompt longer than this keeps its last truncate_prompt_tokens tokens (-1: the server's max_model_len)
    truncate_prompt_tokens: int | None = Field(default=None, ge=-1)
    # vLLM's: logprobs name each token "token_id:<id>", not by its text (which may be no whole character)
    return_tokens_as_token_ids: bool = False
    # vLLM's: the answer carries the prompt's token ids and each choice's (streamed: the ids since the last chunk)
    return_token_ids: bool = False
    # {"token id": bias in [-100, 100]}: added to the logits before sampling (-100 bans the token, +100 all but forces it)
    logit_bias: dict[str, float] | None = None
    # {"type": "text"}, {"type": "json_object"} or {"type": "json_schema", "json_schema": {"schema": {...}}}: the output
    # is held to the schema token by token (cluster/guided.py)
    response_format: dict[str, Any] | None = None
    # vLLM's structured outputs, one at most (nor beside a response_format that holds the output): {"json": a schema,
    # "regex": ..., "choice": [...], "grammar": EBNF, "json_object": true}; and its older names, guided_*
    structured_outputs: dict[str, Any] | None = None
    guided_json: dict[str, Any] | str | None = None
    guided_regex: str | None = None
    guided_choice: list[str] | None = None
    guided_grammar: str | None = None
    # vLLM's: with scheduling_policy priority, lower goes first (then by arrival); else it must be 0
    priority: int = Field(default=0, ge=-2**31, le=2**31 - 1)
    # vLLM's: each prompt token's logprob, its rank and the n most likely tokens at its place (the answer's
    # prompt_logprobs; not streamed)
    prompt_logprobs: int | None = Field(default=None, ge=0, le=20)
    # vLLM's: prompts share cached prefixes only with requests of the same salt (a tenant's, say): no request can tell
    # from its time to first token what prompts of another salt held
    cache_salt: str | None = Field(default=None, min_length=1, max_length=1024)
    # vLLM's: the reasoning's tokens before </think> is forced (where the prompt opens the reasoning); None: no bound
    thinking_token_budget: int | None = Field(default=None, ge=0, le=2**31 - 1)

    @field_validator("stop_token_ids", "allowed_token_ids")
    @classmethod
    def _ids(cls, v, info):
        if v is not None and any(t < 0 for t in v):
            raise ValueError(f"{info.field_name} must be token ids (>= 0)")
        return v

    @field_validator("truncate_prompt_tokens")
    @classmethod
    def _truncate(cls, v):
        if v == 0:
            raise ValueError("truncate_prompt_tokens must be -1 (the server's max_model_len) or >= 1")
        return v

    @field_validator("stop")
    @classmethod
    def _stops(cls, v):
        if isinstance(v, list) and (len(v) > 4 or any(not s for s in v)):
            raise ValueError("stop takes at most 4 non-empty strings")
        if v == "":
            raise ValueError("stop must not be empty")
        return v

    def with_defaults(self, defaults: dict):
        """This request with the fields its client left out set to the model's ``defaults`` (``sampling_defaults``;
        ``max_new_tokens`` bounds a max_tokens left out)."""
        unset = {k: v for k, v in defaults.items() if k in type(self).model_fields and k not in self.model_fields_set}
        return self.model_copy(update=unset) if unset else self

    def sampling_params(self, max_tokens: int, logprobs: int | None, seed_offset: int = 0,
                        text_breaks: tuple[int, ...] = (), tool_guidance: dict | None = None,
                        tool_call_span: tuple[int, ...] = ()) -> SamplingParams:
        """``tool_guidance``: the SamplingParams fields that hold the tool calls (``serve._tool_guidance``);
        ``tool_call_span``: the markers of the calls the server parses (a chat's with tools: ``parallel_tool_calls``
        false ends the output at the first call's close)."""
        stop = (self.stop,) if isinstance(self.stop, str) else tuple(self.stop or ())
        return SamplingParams(max_tokens=max_tokens, temperature=self.temperature, top_p=self.top_p,
                              top_k=max(0, self.top_k), min_p=self.min_p,
                              seed=None if self.seed is None else self.seed + seed_offset,
                              presence_penalty=self.presence_penalty, frequency_penalty=self.frequency_penalty,
                              repetition_penalty=self.repetition_penalty, stop=stop, ignore_eos=self.ignore_eos,
                              stop_token_ids=tuple(self.stop_token_ids or ()),
                              include_stop_str_in_output=self.include_stop_str_in_output,
                              allowed_token_ids=tuple(self.allowed_token_ids or ()),
                              min_tokens=min(self.min_tokens, max_tokens),
                              logprobs=logprobs, text_breaks=text_breaks, tool_call_span=tool_call_span,
                              single_tool_call=bool(tool_call_span) and not getattr(self, "parallel_tool_calls", True),
                              logit_bias=self.bias_pairs(),
                              json_schema=self.guidance[0], grammar=self.guidance[1], priority=self.priority,
                              thinking_budget=self.thinking_token_budget, prompt_logprobs=self.prompt_alternatives(),
                              cache_salt=self.cache_salt, **(tool_guidance or {}))

    def bias_pairs(self) -> tuple[tuple[int, float], ...]:
        """``logit_bias`` as (id, bias) pairs; a key that is no token id, or a bias out of [-100, 100], is a 400."""
        pairs = []
        for key, value in (self.logit_bias or {}).items():
            try:
                tok = int(key)
            except ValueError:
                raise ApiError(400, f"logit_bias keys must be token ids, got {key!r}", "logit_bias") from None
            if tok < 0 or str(tok) != key:
                raise ApiError(400, f"logit_bias keys must be token ids, got {key!r}", "logit_bias")
            if not -100 <= value <= 100:
                raise ApiError(400, f"logit_bias values must be in [-100, 100], got {value} for token {tok}",
                               "logit_bias")
            pairs.append((tok, float(value)))
        if len(pairs) > MAX_LOGIT_BIAS:
            raise ApiError(400, f"logit_bias takes at most {MAX_LOGIT_BIAS} tokens, got {len(pairs)}", "logit_bias")
        return tuple(pairs)

    def prompt_alternatives(self) -> int | None:
        """The prompt tokens' logprobs asked for — the most alternatives any field wants a token — or None
        (``SamplingParams.prompt_logprobs``)."""
        return self.prompt_logprobs

    @property
    def include_usage(self) -> bool:
        return bool(self.stream_options and self.stream_options.include_usage)

    def check_supported(self) -> None:
        """Refuse (400, naming the field) what the engine would otherwise ignore; the no-op values clients send by
        default pass, so that they keep working."""
        self.bias_pairs()
        if self.stream_options is not None and not self.stream:
            raise ApiError(400, "stream_options is only allowed when stream is true", "stream_options")
        if not self.skip_special_tokens:
            raise ApiError(400, "skip_special_tokens false is not supported: the text leaves special tokens out "
                           "(return_token_ids gives every id)", "skip_special_tokens")
        if self.prompt_logprobs is not None and self.stream:
            raise ApiError(400, "prompt_logprobs is not streamed: ask for it without stream (or stream echo with "
                           "logprobs)", "prompt_logprobs")
        limits = (("max_completion_tokens", getattr(self, "max_completion_tokens", None)),   # (the chat's, where
                  ("max_tokens", self.max_tokens))                                        # both are given)
        name, limit = next(((k, v) for k, v in limits if v is not None), (None, None))
        if limit is not None and self.min_tokens > max(1, limit):
            raise ApiError(400, f"min_tokens ({self.min_tokens}) must not exceed {name} ({limit})", "min_tokens")
        if any(self.guidance) and self.ignore_eos:
            raise ApiError(400, "ignore_eos cannot be combined with structured output (response_format json_object / "
                           "json_schema, structured_outputs, guided_*): a completed value ends at EOS", "ignore_eos")

    @functools.cached_property
    def guidance(self) -> tuple[str | None, tuple[str, str] | None]:
        """What holds the output: (a JSON schema's text, a grammar's (kind, source)), one of them at most — from
        ``response_format`` or vLLM's ``structured_outputs`` / ``guided_*``. A 400 names the field at fault."""
        try:
            schema = schema_of(self.response_format)
        except (ValueError, RuntimeError) as e:
            raise ApiError(400, str(e), "response_format") from None
        asked = [("response_format", None)] if schema is not None else []
        for key, value in (self.structured_outputs or {}).items():     # (json_object false: not asked)
            if key not in _STRUCTURED_OPTIONS and value is not None and not (key == "json_object" and value is False):
                asked.append((f"structured_outputs.{key}", value))
        asked += [(f"guided_{k}", v) for k, v in (("json", self.guided_json), ("regex", self.guided_regex),
                                                  ("choice", self.guided_choice), ("grammar", self.guided_grammar))
                  if v is not None]
        if len(asked) > 1:
            raise ApiError(400, f"one structured output at most, got {', '.join(n for n, _ in asked)}", asked[1][0])
        if schema is not None or not asked:
            return schema, None
        name, value = asked[0]
        kind = name.rsplit(".", 1)[-1].removeprefix("guided_")
        try:
            if kind == "json":
                text = value if isinstance(value, str) else json.dumps(value)
                if not isinstance(json.loads(text), dict):
                    raise ValueError("must be a JSON schema object")
                check_schema(text)
                return text, None
            if kind == "json_object":
                if value is not True:
                    raise ValueError("must be true or false")
                return '{"type": "object"}', None
            build = {"regex": regex_grammar, "choice": choice_grammar, "grammar": ebnf_grammar}.get(kind)
            if build is None:
                raise ValueError("is not one of json, regex, choice, grammar, json_object")
            return None, build(value)
        except (ValueError, RuntimeError, RecursionError) as e:
            raise ApiError(400, f"{name} {e}" if str(e).startswith(("must", "is not")) else f"{name}: {e}",
                           name) from None


class CompletionRequest(_Sampling):
    # a text, token ids, or a batch of either: each prompt's n choices are indexed prompt * n + choice (OpenAI's)
    prompt: Union[str, list[str], list[int], list[list[int]]]
    # 0: no tokens, only with echo — the prompt and its logprobs (a scoring request, as lm-eval's)
    max_tokens: int | None = Field(default=None, ge=0)
    logprobs: int | None = Field(default=None, ge=0, le=20)     # OpenAI's bound is 5; vLLM's default, 20
    # The prompt's text before each completion; with logprobs, its tokens' logprobs too (the first token's null)
    echo: bool = False
    # null / "" only: text after the insertion point needs a fill-in-the-middle prompt, which is not built here.
    suffix: str | None = None
    # null or n only: best_of > n would rank candidates by their total logprob, which is not implemented.
    best_of: int | None = Field(default=None, ge=1)

    @field_validator("prompt", mode="before")
    @classmethod
    def _prompt_kind(cls, v):
        # before the union's own checks, whose error names a union member ("prompt.str")
        ids = lambda x: isinstance(x, list) and all(type(t) is int for t in x)
        if not (isinstance(v, str) or ids(v) or isinstance(v, list) and (all(isinstance(t, str) for t in v)
                                                                         or all(ids(t) for t in v))):
            raise ValueError("prompt must be a string, a list of integer token ids, or a list of either (a batch)")
        return v

    @field_validator("prompt")
    @classmethod
    def _prompt(cls, v):
        if isinstance(v, list) and (len(v) == 0 or any(isinstance(p, list) and not p for p in v)):
            raise ValueError("prompt must not be empty")
        return v

    @property
    def prompts(self) -> list[str | list[int]]:
        """The batch: each prompt, a text or token ids."""
        if isinstance(self.prompt, str) or type(self.prompt[0]) is int:
            return [self.prompt]
        return list(self.prompt)

    def prompt_alternatives(self) -> int | None:
        """``prompt_logprobs``, or echo's with logprobs: the more alternatives of the two."""
        wanted = [n for n in (self.logprobs if self.echo else None, self.prompt_logprobs) if n is not None]
        return max(wanted) if wanted else None

    def check_supported(self) -> None:
        super().check_supported()
        if self.max_tokens == 0 and not self.echo:
            raise ApiError(400, "max_tokens 0 returns no completion: it needs echo (the prompt, and with logprobs its "
                           "tokens' logprobs)", "max_tokens")
        if self.suffix:
            raise ApiError(400, "suffix is not supported", "suffix")
        if self.best_of not in (None, self.n):
            raise ApiError(400, f"best_of is not supported unless it equals n ({self.n})", "best_of")


class ToolCallFunction(BaseModel):
    name: str
    arguments: dict[str, Any] = Field(default_factory=dict)

    @field_validator("arguments", mode="before")
    @classmethod
    def _json_arguments(cls, v):
        # OpenAI clients send back a JSON string; the chat template renders each argument, so it needs the mapping.
        if isinstance(v, str):
            try:
                return json.loads(v)
            except ValueError as e:
                raise ValueError(f"arguments is not valid JSON: {e}") from None
        return v


class ToolCall(BaseModel):
    id: str | None = None
    type: Literal["function"] = "function"
    function: ToolCallFunction


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="ignore")

    role: Literal["system", "user", "assistant", "tool", "developer"]
    content: str | list[dict[str, Any]] | None = None
    # the assistant's reasoning as a client sends it back: vLLM's newer `reasoning` and `thinking` are the same field
    # (the tokenizer hands whichever is set to the template as `reasoning_content`)
    reasoning_content: str | None = None
    reasoning: str | None = None
    thinking: str | None = None
    tool_calls: list[ToolCall] | None = None
    # which call a tool message answers: GLM-5.x's template orders parallel results by it
    tool_call_id: str | None = None
    name: str | None = None

    @field_validator("content")
    @classmethod
    def _parts(cls, v):
        if isinstance(v, list):
            for i, part in enumerate(v):
                kind = part.get("type")
                if kind != "text":
                    raise ValueError(f"content part {i} has type {kind!r}: only text parts are supported "
                                     "(this model takes no images or audio)")
                if not isinstance(part.get("text"), str):
                    raise ValueError(f"content part {i} needs a string 'text'")
        return v


class ChatCompletionRequest(_Sampling):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = Field(default=None, ge=1)
    logprobs: bool = False
    top_logprobs: int | None = Field(default=None, ge=0, le=20)
    tools: list[dict[str, Any]] | None = None
    # "auto" / "none" / null: "none" still shows the model the tools but turns no output into tool_calls; "required" or
    # {"type": "function", "function": {"name": ...}}: the answer starts with a call (of that function)
    tool_choice: Literal["none", "auto", "required"] | dict[str, Any] | None = None
    # false: at most one call — the output ends at the first call's close (a strict function's grammar ends it there too)
    parallel_tool_calls: bool = True
    chat_template_kwargs: dict[str, Any] | None = None
    # OpenAI's (GLM-5.2's template takes max too): none / minimal turn thinking off (enable_thinking false), the others
    # reach the chat template as its reasoning_effort argument; chat_template_kwargs set by the client win
    reasoning_effort: Literal["none", "minimal", "low", "medium", "high", "xhigh", "max"] | None = None
    # vLLM's: a final assistant message left open (prefill) that the model continues, without a new generation prompt
    add_generation_prompt: bool = True
    continue_final_message: bool = False

    @field_validator("chat_template_kwargs")
    @classmethod
    def _own_template_args(cls, v):
        taken = sorted(set(v or ()) & {"messages", "add_generation_prompt", "tools"})
        if taken:
            raise ValueError(f"{taken} are set by the server (from the request's messages and tools), "
                             "not by chat_template_kwargs")
        return v

    def check_supported(self) -> None:
        super().check_supported()
        if self.continue_final_message and (self.add_generation_prompt or self.messages[-1].role != "assistant"):
            raise ApiError(400, "continue_final_message continues a final assistant message: it needs one, and "
                           "add_generation_prompt false", "continue_final_message")
        for i, tool in enumerate(self.tools or ()):
            fn = tool.get("function")
            if tool.get("type", "function") != "function" or not isinstance(fn, dict) or \
                    not isinstance(fn.get("name"), str) or not fn["name"]:
                raise ApiError(400, f"tools[{i}] must be a function tool: {{'type': 'function', 'function': "
                               "{'name': ..., 'parameters': {...}}}", f"tools[{i}]")
            if any(m in fn["name"] for m in TOOL_MARKERS) or fn["name"] != fn["name"].strip():
                raise ApiError(400, f"tools[{i}].function.name {fn['name']!r} holds a tool-call marker or surrounding "
                               "whitespace, which a call could not name", f"tools[{i}].function.name")
            if fn.get("strict") is not None and not isinstance(fn["strict"], bool):
                raise ApiError(400, f"tools[{i}].function.strict must be a boolean", f"tools[{i}].function.strict")
            if fn.get("parameters") is not None and not isinstance(fn["parameters"], dict):
                raise ApiError(400, f"tools[{i}].function.parameters must be a JSON schema object",
                               f"tools[{i}].function.parameters")
        if self.tool_choice in (None, "auto", "none"):
            return
        if not self.tools:
            raise ApiError(400, f"tool_choice {self.tool_choice!r} needs tools", "tool_choice")
        if any(self.guidance):
            raise ApiError(400, "tool_choice required or named cannot be combined with response_format or "
                           "structured_outputs", "tool_choice")
        name = self.forced_function
        names = [t.get("function", {}).get("name") for t in self.tools if isinstance(t.get("function"), dict)]
        if self.tool_choice != "required" and name not in names:
            raise ApiError(400, f"tool_choice must be 'none', 'auto', 'required' or {{'type': 'function', 'function': "
                           f"{{'name': one of {names}}}}}, not {self.tool_choice!r}", "tool_choice")

    def template_kwargs(self) -> dict[str, Any]:
        """What the chat template is called with besides the messages: the client's ``chat_template_kwargs``, the tools,
        and ``reasoning_effort`` as the template takes it."""
        kwargs = dict(self.chat_template_kwargs or {})
        if self.reasoning_effort in ("none", "minimal"):
            kwargs.setdefault("enable_thinking", False)
        elif self.reasoning_effort is not None:
            kwargs.setdefault("reasoning_effort", self.reasoning_effort)
        if self.tools:
            kwargs["tools"] = self.tools
        return kwargs

    @property
    def forced_function(self) -> str | None:
        """The function a named ``tool_choice`` asks for (None: none named)."""
        fn = self.tool_choice.get("function") if isinstance(self.tool_choice, dict) else None
        return fn.get("name") if isinstance(fn, dict) and self.tool_choice.get("type") == "function" else None

    @property
    def parses_tool_calls(self) -> bool:
        return bool(self.tools) and self.tool_choice != "none"

    @property
    def string_arguments(self) -> dict[str, set[str]]:
        """Per tool, the arguments its JSON schema types as strings: their values are the model's text as it is (GLM's
        template writes a string argument raw, others as JSON — "3" for a string parameter stays "3")."""
        out: dict[str, set[str]] = {}
        for tool in self.tools or ():
            fn = tool.get("function")
            params = fn.get("parameters") if isinstance(fn, dict) else None
            props = params.get("properties") if isinstance(params, dict) else None
            if isinstance(props, dict):
                out[str(fn.get("name"))] = {k for k, v in props.items() if is_raw_string(v)}
        return out

    def template_messages(self) -> list[dict[str, Any]]:
        out = []
        for m in self.messages:
            d = m.model_dump(exclude_none=True)
            if d["role"] == "developer":
                d["role"] = "system"
            out.append(d)
        return out


class TokenizeRequest(OpenAIBody):
    """``POST /tokenize`` (vLLM's): a completion's ``prompt`` or a chat's ``messages`` (with its ``tools`` and template
    arguments) as the ids the server would feed the model."""

    model_config = ConfigDict(extra="ignore", strict=True)
    model: str
    prompt: str | None = None
    messages: list[dict[str, Any]] | None = None
    add_generation_prompt: bool = True
    tools: list[dict[str, Any]] | None = None
    chat_template_kwargs: dict[str, Any] | None = None
    reasoning_effort: str | None = None            # checked as the chat's

    def check_supported(self) -> None:
        if (self.prompt is None) == (self.messages is None):
            raise ApiError(400, "tokenize takes a prompt or messages, one of the two", "prompt")

    def chat(self) -> ChatCompletionRequest:
        """The messages as a chat completion's (validated as one: a bad message is the same 400)."""
        body = {"model": self.model, "messages": self.messages, "add_generation_prompt": self.add_generation_prompt}
        body.update({k: getattr(self, k) for k in ("tools", "chat_template_kwargs", "reasoning_effort")
                     if getattr(self, k) is not None})
        chat = ChatCompletionRequest.model_validate(body)
        chat.check_supported()
        return chat


class DetokenizeRequest(OpenAIBody):
    """``POST /detokenize`` (vLLM's): token ids back to text (special tokens kept)."""

    model_config = ConfigDict(extra="ignore", strict=True)
    model: str
    tokens: list[int]

    def check_supported(self) -> None:
        pass


_UNION_BRANCH = re.compile(r"(str|int|float|bool|none|[a-z-]+\[.*\])")


def chat_request(body: dict, rename: Callable[[ApiError], ApiError]) -> ChatCompletionRequest:
    """The chat completion ``body`` (another API's request, converted) asks for, checked as the chat endpoint checks
    its own; an error is renamed by ``rename`` to the field the client sent."""
    try:
        chat = ChatCompletionRequest.model_validate(body)
        chat.check_supported()
        chat.max_tokens = chat.max_completion_tokens      # as the chat endpoint does
    except ValidationError as e:
        raise rename(validation_error(e)) from None
    except ApiError as e:
        raise rename(e) from None
    return chat


def delta_pieces(delta: dict) -> list[tuple[str, Any]]:
    """A chat chunk's delta as ("reasoning", text), ("call", a tool call's delta) and ("text", text) pieces, in the
    order the model wrote them: within one chunk a call's pieces come before the text after it (the engine starts an
    event at each special token, a call's markers among them, so a chunk's text never precedes its call pieces)."""
    out = [("reasoning", delta["reasoning_content"])] if delta.get("reasoning_content") else []
    out += [("call", call) for call in delta.get("tool_calls") or ()]
    return out + ([("text", delta["content"])] if delta.get("content") else [])


def validation_error(exc) -> ApiError:
    """A pydantic / FastAPI validation error → 400 naming the first offending field."""
    errors = exc.errors()
    if not errors:
        return ApiError(400, "invalid request body")
    e = errors[0]
    loc = [str(x) for x in e.get("loc", ()) if x not in ("body",)]
    branch = next((i for i, x in enumerate(loc) if _UNION_BRANCH.fullmatch(x)), len(loc))
    param = ".".join(loc[:branch]) or None       # a union's branch ("str", "literal[...]") is no part of the name
    if e.get("type") == "json_invalid":
        return ApiError(400, f"malformed JSON body: {e.get('msg')}", None)
    msg = e.get("msg", "invalid value")
    return ApiError(400, f"invalid value for '{param}': {msg}" if param else msg, param)
