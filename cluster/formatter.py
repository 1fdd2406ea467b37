"""OpenAI bodies and SSE chunks from a request's token events (``cluster/serve.py``'s ingress): completions' and chat
choices — text, reasoning and tool calls split by the parsers, logprobs (a completion's echoed prompt with its tokens'
logprobs first; vLLM's ``prompt_logprobs``), usage."""

import codecs
import json
import time
from dataclasses import replace
from typing import Any, AsyncIterator

from cluster.parsers import ReasoningSplit, ToolCalls
from cluster.protocol import ApiError


class Formatter:
    """Turns token events into OpenAI completion / chat bodies and SSE chunks."""

    def __init__(self, ingress, rid: str, chat: bool, prompts: list[list[int]], logprobs: int | None,
                 thinking: bool = False, n: int = 1, tool_ids: dict[str, int] | None = None,
                 echoes: list[str] | None = None, string_args: dict[str, set[str]] | None = None,
                 echo_only: bool = False, prompt_top: int | None = None, token_ids_as_names: bool = False,
                 continuous_usage: bool = False, return_ids: bool = False, reasoning_parser: bool = False):
        self.ing, self.rid, self.chat, self.logprobs, self.n = ingress, rid, chat, logprobs, n
        self.prompts = prompts                      # choice c answers prompts[c // n]
        self.num_prompt = sum(map(len, prompts))
        # completions' echo: each prompt's text before its choices' text (with logprobs, its tokens' logprobs first)
        self.echo = [e for e in echoes or [""] * len(prompts) for _ in range(n)]
        self.echo_logprobs = echoes is not None and logprobs is not None and not chat
        self.prompt_top = prompt_top                # vLLM's prompt_logprobs: each choice's (a chat's: the answer's)
        self.echo_only = echo_only                  # max_tokens 0: the one token sampled is no part of the answer
        self.as_ids = token_ids_as_names            # vLLM's return_tokens_as_token_ids: logprobs name "token_id:<id>"
        self.continuous_usage = continuous_usage    # vLLM's continuous_usage_stats: each chunk its choice's usage
        self.return_ids = return_ids                # vLLM's return_token_ids: the prompt's and the output's token ids
        self.text_len = [len(e) for e in self.echo]  # characters of each choice's text so far (text_offset)
        self.decoded = list(self.text_len)          # … and of its tokens' bytes decoded so far (where the next starts)
        self.utf8 = [codecs.getincrementaldecoder("utf-8")("replace") for _ in self.echo]
        choices = len(prompts) * n
        tool_start = tool_ids["<tool_call>"] if tool_ids else None
        opens = ingress.think_start if reasoning_parser else None   # thinking off, an output may open a thought
        self.reasoning = [ReasoningSplit(ingress.think_end, thinking, tool_start, opens) for _ in range(choices)]
        decode = (lambda ids: ingress.tokenizer.decode(ids)) if ingress.tokenizer else str
        self.tools = [ToolCalls(tool_ids, decode, string_args) for _ in range(choices)]
        self.created = int(time.time())
        self.cached = [0] * len(prompts)            # each prompt's tokens found cached (by its first choice)
        self.reasoning_tokens = 0                   # output tokens the reasoning parser gave to reasoning_content
        self.fingerprint = ""
        self.object = "chat.completion" if chat else "text_completion"
        self._names: dict[int, str] = {}
        self._completion_names: dict[int, str] = {}

    def _tok(self, tid: int) -> str:
        """A token's text, decoded once a response (a long prompt's logprobs name each id many times)."""
        if (text := self._names.get(tid)) is None:
            tok = self.ing.tokenizer
            text = self._names[tid] = tok.decode([tid], skip_special_tokens=False) if tok else str(tid)
        return text

    def _name(self, tid: int) -> str:
        """How logprobs name a token: its text, or with ``as_ids`` "token_id:<id>"; a completion's token that holds
        part of a UTF-8 character by its bytes, OpenAI's "bytes:\\xe4\\xb8" (its text, U+FFFD, would merge distinct
        tokens in a ``top_logprobs`` dict)."""
        if self.as_ids:
            return f"token_id:{tid}"
        if self.chat or self.ing.tokenizer is None:
            return self._tok(tid)
        if (name := self._completion_names.get(tid)) is None:
            raw = self.ing.tokenizer.token_bytes(tid)
            try:
                raw.decode("utf-8")
                name = self._tok(tid)
            except UnicodeDecodeError:
                name = "bytes:" + "".join(f"\\x{b:02x}" for b in raw)
            self._completion_names[tid] = name
        return name

    def _bytes(self, tid: int) -> list[int]:
        tok = self.ing.tokenizer
        return list(tok.token_bytes(tid) if tok else str(tid).encode())

    def _logprobs(self, ev, choice: int) -> Any:
        self.text_len[choice] += len(ev.text)
        if self.logprobs is None:
            return None
        if self.chat:
            return {"content": [{"token": self._name(t), "logprob": lp.logprob, "bytes": self._bytes(t),
                                 "top_logprobs": [{"token": self._name(i), "logprob": v, "bytes": self._bytes(i)}
                                                  for i, v in lp.top]}
                                for t, lp in zip(ev.token_ids, ev.logprobs)]}
        # Each token starts where its bytes start in the text: the tokens before it decoded (a token inside a UTF-8
        # character adds it once it completes; a special token adds nothing), within the text a finished choice kept
        # (a stop string cut what follows).
        specials, tok = self.ing.tokenizer.special_ids if self.ing.tokenizer else (), self.ing.tokenizer
        offsets, end = [], self.text_len[choice] if ev.finished else None
        for t in ev.token_ids:
            offsets.append(self.decoded[choice] if end is None else min(self.decoded[choice], end))
            if tok is not None and t not in specials:
                self.decoded[choice] += len(self.utf8[choice].decode(tok.token_bytes(t)))
        out = self._token_logprobs(ev.token_ids, ev.logprobs, offsets)
        if ev.prompt_logprobs is not None and self.echo_logprobs:   # the prompt's tokens first, the first's null
            ids = self.prompts[choice // self.n]
            offsets = self._prompt_offsets(ids, self.echo[choice])
            prompt = self._token_logprobs(ids, [None, *ev.prompt_logprobs], offsets)
            out = {k: prompt[k] + out[k] for k in out}
        return out

    def _token_logprobs(self, ids: list[int], lps: list, offsets: list[int]) -> dict:
        """A completion's logprobs of tokens ``ids`` (a None logprob: the prompt's first token's) at ``offsets``; each
        token's top ``logprobs`` with the token itself among them (OpenAI's: up to logprobs + 1)."""
        def top(t: int, lp) -> dict[str, float]:
            out: dict[str, float] = {}
            for i, v in lp.top[:self.logprobs]:       # (best first: two tokens of one name keep the better's)
                out.setdefault(self._name(i), v)
            out[self._name(t)] = lp.logprob
            return out

        return {"tokens": [self._name(t) for t in ids], "token_logprobs": [lp.logprob if lp else None for lp in lps],
                "top_logprobs": [top(t, lp) if lp else None for t, lp in zip(ids, lps)], "text_offset": offsets}

    def _vllm_prompt_logprobs(self, choice: int, lps: list) -> list[dict | None]:
        """vLLM's ``prompt_logprobs``: per prompt token (the first: null), {id: {logprob, rank, decoded_token}} for the
        token itself and the ``prompt_top`` most likely there (ranked 1..n)."""
        out: list[dict | None] = [None]
        for t, lp in zip(self.prompts[choice // self.n][1:], lps):
            row = {str(t): {"logprob": lp.logprob, "rank": lp.rank, "decoded_token": self._tok(t)}}
            for r, (i, v) in enumerate(lp.top[:self.prompt_top]):
                row.setdefault(str(i), {"logprob": v, "rank": r + 1, "decoded_token": self._tok(i)})
            out.append(row)
        return out

    def _prompt_offsets(self, ids: list[int], text: str) -> list[int]:
        """Where each prompt token starts in its echoed ``text``: the tokens' bytes decoded in order (a token that ends
        inside a UTF-8 character adds the character once it completes); a special token the text leaves out (ids are
        echoed without them) adds nothing."""
        tok = self.ing.tokenizer
        if tok is None:
            return [0] * len(ids)
        specials = set(tok.special_ids_by_token().values())
        decoder = codecs.getincrementaldecoder("utf-8")("replace")
        out, at = [], 0
        for t in ids:
            out.append(min(at, len(text)))
            piece = decoder.decode(tok.token_bytes(t))
            at += len(piece) if t not in specials or text.startswith(piece, at) else 0
        return out

    def _error(self, ev) -> None:
        if ev.error:
            raise self._api_error(ev)

    def _api_error(self, ev) -> ApiError:
        """An event's error: 503 when the server ended the request on shutting down, else 500."""
        return ApiError(503 if getattr(self.ing, "closing", False) else 500, ev.error, None, "server_error")

    async def whole(self, merged, n: int) -> dict:
        texts, thoughts, reasons, lps, completion = list(self.echo), [""] * n, [None] * n, [[] for _ in range(n)], 0
        stops: list[str | None] = [None] * n
        prompt_lps: list = [[] for _ in range(n)]
        ids: list[list[int]] = [[] for _ in range(n)]
        async for i, ev in merged:
            self._error(ev)
            ev = self._shown(ev)
            ids[i] += ev.token_ids
            prompt_lps[i] = ev.prompt_logprobs if ev.prompt_logprobs is not None else prompt_lps[i]
            self.fingerprint = ev.served_by
            self._count_cached(i, ev)
            if self.reasoning[i].takes(ev):
                thoughts[i] += ev.text
                self.reasoning_tokens += len(ev.token_ids)
            else:
                texts[i] += self.tools[i].feed(ev)[0]
            completion += len(ev.token_ids)
            lps[i].append(self._logprobs(ev, i))
            if ev.finished:
                reasons[i], stops[i] = ev.finish_reason, ev.stop_str
                if self.reasoning[i].skipped(ev):          # no thought: the answer
                    texts[i], thoughts[i] = texts[i] + thoughts[i], ""
                    self.reasoning_tokens -= self.reasoning[i].tokens
        choices = []
        for i in range(n):
            lp = join_logprobs(lps[i], self.chat) if self.logprobs is not None else None
            if self.chat:
                msg = {"role": "assistant", "content": texts[i]}
                if thoughts[i]:
                    msg["reasoning_content"] = thoughts[i]
                if self.tools[i].calls:
                    msg["tool_calls"] = self.tools[i].calls
                    msg["content"] = texts[i] or None
                    reasons[i] = "tool_calls" if reasons[i] == "stop" else reasons[i]
                choices.append({"index": i, "message": msg, "logprobs": lp, "finish_reason": reasons[i],
                                "stop_reason": stops[i]})
            else:
                choices.append({"index": i, "text": texts[i], "logprobs": lp, "finish_reason": reasons[i],
                                "stop_reason": stops[i]})
                if self.prompt_top is not None:
                    choices[-1]["prompt_logprobs"] = self._vllm_prompt_logprobs(i, prompt_lps[i])
            if self.return_ids:                         # vLLM's return_token_ids (a chat's prompt: beside its choices)
                choices[-1]["token_ids"] = ids[i]
                if not self.chat:
                    choices[-1]["prompt_token_ids"] = self.prompts[i // self.n]
        body = {"id": self.rid, "object": self.object, "created": self.created, "model": self.ing.model_name,
                "system_fingerprint": self.fingerprint, "choices": choices, "usage": self._usage(completion)}
        if self.chat and self.prompt_top is not None:       # vLLM's: the chat's one prompt, beside its choices
            body["prompt_logprobs"] = self._vllm_prompt_logprobs(0, prompt_lps[0])
        if self.chat and self.return_ids:
            body["prompt_token_ids"] = self.prompts[0]
        return body

    def _shown(self, ev):
        """``ev`` as the answer shows it: with max_tokens 0 (echo alone) the token sampled is no part of it."""
        return replace(ev, token_ids=[], text="", logprobs=[]) if self.echo_only else ev

    def _count_cached(self, choice: int, ev) -> None:
        if choice % self.n == 0:   # a prompt's n choices share it (the later ones find the first's blocks cached)
            self.cached[choice // self.n] = max(self.cached[choice // self.n], ev.num_cached_tokens)

    def _usage(self, completion: int) -> dict:
        return {"prompt_tokens": self.num_prompt, "completion_tokens": completion,
                "total_tokens": self.num_prompt + completion,
                "prompt_tokens_details": {"cached_tokens": sum(self.cached)},
                "completion_tokens_details": {"reasoning_tokens": self.reasoning_tokens}}

    def _choice_usage(self, choice: int, completion: int) -> dict:
        """vLLM's continuous usage: a chunk's choice's prompt and its tokens so far."""
        prompt = len(self.prompts[choice // self.n])
        return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}

    def _chunk(self, choices: list, usage: dict | None = None) -> dict:
        body = {"id": self.rid, "object": self.object + ".chunk" if self.chat else self.object,
                "created": self.created, "model": self.ing.model_name, "system_fingerprint": self.fingerprint,
                "choices": choices}
        if usage is not None:
            body["usage"] = usage
        return body

    async def chunks(self, merged) -> AsyncIterator[dict]:
        """The stream's chunks: each event's choice delta, then one with no choices and the usage — or, at an error,
        its body, last."""
        completion, started, each = 0, set(), [0] * len(self.echo)     # each: a choice's tokens so far
        unsent, sent = [[] for _ in self.echo], set()   # return_token_ids: a choice's ids no chunk carried yet
        async for i, ev in merged:
            if ev.error:
                yield ErrorChunk(self._api_error(ev))
                return                  # the error ends the stream: no usage after it
            ev = self._shown(ev)
            completion += len(ev.token_ids)
            each[i] += len(ev.token_ids)
            unsent[i] += ev.token_ids
            self.fingerprint = ev.served_by
            self._count_cached(i, ev)
            if self.chat:
                thought = self.reasoning[i].takes(ev)
                self.reasoning_tokens += len(ev.token_ids) if thought else 0
                text, calls = ("", []) if thought else self.tools[i].feed(ev)
                role = {} if i in started else {"role": "assistant"}
                started.add(i)
                if calls and text:      # a tool call's chunk holds no content (a client reads it as a call, not text):
                    yield self._chunk([{"index": i, "delta": {**role, "tool_calls": calls}, "logprobs": None,
                                        "finish_reason": None}])         # the call's end, then the text after it
                    role, calls = {}, []
                delta = {"reasoning_content": ev.text} if thought else {"content": text} if text or not calls else {}
                if calls:
                    delta["tool_calls"] = calls
                if ev.finished and self.tools[i].calls and ev.finish_reason == "stop":
                    ev.finish_reason = "tool_calls"
                skipped = ev.finished and self.reasoning[i].skipped(ev)
                if skipped:                     # no thought: the answer, once more as content
                    delta["content"] = self.reasoning[i].text
                    self.reasoning_tokens -= self.reasoning[i].tokens
                delta.update(role)
                choice = {"index": i, "delta": delta, "logprobs": self._logprobs(ev, i),
                          "finish_reason": ev.finish_reason if ev.finished else None}
                if skipped:                     # (for the Messages and Responses answers: not sent in a chat's)
                    choice["reasoning_skipped"] = True
            else:
                text = ev.text if i in started else self.echo[i] + ev.text
                started.add(i)
                choice = {"index": i, "text": text, "logprobs": self._logprobs(ev, i),
                          "finish_reason": ev.finish_reason if ev.finished else None}
            if ev.finished:             # vLLM's field: the stop string that ended the choice, if one did
                choice["stop_reason"] = ev.stop_str
            if ev.finished or choice["logprobs"] is not None or (any(choice["delta"].values()) if self.chat else
                                                                 text or ev.token_ids):
                # (a chat's tokens that say nothing yet — a call's name — wait)
                chunk = self._chunk([choice], self._choice_usage(i, each[i]) if self.continuous_usage else None)
                if self.return_ids:             # vLLM's: the ids since the last chunk; the prompt's in the first
                    choice["token_ids"], unsent[i] = unsent[i], []
                    if (0 if self.chat else i) not in sent:
                        (chunk if self.chat else choice)["prompt_token_ids"] = self.prompts[i // self.n]
                        sent.add(0 if self.chat else i)
                yield chunk
        yield self._chunk([], self._usage(completion))

    async def sse(self, merged, include_usage: bool) -> AsyncIterator[str]:
        try:
            async for chunk in self.chunks(merged):
                for choice in chunk.get("choices", ()):     # (an error's body has none)
                    choice.pop("reasoning_skipped", None)
                if include_usage or chunk.get("choices", True):
                    yield f"data: {json.dumps(chunk, ensure_ascii=False)}\n\n"
            yield "data: [DONE]\n\n"
        finally:
            await merged.aclose()


class ErrorChunk(dict):
    """A stream's last chunk when it failed: the error's body, as the chat sends it, and its HTTP ``status`` (503: the
    server ended it on shutting down), which the Messages and Responses streams answer by."""

    def __init__(self, error: ApiError) -> None:
        super().__init__(error.body())
        self.status = error.status


def join_logprobs(parts: list, chat: bool) -> dict:
    if chat:
        return {"content": [c for p in parts for c in p["content"]]}
    out = {"tokens": [], "token_logprobs": [], "top_logprobs": [], "text_offset": []}
    for p in parts:
        for k in out:
            out[k] += p[k]
    return out
