"""The engine's tokenizer: HF ``tokenizer.json`` + the chat template, without transformers.

Renders chat templates the way ``transformers`` does (sandboxed Jinja with
``trim_blocks``/``lstrip_blocks``, ``loopcontrols``, a JSON ``tojson`` filter and
``raise_exception``), so prompts match ``AutoTokenizer.apply_chat_template``.
"""

from __future__ import annotations

import copy
import json
import logging
import re
import secrets
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

import jinja2
import jinja2.ext
from jinja2.sandbox import ImmutableSandboxedEnvironment, safe_range
from tokenizers import Tokenizer as HFTokenizer
from tokenizers import decoders

# Names a message's reasoning may arrive under; the template reads `reasoning_content`.
_REASONING_FIELDS = ("reasoning_content", "thinking", "reasoning")


class _TemplateError(ValueError):
    """A chat template called raise_exception: the caller's messages are invalid."""


def _raise_exception(message: str) -> None:
    raise _TemplateError(message)


def _tojson(
    value: Any,
    ensure_ascii: bool = False,
    indent: int | None = None,
    separators: tuple[str, str] | None = None,
    sort_keys: bool = False,
) -> str:
    # Jinja's own tojson HTML-escapes; templates expect plain JSON.
    return json.dumps(
        value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys
    )


# One request's chat-template renders (``chat_pieces`` renders twice) stop with an error past this many seconds: a
# template whose work grows with the square of the messages (GLM-5.x's orders a turn's tool results by call id) must
# not hold a tokenizer thread for minutes on a huge history. Ordinary conversations render in milliseconds.
RENDER_SECONDS = 20.0


class _Render(threading.local):
    deadline = float("inf")     # this thread's render stops past this time.monotonic()


_render = _Render()


class RenderTimeout(ValueError):
    """A chat template's render ran past ``RENDER_SECONDS``."""


class _render_budget:
    """Times the renders inside it against one deadline (an inner one keeps the outer's)."""

    def __enter__(self):
        self.outer = _render.deadline
        _render.deadline = min(self.outer, time.monotonic() + RENDER_SECONDS)

    def __exit__(self, *exc):
        _render.deadline = self.outer


def _tick(now=time.monotonic, render=_render) -> None:
    """One step of a render (an attribute, an item, a call, 256 numbers of a range), past its deadline: an error."""
    if now() > render.deadline:
        raise RenderTimeout(f"the chat template took over {RENDER_SECONDS:g} s to render these messages; send a "
                            f"shorter conversation")


class _TimedSandbox(ImmutableSandboxedEnvironment):
    """transformers' sandbox, with a clock: the template's attribute and item reads, calls and ranges count towards
    the render's deadline (``_render_budget``)."""

    def getattr(self, obj: Any, attribute: str) -> Any:
        _tick()
        return ImmutableSandboxedEnvironment.getattr(self, obj, attribute)

    def getitem(self, obj: Any, argument: Any) -> Any:
        _tick()
        return ImmutableSandboxedEnvironment.getitem(self, obj, argument)

    def call(__self, __context, __obj, *args, **kwargs):  # noqa: N805 — jinja2's own signature
        _tick()
        return ImmutableSandboxedEnvironment.call(__self, __context, __obj, *args, **kwargs)


def _timed_range(*args: int) -> Iterator[int]:
    for i in safe_range(*args):
        if i & 255 == 0:
            _tick()
        yield i


def _compile(template: str) -> jinja2.Template:
    env = _TimedSandbox(trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols])
    env.globals["range"] = _timed_range
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
    return env.from_string(template)


def _byte_level_alphabet() -> dict[str, int]:
    """GPT-2's byte-level vocabulary alphabet, inverted: the character that stands for each byte → the byte."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    others = [b for b in range(256) if b not in printable]
    return {chr(b): b for b in printable} | {chr(256 + i): b for i, b in enumerate(others)}


_BYTE_OF = _byte_level_alphabet()
_log = logging.getLogger(__name__)


def _token_content(token: str | dict | None) -> str | None:
    # tokenizer_config.json stores special tokens as strings or AddedToken dicts.
    return token.get("content") if isinstance(token, dict) else token


def _text_holders(messages: list[dict], prefill: bool) -> list[list[tuple[dict, str]]]:
    """Where each text of the messages stands, a list a text: (the message, "content") or its text parts' (part,
    "text"), and an assistant's reasoning (the fields ``_REASONING_FIELDS`` name). A final assistant message the model
    continues (``prefill``) is the client writing the model's turn, markers and all: it holds none."""
    out = []
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or prefill and i == len(messages) - 1 and m.get("role") == "assistant":
            continue
        parts = m.get("content") or ()
        out.append([(m, "content")] if isinstance(parts, str) else
                   [(p, "text") for p in parts if isinstance(p, dict) and isinstance(p.get("text"), str)])
        if m.get("role") == "assistant":
            out += [[(m, k)] for k in _REASONING_FIELDS if isinstance(m.get(k), str)]
    return out


