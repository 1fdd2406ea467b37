"""The Ray Serve application: an OpenAI-compatible FastAPI ingress in front of the coordinator.

    serve run cluster.serve:build_app model=/path/to/ckpt num_workers=8
    glmserve serve                      # the same, with a local Ray started for you (cluster/server.py)

``build_app(args)`` is the Serve import path; ``args`` are ``EngineConfig`` fields (unknown keys are an
error naming them). Coordinator replicas (each with its own N workers) scale with ``num_replicas`` or
``autoscaling_config`` on the ``Coordinator`` deployment.
"""

# no `from __future__ import annotations`: FastAPI must see real annotations on the class-based routes

import asyncio
import functools
import importlib.metadata
import json
import re
import uuid
from concurrent.futures import ThreadPoolExecutor
from typing import AsyncIterator

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse
from pydantic import ValidationError
from ray import serve
from ray.exceptions import RayTaskError
from starlette.exceptions import HTTPException

from cluster.anthropic import CountTokensRequest, MessageEvents, MessagesRequest, messages_param
from cluster.anthropic import error_response as anthropic_error
from cluster.choices import ChoicesStream, MergedChoices
from cluster.config import EngineConfig
from cluster.disagg import prefill_plan
from cluster.formatter import Formatter
from cluster.guided import check_tool_grammar, tool_grammar
from cluster.metrics_hub import HttpCounts, app_metrics_hub, http_text, merge
from cluster.parsers import TOOL_MARKERS
from cluster.protocol import (
    ApiError,
    ChatCompletionRequest,
    CompletionRequest,
    DetokenizeRequest,
    TokenizeRequest,
    validation_error,
)
from cluster.responses import ResponseEvents, ResponsesRequest, responses_param
from scheduler.scheduler import AdmissionError

app = FastAPI(title="glmserve", docs_url=None, redoc_url=None)
app.add_middleware(HttpCounts)          # glmserve_http_requests_total{route,status}: every answer, its own 400s too


def _version() -> str:
    try:
        return importlib.metadata.version("glmserve")
    except importlib.metadata.PackageNotFoundError:     # a checkout on the path, not installed
        return "unknown"


VERSION = _version()


@app.exception_handler(ApiError)
async def _api_error(_: Request, e: ApiError):
    return JSONResponse(e.body(), status_code=e.status, headers=e.headers)


@app.exception_handler(HTTPException)
async def _http_error(request: Request, e: HTTPException):
    # FastAPI's own 404 / 405 (unknown route, wrong method): OpenAI clients parse {"error": ...}, not {"detail": ...}
    message = f"{e.detail}: {request.method} {request.url.path}"
    return JSONResponse(ApiError(e.status_code, message).body(), status_code=e.status_code, headers=e.headers)


def _ingress_id() -> str:
    """This ingress replica's ``replica`` label on /metrics."""
    try:
        return f"ingress-{serve.get_replica_context().replica_id.unique_id}"
    except Exception:   # noqa: BLE001 — not a Serve replica (the class driven directly)
        return "ingress"


def _model_name(cfg: EngineConfig) -> str:
    from pathlib import Path

    return cfg.served_model_name or Path(cfg.model).name


def _cause(e: BaseException) -> BaseException:
    """The exception the replica raised: across Ray it arrives as ``RayTaskError(cause)``, whose str() is the remote
    traceback (colour codes, pid, host, paths), never a message for the client."""
    return e.cause if isinstance(e, RayTaskError) and e.cause is not None else e


# Tokenizing and rendering chat templates run beside the event loop (megabytes take seconds, and /health and every
# open stream share the loop), in two pools: texts past LARGE_TEXT characters in their own, so a burst of huge prompts
# queues behind itself rather than in front of ordinary requests.
LARGE_TEXT = 1 << 16
TRUNCATED_MAX_CHARS = 1 << 24   # a prompt to be cut (truncate_prompt_tokens) is tokenized whole, up to this size
_POOLS = {False: ThreadPoolExecutor(8, "tokenize"), True: ThreadPoolExecutor(2, "tokenize-large")}


async def _beside_loop(size: int, fn, *args, **kwargs):
    """``fn(*args, **kwargs)`` in the pool for a text of ``size`` characters."""
    return await asyncio.get_running_loop().run_in_executor(_POOLS[size > LARGE_TEXT],
                                                            functools.partial(fn, *args, **kwargs))


async def _encode(tokenizer, text: str, max_chars: int, param: str) -> list[int]:
    """Tokenize beside the event loop. A text that cannot fit the context (``max_chars``) is refused first, without
    spending the seconds."""
    _fits(len(text), max_chars, param)
    return await _beside_loop(len(text), _unicode_encode, tokenizer, text, param)


