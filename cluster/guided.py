"""Structured output (``response_format``; vLLM's ``structured_outputs``: a JSON schema, a regex, a choice, an EBNF
grammar): a request's JSON schema or grammar as a grammar over the model's vocabulary.

The engine keeps one ``Guide`` per request whose ``SamplingParams.json_schema`` (or ``grammar``) is set. Before each
step that samples one of its rows it asks the guide for the tokens the grammar allows next — a bitmask, token t at bit
t % 32 of word t // 32 (xgrammar's layout) — and sends it with the step; the worker that samples the row masks the
row's logits (``workers.sampler.allow_only``) before penalties, temperature and top-k / top-p. Every token the engine
commits is fed back (``accept``). The grammar is xgrammar's, compiled once per schema; a completed value allows only
the model's stop tokens, so the output ends there. Special tokens (``<think>``, tool-call markers) are never allowed
inside it.

A prompt that opens the reasoning block (the chat template's generation prompt ends in ``<think>``) is not
constrained until the model closes it (``</think>``): the schema applies to the answer, not to the reasoning. Where
the answer must come (a schema, a forced call: not a call the model may open under ``tool_choice`` auto) the stop
tokens are held back meanwhile (``hold``), so the reasoning cannot end the output before it.
While a guide constrains, its request's drafts ride, each verify row masked with what may follow the drafts before it
(``masks``), so the verified output is what guided plain decoding gives, and a step launched ahead samples only once
the next step brings its masks (they need the token it was fed, on the host); while it waits, drafts stop before the
token that would end the wait (``free_drafts``).
A reasoning budget (``SamplingParams.thinking_budget``, vLLM's ``thinking_token_budget``) is counted while the guide
waits for ``</think>``: once the reasoning has taken its budget the next row allows ``</think>`` alone (``Budget`` where
nothing else guides the request); drafts stop a token short of it, so no verify row past the first needs the mask.
``Prefix`` is the same for an output that must start with one of given token sequences (``tool_choice`` required or
named: the call's marker, a function's name, then its first argument's key or the call's end), dropped once one is out.

Tool calls whose arguments must follow their schemas (a function with ``"strict": true``) are a grammar too:
``tool_grammar`` writes GLM's call format as xgrammar Lark source whose markers are the tokenizer's own special tokens
(matched by id, so no text spells one), a strict function's properties in their order with string values as raw text
and the rest as JSON of the property's schema. Under ``tool_choice`` auto the guide waits for the model to open a
call (``SamplingParams.guide_after``): the text before it stays free.
"""

from __future__ import annotations

import functools
import json
import re
from collections.abc import Sequence

import numpy as np

from cluster.parsers import TOOL_MARKERS

_XGR_PREFIX = re.compile(r"\[\d\d:\d\d:\d\d\]\s*\S+:\d+:\s*")   # "[16:36:59] /project/cpp/....cc:4944: "


def _xgrammar():
    try:
        import xgrammar
    except ImportError as e:                # pragma: no cover - a serve install has it (pyproject's serve extra)
        raise RuntimeError("response_format json_object / json_schema needs the xgrammar package "
                           "(pip install xgrammar)") from e
    return xgrammar


def _built(build, what: str = ""):
    """``build()``, xgrammar's errors raised as a ValueError with its message (its log prefix cut; ``what`` before)."""
    try:
        return build()
    except (RuntimeError, ValueError, TypeError) as e:
        first = _XGR_PREFIX.sub("", str(e)).strip().split("\n")[0]     # not the source excerpt after it
        raise ValueError(what + (first or type(e).__name__)) from None


MAX_ENUM_VALUES = 1000    # a schema's enum values, all its enums together: compiling grows with them (8,000 took 4.4 s
# on the tiny model's 6,144-token vocabulary, 100,000 over 40 s: session 55's review 5; GLM's is 25 times larger)


