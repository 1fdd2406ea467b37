"""GLM output parsers for one choice of a chat completion: the reasoning split and tool calls, on token ids.

Their markers (``</think>``, ``<tool_call>``, ``<arg_key>`` …) are special tokens that the text omits, and the engine
starts an event at each special token (``Engine._emit``), also when a speculative step commits several tokens at
once: so an event is a marker or not, then tokens of one kind, and a split falls between events. Both parsers
see each event once, in order; the streamed pieces they return add up to what the whole response holds.
"""

from __future__ import annotations

import itertools
import json
import uuid
from dataclasses import dataclass, field

from cluster.detok import IncrementalDetokenizer

TOOL_MARKERS = ("<tool_call>", "</tool_call>", "<arg_key>", "</arg_key>", "<arg_value>", "</arg_value>")


class ReasoningSplit:
    """Text before ``</think>`` is reasoning_content, after it content. A tool call's start (``tool_start``: tool calls
    are parsed) ends the reasoning too — a model that calls a tool before closing its thought (seen in GLM-5.1
    traffic at long context, vLLM #42400) still makes the call. An output that stops (EOS, a stop token or string)
    inside the thought the prompt opened — the model skipped thinking and answered (sglang #37645) — is the answer:
    ``skipped``. Where the prompt opened none (thinking off), an output that opens one itself (``think_start`` its
    first token: a model that thinks though told not to) has it as reasoning too, as vLLM's GLM parser."""

    def __init__(self, think_end: int | None, thinking: bool, tool_start: int | None = None,
                 think_start: int | None = None):
        self.ends = {think_end, tool_start} - {None}
        self.in_reasoning = self.prompt_opened = thinking and think_end is not None
        self.opens = think_start if think_end is not None and not self.in_reasoning else None
        self.text, self.tokens = "", 0          # the reasoning so far

    def takes(self, ev) -> bool:
        """Whether ``ev`` is reasoning (else it is content, as is everything after it)."""
        opened = False                          # (a special token starts an event: the marker, then thought)
        if self.opens is not None and ev.token_ids:     # the output's first token, and only it, may open a thought
            opened = self.in_reasoning = ev.token_ids[0] == self.opens
            self.opens = None
        if self.in_reasoning and not opened and ev.token_ids and ev.token_ids[0] in self.ends:
            self.in_reasoning = False
        if self.in_reasoning:
            self.text, self.tokens = self.text + ev.text, self.tokens + len(ev.token_ids)
        return self.in_reasoning

    def skipped(self, ev) -> bool:
        """Whether the output ended with ``ev`` stopped inside the thought the prompt opened — its text (``text``) is
        the answer; cut by ``max_tokens`` (``length``), or a thought the output opened itself, it stays a thought."""
        return ev.finished and ev.finish_reason == "stop" and self.in_reasoning and self.prompt_opened


def json_or_text(v: str):
    """A value as JSON where it parses as such, else its text. NaN / Infinity (and 1e999, which parses to inf) are
    not JSON: json.dumps would write them back as bare tokens that no client can parse, so such a value stays text."""
    try:
        value = json.loads(v)
        json.dumps(value, allow_nan=False)
        return value
    except ValueError:
        return v


@dataclass
class _Call:
    """The tool call being read: where in it the parser is and what it has read of the current part."""

    index: int
    id: str
    part: str = "name"                 # name / key / value / between (arguments)
    ids: list[int] = field(default_factory=list)      # the name's, a key's or a JSON value's ids so far
    name: str | None = None            # set (and streamed) at its first argument or its end
    key: str | None = None
    string: IncrementalDetokenizer | None = None      # a string value's text, streamed as it comes
    raw: list[int] = field(default_factory=list)      # every id after <tool_call>: the text if it never gets a name
    text: str = ""                     # its arguments as streamed: the whole response's (a repeated key twice too)