def _fits(size: int, max_chars: int, param: str) -> None:
    if size > max_chars:
        raise ApiError(400, f"the prompt is {size} characters: more than the context can hold whatever it "
                       f"tokenizes to (at most {max_chars})", param, code="context_length_exceeded")


_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F]")     # JSON's escape of a UTF-16 surrogate: \ud800 ... \udfff


def _lone_surrogate(raw) -> str | None:
    """The path (``messages.0.name``) of the first key or string in a parsed body that holds a lone surrogate (which
    no UTF-8 text holds: echoed back, it fails the response's encoding), or None."""
    todo = [("", raw)]
    while todo:
        path, v = todo.pop()
        items = v.items() if isinstance(v, dict) else enumerate(v) if isinstance(v, list) else ()
        for k, x in items:
            key = str(k).encode(errors="backslashreplace").decode()       # a key's own surrogate, escaped
            where = f"{path}.{key}" if path else key
            for s in (k, x):
                if isinstance(s, str):
                    try:
                        s.encode()
                    except UnicodeEncodeError:
                        return where
            todo.append((where, x))
    return None


def _unicode_encode(tokenizer, text: str, param: str) -> list[int]:
    """``tokenizer.encode(text)`` for a text that is Unicode: JSON's ``"\\ud800"`` escape decodes to a lone surrogate,
    which no UTF-8 tokenizer takes (a TypeError there)."""
    try:
        text.encode()
    except UnicodeEncodeError as e:
        raise ApiError(400, f"{param} holds a lone UTF-16 surrogate ({text[e.start]!r}), which is not valid Unicode",
                       param) from None
    return tokenizer.encode(text)


def _tool_guidance(body, tool_ids: dict[str, int] | None, tokenizer) -> dict:
    """The SamplingParams fields that hold a chat request's tool calls (``tool_ids``: the tool parser's markers, None
    when it is off). Where a function that may be called is strict (``"strict": true``), a grammar holds the calls
    (``guided.tool_grammar``: a strict function's arguments follow its schema) — from the answer's start under
    tool_choice required / named, from the model's own ``<tool_call>`` under auto (not where structured output holds the
    answer); otherwise required / named only force the call's start (``_forced_call``)."""
    forced = body.tool_choice not in (None, "auto", "none")
    if not body.tools or body.tool_choice == "none" or (not forced and (
            tool_ids is None or tokenizer is None or any(body.guidance))):
        return {}
    if forced and (tool_ids is None or tokenizer is None):
        raise ApiError(400, f"tool_choice {body.tool_choice!r} needs the server's tool parser (--tool-parser glm)",
                       "tool_choice")
    name = body.forced_function
    fns = [t.get("function") for t in body.tools if isinstance(t.get("function"), dict)]
    if not any(fn.get("strict") is True and name in (None, fn.get("name")) for fn in fns):
        return {"forced_paths": _forced_call(body, tool_ids, tokenizer)} if forced else {}
    if body.ignore_eos:
        raise ApiError(400, "ignore_eos cannot be combined with a strict function: its calls end at EOS", "ignore_eos")
    try:
        source = tool_grammar(body.tools, tool_ids, name, parallel=body.parallel_tool_calls and name is None,
                              opened=not forced)
        check_tool_grammar(source)
    except (ValueError, TypeError) as e:         # TypeError: a schema value of a type it may not take
        raise ApiError(400, f"tools: {e}", "tools") from None
    return {"tool_grammar": source, "guide_after": () if forced else (tool_ids["<tool_call>"],)}


def _forced_call(body, tool_ids: dict[str, int], tokenizer) -> tuple[tuple[int, ...], ...]:
    """The token sequences a ``tool_choice`` of required / a named function makes the answer start with one of:
    ``<tool_call>``, a function's name (that one's, or any tool's), then ``<arg_key>`` where it takes arguments and
    ``</tool_call>`` where it may take none. The rest of the call is the model's; the tool parser (``tool_ids``: its
    markers) reads it."""
    paths = []
    for tool in body.tools:
        fn = tool.get("function") if isinstance(tool.get("function"), dict) else {}
        if body.forced_function not in (None, fn.get("name")) or not isinstance(fn.get("name"), str):
            continue
        params = fn.get("parameters") if isinstance(fn.get("parameters"), dict) else {}
        ends = ([tool_ids["<arg_key>"]] if params.get("properties") else []) + \
            ([] if params.get("required") else [tool_ids["</tool_call>"]]) or [tool_ids["<arg_key>"]]
        paths += [(tool_ids["<tool_call>"], *tokenizer.encode(fn["name"]), end) for end in ends]
    return tuple(paths)