@functools.lru_cache(maxsize=256)                 # an agent sends the same schema request after request
def check_schema(schema: str) -> None:
    """Raise ValueError naming the problem if ``schema`` (JSON text) is not a JSON schema the grammar supports: one
    xgrammar refuses, one using a keyword it would pass over unheld (``_unheld``), or one whose enums hold more than
    ``MAX_ENUM_VALUES`` values."""
    try:
        parsed = json.loads(schema)
        where, values = _unheld(parsed), _enum_values(parsed)
    except RecursionError:
        raise ValueError("the schema is nested too deeply") from None
    if values > MAX_ENUM_VALUES:
        raise ValueError(f"the schema's enums hold {values} values; at most {MAX_ENUM_VALUES} (its grammar would take "
                         "long to compile)")
    if where is not None:
        raise ValueError(f"{where} cannot be held by the grammar (not, uniqueItems, allOf of several schemas, $refs "
                         "outside the schema, if / then, multipleOf, an empty anyOf / oneOf and required keys missing "
                         "from properties are not supported)")
    _built(lambda: _xgrammar().Grammar.from_json_schema(schema))


# where a schema holds schemas: keyword -> how (one schema, a list of them, a map of names to them)
_SUBSCHEMAS = {**dict.fromkeys(("items", "additionalProperties", "additionalItems", "contains", "propertyNames",
                                "if", "then", "else", "unevaluatedProperties", "unevaluatedItems"), "one"),
               **dict.fromkeys(("anyOf", "oneOf", "allOf", "prefixItems"), "list"),
               **dict.fromkeys(("properties", "patternProperties", "$defs", "definitions", "dependentSchemas",
                                "dependencies"), "map")}


def _enum_values(schema) -> int:
    """How many values the enums of ``schema`` and its subschemas hold together."""
    if not isinstance(schema, dict):
        return 0
    n = len(schema["enum"]) if isinstance(schema.get("enum"), list) else 0
    for key, how in _SUBSCHEMAS.items():
        sub = schema.get(key)
        subs = [sub] if how == "one" else sub if how == "list" and isinstance(sub, list) else \
            list(sub.values()) if how == "map" and isinstance(sub, dict) else []
        n += sum(map(_enum_values, subs))
    return n


def _unheld(schema, path: str = "schema") -> str | None:
    """The path of the first keyword in ``schema`` that xgrammar accepts but does not hold (measured with xgrammar's
    matcher: output breaking it passes), or None: ``not``, ``uniqueItems: true``, ``allOf`` of several schemas, a
    ``$ref`` that is not a ``#`` pointer, ``if`` (then / else), ``multipleOf``, an empty ``anyOf`` / ``oneOf``, a
    ``required`` key not in ``properties`` (session 55's review 5). ``oneOf`` is held as ``anyOf``: a value several
    branches take passes. Enums' and consts' values are data, not walked."""
    if not isinstance(schema, dict):
        return None
    for key in ("not", "if", "multipleOf"):
        if key in schema:
            return f"{path}.{key}"
    for key in ("anyOf", "oneOf"):
        if schema.get(key) == []:
            return f"{path}.{key}"
    props = schema.get("properties") if isinstance(schema.get("properties"), dict) else {}
    if (props or schema.get("type") == "object") and isinstance(schema.get("required"), list) and \
            any(k not in props for k in schema["required"]):        # (an allOf part's keys may be its parent's)
        return f"{path}.required"
    if schema.get("uniqueItems") is True:
        return f"{path}.uniqueItems"
    if isinstance(schema.get("allOf"), list) and len(schema["allOf"]) > 1:
        return f"{path}.allOf"
    if isinstance(schema.get("$ref"), str) and not schema["$ref"].startswith("#"):
        return f"{path}.$ref"
    for key, how in _SUBSCHEMAS.items():
        sub = schema.get(key)
        subs = [(key, sub)] if how == "one" else \
            [(f"{key}.{i}", x) for i, x in enumerate(sub)] if how == "list" and isinstance(sub, list) else \
            [(f"{key}.{k}", x) for k, x in sub.items()] if how == "map" and isinstance(sub, dict) else []
        for name, x in subs:
            if (where := _unheld(x, f"{path}.{name}")) is not None:
                return where
    return None


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


# A grammar goes to the engine as (kind, source), ``SamplingParams.grammar``, and is compiled from that source there:
# xgrammar's printed form of a grammar does not read back (it writes é as \xe9, which its parser reads with every
# hex digit after it).
_HEX_ESCAPE = re.compile(r"(?<!\\)((?:\\\\)*)\\x([0-9a-fA-F]{2})")     # \xHH, not \\xHH