def _caller_texts(messages: list[dict], special: Callable[[str], Any], prefill: bool) -> list[tuple[dict, str]]:
    """The message texts ``chat_pieces`` encodes apart: every text of a message whose text, its parts joined as the
    template joins them, holds a special token's text (a token split over two parts is one too)."""
    return [h for holders in _text_holders(messages, prefill) if special("".join(p[k] for p, k in holders))
            for h in holders]


def _call_functions(messages: list[dict], prefill: bool) -> list[dict]:
    """The ``function`` of each tool call in the assistant's earlier turns: their arguments are the model's text."""
    last = len(messages) - 1
    return [c["function"] for i, m in enumerate(messages)
            if isinstance(m, dict) and m.get("role") == "assistant" and not (prefill and i == last)
            for c in m.get("tool_calls") or () if isinstance(c, dict) and isinstance(c.get("function"), dict)]


def _strings(value: Any) -> Iterator[str]:
    """Every string in ``value`` (tool definitions: JSON-like), keys and values."""
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for k, v in value.items():
            yield from _strings(k)
            yield from _strings(v)
    elif isinstance(value, list | tuple):
        for v in value:
            yield from _strings(v)


def _marked(value: Any, special: Callable[[str], Any], mark: Callable[[str], str]) -> Any:
    """``value`` (JSON-like) with each string, key or value, that ``special`` finds text in replaced by ``mark(it)``."""
    if isinstance(value, str):
        return mark(value) if special(value) else value
    if isinstance(value, dict):
        return {_marked(k, special, mark): _marked(v, special, mark) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_marked(v, special, mark) for v in value]
    return value


def _free_mark(prompt: str) -> str:
    """A string ``prompt`` holds neither as is nor as JSON's ``\\u`` escapes: a private-use character where one is
    free, else eight drawn at random (a prompt cannot hold them all)."""
    escaped = {int(h, 16) for h in re.findall(r"\\u([0-9a-fA-F]{4})", prompt)}
    used = set(prompt)
    free = next((chr(c) for c in range(0xE000, 0xF900) if chr(c) not in used and c not in escaped), None)
    while free is None:
        m = "".join(chr(0xE000 + secrets.randbelow(0x1900)) for _ in range(8))
        free = m if m not in prompt and json.dumps(m)[1:-1] not in prompt else None
    return free


def _text_forms(text: str) -> tuple[str, ...]:
    """How a template may write a caller's text: as is, or inside a JSON string (``tojson``, ASCII or not)."""
    return tuple(dict.fromkeys((text, json.dumps(text, ensure_ascii=False)[1:-1], json.dumps(text)[1:-1])))


def _locate(prompt: str, pieces: list[str], texts: list[str]) -> list[tuple[str, bool]] | None:
    """``prompt`` cut as ``pieces`` (the marked rendering split at its marks: template text, a text's number,
    template text, …) say, each text in one of its forms (``_text_forms``), or None where the prompt is not so made.
    The forms a text may take are followed side by side (a text's own form can be a prefix of its JSON form)."""
    paths: dict[int, tuple] = {0: ()}          # where in the prompt -> the pieces that reach there, as a chain
    for i, piece in enumerate(pieces):
        if i % 2 == 0:
            forms = (piece,)
        else:                                   # (a number no text has: the template wrote a mark of its own)
            forms = _text_forms(texts[int(piece)]) if int(piece) < len(texts) else ()
        reach: dict[int, tuple] = {}
        for at, chain in paths.items():
            for form in forms:
                if prompt.startswith(form, at):
                    reach.setdefault(at + len(form), (chain, form, bool(i % 2)))
        if not reach or len(reach) > 64:
            return None
        paths = reach
    chain, out = paths.get(len(prompt)), []
    while chain:
        chain, form, caller = chain
        out.append((form, caller))
    return [p for p in reversed(out) if p[0]] if out else None


def _check_content(content: Any, index: int) -> None:
    if content is None or isinstance(content, str):
        return
    if not isinstance(content, list):  # user input, so ValueError (-> HTTP 400), not TypeError
        raise ValueError(  # noqa: TRY004
            f"message {index}: content must be a string or a list of parts, got {type(content).__name__}"
        )
    for part in content:
        kind = part.get("type") if isinstance(part, dict) else type(part).__name__
        if kind != "text":
            raise ValueError(f"message {index}: {kind} content parts are not supported (only text)")