def _admission_error(e: AdmissionError) -> ApiError:
    if e.reason == "queue_full":
        return ApiError(429, str(e), None, "rate_limit_error", {"Retry-After": "1"})
    if e.reason == "unavailable":       # the replica's worker group is down (a rebuild failed): another may answer
        return ApiError(503, str(e), None, "service_unavailable", {"Retry-After": "5"})
    return ApiError(400, str(e), e.field,
                    code="context_length_exceeded" if e.reason in ("too_long", "kv_capacity") else None)


def _check_context(body, ids: list[int], max_tokens: int, chat: bool, context: int) -> None:
    """A 400 where the prompt and ``max_tokens`` do not fit the ``context``."""
    if len(ids) + max_tokens <= context:
        return
    if body.max_tokens == 0:
        raise ApiError(400, f"prompt ({len(ids)} tokens) fills the context length {context}: scoring it (max_tokens 0) "
                       "takes one token more", "prompt", code="context_length_exceeded")
    # max_tokens is to blame only if a smaller one would fit: a prompt that fills the context is too long
    fits = body.max_tokens and len(ids) < context
    limit = "max_completion_tokens" if chat and body.max_completion_tokens is not None else "max_tokens"
    asked = f" + {limit} ({max_tokens})" if body.max_tokens is not None else "" if chat else \
        f" + the default max_tokens ({max_tokens})"
    what = "leaves no room for an answer in" if not asked and len(ids) <= context else "exceeds"
    raise ApiError(400, f"prompt ({len(ids)} tokens){asked} {what} the context length {context}",
                   limit if fits else "messages" if chat else "prompt", code="context_length_exceeded")


_TURNS = ("<|system|>", "<|user|>", "<|assistant|>", "<|observation|>")   # the role tokens that start a turn
HEALTH_PROBE_S = 2.0    # /health before the model first answered: how long it asks the coordinator before a 503
HUB_TIMEOUT_S = 5.0     # /metrics: how long it waits for the other replicas' metrics