def regex_grammar(pattern: str) -> tuple[str, str]:
    """vLLM's ``regex``: text matching ``pattern`` (xgrammar's regex syntax, as ECMAScript's), checked. Its
    ``\\xHH`` escapes are written ``\\u00HH`` (xgrammar 0.2.9 reads hex digits after ``\\xHH`` into the escape)."""
    if not isinstance(pattern, str) or not pattern:
        raise ValueError("must be a non-empty regular expression")
    pattern = _HEX_ESCAPE.sub(r"\1\\u00\2", pattern)
    _built(lambda: _xgrammar().Grammar.from_regex(pattern))
    return "regex", pattern


def choice_grammar(choices: Sequence[str]) -> tuple[str, str]:
    """vLLM's ``choice``: exactly one of ``choices``, as an EBNF grammar (each a literal of its own UTF-8 text)."""
    if not isinstance(choices, list) or not choices or not all(isinstance(c, str) and c for c in choices):
        raise ValueError("must be a list of non-empty strings")
    if any(0xD800 <= ord(ch) <= 0xDFFF for c in choices for ch in c):
        raise ValueError("must be valid Unicode (a lone surrogate is not)")
    literal = lambda c: '"' + "".join(_EBNF_ESCAPES.get(ch, ch) for ch in c) + '"'     # noqa: E731
    return ebnf_grammar("root ::= " + " | ".join(map(literal, choices)))


_EBNF_ESCAPES = {'"': '\\"', "\\": "\\\\", **{chr(i): f"\\u{i:04x}" for i in range(32)}}


def ebnf_grammar(source: str) -> tuple[str, str]:
    """vLLM's ``grammar``: an EBNF grammar (xgrammar's / GBNF's syntax, its start rule ``root``), checked."""
    if not isinstance(source, str) or not source.strip():
        raise ValueError("must be an EBNF grammar's source")
    _built(lambda: _xgrammar().Grammar.from_ebnf(source))
    return "ebnf", source


MAX_WHITESPACE = 32   # a run of whitespace between a JSON value's tokens (indented output fits; a model stuck on spaces
                      # cannot fill max_tokens with them)
_RAW = r"/[^\x00-\x06]*/"       # a raw value: any text (the markers' stand-ins, \x01-\x06, are not text here)


def tool_grammar(tools: Sequence[dict], ids: dict[str, int], name: str | None = None, parallel: bool = True,
                 opened: bool = False) -> str:
    """xgrammar Lark source for the GLM tool calls an answer makes: ``<tool_call>``, a function's name, its arguments as
    ``<arg_key>`` key ``</arg_key><arg_value>`` value ``</arg_value>``, ``</tool_call>`` (a newline allowed between the
    parts) — one call, or with ``parallel`` one or more. A strict function (``"strict": true``) takes its schema's
    properties in their order, the required ones always; a string-typed value is raw text (as GLM's template writes
    it; an enum or const of strings one of them), any other JSON of the property's schema; another function any keys
    with raw values. ``ids``: the markers' token ids; ``name``: that function only; ``opened``: the first call's
    ``<tool_call>`` is already out (tool_choice auto: the guide starts once the model opens a call)."""
    tok = {m: f"<[{ids[m]}]>" for m in TOOL_MARKERS}
    fns, rules = [], []
    for i, tool in enumerate(tools):
        fn = tool.get("function") if isinstance(tool.get("function"), dict) else {}
        if not isinstance(fn.get("name"), str) or name not in (None, fn["name"]):
            continue
        params = fn.get("parameters") if isinstance(fn.get("parameters"), dict) else {}
        props = params.get("properties") if isinstance(params.get("properties"), dict) else {}
        if fn.get("strict") is True:
            _check_strict(fn["name"], params)
            required = set(params.get("required") or ())
            keys = [*props, *(k for k in params.get("required") or () if k not in props)]
            args = []
            for j, key in enumerate(keys):
                try:
                    value = _value(props.get(key), params)
                except ValueError as e:
                    raise ValueError(f"function {fn['name']!r}, argument {key!r}: {e}") from None
                rules.append(f"a{i}_{j}: NL {tok['<arg_key>']} {json.dumps(key)} {tok['</arg_key>']} NL "
                             f"{tok['<arg_value>']} {value} {tok['</arg_value>']}")
                args.append(f"a{i}_{j}" + ("" if key in required else "?"))
        else:
            rules.append(f"a{i}: NL {tok['<arg_key>']} KEY {tok['</arg_key>']} NL {tok['<arg_value>']} RAW "
                         f"{tok['</arg_value>']}")
            args = [f"a{i}*"]
        fns.append(f"f{i}")
        rules.append(f"f{i}: {json.dumps(fn['name'])} {' '.join(args)} NL")
    if not fns:
        raise ValueError(f"tools hold no function named {name!r}" if name else "tools hold no function")
    call = f"fns {tok['</tool_call>']}"
    more = f"(NL {tok['<tool_call>']} {call})*" if parallel else ""
    start = f"{call} {more} NL" if opened else f"{tok['<tool_call>']} {call} {more} NL"
    return "\n".join([f"start: {start}", f"fns: {' | '.join(fns)}", *rules, r"NL: /\n?/", f"RAW: {_RAW}",
                      r"KEY: /[^\x00-\x06]+/"]) + "\n"


