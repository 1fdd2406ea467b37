"""A request's output as the engine hands it out: ``TokenEvent`` (new tokens, the text they finalised, how the request
ended) and ``OutputStream``, the per-request state that turns committed tokens into that text (detokenizer, stop
strings, the prompt's logprobs until they go out)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from cluster.detok import IncrementalDetokenizer, StopStringMatcher, TextOf
from scheduler.request import Request, SamplingParams
from scheduler.scheduler import AdmissionError
from workers.runner import TokenLogprobs


@dataclass
class TokenEvent:
    """New output of one request: tokens, the text they finalised, and how it ended (if it did)."""

    req_id: str
    token_ids: list[int]
    text: str
    finished: bool = False
    finish_reason: str | None = None
    error: str | None = None
    logprobs: list[TokenLogprobs] = field(default_factory=list)
    # SamplingParams.prompt_logprobs: the prompt's tokens after the first, on the request's first event
    prompt_logprobs: list[TokenLogprobs] | None = None
    num_prompt_tokens: int = 0
    num_output_tokens: int = 0
    num_cached_tokens: int = 0           # prompt tokens whose KV was found cached (prefix caching)
    served_by: str = ""                  # the coordinator replica (set at the Serve edge)
    refused: AdmissionError | None = None   # refused after admission, before any output (``Engine._displaceable``)
    # vLLM's ``stop_reason``: the stop string that ended it, or the stop_token_ids id (not EOS)
    stop_str: str | int | None = None
    kv: Any = None                       # the prompt's ``KVBundle``, on an ``export_kv`` request's final event


@dataclass
class OutputStream:
    prompt_len: int
    detok: IncrementalDetokenizer | None
    stops: StopStringMatcher
    breaks: frozenset[int] = frozenset()   # SamplingParams.text_breaks
    stop_ids: frozenset[int] = frozenset()  # SamplingParams.stop_token_ids
    keep_stop: bool = False                # SamplingParams.include_stop_str_in_output
    num_output: int = 0
    request: Request | None = None         # the scheduler's record (its prompt's cached tokens)
    admitted: int = 0                      # the engine's admission order (ranks number their arrivals apart)
    prompt_lps: list[TokenLogprobs] | None = None   # SamplingParams.prompt_logprobs' so far (None: not asked, or sent)
    min_tokens: int = 0                    # SamplingParams.min_tokens: no stop string cuts the output before them
    call_span: tuple[int, ...] = ()        # SamplingParams.tool_call_span
    in_call: bool = False                  # between its markers: no stop string applies

    def event(self, req_id: str, finished: bool = False, reason: str | None = None,
              error: str | None = None) -> TokenEvent:
        """An event of this request with no tokens yet, carrying its counts."""
        return TokenEvent(req_id, [], "", finished, reason, error, num_prompt_tokens=self.prompt_len,
                          num_output_tokens=self.num_output,
                          num_cached_tokens=self.request.num_cached_tokens if self.request else 0)

    def add_prompt_logprobs(self, first: int, lps: list[TokenLogprobs]) -> None:
        """A prompt chunk's logprobs, of the tokens from position ``first`` on: those not held yet (a preempted request
        computes its prompt again)."""
        if self.prompt_lps is not None:
            assert first <= len(self.prompt_lps) + 1, "a prompt chunk's logprobs came before the chunk ahead of it"
            self.prompt_lps += lps[len(self.prompt_lps) + 1 - first:]

    @classmethod
    def open(cls, prompt_ids: Sequence[int], params: SamplingParams, decode, eos: Sequence[int] = (),
             **kw) -> OutputStream:
        """A request's stream: its detokenizer over ``decode`` (None: token ids only; a ``TextOf`` picks its own), its
        stop strings and ids (an EOS id among them is EOS: no stop_reason, as vLLM's)."""
        stop_ids = set(params.stop_token_ids) - (set() if params.ignore_eos else set(eos))
        detok = None if decode is None else decode.stream(prompt_ids) if isinstance(decode, TextOf) else \
            IncrementalDetokenizer(decode, list(prompt_ids))
        return cls(len(prompt_ids), detok,
                   StopStringMatcher(params.stop, params.include_stop_str_in_output), frozenset(params.text_breaks),
                   frozenset(stop_ids), params.include_stop_str_in_output,
                   prompt_lps=None if params.prompt_logprobs is None else [], min_tokens=params.min_tokens,
                   call_span=params.tool_call_span, **kw)

    def text(self, ids: Sequence[int], last: bool, held: bool = False, stop_token: bool = False) -> tuple[str, bool]:
        """(the text that ``ids`` finalise, whether a stop string ended it); ``last``: the request's final ids — the
        text held back (a split character, a stop string's possible start) goes out with them. ``held``: a grammar
        chose ``ids`` (structured output): stop strings do not apply — the grammar says where the output ends. Nor
        does one end in the text of the output's first ``min_tokens`` tokens (vLLM's count), nor inside a tool call
        (``call_span``). ``stop_token``: the last id is the EOS or stop token id that ended the output: its text is no
        part of it (vLLM's), unless ``keep_stop``."""
        armed = self.num_output + len(ids) > self.min_tokens
        for t in ids if self.call_span else ():
            self.in_call = t == self.call_span[0] or (self.in_call and t != self.call_span[1])
        held = held or self.in_call
        text = self.detok.add(list(ids[:-1] if stop_token and not self.keep_stop else ids)) if self.detok else ""
        if last and self.detok:
            text += self.detok.flush()
        if held:
            return self.stops.flush() + text, False
        text, stopped = self.stops.feed(text, armed=armed)
        if last and not stopped:
            text += self.stops.flush()
        return text, stopped
