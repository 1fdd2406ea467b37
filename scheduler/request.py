"""Request state: sampling parameters, the status machine and the mutable per-request record."""

from __future__ import annotations

import enum
import json
import math
from dataclasses import dataclass, field

MAX_LOGPROBS = 20
# Temperatures below this sample greedily: logits / T of a tiny T overflows float32 to inf, and the draw turns NaN
# (vLLM's _SAMPLING_EPS).
SAMPLING_EPS = 1e-5


class FinishReason:
    """Why a request stopped (the OpenAI `finish_reason` strings)."""

    STOP = "stop"
    LENGTH = "length"
    ABORT = "abort"
    ERROR = "error"


class RequestStatus(enum.Enum):
    """WAITING -> PREFILLING -> DECODING -> FINISHED | ABORTED | FAILED (preemption: back to WAITING)."""

    WAITING = "waiting"
    PREFILLING = "prefilling"
    DECODING = "decoding"
    FINISHED = "finished"
    ABORTED = "aborted"
    FAILED = "failed"

    @property
    def is_finished(self) -> bool:
        return self in (RequestStatus.FINISHED, RequestStatus.ABORTED, RequestStatus.FAILED)


def _check_int(name: str, value: object) -> None:
    # ValueError, not TypeError: every bad user field reaches the HTTP edge as one error kind (400).
    if not isinstance(value, int) or isinstance(value, bool):
        raise ValueError(f"{name} must be an int, got {value!r}")  # noqa: TRY004


def _check_ids(name: str, ids) -> None:
    """Every one of ``ids`` a token id: an int >= 0."""
    for tok in ids:
        _check_int(name, tok)
        if tok < 0:
            raise ValueError(f"{name} must hold ids >= 0, got {tok}")


def _check_range(name: str, value: float, lo: float, hi: float) -> None:
    if not lo <= value <= hi:
        raise ValueError(f"{name} must be in [{lo}, {hi}], got {value}")