class ToolCalls:
    """GLM tool calls: ``<tool_call>name<arg_key>k</arg_key><arg_value>v</arg_value>…</tool_call>`` → OpenAI
    ``tool_calls``. Text outside calls stays content (whitespace that ends the output after a call does not: the
    newline a model writes after its calls). A value is its text where the tool's schema types the argument as a string
    (``strings``: GLM's template writes those raw), else JSON where it parses as such; a value written without its
    ``<arg_value>`` (or a key without its ``</arg_key>``) is read as if the marker were there.

    Streamed, a call's name and id go out at its first argument (or its end), then its arguments as JSON pieces — a
    string value as its text comes — that add up to the whole response's ``arguments``. A call the output's end cuts
    (``max_tokens``) ends there, its last value as far as it got (finish_reason ``length`` says so); cut before its
    name was complete, or ended with no name at all, it is content, as the model wrote it."""

    def __init__(self, ids: dict[str, int] | None, decode, strings: dict[str, set[str]] | None = None):
        self.ids, self.decode, self.strings = ids, decode, strings or {}   # ids None: no parsing, all is content
        self.marker = {v: k for k, v in (ids or {}).items()}
        self.call: _Call | None = None
        self.calls: list[dict] = []
        self.held = ""                   # whitespace after a call: content only if more text follows
        self.spilt = ""                  # a call that ended with no name: content before this event's text

    def feed(self, ev) -> tuple[str, list[dict]]:
        """(content text of this event, its ``tool_calls`` deltas)."""
        if not self.ids:
            return ev.text, []
        ids, text, deltas = list(ev.token_ids), ev.text, []
        marker = self.marker.get(ids[0]) if ids else None       # no ids: text held back before a marker
        if marker == "<tool_call>":
            if self.call is not None:                    # a call left open ends where the next starts
                deltas += self._end()
            self.call = _Call(len(self.calls), f"call_{uuid.uuid4().hex[:24]}")
            ids = ids[1:]
        elif self.call is not None and marker is not None:
            self.call.raw.append(ids[0])
            deltas += self._end() if marker == "</tool_call>" else self._edge(marker)
            ids = ids[1:]
        if self.call is not None:                        # inside a call: its tokens, no content
            self.call.raw += ids
            deltas += self._read(ids)
            text = ""
        if ev.finished and self.call is not None:
            if self.call.name is None:                   # cut before its name was complete: content
                text += self._text([self.ids["<tool_call>"], *self.call.raw])
                self.call = None
            else:
                deltas += self._end()
        text, self.spilt = self.spilt + text, ""
        if self.calls and self.call is None and text:    # the newline a model writes after its calls is no content:
            whole = self.held + text                     # trailing whitespace waits for more text, whatever the
            text = whole.rstrip()                        # tokens' grouping into events (speculative steps)
            self.held = whole[len(text):]
        return text, _merged(deltas)

    def _edge(self, marker: str) -> list[dict]:
        c, out = self.call, []
        if c.part == "name" and not self._named(out):
            return out
        if c.part == "value" and marker != "</arg_value>":     # a value left open ends at the next marker
            out += self._value()
        if marker == "<arg_value>" and c.part == "key":         # ... and a key left open at its value
            c.key = self.decode(c.ids).strip()
        if marker != "<arg_value>":
            out += self._unmarked()
        if marker == "<arg_key>":
            c.part, c.ids, c.key = "key", [], None
        elif marker == "</arg_key>" and c.part == "key":
            c.key, c.part, c.ids = self.decode(c.ids).strip(), "between", []
        elif marker == "<arg_value>" and c.key is not None:
            out += self._open_value()
        elif marker == "</arg_value>" and c.part == "value":
            out += self._value()
        return out

    def _open_value(self) -> list[dict]:
        """The value of the key read starts: its JSON up to the value."""
        c = self.call
        c.part, c.ids = "value", []
        c.string = IncrementalDetokenizer(self.decode) if c.key in self.strings.get(c.name, ()) else None
        return self._args(("{" if not c.text else ", ") + json.dumps(c.key, ensure_ascii=False) + ": "
                          + ('"' if c.string else ""))

    def _unmarked(self) -> list[dict]:
        """Text after a key's ``</arg_key>`` that no ``<arg_value>`` opened (a model skips it, vLLM #49248): its value,
        at the marker after it — blank, there was none."""
        c = self.call
        if c.part != "between" or c.key is None or not self.decode(c.ids).strip():
            return []
        ids, out = c.ids, self._open_value()
        if c.string is not None:
            out += self._args(_escaped(c.string.add(ids)))
        else:
            c.ids = ids
        return out + self._value()

    def _read(self, ids: list[int]) -> list[dict]:
        c = self.call
        if c.part == "value" and c.string is not None:
            return self._args(_escaped(c.string.add(ids)))
        if c.part != "between" or c.key is not None:      # (between: a value with no <arg_value>, maybe)
            c.ids += ids
        return []

    def _value(self) -> list[dict]:
        """The value read ends: the rest of its JSON."""
        c = self.call
        if c.string is not None:
            piece = _escaped(c.string.flush()) + '"'
        else:
            piece = json.dumps(json_or_text(self.decode(c.ids)), ensure_ascii=False)
        c.part, c.key, c.string = "between", None, None
        return self._args(piece)

    def _named(self, out: list[dict]) -> bool:
        """The name is read: its delta goes out — or, with no name, the call was none: its text is content."""
        c = self.call
        c.name, c.part = self.decode(c.ids).strip(), "between"
        if not c.name:
            self.spilt += self._text([self.ids["<tool_call>"], *c.raw])
            self.call = None
            return False
        out.append({"index": c.index, "id": c.id, "type": "function", "function": {"name": c.name, "arguments": ""}})
        return True

    def _end(self) -> list[dict]:
        """The open call ends (its close, the next call's start, or the output's end)."""
        c, out = self.call, []
        if c.part == "name" and not self._named(out):
            return out
        if c.part == "value":
            out += self._value()
        out += self._unmarked() + self._args("}" if c.text else "{}")
        self.calls.append({"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.text}})
        self.call = None
        return out

    def _args(self, piece: str) -> list[dict]:
        self.call.text += piece
        return [{"index": self.call.index, "function": {"arguments": piece}}] if piece else []

    def _text(self, ids: list[int]) -> str:
        # decode() skips special tokens, the markers among them: put those back, leave an EOS out
        return "".join("".join(self.marker[t] for t in run) if is_marker else self.decode(list(run))
                       for is_marker, run in itertools.groupby(ids, self.marker.__contains__))


def _escaped(text: str) -> str:
    """``text`` inside a JSON string (escaping is per character, so escaped pieces join to the escaped whole)."""
    return json.dumps(text, ensure_ascii=False)[1:-1]


def _merged(deltas: list[dict]) -> list[dict]:
    """One delta per call: a call's argument pieces joined into its first delta of the event."""
    out: list[dict] = []
    for d in deltas:
        if out and out[-1]["index"] == d["index"] and set(d) == {"index", "function"}:
            out[-1]["function"]["arguments"] += d["function"]["arguments"]
        else:
            out.append(d)
    return out
