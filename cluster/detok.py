"""Incremental detokenization and stop-string matching for streamed output (pure Python).

``IncrementalDetokenizer`` uses the prefix/read offset method (HF TGI, vLLM): decode a short window of
recent ids twice, without and with the new ids, and emit the difference. Decoding a window instead of
one id at a time keeps tokenizers that strip or merge across ids (SentencePiece's leading space,
byte-level pieces of one UTF-8 char) right, and keeps the cost O(window) per token. While the window
ends in U+FFFD (a multibyte char split across tokens) nothing is emitted and the window grows.
``ByteDetokenizer`` does a byte-level BPE tokenizer's (GLM's) in O(1) a token: each id's bytes through an incremental
UTF-8 decoder — a byte that can never belong to a character is U+FFFD at once, where the window method holds it (and
decodes a growing window every step) to the end. ``TextOf`` is the engine's ``decode``, and picks one of them.
"""

from __future__ import annotations

import codecs
from collections.abc import Callable, Sequence

REPLACEMENT_CHAR = "\ufffd"
# Prompt ids decoded ahead of the first generated id, so context-dependent decoding (a leading space)
# sees the same left context it would in the full text; vLLM uses the same 5.
_PROMPT_CONTEXT_IDS = 5


class IncrementalDetokenizer:
    """Turns generated ids into text deltas that never end in a split multibyte char.

    ``decode`` maps ids to text, e.g. ``lambda ids: tok.decode(ids, skip_special_tokens=True)``.
    ``prompt_ids`` (optional) give left context only; their text is never emitted.
    """

    def __init__(self, decode: Callable[[list[int]], str], prompt_ids: list[int] | None = None) -> None:
        self._decode = decode
        self._ids: list[int] = list(prompt_ids or [])
        self._read_offset = len(self._ids)  # ids before this have been emitted
        self._prefix_offset = max(self._read_offset - _PROMPT_CONTEXT_IDS, 0)  # window start
        self._chunks: list[str] = []

    @property
    def text(self) -> str:
        """All text emitted so far (generated ids only)."""
        return "".join(self._chunks)

    def add(self, token_ids: list[int]) -> str:
        """Append generated ids; return the text that became final (may be empty)."""
        self._ids.extend(token_ids)
        prefix_text, new_text = self._window_texts()
        if len(new_text) <= len(prefix_text) or new_text.endswith(REPLACEMENT_CHAR):
            return ""  # nothing new, or the last char is still incomplete: hold the ids back
        return self._emit(new_text[len(prefix_text):])

    def flush(self) -> str:
        """At finish: emit whatever is held back (a genuinely invalid tail keeps its U+FFFD)."""
        prefix_text, new_text = self._window_texts()
        if len(new_text) <= len(prefix_text):
            return ""
        return self._emit(new_text[len(prefix_text):])

    def _window_texts(self) -> tuple[str, str]:
        """(text of the already-emitted window ids, text of the window plus the held-back ids)."""
        prefix_text = self._decode(self._ids[self._prefix_offset:self._read_offset])
        new_text = self._decode(self._ids[self._prefix_offset:])
        return prefix_text, new_text

    def _emit(self, delta: str) -> str:
        self._prefix_offset = self._read_offset
        self._read_offset = len(self._ids)
        self._chunks.append(delta)
        return delta


class ByteDetokenizer:
    """A byte-level BPE tokenizer's generated ids to text: each id's bytes (``token_bytes``; ``skip``: special ids, no
    text) through one incremental UTF-8 decoder, errors replaced — the text of all ids is ``decode(ids)``'s, and a
    delta holds back only a character still incomplete. No left context: byte-level tokens strip and merge nothing."""

    def __init__(self, token_bytes: Callable[[int], bytes], skip: frozenset[int] = frozenset()) -> None:
        self._bytes, self._skip = token_bytes, skip
        self._utf8 = codecs.getincrementaldecoder("utf-8")("replace")
        self._chunks: list[str] = []

    @property
    def text(self) -> str:
        return "".join(self._chunks)

    def add(self, token_ids: list[int]) -> str:
        delta = "".join(self._utf8.decode(self._bytes(t)) for t in token_ids if t not in self._skip)
        self._chunks.append(delta)
        return delta

    def flush(self) -> str:
        delta = self._utf8.decode(b"", final=True)       # an incomplete character at the end: U+FFFD
        self._chunks.append(delta)
        return delta