# Defined after its helpers: serve.ingress pickles the class by value at decoration time.
@serve.ingress(app)
class OpenAIIngress:
    """HTTP edge: parse and validate, template and tokenize, stream events back as OpenAI chunks."""

    def __init__(self, coordinator, engine_config: dict):
        from cluster.local import load_tokenizer, max_model_len, sampling_defaults
        from models.config import ModelConfig

        self.coord = coordinator
        self.cfg = EngineConfig.from_dict(engine_config)
        self.model_name = _model_name(self.cfg)
        self.tokenizer = load_tokenizer(self.cfg.model, self.cfg.chat_template)
        specials = self.tokenizer.special_ids_by_token() if self.tokenizer else {}
        self.think_start, self.think_end = specials.get("<think>"), specials.get("</think>")
        self.turn_ids = {specials[t] for t in _TURNS if t in specials}
        self.tool_ids = {n: specials[n] for n in TOOL_MARKERS} if all(n in specials for n in TOOL_MARKERS) else None
        self.model_config = ModelConfig.from_json(self.cfg.model)
        self.sampling_defaults = sampling_defaults(self.cfg.model) if self.cfg.generation_config == "auto" else {}
        # No token holds more bytes than the vocabulary's longest and no character is less than a byte (byte-level
        # BPE drops none), so a longer text cannot fit the context whatever it tokenizes to.
        tok = self.tokenizer
        self.longest_token = max(len(tok.token_bytes(i)) for i in range(tok.vocab_size)) if tok else 0
        self.max_model_len = self.max_prompt_chars = None      # the scheduler's: ``_limits``
        if self.cfg.num_blocks or self.cfg.max_model_len:      # else the pool is sized to memory: the coordinator's
            self._set_limits(max_model_len(self.cfg, self.model_config, self.cfg.num_blocks))
        self.draining = False           # shutting down: new requests are refused, those in flight finish
        self.ready = False              # the coordinator answered once: its model is loaded (see ``health``)
        self.in_flight = 0              # streams open to the coordinator
        self.open_ids: set[str] = set()  # their request ids
        self.closing = False            # the drain's time ran out: the streams still open end with an error
        self._hub = None                # the app's MetricsHub: this replica's HTTP counts go there (``check_health``)

    async def check_health(self) -> None:
        """Serve's periodic check: this replica's HTTP answer counts reach the app's /metrics whichever replica a
        scrape meets (as the coordinators' do)."""
        try:
            if self._hub is None:
                self._hub = app_metrics_hub()
            if self._hub is not None and (text := http_text()):
                self._hub.put.remote(_ingress_id(), text)
        except Exception:   # noqa: BLE001 — metrics are not the replica's health
            self._hub = None

    def _thinking(self, ids: list[int]) -> bool:
        """Whether the prompt leaves the model inside a thought: its last turn opens ``<think>`` and does not close it
        (a generation prompt with thinking on, or a ``continue_final_message`` that ends mid-thought)."""
        for t in reversed(ids):
            if t == self.think_start:
                return True
            if t == self.think_end or t in self.turn_ids:
                return False
        return False

    def _set_limits(self, context: int) -> None:
        self.max_model_len, self.max_prompt_chars = context, context * self.longest_token

    async def _limits(self) -> None:
        """The context length, where the coordinator's workers sized their KV pool to memory: asked once."""
        if self.max_model_len is None:
            self._set_limits((await self.coord.info.remote())["max_model_len"])

    async def info(self) -> dict:
        """The coordinator's counters (one replica's, as Serve routes it): ``glmserve serve``'s stats line."""
        return await self.coord.info.remote()

    async def drain(self) -> int:
        """Refuse new requests from now on (503); the streams still in flight (``glmserve serve`` waits for 0)."""
        self.draining = True
        return self.in_flight

    async def close_streams(self) -> int:
        """The drain's time is up: end every request still in flight — each stream's last event an error (503
        "the server shut down ...": streaming clients get it as an error event, others as the response) rather
        than a connection cut mid-stream. Returns how many were ended."""
        self.draining = self.closing = True
        ids = list(self.open_ids)
        await asyncio.gather(*[self.coord.abort.remote(r) for r in ids], return_exceptions=True)
        return len(ids)

    # ---- endpoints ------------------------------------------------------------------------------
    @app.get("/health")
    async def health(self) -> dict:
        if self.draining:                  # a load balancer stops sending requests here
            raise ApiError(503, "the server is shutting down", None, "server_error")
        # the coordinator asked each time: before it first answers it is loading the model; later a replica whose worker
        # group is down (rebuilt again and again) refuses every request with a 503 until Serve replaces it — a load
        # balancer must hear that too (a handle reaches one replica: "a replica here can serve")
        try:
            why = await asyncio.wait_for(self.coord.unhealthy.remote(), HEALTH_PROBE_S)
        except Exception:  # noqa: BLE001 — still loading, or gone / stuck
            raise ApiError(503, "the model replica does not answer" if self.ready else "the model is loading", None,
                           "server_error") from None
        if why is not None:
            raise ApiError(503, f"the model replica cannot serve: {why}", None, "server_error")
        self.ready = True
        return {"status": "ok"}

    @app.get("/ping")                       # vLLM's (SageMaker's probe): /health's answer
    @app.post("/ping")
    async def ping(self) -> dict:
        return await self.health()

    @app.get("/version")
    async def version(self) -> dict:
        return {"version": VERSION}

    @app.get("/v1/models")
    async def models(self) -> dict:
        await self._limits()
        return {"object": "list", "data": [self._card()]}

    @app.get("/v1/models/{model_id:path}")          # :path — a served name may hold a slash (org/model)
    async def model(self, model_id: str) -> dict:
        if model_id != self.model_name:
            raise ApiError(404, f"the model {model_id!r} does not exist; this server serves {self.model_name!r}",
                           "model", code="model_not_found")
        await self._limits()
        return self._card()

    def _card(self) -> dict:
        return {"id": self.model_name, "object": "model", "created": 0, "owned_by": "glmserve",
                "max_model_len": self.max_model_len}

    @app.get("/metrics")
    async def metrics(self) -> PlainTextResponse:
        """Every Coordinator replica's metrics, each sample labelled with its ``replica``: the one this call reaches,
        fresh, and the others' as they left them at their last health check (``cluster/metrics_hub.py``)."""
        replica, text = await self.coord.metrics_text.remote()
        texts = {}
        if (hub := app_metrics_hub()) is not None:
            try:
                texts = await asyncio.wait_for(hub.get.remote(), HUB_TIMEOUT_S)
            except Exception:    # noqa: BLE001 — the others' metrics are lost for this scrape, not the answer
                texts = {}
        texts[replica] = text
        if own := http_text():          # this ingress replica's answers, fresh
            texts[_ingress_id()] = own
        return PlainTextResponse(merge(texts), media_type="text/plain; version=0.0.4")

    @app.post("/v1/completions")
    async def completions(self, request: Request):
        body = await self._parse(request, CompletionRequest)
        prompts, echoes = [], []
        for prompt in body.prompts:
            if isinstance(prompt, str):
                ids, text = await _encode(self._tokenizer(), prompt, self._max_chars(body), "prompt"), prompt
            else:
                ids = list(prompt)
                # ids echo as their text; a checkpoint without a tokenizer returns no text at all
                if body.echo and self.tokenizer:
                    self._check_ids(ids, "prompt")
                text = self.tokenizer.decode(ids) if body.echo and self.tokenizer else ""
            if len(kept := self._truncated(body, ids)) < len(ids):     # echo shows what the model read
                ids, text = kept, self.tokenizer.decode(kept) if body.echo and self.tokenizer else ""
            prompts.append(ids)
            echoes.append(text)
        return await self._respond(body, prompts, body.logprobs, chat=False,
                                   echoes=echoes if body.echo else None)

    @app.post("/v1/chat/completions")
    async def chat_completions(self, request: Request):
        body = await self._parse(request, ChatCompletionRequest)
        ids = self._truncated(body, await self._chat_ids(body))
        logprobs = (body.top_logprobs or 0) if body.logprobs else None
        if body.top_logprobs and not body.logprobs:
            raise ApiError(400, "top_logprobs requires logprobs=true", "top_logprobs")
        if body.max_completion_tokens is not None:
            body.max_tokens = body.max_completion_tokens
        return await self._respond(body, [ids], logprobs, chat=True)

    @app.post("/v1/messages")
    async def messages(self, request: Request):
        """Anthropic's Messages API on the chat machinery (``cluster/anthropic.py``): Claude Code's endpoint."""
        try:
            body = await self._parse(request, MessagesRequest)
            chat = body.to_chat()
            try:
                ids = await self._chat_ids(chat)
                if len(ids) >= self.max_model_len:
                    raise ApiError(400, f"prompt is too long: {len(ids)} tokens > {self.max_model_len - 1} maximum",
                                   "messages", code="context_length_exceeded")
                clamped = len(ids) + chat.max_tokens > self.max_model_len      # Anthropic's newer models: not a 400
                chat.max_tokens = min(chat.max_tokens, self.max_model_len - len(ids))
                fmt, merged = await self._start(chat, [ids], None, chat=True)
            except ApiError as e:
                raise messages_param(e) from None
        except ApiError as e:
            return anthropic_error(e)
        events = MessageEvents(body, self.model_name, fmt.num_prompt, clamped)
        if body.stream:
            return ChoicesStream(events.sse(fmt.chunks(merged)), merged)
        try:
            return JSONResponse(await events.whole(fmt.chunks(merged)))
        except ApiError as e:
            return anthropic_error(e)
        finally:
            await merged.aclose()

    @app.post("/v1/messages/count_tokens")
    async def count_tokens(self, request: Request):
        """The prompt tokens a Messages request would take (Anthropic's endpoint)."""
        try:
            body = await self._parse(request, CountTokensRequest)
            try:
                return {"input_tokens": len(await self._chat_ids(body.to_chat()))}
            except ApiError as e:
                raise messages_param(e) from None
        except ApiError as e:
            return anthropic_error(e)

    @app.post("/v1/responses")
    async def responses(self, request: Request):
        """OpenAI's Responses API on the chat machinery (``cluster/responses.py``): not stored, text and functions."""
        body = await self._parse(request, ResponsesRequest)
        chat = body.to_chat()
        try:
            fmt, merged = await self._start(chat, [await self._chat_ids(chat)], None, chat=True)
        except ApiError as e:
            raise responses_param(e) from None
        events = ResponseEvents(body, self.model_name)
        if body.stream:
            return ChoicesStream(events.sse(fmt.chunks(merged)), merged)
        try:
            return JSONResponse(await events.whole(fmt.chunks(merged)))
        finally:
            await merged.aclose()

    @app.post("/tokenize")
    async def tokenize(self, request: Request) -> dict:
        """The ids a completion's prompt or a chat's messages become (vLLM's endpoint): clients count their context."""
        body = await self._parse(request, TokenizeRequest)
        if body.messages is not None:
            try:
                chat = body.chat()
            except ValidationError as e:
                raise validation_error(e) from None
            ids = await self._chat_ids(chat)
        else:
            ids = await _encode(self._tokenizer(), body.prompt, self.max_prompt_chars, "prompt")
        return {"count": len(ids), "max_model_len": self.max_model_len, "tokens": ids}

    @app.post("/detokenize")
    async def detokenize(self, request: Request) -> dict:
        body = await self._parse(request, DetokenizeRequest)
        self._check_ids(body.tokens, "tokens")
        return {"prompt": self._tokenizer().decode(body.tokens, skip_special_tokens=False)}

    def _truncated(self, body, ids: list[int]) -> list[int]:
        """vLLM's ``truncate_prompt_tokens``: the prompt's last k tokens (-1: ``max_model_len``)."""
        k = body.truncate_prompt_tokens
        if k is not None and k > self.max_model_len:
            raise ApiError(400, f"truncate_prompt_tokens ({k}) must be at most max_model_len ({self.max_model_len})",
                           "truncate_prompt_tokens")
        k = self.max_model_len if k == -1 else k
        return ids[-k:] if k is not None and len(ids) > k else ids

    def _max_chars(self, body) -> int:
        """The longest prompt text tokenized: what the context can hold, or one to be cut to its last tokens."""
        return self.max_prompt_chars if body.truncate_prompt_tokens is None else \
            max(self.max_prompt_chars, TRUNCATED_MAX_CHARS)

    def _check_ids(self, ids: list[int], param: str) -> None:
        bad = next((t for t in ids if not 0 <= t < self.model_config.vocab_size), None)
        if bad is not None:
            raise ApiError(400, f"token id {bad} is outside [0, vocab_size={self.model_config.vocab_size})", param)

    async def _chat_ids(self, body: ChatCompletionRequest) -> list[int]:
        """The chat's prompt ids: its messages (and tools, template arguments) through the chat template."""
        tok = self._tokenizer()
        messages, kwargs = body.template_messages(), body.template_kwargs()
        try:     # a message's (or a tool definition's) text that holds a special token's text is encoded as text
            pieces = await _beside_loop(len(str(messages)) + len(str(kwargs)), tok.chat_pieces, messages,
                                        add_generation_prompt=body.add_generation_prompt, **kwargs)
        except ValueError as e:
            raise ApiError(400, str(e), "messages") from None
        except RecursionError:      # JSON the parser took (~1000 deep) but the template's walk over it could not
            raise ApiError(400, "messages or tools are nested too deeply to render", "messages") from None
        if len(pieces) == 1:
            return await _encode(tok, pieces[0][0], self._max_chars(body), "messages")
        size = sum(len(text) for text, _ in pieces)
        _fits(size, self._max_chars(body), "messages")
        return await _beside_loop(size, tok.encode_pieces, pieces)

    # ---- shared machinery ----------------------------------------------------------------------
    async def _parse(self, request: Request, model):
        if self.draining:
            raise ApiError(503, "the server is shutting down", None, "server_error", {"Retry-After": "1"})
        data = await request.body()
        try:
            raw = json.loads(data.decode("utf-8-sig"))      # UTF-8, as JSON over HTTP is (json.loads takes UTF-16 too)
        except ValueError as e:         # JSONDecodeError, UnicodeDecodeError, an integer past Python's 4300 digits
            raise ApiError(400, f"malformed JSON body: {e}") from None
        except RecursionError:          # arrays / objects nested past the parser's depth (~1000)
            raise ApiError(400, "malformed JSON body: nested too deeply") from None
        if not isinstance(raw, dict):
            raise ApiError(400, "the request body must be a JSON object")
        if _SURROGATE_ESCAPE.search(data) and (where := _lone_surrogate(raw)) is not None:
            raise ApiError(400, f"{where} holds a lone UTF-16 surrogate, which is not valid Unicode", where)
        try:
            body = model.model_validate(raw)
        except ValidationError as e:
            raise validation_error(e) from None
        if body.model != self.model_name:
            raise ApiError(404, f"the model {body.model!r} does not exist; this server serves {self.model_name!r}",
                           "model", code="model_not_found")
        body.check_supported()
        if getattr(body, "priority", 0) and self.cfg.scheduling_policy != "priority":
            raise ApiError(400, f"priority {body.priority} needs the server's priority scheduling (--scheduling-policy "
                           "priority); under fcfs every request's priority is 0", "priority")
        await self._limits()
        return body

    def _tokenizer(self):
        if self.tokenizer is None:
            raise ApiError(400, "this checkpoint ships no tokenizer: send token ids as the prompt", "prompt")
        return self.tokenizer

    async def _respond(self, body, prompts: list[list[int]], logprobs: int | None, chat: bool,
                       echoes: list[str] | None = None):
        fmt, merged = await self._start(body, prompts, logprobs, chat, echoes)
        if body.stream:
            return ChoicesStream(fmt.sse(merged, body.include_usage), merged)
        try:
            return JSONResponse(await fmt.whole(merged, len(prompts) * body.n))
        finally:
            await merged.aclose()

    async def _start(self, body, prompts: list[list[int]], logprobs: int | None, chat: bool,
                     echoes: list[str] | None = None):
        """Open the request's choices — ``body.n`` of each of ``prompts`` (a completion's batch; a chat's one), choice
        ``p * n + i`` the ``i``-th of prompt ``p`` — on the coordinator (their first events come back: an admission
        error is raised here, before any response starts); returns the formatter and the choices' merged events."""
        ids, body = prompts[0], body.with_defaults(self.sampling_defaults)
        # max_tokens 0 (a completion's echo alone): one token is sampled, and the formatter drops it
        cap = self.sampling_defaults.get("max_new_tokens", self.max_model_len)       # the model's, where it sets one
        max_tokens = max(1, body.max_tokens) if body.max_tokens is not None else min(
            max(1, self.max_model_len - len(ids)) if chat else 16, cap)
        for p in prompts:
            _check_context(body, p, max_tokens, chat, self.max_model_len)
        reasoning = chat and self.cfg.reasoning_parser == "glm"
        thinking = reasoning and self._thinking(ids)
        tool_ids = self.tool_ids if chat and body.parses_tool_calls and self.cfg.tool_parser == "glm" else None
        # the markers where the parsers below split the text into fields (SamplingParams.text_breaks)
        breaks = {self.think_end} if reasoning and self.think_end is not None else set()
        breaks = tuple(sorted(breaks | set(tool_ids.values() if tool_ids else ())))
        tools = _tool_guidance(body, self.tool_ids if self.cfg.tool_parser == "glm" else None, self.tokenizer) \
            if chat else {}
        try:
            span = (tool_ids["<tool_call>"], tool_ids["</tool_call>"]) if tool_ids else ()
            params = [body.sampling_params(max_tokens, logprobs, seed_offset=i, text_breaks=breaks,
                                           tool_guidance=tools, tool_call_span=span) for i in range(body.n)]
        except ValueError as e:
            raise ApiError(400, str(e)) from None
        choices = len(prompts) * body.n
        if choices > (admits := self.cfg.max_num_seqs + self.cfg.max_waiting):
            what = f"n ({body.n})" if len(prompts) == 1 else f"{len(prompts)} prompts × n ({body.n})"
            raise ApiError(400, f"{what} is more choices than the server admits at once (max_num_seqs + "
                           f"max_waiting = {admits})", "n" if len(prompts) == 1 else "prompt")
        queued = self.cfg.max_waiting_tokens       # the choices queue their prompts at once, unless cached one by one
        # (a request for its prompt's logprobs takes no cached blocks)
        share = body.n > 1 and self.cfg.prefix_caching and body.prompt_alternatives() is None and \
            min(map(len, prompts)) > self.cfg.block_size
        if queued and sum(map(len, prompts)) * body.n > queued and not share:
            what = f"n ({body.n}) choices of a {len(ids)}-token prompt" if len(prompts) == 1 else \
                f"{len(prompts)} prompts × n ({body.n}) choices"
            raise ApiError(400, f"{what} are more prompt tokens than the server queues at once (max_waiting_tokens = "
                           f"{queued})", "n" if len(prompts) == 1 else "prompt")
        rid = f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex[:24]}"
        streams = [self._open(p, params[i], f"{rid}-{k * body.n + i}") for k, p in enumerate(prompts)
                   for i in range(body.n)]
        leads = [s for k, s in enumerate(streams) if k % body.n == 0]
        if share:
            # the other choices of a prompt start once its first has its first token: they find the prompt's blocks
            # cached (each would compute the whole prompt beside it otherwise)
            first = await asyncio.gather(*[s.__anext__() for s in leads], return_exceptions=True)
            if not any(isinstance(f, BaseException) for f in first):
                rest = await asyncio.gather(*[s.__anext__() for s in streams if s not in leads],
                                            return_exceptions=True)
                first = [first[k // body.n] if k % body.n == 0 else rest[k - k // body.n - 1]
                         for k in range(len(streams))]
        else:
            first = await asyncio.gather(*[s.__anext__() for s in streams], return_exceptions=True)
        for s, f in zip(streams, first):
            if isinstance(f, BaseException):
                await asyncio.gather(*[x.aclose() for x in streams], return_exceptions=True)
                f = _cause(f)
                if isinstance(f, AdmissionError):
                    raise _admission_error(f) from None
                raise ApiError(503, f"the model replica is unavailable: {f}", None, "server_error") from None
        fmt = Formatter(self, rid, chat, prompts, logprobs, thinking, body.n, tool_ids, echoes,
                         body.string_arguments if tool_ids else None, echo_only=body.max_tokens == 0,
                         prompt_top=body.prompt_logprobs, token_ids_as_names=body.return_tokens_as_token_ids,
                         continuous_usage=body.include_usage and body.stream_options.continuous_usage_stats,
                         return_ids=body.return_token_ids, reasoning_parser=reasoning)
        return fmt, MergedChoices(streams, first)

    async def _open(self, ids, params, req_id) -> AsyncIterator:
        gen = None
        started = finished = False
        self.in_flight += 1
        self.open_ids.add(req_id)
        try:
            gen = self.coord.options(stream=True).generate.remote(ids, params, req_id)
            try:
                async for ev in gen:
                    if ev.refused is not None and not started:
                        raise ev.refused        # ``_respond`` answers it: 400 / 429
                    started, finished = True, ev.finished
                    if finished and ev.finish_reason == "abort" and self.closing and not ev.error:
                        ev.error = "the server shut down before the request finished"
                    yield ev
            except Exception as e:
                if not started:             # ``_respond`` answers it (the replica unavailable: 503)
                    raise
                from cluster.engine import TokenEvent

                # the replica died (or its generator failed, which aborts the request): nothing left to abort. The
                # client gets an error, not an answer cut short that looks whole.
                finished = True
                yield TokenEvent(req_id, [], "", True, "abort", error="the model replica failed during the request "
                                 f"({type(_cause(e)).__name__})")
        finally:
            self.in_flight -= 1
            self.open_ids.discard(req_id)
            if not finished and gen is not None:    # the client went away: free the request's KV now
                gen.cancel()
                await self.coord.abort.remote(req_id)


# ---- the Serve application ------------------------------------------------------------------------
def build_app(args: dict | None = None):
    """Serve import path: ``args`` are EngineConfig fields, plus optionally ``num_replicas`` or
    ``autoscaling_config`` for the Coordinator (a YAML ``deployments:`` entry does the same), and ``prefill`` for
    disaggregated prefill (``cluster/disagg.py``'s ``prefill_plan``: a ``PrefillCoordinator`` deployment of its own)."""
    args = dict(args or {})
    scaling = {k: args.pop(k) for k in ("num_replicas", "autoscaling_config") if k in args}
    # (a ``prefill:`` section whose fields are all commented out is YAML null: the defaults, as ``prefill: {}``)
    prefill = args.pop("prefill") if "prefill" in args else False
    cfg = EngineConfig.from_dict(args)
    _check_model_here(cfg)
    pd = ()
    if prefill is not False:    # disaggregated prefill: replicas of their own, which the
        plan = prefill_plan(cfg.to_dict(), prefill)     # Coordinator's replicas ask (cluster/disagg.py)
        pd = (_coordinator("PrefillCoordinator", plan.engine, plan.deployment, exports=True), plan.min_prompt_tokens,
              plan.engine["block_size"])
    coord = _coordinator("Coordinator", cfg.to_dict(), scaling, *pd)
    ingress = serve.deployment(OpenAIIngress, name="OpenAIIngress", ray_actor_options={"num_cpus": 0},
                               max_ongoing_requests=INGRESS_MAX_ONGOING, max_queued_requests=512,
                               graceful_shutdown_timeout_s=GRACEFUL_SHUTDOWN_S)
    return ingress.bind(coord, cfg.to_dict())


def _check_model_here(cfg: EngineConfig) -> None:
    """What only the checkpoint can check (the model's positions, layers, the chat template file, the tokenizer),
    before Serve touches a replica: a redeploy with a bad value stopped the running replicas and then failed to start
    new ones (session 59). Only where the model folder is readable here (the node that builds the app: a head without
    the checkpoint's volume leaves the checks to the replicas, as before)."""
    import logging
    from pathlib import Path

    from cluster.local import load_tokenizer
    from models.config import ModelConfig

    if not (Path(cfg.model) / "config.json").is_file():
        logging.getLogger("ray.serve").warning("glmserve: %s/config.json is not readable here: the replicas check the "
                                               "model", cfg.model)
        return
    cfg.check_model(ModelConfig.from_json(cfg.model))
    load_tokenizer(cfg.model, cfg.chat_template)


def _coordinator(name: str, engine: dict, scaling: dict, *args, **kwargs):
    """A bound Coordinator deployment: ``engine``'s model replicas, scaled by ``scaling`` (``args``, ``kwargs``: the
    rest of ``Coordinator``'s)."""
    from cluster.coordinator import Coordinator

    scaling = dict(scaling)
    if engine["prefix_caching"]:   # several replicas: a prompt goes where its prefix is cached (cluster/routing.py)
        from ray.serve.config import RequestRouterConfig

        scaling["request_router_config"] = RequestRouterConfig(
            request_router_class="cluster.routing.PrefixAffinityRouter")
    deployment = serve.deployment(Coordinator, name=name, ray_actor_options={"num_cpus": 0}, max_ongoing_requests=4096,
                                  health_check_period_s=10, health_check_timeout_s=60,
                                  graceful_shutdown_timeout_s=GRACEFUL_SHUTDOWN_S, **scaling)
    return deployment.bind(engine, *args, **kwargs)


# How long a replica Serve stops (an update, a downscale) lets its requests finish: Serve's default, 20 s, cut
# answers in flight (a GLM-5 reasoning answer often takes longer). A deploy file's ``deployments:`` entry may set it.
GRACEFUL_SHUTDOWN_S = 300

# Requests an ingress replica holds at once (each a stream it relays). Beyond what the engine admits — running
# (max_num_seqs) plus waiting (max_waiting) — so that a full engine answers its own 429 (OpenAI-shaped, Retry-After)
# rather than Serve's proxy queueing requests and then dropping them with a plain-text 503 (the ingress held 256
# before session 18: with the 8×H200 file's 128 + 1024 the 429 was unreachable).
INGRESS_MAX_ONGOING = 4096
