"""Structured output (``response_format``): a request's JSON schema as a grammar over the model's vocabulary.

The engine keeps one ``Guide`` per request whose ``SamplingParams.json_schema`` is set. Before each step that samples
one of its rows it asks the guide for the tokens the grammar allows next — a bitmask, token t at bit t % 32 of word
t // 32 (xgrammar's layout) — and sends it with the step; the worker that samples the row masks the row's logits
(``workers.sampler.allow_only``) before penalties, temperature and top-k / top-p. Every token the engine commits is fed
back (``accept``). The grammar is xgrammar's, compiled once per schema; a completed value allows only the model's
stop tokens, so the output ends there. Special tokens (``<think>``, tool-call markers) are never allowed inside it.

A prompt that opens the reasoning block (the chat template's generation prompt ends in ``<think>``) is not
constrained until the model closes it (``</think>``): the schema applies to the answer, not to the reasoning.
Guided rows take no speculative drafts and no look-ahead (the next mask needs this step's token on the host).
``Prefix`` is the same for an output that must start with one of given token sequences (``tool_choice`` required or
named: the call's marker, a function's name, then its first argument's key or the call's end), dropped once one is out.
"""

from __future__ import annotations

import functools
import json
import re
from collections.abc import Sequence

import numpy as np

_XGR_PREFIX = re.compile(r"^\[[^\]]*\]\s*\S+:\d+:\s*")      # "[16:36:59] /project/cpp/....cc:4944: "


def _xgrammar():
    try:
        import xgrammar
    except ImportError as e:                # pragma: no cover - a serve install has it (pyproject's serve extra)
        raise RuntimeError("response_format json_object / json_schema needs the xgrammar package "
                           "(pip install xgrammar)") from e
    return xgrammar


@functools.lru_cache(maxsize=256)                 # an agent sends the same schema request after request
def check_schema(schema: str) -> None:
    """Raise ValueError naming the problem if ``schema`` (JSON text) is not a JSON schema the grammar supports."""
    xgr = _xgrammar()
    try:
        xgr.Grammar.from_json_schema(schema)
    except (RuntimeError, ValueError, TypeError) as e:
        raise ValueError(_XGR_PREFIX.sub("", str(e)).strip() or type(e).__name__) from None


def schema_of(response_format: dict | None) -> str | None:
    """The JSON text of the schema an OpenAI ``response_format`` asks for: None for ``text`` (or none), ``{"type":
    "object"}`` for ``json_object``, ``json_schema.schema`` for ``json_schema``. ValueError names what is wrong."""
    if not response_format:
        return None
    kind = response_format.get("type")
    if kind == "text":
        return None
    if kind == "json_object":
        return '{"type": "object"}'
    if kind == "json_schema":
        spec = response_format.get("json_schema")
        if not isinstance(spec, dict) or not isinstance(spec.get("schema"), dict):
            raise ValueError("response_format.json_schema.schema must be a JSON schema object")
        schema = json.dumps(spec["schema"])
        check_schema(schema)
        return schema
    raise ValueError(f"response_format.type must be 'text', 'json_object' or 'json_schema', not {kind!r}")


class _Gated:
    """What a request's guide shares: it waits for the end of the reasoning (``wait_for``: ``</think>`` when the prompt
    opens it), then takes each committed token (``_take``); ``rejected`` counts those it did not allow."""

    done = False                                # a guide that constrains nothing more (``Prefix``) may be dropped

    def __init__(self, vocab_size: int, wait_for: int | None):
        self.vocab_size, self.wait_for = vocab_size, wait_for
        self.rejected = 0                       # none while its masks apply

    def accept(self, ids: Sequence[int]) -> None:
        for t in ids:
            if self.wait_for is not None:
                if t == self.wait_for:
                    self.wait_for = None
            else:
                self._take(t)

    def _take(self, t: int) -> None:
        raise NotImplementedError