class Tokenizer:
    """Byte-level BPE encode/decode plus GLM chat-template rendering for one model directory."""

    def __init__(self, hf: HFTokenizer, config: dict[str, Any]) -> None:
        self._hf = hf
        self.vocab_size: int = hf.get_vocab_size(with_added_tokens=True)
        self.special_tokens: dict[str, str | None] = {
            name: _token_content(config.get(name))
            for name in ("bos_token", "eos_token", "pad_token", "unk_token")
        }
        added = hf.get_added_tokens_decoder()
        self.special_ids: frozenset[int] = frozenset(i for i, tok in added.items() if tok.special)
        eos = self.special_tokens["eos_token"]
        if eos is None:
            raise ValueError("tokenizer_config.json has no eos_token")
        stop_names = [eos, *config.get("stop_tokens", [])]
        self.eos_token_ids: tuple[int, ...] = tuple(
            dict.fromkeys(self._single_id(name) for name in stop_names)
        )
        self.chat_template: str | None = config.get("chat_template")
        self._template = _compile(self.chat_template) if self.chat_template else None
        self._added_ids = frozenset(added)
        self._byte_level = isinstance(hf.decoder, decoders.ByteLevel)
        specials = sorted((t.content for t in added.values() if t.special), key=len, reverse=True)
        self._special_text = re.compile("|".join(map(re.escape, specials)) or "(?!)")
        self._as_text: HFTokenizer | None = None    # encodes special tokens' text as text (``encode_pieces``)

    @classmethod
    def from_dir(cls, path: str | Path, chat_template: str | None = None) -> Tokenizer:
        """The tokenizer of a model folder; ``chat_template`` (a template's text) replaces the folder's."""
        path = Path(path)
        for name in ("tokenizer.json", "tokenizer_config.json"):
            if not (path / name).is_file():
                raise FileNotFoundError(f"{path / name} not found: a model directory needs {name}")
        config = json.loads((path / "tokenizer_config.json").read_text(encoding="utf-8"))
        if (path / "chat_template.jinja").is_file():     # transformers' own file wins over the config's copy
            config["chat_template"] = (path / "chat_template.jinja").read_text(encoding="utf-8")
        if chat_template is not None:
            config["chat_template"] = chat_template
        return cls(HFTokenizer.from_file(str(path / "tokenizer.json")), config)

    @property
    def byte_level(self) -> bool:
        """Whether tokens are byte-level BPE strings (GPT-2's byte alphabet: "Ġ" for a space)."""
        return self._byte_level

    def vocab(self) -> dict[str, int]:
        """Token string (as the vocabulary writes it) → id, added tokens included."""
        return self._hf.get_vocab(with_added_tokens=True)

    def special_ids_by_token(self) -> dict[str, int]:
        """Special token text → id (e.g. "</think>" for the reasoning split)."""
        return {tok.content: i for i, tok in self._hf.get_added_tokens_decoder().items() if tok.special}

    def _single_id(self, token: str) -> int:
        token_id = self._hf.token_to_id(token)
        if token_id is None:
            raise ValueError(f"token {token!r} named in tokenizer_config.json is not in the vocabulary")
        return token_id

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        # encode_batch releases the GIL while it works and encode holds it: the HTTP ingress tokenizes in a thread,
        # and a long prompt must not stall its event loop (same ids, same cost).
        return self._hf.encode_batch([text], add_special_tokens=add_special_tokens)[0].ids

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        return self._hf.decode(list(ids), skip_special_tokens=skip_special_tokens)

    def token_bytes(self, token_id: int) -> bytes:
        """The token's own bytes (logprobs' ``bytes``): a byte-level token may hold part of a UTF-8 character,
        which ``decode`` would turn into U+FFFD."""
        token = self._hf.id_to_token(token_id)
        if token is None or token_id in self._added_ids or not self._byte_level:
            return self.decode([token_id], skip_special_tokens=False).encode()
        return bytes(_BYTE_OF[c] for c in token)

    def apply_chat_template(
        self, messages: list[dict], add_generation_prompt: bool = True, **kwargs: Any
    ) -> str:
        """Render `messages` to the prompt string; extra kwargs (tools, enable_thinking) reach the template."""
        if self._template is None:
            raise ValueError("the model has no chat template (neither chat_template.jinja nor tokenizer_config.json's "
                             "chat_template): send prompts to /v1/completions")
        chat = []
        for i, message in enumerate(messages):
            if not isinstance(message, dict) or "role" not in message:
                raise ValueError(f"message {i} must be a dict with a 'role', got {message!r}")
            _check_content(message.get("content"), i)
            reasoning = next((message[k] for k in _REASONING_FIELDS if message.get(k) is not None), None)
            if reasoning is not None:
                message = {"thinking": reasoning, **message, "reasoning_content": reasoning}
            chat.append(message)
        context = {**{k: v for k, v in self.special_tokens.items() if v is not None}, **kwargs}
        context.setdefault("tools", None)
        context.setdefault("documents", None)
        try:
            with _render_budget():
                return self._template.render(messages=chat, add_generation_prompt=add_generation_prompt, **context)
        except (jinja2.TemplateError, TypeError) as e:
            # The template walks the caller's data: a field of the wrong type (tool arguments as a list, a tool
            # name as a number) fails inside it, which is bad input, not a server fault.
            raise ValueError(f"the chat template cannot render these messages: {e}") from e

    def chat_pieces(self, messages: list[dict], add_generation_prompt: bool = True,
                    **kwargs: Any) -> list[tuple[str, bool]]:
        """The rendered prompt as (text, is_caller_text) pieces: the text a message holds (a user's, a tool's, and the
        assistant's earlier content, reasoning and call arguments — the model wrote those as plain tokens), and each
        string of the tool definitions (a description an MCP server wrote, say), is a piece of its own where it holds a
        special token's text (``<|assistant|>``, ``<tool_call>`` …), so that it is encoded as the text it is
        (``encode_pieces``) — a pasted file, a tool's output or its description cannot forge a turn or a marker, and a
        file the model wrote replays as it wrote it. Found by rendering again with a mark in each such text's place (a
        string the prompt does not hold, around the text's number); the template may write a text as is or inside a
        JSON string. A final assistant message the model continues (no generation prompt) stays as the template writes
        it. Where the template does not write such a text in one of those forms (it trims it, sorts keys by it …), the
        text cannot be told apart: the prompt is one piece, as before, and a warning says so. Both renders share one
        deadline (``RENDER_SECONDS``)."""
        with _render_budget():
            return self._chat_pieces(messages, add_generation_prompt, **kwargs)

    def _chat_pieces(self, messages: list[dict], add_generation_prompt: bool, **kwargs: Any) -> list[tuple[str, bool]]:
        prompt = self.apply_chat_template(messages, add_generation_prompt, **kwargs)
        special = self._special_text.search
        tools, prefill = kwargs.get("tools"), not add_generation_prompt
        if not _caller_texts(messages, special, prefill) and not any(
                special(t) for t in _strings([tools, [f.get("arguments") for f in _call_functions(messages, prefill)]])):
            return [(prompt, False)]
        mark, numbers = _free_mark(prompt), {}
        marking = lambda text: f"{mark}{numbers.setdefault(text, len(numbers))}{mark}"   # equal texts, one number
        marked = copy.deepcopy(messages)
        for h, key in _caller_texts(marked, special, prefill):
            h[key] = marking(h[key])
        for fn in _call_functions(marked, prefill):
            fn["arguments"] = _marked(fn.get("arguments"), special, marking)
        if tools:
            kwargs = {**kwargs, "tools": _marked(tools, special, marking)}
        at = f"(?:{re.escape(mark)}|{re.escape(json.dumps(mark)[1:-1])})"
        pieces = re.split(f"{at}([0-9]+){at}", self.apply_chat_template(marked, add_generation_prompt, **kwargs))
        located = _locate(prompt, pieces, list(numbers))
        if located is None:
            _log.warning("the chat template does not write a caller's text as given: special tokens' text in it is "
                         "encoded as those tokens")
            return [(prompt, False)]
        return located

    def encode_pieces(self, pieces: list[tuple[str, bool]]) -> list[int]:
        """``chat_pieces``'s ids: message text with its special tokens' text as plain text, the template's as its
        tokens."""
        if self._as_text is None:
            as_text = HFTokenizer.from_str(self._hf.to_str())
            as_text.encode_special_tokens = True
            self._as_text = as_text
        out: list[int] = []
        for text, literal in pieces:
            hf = self._as_text if literal else self._hf
            out += hf.encode_batch([text], add_special_tokens=False)[0].ids
        return out

    def encode_chat(self, messages: list[dict], **kwargs: Any) -> list[int]:
        # The template writes [gMASK]<sop> itself, so no special tokens are added here.
        return self.encode_pieces(self.chat_pieces(messages, **kwargs))