def _allows(words: np.ndarray, t: int) -> bool:
    """Whether mask ``words`` (int32, token t at bit t % 32 of word t // 32) allows token ``t``."""
    return 0 <= t < 32 * len(words) and bool((int(words[t // 32]) >> (t % 32)) & 1)


def _check_strict(name: str, params: dict) -> None:
    """ValueError unless a strict function's parameters list its arguments under top-level ``properties`` (what GLM's
    call format writes, key by key) and its ``$ref``s name its own ``$defs`` / ``definitions``."""
    where = f"function {name!r}"
    if params.get("type", "object") != "object" or not isinstance(params.get("properties", {}), dict):
        raise ValueError(f"{where}: parameters must be an object schema with its arguments under 'properties'")
    if top := sorted({"$ref", "allOf", "anyOf", "oneOf", "not", "if"} & set(params)):
        raise ValueError(f"{where}: parameters must list its arguments under 'properties', not {top}")
    required = params.get("required", [])
    if not isinstance(required, list) or not all(isinstance(k, str) for k in required):
        raise ValueError(f"{where}: parameters.required must be a list of argument names")
    refs = []
    _walk_refs(params, refs)
    if bad := [r for r in refs if not isinstance(r, str) or not r.startswith(("#/$defs/", "#/definitions/"))]:
        raise ValueError(f"{where}: a $ref must name the parameters' own '#/$defs/...' or '#/definitions/...', "
                         f"not {bad[0]!r}")


def _walk_refs(node, out: list) -> None:
    if isinstance(node, dict):
        for k, v in node.items():
            out.append(v) if k == "$ref" else _walk_refs(v, out)
    elif isinstance(node, list):
        for v in node:
            _walk_refs(v, out)


def is_raw_string(schema) -> bool:
    """Whether GLM's template writes a value of ``schema`` raw: a string (or a string or null), or an enum / const of
    strings. The tool parser reads such a value as its text, any other as JSON."""
    if not isinstance(schema, dict):
        return False
    values = [schema["const"]] if "const" in schema else schema.get("enum")
    if isinstance(values, list) and values:
        return any(isinstance(v, str) for v in values) and all(isinstance(v, str) or v is None for v in values)
    t = schema.get("type")
    return t == "string" or (isinstance(t, list) and bool(t) and all(isinstance(x, str) for x in t)
                             and set(t) - {"null"} == {"string"})


def _value(schema, params: dict) -> str:
    """A strict argument's value in the grammar: raw text for a string — one of its enum / const strings, matching its
    ``pattern``, within its ``minLength`` / ``maxLength`` (``format`` is not held) — else JSON of its schema (with the
    parameters' ``$defs`` / ``definitions``). ValueError: a schema the grammar cannot follow."""
    if not isinstance(schema, dict):
        return "RAW"
    if (where := _unheld(schema, "argument")) is not None:
        raise ValueError(f"{where} cannot be held by the grammar")
    if (n := _enum_values(schema)) > MAX_ENUM_VALUES:
        raise ValueError(f"its enums hold {n} values; at most {MAX_ENUM_VALUES} (its grammar would take long to "
                         "compile)")
    if is_raw_string(schema):
        values = [schema["const"]] if "const" in schema else schema.get("enum")
        if values:
            return "(" + " | ".join(json.dumps(v) for v in values if isinstance(v, str)) + ")"
        if "pattern" in schema:
            if "minLength" in schema or "maxLength" in schema:
                raise ValueError("pattern with minLength / maxLength on a string argument is not supported")
            body = _lark_regex(str(schema["pattern"]))
            _built(lambda: _xgrammar().Grammar.from_lark(f"start: /{body}/"), "pattern: ")
            return f"/{body}/"
        lo = schema["minLength"] if schema.get("minLength") is not None else 0      # null: not given
        hi = schema.get("maxLength")
        if any(isinstance(v, bool) or not isinstance(v, int) or not 0 <= v < 2**31 for v in (lo, hi) if v is not None) \
                or (hi is not None and hi < lo):
            raise ValueError(f"minLength / maxLength must be integers in [0, 2**31), minLength <= maxLength: {lo!r}, "
                             f"{hi!r}")
        return "RAW" if lo == 0 and hi is None else f"/[^\\x00-\\x06]{{{lo},{'' if hi is None else hi}}}/"
    sub = json.dumps({**schema, **{k: params[k] for k in ("$defs", "definitions") if k in params}})
    check_schema(sub)
    return f"%json {sub}"


def _lark_regex(pattern: str) -> str:
    """A JSON schema ``pattern`` (a whole-string match: its anchors dropped, an escaped ``\\$`` kept) as the body of
    a Lark ``/.../`` regex (its unescaped slashes escaped)."""
    body = pattern.removeprefix("^")
    if body.endswith("$") and (len(body) - len(body[:-1].rstrip("\\")) - 1) % 2 == 0:
        body = body[:-1]
    return re.sub(r"(?<!\\)((?:\\\\)*)/", r"\1\\/", body)


@functools.lru_cache(maxsize=256)                 # an agent sends the same tools request after request
def check_tool_grammar(source: str) -> None:
    """Raise ValueError naming the problem if ``source`` (``tool_grammar``'s) is not a grammar xgrammar takes."""
    _built(lambda: _xgrammar().Grammar.from_lark(source))


class _Gated:
    """What a request's guide shares: it waits for tokens, in order (``waits``: ``</think>`` when the prompt opens the
    reasoning; then ``SamplingParams.guide_after``), then takes each committed token (``_take``); ``rejected`` counts
    those it did not allow. ``starts_on``: a token that ends every wait and is the guide's own first (a tool call's
    ``<tool_call>``: a call the model opens before closing its reasoning is held too). ``hold``: the mask of its rows
    while it waits (every token but the stop tokens), or None: unmasked. ``budget``: the reasoning tokens it may take
    before ``</think>`` (``think_end``) is the only token allowed — where the prompt opens the reasoning (``thinking``;
    by default: its first wait is ``</think>``); None: no bound. The count ends at ``</think>``, ``starts_on`` or the
    first wait."""

    done = False                                # a guide that constrains nothing more (``Prefix``) may be dropped

    def __init__(self, vocab_size: int, waits: Sequence[int], starts_on: int | None = None,
                 hold: np.ndarray | None = None, budget: int | None = None, think_end: int | None = None,
                 thinking: bool | None = None):
        self.vocab_size, self.waits, self.starts_on, self.hold = vocab_size, list(waits), starts_on, hold
        self.rejected = 0                       # none while its masks apply
        thinking = self.waits[:1] == [think_end] if thinking is None else thinking
        self.left = budget if budget is not None and thinking else None
        self.think_end, self.uncounted = think_end, {think_end, starts_on, *self.waits[:1]} - {None}

    @property
    def _held(self) -> np.ndarray | None:
        """The mask of its next row while it waits: ``</think>`` alone once the budget is spent, else ``hold``."""
        return _bitmask(self.vocab_size, [self.think_end]) if self.left == 0 else self.hold

    @property
    def wait_for(self) -> int | None:
        """The token the guide waits for before it constrains anything; None: it constrains now."""
        return self.waits[0] if self.waits else None

    @property
    def active(self) -> bool:
        """Whether the next token is constrained (its rows need the grammar's masks)."""
        return not self.waits and not self.done

    @property
    def masked(self) -> bool:
        """Whether the next token's rows need masks: the guide's, or ``_held`` while it waits."""
        return self.active or (bool(self.waits) and (self.hold is not None or self.left == 0))

    def free_drafts(self, committed: Sequence[int], drafts: Sequence[int]) -> int:
        """How many of ``drafts`` (proposed after ``committed``, which the guide has not taken yet) may ride: all where
        it constrains (``masks`` gives each verify row its own); while it waits, those before the token that would end
        the wait (the rows after it would need masks of a state the guide is not in yet) — that token may still come
        as the round's last, sampled one."""
        waits, left = list(self.waits), self.left
        for t in committed:
            if waits:
                left = None if t in self.uncounted else left if left is None else left - 1
                waits = [] if t == self.starts_on else waits[1:] if t == waits[0] else waits
        if not waits:                           # it constrains: each verify row gets its mask (``masks``)
            return len(drafts)
        if left is not None:                    # a token short of the budget: only the first row may be forced
            drafts = drafts[:max(0, left - 1)]
        for n, t in enumerate(drafts):
            if t == self.starts_on or (t == waits[0] and len(waits) == 1):
                return n
            if t == waits[0]:
                waits.pop(0)
        return len(drafts)

    def accept(self, ids: Sequence[int]) -> None:
        for t in ids:
            if self.left is not None:
                self.left = None if t in self.uncounted else max(0, self.left - 1)
            if self.waits and t == self.starts_on:
                self.waits.clear()
            if self.waits:
                if t == self.waits[0]:
                    self.waits.pop(0)
            else:
                self._take(t)

    def _take(self, t: int) -> None:
        raise NotImplementedError


class Guide(_Gated):
    """One request's grammar state: the next allowed tokens, and the tokens committed since (``accept``). ``ends``: the
    mask of a grammar that allows nothing next (a client's dead end, ``root ::= "ab" []``): the stop tokens, so the
    output ends there rather than sampling from a row with nothing left."""

    def __init__(self, matcher, vocab_size: int, waits: Sequence[int], starts_on: int | None = None,
                 hold: np.ndarray | None = None, budget: int | None = None, think_end: int | None = None,
                 ends: np.ndarray | None = None, thinking: bool | None = None):
        super().__init__(vocab_size, waits, starts_on, hold, budget, think_end, thinking)
        self.matcher, self.ends = matcher, ends

    def mask(self) -> np.ndarray | None:
        """The allowed next tokens as int32 words [⌈V / 32⌉], or None while unconstrained (inside the reasoning). An
        array, not a tensor: a step crosses to the workers pickled, where a tensor would go as a shared-memory handle
        that a worker behind a socket cannot open."""
        if self.wait_for is not None:
            return self._held
        words = self._next()
        return words if words.any() or self.ends is None else self.ends

    def _next(self) -> np.ndarray:
        words = _xgrammar().allocate_token_bitmask(1, self.vocab_size)
        self.matcher.fill_next_token_bitmask(words)
        return words[0].numpy()

    @property
    def empty(self) -> bool:
        """Whether the grammar allows no token now (at the start: it takes no output at all)."""
        return not self._next().any()

    def masks(self, drafts: Sequence[int] = ()) -> list[np.ndarray | None]:
        """The masks of a verify round's rows: row i's allows what may follow the first i ``drafts``; past a draft the
        grammar does not allow (verification rejects it there and drops the rows after) or the output's end, None. The
        matcher is rolled back: the guide's state is as it was. While it waits, every row's is ``hold`` (the drafts stop
        before the token that would end the wait: ``free_drafts``)."""
        if self.wait_for is not None:
            return [self._held] * (len(drafts) + 1)
        out, taken = [self.mask()], 0
        for d in drafts:
            if out[-1] is None or not _allows(out[-1], d) or not self.matcher.accept_token(d):
                break
            taken += 1
            if self.matcher.is_terminated():
                break
            out.append(self.mask())
        if taken:
            self.matcher.rollback(taken)
        return out + [None] * (len(drafts) + 1 - len(out))

    def _take(self, t: int) -> None:
        if not self.matcher.is_terminated() and not self.matcher.accept_token(t):
            self.rejected += 1


class Prefix(_Gated):
    """An output that must start with one of given token sequences (``SamplingParams.forced_paths``: for
    ``tool_choice`` required or named, the call's marker, a function's name and what may follow it); a token trie, the
    next mask its node's children. Once a sequence is out (or a token left the trie) the output is free again; while
    the reasoning is open it waits, as a ``Guide`` does."""

    def __init__(self, paths: Sequence[Sequence[int]], vocab_size: int, waits: Sequence[int],
                 hold: np.ndarray | None = None, budget: int | None = None, think_end: int | None = None):
        super().__init__(vocab_size, waits, hold=hold, budget=budget, think_end=think_end)
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
        return self._held if self.wait_for is not None else None if self.done else self._mask_of(self.node)

    def masks(self, drafts: Sequence[int] = ()) -> list[np.ndarray | None]:
        """As ``Guide.masks``: the trie walked along the drafts, left where it was."""
        if self.wait_for is not None:
            return [self._held] * (len(drafts) + 1)
        out, node = [self.mask()], self.node
        for d in drafts:
            if out[-1] is None or d not in node:
                break
            node = node[d]
            out.append(self._mask_of(node) if node else None)          # a path out: free from there
        return out + [None] * (len(drafts) + 1 - len(out))

    def _mask_of(self, node: dict) -> np.ndarray:
        return _bitmask(self.vocab_size, node)

    def _take(self, t: int) -> None:
        if not self.done:
            self.rejected += t not in self.node
            self.node = self.node.get(t, {})


class Budget(_Gated):
    """A reasoning budget alone (nothing else guides the request): free but for ``</think>`` forced once the
    reasoning has taken its budget; dropped once the reasoning closes."""

    @property
    def done(self) -> bool:
        return self.wait_for is None

    def mask(self) -> np.ndarray | None:
        return self._held if self.wait_for is not None else None

    def masks(self, drafts: Sequence[int] = ()) -> list[np.ndarray | None]:
        return [self.mask()] * (len(drafts) + 1)

    def _take(self, t: int) -> None:
        pass


def _bitmask(vocab_size: int, tokens: Sequence[int], allowed: bool = True) -> np.ndarray:
    """int32 words [⌈V / 32⌉] allowing ``tokens`` (``allowed``) or every token of the vocabulary but them."""
    words = np.zeros(-(-vocab_size // 32), dtype=np.uint32)
    if not allowed:
        words[:] = np.uint32(0xFFFFFFFF)
        if vocab_size % 32:
            words[-1] = np.uint32((1 << (vocab_size % 32)) - 1)
    for t in tokens:
        bit = np.uint32(1) << np.uint32(t % 32)
        words[t // 32] = words[t // 32] | bit if allowed else words[t // 32] & ~bit
    return words.view(np.int32)


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

    @functools.cached_property
    def _tool_compiler(self):
        """A compiler whose vocabulary holds the tool-call markers too, each as a control character of its own
        (\x01-\x06): ``tool_grammar`` names them by id, its raw text excludes those characters, and JSON never holds
        one unescaped — so a marker is allowed only where the grammar puts it."""
        xgr = _xgrammar()
        self._compiler                          # the vocabulary checks
        marks = self.tokenizer.special_ids_by_token()
        if not all(m in marks for m in TOOL_MARKERS):
            raise ValueError("this tokenizer lacks GLM's tool-call markers")
        vocab = [""] * self.vocab_size
        for token, i in self.tokenizer.vocab().items():
            if i < self.vocab_size and i not in self.tokenizer.special_ids:
                vocab[i] = token
        for n, m in enumerate(TOOL_MARKERS, 1):
            vocab[marks[m]] = chr(n)
        info = xgr.TokenizerInfo(vocab, xgr.VocabType.BYTE_LEVEL, vocab_size=self.vocab_size,
                                 stop_token_ids=self.stop_ids)
        return xgr.GrammarCompiler(info, max_threads=1)

    @functools.lru_cache(maxsize=64)
    def _compiled(self, schema: str):
        # (check_schema: the front end checked it; an engine's own caller may not have)
        return _built(lambda: check_schema(schema) or self._compiler.compile_json_schema(
            schema, max_whitespace_cnt=MAX_WHITESPACE), "json_schema: ")

    @functools.lru_cache(maxsize=64)
    def _compiled_grammar(self, grammar: tuple[str, str]):
        kind, source = grammar
        compile = self._compiler.compile_regex if kind == "regex" else self._compiler.compile_grammar
        return _built(lambda: compile(source), f"{kind}: ")

    @functools.lru_cache(maxsize=64)
    def _compiled_tools(self, source: str):
        # compile_lark, not compile_grammar(Grammar.from_lark(...)): a name's é came out as other text that way
        return _built(lambda: self._tool_compiler.compile_lark(source), "tools: ")

    def _waits(self, prompt_ids: Sequence[int], after: Sequence[int] = ()) -> list[int]:
        """``</think>`` when the prompt opens the reasoning (a guide starts after it), then ``after``."""
        opens = self.think_start is not None and len(prompt_ids) > 0 and prompt_ids[-1] == self.think_start
        return [self.think_end, *after] if opens else list(after)

    @functools.cached_property
    def _ends(self) -> np.ndarray:
        return _bitmask(self.vocab_size, self.stop_ids)

    @functools.cached_property
    def _hold(self) -> np.ndarray:
        return _bitmask(self.vocab_size, self.stop_ids, allowed=False)

    def _hold_for(self, waits: Sequence[int]) -> np.ndarray | None:
        """The stop tokens held back while ``waits`` is only the reasoning's end: the guided answer must come."""
        return self._hold if list(waits) == [self.think_end] else None

    def guide(self, schema: str | None, prompt_ids: Sequence[int], after: Sequence[int] = (),
              budget: int | None = None, grammar: tuple[str, str] | None = None) -> Guide:
        """A guide for a new request held to ``schema`` (a JSON schema's text) or ``grammar`` ((kind, source):
        ``regex_grammar``'s, ``ebnf_grammar``'s); one whose prompt opens the reasoning waits for its end."""
        waits = self._waits(prompt_ids, after)
        compiled = self._compiled(schema) if grammar is None else self._compiled_grammar(grammar)
        guide = Guide(_xgrammar().GrammarMatcher(compiled), self.vocab_size, waits, hold=self._hold_for(waits),
                      budget=budget, think_end=self.think_end, ends=self._ends)
        if guide.empty:
            raise ValueError(f"{grammar[0] if grammar else 'schema'}: it allows no output")
        return guide

    def budget(self, prompt_ids: Sequence[int], budget: int) -> Budget | None:
        """A reasoning budget alone; None where the prompt does not open the reasoning (nothing to count)."""
        waits = self._waits(prompt_ids)
        return Budget(self.vocab_size, waits, budget=budget, think_end=self.think_end) if waits else None

    def tool_guide(self, source: str, prompt_ids: Sequence[int], after: Sequence[int] = (),
                   budget: int | None = None) -> Guide:
        """A guide for a new request's tool calls (``tool_grammar``'s source): after ``after`` (tool_choice auto's
        ``<tool_call>``: wherever the model opens a call, in its reasoning too), else after the reasoning — or from
        a ``<tool_call>`` the model opens before closing it."""
        matcher = _xgrammar().GrammarMatcher(self._compiled_tools(source))
        waits = self._waits(prompt_ids)
        if after:                               # (the budget counts the reasoning the prompt opens, till a call)
            return Guide(matcher, self.vocab_size, after, budget=budget, think_end=self.think_end, ends=self._ends,
                         thinking=bool(waits))
        return Guide(matcher, self.vocab_size, waits, self.tokenizer.special_ids_by_token()["<tool_call>"],
                     self._hold_for(waits), budget, self.think_end, self._ends)

    def prefix(self, paths: Sequence[Sequence[int]], prompt_ids: Sequence[int], budget: int | None = None) -> Prefix:
        """A guide for a new request that must start with one of ``paths`` (after the reasoning, as ``guide``)."""
        waits = self._waits(prompt_ids)
        return Prefix(paths, self.vocab_size, waits, self._hold_for(waits), budget, self.think_end)