class Guide(_Gated):
    """One request's grammar state: the next allowed tokens, and the tokens committed since (``accept``)."""

    def __init__(self, matcher, vocab_size: int, wait_for: int | None):
        super().__init__(vocab_size, wait_for)
        self.matcher = matcher

    def mask(self) -> np.ndarray | None:
        """The allowed next tokens as int32 words [⌈V / 32⌉], or None while unconstrained (inside the reasoning). An
        array, not a tensor: a step crosses to the workers pickled, where a tensor would go as a shared-memory handle
        that a worker behind a socket cannot open."""
        if self.wait_for is not None:
            return None
        words = _xgrammar().allocate_token_bitmask(1, self.vocab_size)
        self.matcher.fill_next_token_bitmask(words)
        return words[0].numpy()

    def _take(self, t: int) -> None:
        if not self.matcher.is_terminated() and not self.matcher.accept_token(t):
            self.rejected += 1


class Prefix(_Gated):
    """An output that must start with one of given token sequences (``SamplingParams.forced_paths``: for
    ``tool_choice`` required or named, the call's marker, a function's name and what may follow it); a token trie, the
    next mask its node's children. Once a sequence is out (or a token left the trie) the output is free again; while
    the reasoning is open it waits, as a ``Guide`` does."""

    def __init__(self, paths: Sequence[Sequence[int]], vocab_size: int, wait_for: int | None):
        super().__init__(vocab_size, wait_for)
        self.trie: dict = {}
        for path in paths:
            node = self.trie
            for t in path:
                node = node.setdefault(t, {})
        self.node = self.trie

    @property
    def done(self) -> bool:
        return self.wait_for is None and not self.node

    def mask(self) -> np.ndarray | None:
        if self.wait_for is not None or self.done:
            return None
        words = np.zeros(-(-self.vocab_size // 32), dtype=np.uint32)
        for t in self.node:
            words[t // 32] |= np.uint32(1) << np.uint32(t % 32)
        return words.view(np.int32)

    def _take(self, t: int) -> None:
        if not self.done:
            self.rejected += t not in self.node
            self.node = self.node.get(t, {})


class Guides:
    """Builds each request's ``Guide`` over one tokenizer: the vocabulary's byte-level strings (special tokens made
    empty, so the grammar never allows them), the model's vocabulary size (logits' width) and its stop tokens."""

    def __init__(self, tokenizer, vocab_size: int, stop_ids: Sequence[int]):
        self.tokenizer, self.vocab_size, self.stop_ids = tokenizer, vocab_size, list(stop_ids)
        marks = tokenizer.special_ids_by_token()
        self.think_start, self.think_end = marks.get("<think>"), marks.get("</think>")

    @functools.cached_property
    def _compiler(self):
        xgr = _xgrammar()
        if not self.tokenizer.byte_level:       # GLM's vocabularies are; another one's strings would be misread
            raise ValueError("structured output needs a byte-level BPE vocabulary; this tokenizer's is not")
        vocab = [""] * self.vocab_size
        for token, i in self.tokenizer.vocab().items():
            if i < self.vocab_size and i not in self.tokenizer.special_ids:
                vocab[i] = token
        info = xgr.TokenizerInfo(vocab, xgr.VocabType.BYTE_LEVEL, vocab_size=self.vocab_size,
                                 stop_token_ids=self.stop_ids)
        return xgr.GrammarCompiler(info, max_threads=1)

    @functools.lru_cache(maxsize=64)
    def _compiled(self, schema: str):
        try:
            return self._compiler.compile_json_schema(schema)
        except (RuntimeError, ValueError) as e:
            raise ValueError(f"json_schema: {_XGR_PREFIX.sub('', str(e)).strip()}") from None

    def _wait_for(self, prompt_ids: Sequence[int]) -> int | None:
        """``</think>`` when the prompt opens the reasoning (a guide starts after it), else None."""
        opens = self.think_start is not None and len(prompt_ids) > 0 and prompt_ids[-1] == self.think_start
        return self.think_end if opens else None

    def guide(self, schema: str, prompt_ids: Sequence[int]) -> Guide:
        """A guide for a new request held to ``schema``; one whose prompt opens the reasoning waits for its end."""
        return Guide(_xgrammar().GrammarMatcher(self._compiled(schema)), self.vocab_size, self._wait_for(prompt_ids))

    def prefix(self, paths: Sequence[Sequence[int]], prompt_ids: Sequence[int]) -> Prefix:
        """A guide for a new request that must start with one of ``paths`` (after the reasoning, as ``guide``)."""
        return Prefix(paths, self.vocab_size, self._wait_for(prompt_ids))