@dataclass(frozen=True)
class SamplingParams:
    """How to sample one request; validated at construction (ValueError names the field)."""

    max_tokens: int = 16
    temperature: float = 1.0  # below SAMPLING_EPS -> greedy
    top_p: float = 1.0
    top_k: int = 0  # 0 = off
    min_p: float = 0.0
    seed: int | None = None
    repetition_penalty: float = 1.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    stop_token_ids: tuple[int, ...] = ()
    stop: tuple[str, ...] = ()  # stop strings: matched by the detokenizer, not the scheduler
    include_stop_str_in_output: bool = False   # vLLM's: the text ends after the stop string that ended it, not before
    # special ids where the front end's parsers split the text into fields (</think>, tool-call markers): no stop string
    # spans one, and the text held back for a stop string's possible start goes out before it
    text_breaks: tuple[int, ...] = ()
    # (open, close): a tool call's markers (the front end parses calls): no stop string applies between them — a
    # call's text is its arguments, not content (a stop string in a file's content would cut the call)
    tool_call_span: tuple[int, ...] = ()
    # parallel_tool_calls false: the output ends at its first call's close (the span's second marker; OpenAI's "at
    # most one call"), which stays in the output for the parser
    single_tool_call: bool = False
    ignore_eos: bool = False
    # vLLM's: the first min_tokens tokens are none of the tokens that would stop the output (and no stop string cuts it
    # before then); the engine fills ``min_tokens_ban`` with those ids (EOS unless ignore_eos, stop_token_ids)
    min_tokens: int = 0
    min_tokens_ban: tuple[int, ...] = ()
    logprobs: int | None = None  # None: none; 0: the chosen token's; n: chosen + top n
    # the prompt's tokens' logprobs, each under the logits of the position before it (None: none; n: + top n there);
    # such a request reuses no cached prefix (its logits are computed)
    prompt_logprobs: int | None = None
    # (token id, bias) pairs added to the logits before sampling (OpenAI's logit_bias; -100 bans, +100 forces)
    logit_bias: tuple[tuple[int, float], ...] = ()
    # vLLM's: the only ids the output may hold (empty: any) — unless none of them is left (a grammar's mask)
    allowed_token_ids: tuple[int, ...] = ()
    # structured output: the JSON schema (its JSON text) the output must match, token by token (cluster/guided.py)
    json_schema: str | None = None
    # structured output by a grammar: ("regex", a pattern) or ("ebnf", a grammar's source) — vLLM's regex, choice and
    # grammar (``cluster/guided.py``'s regex_grammar, choice_grammar, ebnf_grammar)
    grammar: tuple[str, str] | None = None
    # token sequences the output must start with one of (after the reasoning): tool_choice required / named
    forced_paths: tuple[tuple[int, ...], ...] = ()
    # tool calls held to their functions' schemas: the grammar's xgrammar Lark source (cluster/guided.py tool_grammar)
    tool_grammar: str | None = None
    # tokens the output passes, in order, before json_schema / tool_grammar applies (after the reasoning): tool_choice
    # auto's <tool_call>, where the model opens a call of its own accord
    guide_after: tuple[int, ...] = ()
    # the reasoning's tokens before </think> is forced, where the prompt opens it (vLLM's thinking_token_budget)
    thinking_budget: int | None = None
    # the scheduling policy ``priority``'s order: lower first, then by arrival (vLLM's); under fcfs it must be 0
    priority: int = 0
    # vLLM's: requests share cached prefix blocks only with requests of the same salt (None: the unsalted ones), so
    # one tenant cannot tell from its time to first token what another's prompts held
    cache_salt: str | None = None

    def __post_init__(self) -> None:
        # Lists arrive from JSON bodies; store tuples so the params stay hashable and immutable.
        object.__setattr__(self, "stop_token_ids", tuple(self.stop_token_ids))
        object.__setattr__(self, "stop", tuple(self.stop))
        object.__setattr__(self, "text_breaks", tuple(self.text_breaks))
        object.__setattr__(self, "tool_call_span", tuple(self.tool_call_span))
        object.__setattr__(self, "forced_paths", tuple(tuple(p) for p in self.forced_paths))
        object.__setattr__(self, "guide_after", tuple(self.guide_after))
        object.__setattr__(self, "min_tokens_ban", tuple(self.min_tokens_ban))
        object.__setattr__(self, "allowed_token_ids", tuple(sorted(set(self.allowed_token_ids))))
        bias = self.logit_bias.items() if isinstance(self.logit_bias, dict) else self.logit_bias
        object.__setattr__(self, "logit_bias", tuple(sorted((tok, value) for tok, value in bias)))
        _check_int("max_tokens", self.max_tokens)
        if self.single_tool_call and len(self.tool_call_span) != 2:
            raise ValueError("single_tool_call needs tool_call_span (the call's open and close markers)")
        if self.max_tokens < 1:
            raise ValueError(f"max_tokens must be >= 1, got {self.max_tokens}")
        if not (math.isfinite(self.temperature) and self.temperature >= 0):
            raise ValueError(f"temperature must be a finite number >= 0, got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        _check_int("top_k", self.top_k)
        if self.top_k < 0:
            raise ValueError(f"top_k must be >= 0 (0 disables it), got {self.top_k}")
        _check_range("min_p", self.min_p, 0.0, 1.0)
        if self.seed is not None:
            _check_int("seed", self.seed)
        _check_int("priority", self.priority)
        if self.cache_salt is not None and (not isinstance(self.cache_salt, str) or not self.cache_salt):
            raise ValueError(f"cache_salt must be a non-empty string, got {self.cache_salt!r}")
        _check_int("min_tokens", self.min_tokens)
        if not 0 <= self.min_tokens <= self.max_tokens:
            raise ValueError(f"min_tokens must be in [0, max_tokens={self.max_tokens}], got {self.min_tokens}")
        if self.thinking_budget is not None:
            _check_int("thinking_budget", self.thinking_budget)
            if self.thinking_budget < 0:
                raise ValueError(f"thinking_budget must be >= 0, got {self.thinking_budget}")
        if self.repetition_penalty <= 0:
            raise ValueError(f"repetition_penalty must be > 0, got {self.repetition_penalty}")
        _check_range("presence_penalty", self.presence_penalty, -2.0, 2.0)
        _check_range("frequency_penalty", self.frequency_penalty, -2.0, 2.0)
        _check_ids("stop_token_ids", self.stop_token_ids)
        _check_ids("allowed_token_ids", self.allowed_token_ids)
        for s in self.stop:
            if not isinstance(s, str) or not s:
                raise ValueError(f"stop must hold non-empty strings, got {s!r}")
        if self.logprobs is not None:
            _check_int("logprobs", self.logprobs)
            _check_range("logprobs", self.logprobs, 0, MAX_LOGPROBS)
        if self.prompt_logprobs is not None:
            _check_int("prompt_logprobs", self.prompt_logprobs)
            _check_range("prompt_logprobs", self.prompt_logprobs, 0, MAX_LOGPROBS)
        _check_ids("logit_bias", [tok for tok, _ in self.logit_bias])
        for tok, value in self.logit_bias:
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not -100 <= value <= 100:
                raise ValueError(f"logit_bias values must be numbers in [-100, 100], got {value!r} for id {tok}")
        if len({tok for tok, _ in self.logit_bias}) != len(self.logit_bias):
            raise ValueError("logit_bias names an id twice")
        if self.json_schema is not None:
            try:
                json.loads(self.json_schema)
            except (TypeError, ValueError) as e:
                raise ValueError(f"json_schema must be a JSON text: {e}") from None
            if self.ignore_eos:
                raise ValueError("ignore_eos cannot be combined with json_schema: a completed schema ends at EOS")
            if self.forced_paths:
                raise ValueError("forced_paths cannot be combined with json_schema")
        if self.grammar is not None:
            object.__setattr__(self, "grammar", tuple(self.grammar))
            if len(self.grammar) != 2 or self.grammar[0] not in ("regex", "ebnf") or \
                    not isinstance(self.grammar[1], str) or not self.grammar[1]:
                raise ValueError("grammar must be ('regex', a pattern) or ('ebnf', a grammar's source)")
            if self.ignore_eos:
                raise ValueError("ignore_eos cannot be combined with grammar: a completed grammar ends at EOS")
            if self.json_schema is not None or self.forced_paths:
                raise ValueError("grammar cannot be combined with json_schema or forced_paths")
        if self.tool_grammar is not None:
            if not isinstance(self.tool_grammar, str) or not self.tool_grammar:
                raise ValueError("tool_grammar must be a grammar's source text")
            if self.ignore_eos:
                raise ValueError("ignore_eos cannot be combined with tool_grammar: the finished calls end at EOS")
            if self.json_schema is not None or self.grammar is not None or self.forced_paths:
                raise ValueError("tool_grammar cannot be combined with json_schema, grammar or forced_paths")
        if self.guide_after and self.json_schema is None and self.grammar is None and self.tool_grammar is None:
            raise ValueError("guide_after needs json_schema, grammar or tool_grammar")
        _check_ids("guide_after", self.guide_after)
        for path in self.forced_paths:
            if not path:
                raise ValueError("forced_paths must hold non-empty token sequences")
            _check_ids("forced_paths", path)

    @property
    def is_greedy(self) -> bool:
        return self.temperature < SAMPLING_EPS or self.top_k == 1


@dataclass(eq=False)
class Request:
    """Mutable state of one request, owned by the scheduler.

    `num_computed_tokens` counts the tokens of `all_ids` whose KV is in the cache; `block_ids` is the
    block table covering them (its leading blocks may be shared with other requests: a cached prefix).
    Preemption resets both; `output_ids` survive and are recomputed.
    """

    req_id: str
    prompt_ids: list[int]
    params: SamplingParams
    arrival: int  # monotonic counter: FCFS order and preemption victim order (after priority: ``rank``)
    output_ids: list[int] = field(default_factory=list)
    num_computed_tokens: int = 0
    block_ids: list[int] = field(default_factory=list)
    status: RequestStatus = RequestStatus.WAITING
    finish_reason: str | None = None
    error: str | None = None
    num_preemptions: int = 0
    draft_ids: list[int] = field(default_factory=list)  # proposed after the last step; verified next
    # prefix caching: the nodes of the leading blocks cached under this request's tokens (BlockPool.register / match)
    cached_nodes: list[int] = field(default_factory=list)
    num_cached_tokens: int = 0  # prompt tokens whose KV its first prefill found cached (the usage report's)
    hit_blocks: int = 0  # while it waits: its leading blocks cached on its rank when it began to wait there
    kept: list[int] = field(default_factory=list)  # while it waits: the nodes of those blocks it keeps (BlockPool.keep)
    importing: bool = False  # its prompt's KV from another replica is still on its way to its blocks: it waits
    imported: bool = False   # that KV was written by the last step: the next plan finds it here (no rank move)
    imported_tokens: int = 0  # prompt tokens whose KV came from another replica (no prefix-cache hits of this one)

    @property
    def all_ids(self) -> list[int]:
        return self.prompt_ids + self.output_ids

    def ids(self, start: int, end: int) -> list[int]:
        """``all_ids[start:end]`` without building ``all_ids`` (a long context's copy per step)."""
        p = len(self.prompt_ids)
        if start >= p:
            return self.output_ids[start - p:end - p]
        return self.prompt_ids[start:end] + self.output_ids[:max(0, end - p)]

    @property
    def num_tokens(self) -> int:
        return len(self.prompt_ids) + len(self.output_ids)

    @property
    def rank(self) -> tuple[int, int]:
        """The scheduler's order: by priority (lower first; all 0 under FCFS), then by arrival."""
        return self.params.priority, self.arrival

    @property
    def is_finished(self) -> bool:
        return self.status.is_finished