class TextOf:
    """The engine's ``decode`` for ``tokenizer``: ids → text, special tokens left out; ``stream`` a request's
    detokenizer — ``ByteDetokenizer`` for a byte-level BPE tokenizer, else the window method over the prompt's last
    ids."""

    def __init__(self, tokenizer) -> None:
        self.tokenizer, self._bytes = tokenizer, {}
        self._skip = frozenset(tokenizer.special_ids)

    def __call__(self, ids: Sequence[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=True)

    def token_bytes(self, t: int) -> bytes:
        if (b := self._bytes.get(t)) is None:
            b = self._bytes[t] = self.tokenizer.token_bytes(t)
        return b

    def stream(self, prompt_ids: Sequence[int]) -> ByteDetokenizer | IncrementalDetokenizer:
        if self.tokenizer.byte_level:
            return ByteDetokenizer(self.token_bytes, self._skip)
        return IncrementalDetokenizer(self, list(prompt_ids))


class StopStringMatcher:
    """Cuts streamed text at the earliest stop string, even one split across deltas.

    Text is released only once it cannot be the start of a stop string; the held-back tail is at most
    ``max(len(stop)) - 1`` chars. With ``keep`` (the stop string stays in the text) nothing is held back: that tail is
    only searched again.
    """

    def __init__(self, stops: Sequence[str], keep: bool = False) -> None:
        if any(not s for s in stops):
            raise ValueError("stop strings must be non-empty")
        self._stops = tuple(stops)
        self._keep = keep                    # the text ends after the stop string (vLLM's include_stop_str_in_output)
        self._max_hold = max((len(s) for s in self._stops), default=1) - 1
        self._held = ""
        self._quiet = 0                      # leading chars of ``_held`` in which no stop string may end
        self.stopped = False
        self.matched: str | None = None      # the stop string that ended the text

    def feed(self, delta: str, armed: bool = True) -> tuple[str, bool]:
        """Returns (text safe to emit now, stopped). On a stop, the text ends just before the stop string (after it, with
        ``keep``). ``armed``
        False: no stop string may end in ``delta`` (an output short of its ``min_tokens``, as vLLM counts: one that
        starts there and ends in a later, armed delta still stops the text)."""
        if self.stopped:
            return "", True
        buf = self._held + delta
        quiet = self._quiet if armed else len(buf)     # leading chars of ``buf`` in which no stop string may end
        hit = self._earliest_stop(buf, quiet) if armed else None
        if hit is not None:
            self._held = ""
            self.stopped = True
            cut, self.matched = hit
            if self._keep:                   # the tail searched again was out already
                return buf[len(buf) - len(delta):cut + len(self.matched)], True
            return buf[:cut], True
        # nothing held back with ``keep``: the text out is the same whether a stop comes or not (the tail is only
        # searched again)
        hold = (min(len(buf), self._max_hold) if self._keep else self._partial_stop_len(buf))
        self._held = buf[len(buf) - hold:] if hold else ""
        self._quiet = max(0, quiet - (len(buf) - hold))  # those chars still at the front of the held tail
        return (delta if self._keep else buf[:len(buf) - hold]), False

    def flush(self) -> str:
        """At finish without a stop: release the held-back tail (with ``keep``, out already)."""
        held, self._held, self._quiet = self._held, "", 0
        return "" if self.stopped or self._keep else held

    def _earliest_stop(self, buf: str, quiet: int = 0) -> tuple[int, str] | None:
        """(index where the first stop string in ``buf`` that ends past its first ``quiet`` chars starts, that string),
        or None."""
        hits = [(i, s) for i, s in ((buf.find(s, max(0, quiet - len(s) + 1)), s) for s in self._stops) if i >= 0]
        return min(hits, key=lambda h: h[0]) if hits else None

    def _partial_stop_len(self, buf: str) -> int:
        """Length of the longest suffix of ``buf`` that is a proper prefix of some stop string."""
        # The longest such suffix starts earliest, so it covers every stop that might still complete.
        for n in range(min(len(buf), self._max_hold), 0, -1):
            tail = buf[-n:]
            if any(s.startswith(tail) for s in self._stops):
                return n
        return 0
