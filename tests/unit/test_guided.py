"""Structured output's pieces: the mask's bit layout on the logits, a guide's grammar over the embedded tokenizer."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from cluster.config import DEFAULT_MODEL
from workers.sampler import allow_only

pytest.importorskip("xgrammar", reason="xgrammar is not installed (it is in the 'serve' and 'test' extras)")


def test_allow_only_reads_token_t_at_bit_t_mod_32_of_word_t_div_32():
    logits = torch.randn(3, 70)
    words = torch.zeros(3, dtype=torch.int32)              # ⌈70 / 32⌉ words
    for t in (0, 31, 32, 69):
        words[t // 32] |= torch.tensor(1 << (t % 32)).to(torch.int32)    # bit 31: a negative int32
    out = allow_only(logits, [None, words, None])
    assert torch.equal(out[0], logits[0]) and torch.equal(out[2], logits[2])
    assert torch.isfinite(out[1]).nonzero().flatten().tolist() == [0, 31, 32, 69]
    assert torch.equal(out[1, [0, 31, 32, 69]], logits[1, [0, 31, 32, 69]])
    assert torch.isfinite(logits).all()                    # a copy: the step's logits are left as they were
    assert allow_only(logits, [None, None, None]) is logits


@pytest.fixture(scope="module")
def tok():
    from cluster.local import load_tokenizer

    return load_tokenizer(DEFAULT_MODEL)


@pytest.fixture(scope="module")
def guides(tok):
    from cluster.guided import Guides

    return Guides(tok, 6144, tok.eos_token_ids)


def allowed(guide) -> set[int]:
    words = guide.mask()
    return set(allow_only(torch.zeros(1, 6144), [words]).isfinite().nonzero()[:, 1].tolist())


SCHEMA = '{"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}'


def test_a_guide_allows_the_schema_then_only_stop_tokens(tok, guides):
    g = guides.guide(SCHEMA, tok.encode("hi"))
    first = allowed(g)
    assert first and all(tok.decode([t], skip_special_tokens=False).lstrip().startswith("{") or
                         not tok.decode([t], skip_special_tokens=False).strip() for t in first)
    assert tok.encode("{")[0] in first and tok.encode("[")[0] not in first
    g.accept(tok.encode('{"a": '))
    assert tok.encode('"')[0] not in allowed(g)            # an integer, not a string
    g.accept(tok.encode("12}"))
    assert allowed(g) == set(tok.eos_token_ids) and g.rejected == 0


def test_special_tokens_never_ride_inside_the_value(tok, guides):
    g = guides.guide('{"type": "object"}', tok.encode("hi"))
    g.accept(tok.encode('{"x": "'))                        # inside a string: text only
    inside = allowed(g)
    assert len(inside) > 1000 and not inside & set(tok.special_ids)


def test_a_prompt_opening_the_reasoning_is_free_until_it_closes(tok, guides):
    """The reasoning is free but for the stop tokens, held back until it closes (the answer must come); its verify
    rows alike."""
    marks = tok.special_ids_by_token()
    g = guides.guide(SCHEMA, [*tok.encode("hi"), marks["<think>"]])
    assert allowed(g) == set(range(6144)) - set(tok.eos_token_ids) and g.masked and not g.active
    assert [(m == g.mask()).all() for m in g.masks([5, 6])] == [True] * 3
    g.accept([*tok.encode("let me think [1, 2"), marks["</think>"]])
    assert g.rejected == 0 and tok.encode("{")[0] in allowed(g) and tok.encode("[")[0] not in allowed(g)
    closed = guides.guide(SCHEMA, [*tok.encode("hi"), marks["</think>"]])      # thinking off: constrained at once
    assert closed.mask() is not None


def test_a_schema_the_grammar_cannot_follow_is_a_value_error(guides, tok):
    from cluster.guided import check_schema

    with pytest.raises(ValueError, match='Unsupported type "objectx"'):
        check_schema('{"type": "objectx"}')
    with pytest.raises(ValueError, match="json_schema"):
        guides.guide('{"type": "objectx"}', tok.encode("hi"))


@pytest.mark.parametrize("schema,where", [
    ({"type": "integer", "not": {"const": 1}}, "schema.not"),
    ({"type": "object", "properties": {"a": {"type": "array", "items": {"type": "integer"}, "uniqueItems": True}}},
     "schema.properties.a.uniqueItems"),
    ({"allOf": [{"type": "integer"}, {"minimum": 5}]}, "schema.allOf"),
    ({"anyOf": [{"type": "string"}, {"$ref": "https://example.com/s.json"}]}, "schema.anyOf.1.$ref"),
    ({"type": "object", "$defs": {"q": {"not": {}}}, "properties": {"a": {"$ref": "#/$defs/q"}}}, "schema.$defs.q.not"),
    ({"type": "object", "required": ["id"]}, "schema.required"),                # (session 55's review 5: these too)
    ({"type": "object", "properties": {"k": {"const": "a"}}, "if": {"properties": {"k": {"const": "a"}}},
      "then": {"required": ["x"]}}, "schema.if"),
    ({"type": "number", "multipleOf": 0.25}, "schema.multipleOf"),
    ({"type": "object", "properties": {"a": {"anyOf": []}}}, "schema.properties.a.anyOf"),
])
def test_a_keyword_the_grammar_would_pass_over_is_refused_naming_it(schema, where):
    """Keywords xgrammar accepts without holding them (output that breaks them passed its matcher, session 44) are
    refused, not ignored; a property or a const named like one is no keyword."""
    import json

    from cluster.guided import check_schema

    with pytest.raises(ValueError) as e:
        check_schema(json.dumps(schema))
    assert str(e.value).startswith(where + " cannot be held"), e.value
    check_schema(json.dumps({"type": "object", "properties": {"not": {"type": "integer"}, "b": {"const": {"not": 1}}},
                             "allOf": [{"required": ["not"]}], "$defs": {"q": {"uniqueItems": False}}}))



def test_enums_past_their_bound_are_refused_before_they_compile(marks):
    """A schema's enums (all of them together) or a strict argument's past ``MAX_ENUM_VALUES`` values: a ValueError (a
    400) at the edge — compiling one took seconds to minutes (session 55's review 5)."""
    import json

    from cluster.guided import MAX_ENUM_VALUES, check_schema, tool_grammar

    enum = lambda n: {"enum": [f"v{i}" for i in range(n)]}
    check_schema(json.dumps({"type": "object", "properties": {"a": enum(MAX_ENUM_VALUES)}}))
    with pytest.raises(ValueError, match=f"enums hold {MAX_ENUM_VALUES + 1} values"):
        check_schema(json.dumps({"type": "object", "properties": {"a": enum(MAX_ENUM_VALUES // 2),
                                                                  "b": {"items": enum(MAX_ENUM_VALUES // 2 + 1)}}}))
    fn = {"type": "function", "function": {"name": "f", "strict": True, "parameters": {
        "type": "object", "properties": {"a": enum(MAX_ENUM_VALUES + 1)}}}}
    with pytest.raises(ValueError, match="function 'f', argument 'a': its enums hold"):
        tool_grammar([fn], marks)


def test_a_strict_string_argument_with_a_keyword_the_grammar_would_pass_over_is_refused():
    from cluster.guided import _value

    with pytest.raises(ValueError, match="argument.not cannot be held"):
        _value({"type": "string", "not": {"const": "x"}}, {})
    for nulls in ({"minLength": None}, {"minLength": None, "maxLength": 5}):     # null: not given
        assert _value({"type": "string", **nulls}, {}) in ("RAW", "/[^\\x00-\\x06]{0,5}/")



def test_a_vocabulary_that_is_not_byte_level_is_refused(tok):
    """xgrammar reads the vocabulary's strings as GPT-2's byte alphabet: another kind would be misread, so refused."""
    from cluster.guided import Guides

    class Metaspace:
        byte_level, special_ids = False, frozenset()

        def special_ids_by_token(self):
            return {}

        def vocab(self):
            return {"▁a": 0, "b": 1}
    with pytest.raises(ValueError, match="byte-level"):
        Guides(Metaspace(), 2, [1]).guide('{"type": "object"}', [0])


def test_a_prefix_allows_its_trie_then_nothing_more(tok, guides):
    """``forced_paths`` as a token trie: each mask is the node's children; once a path is out the guide is done (the
    output free); a prompt that opens the reasoning waits for its end first; a token off the trie counts, then frees."""
    marks = tok.special_ids_by_token()
    call, key, end = marks["<tool_call>"], marks["<arg_key>"], marks["</tool_call>"]
    add, adder = tok.encode("add"), tok.encode("adder")
    paths = [(call, *add, key), (call, *add, end), (call, *adder, key)]
    p = guides.prefix(paths, [*tok.encode("hi"), marks["<think>"]])
    assert allowed(p) == set(range(6144)) - set(tok.eos_token_ids) and not p.done   # no stop before the call
    p.accept([*tok.encode("hmm"), marks["</think>"]])
    assert allowed(p) == {call}
    p.accept([call])
    assert allowed(p) == {add[0], adder[0]}
    p.accept(add)
    assert {key, end} <= allowed(p) and not p.done
    p.accept([end])
    assert p.done and p.mask() is None and p.rejected == 0
    off = guides.prefix(paths, tok.encode("hi"))
    off.accept([call, key])                             # not a name: counted, and the output is free from there
    assert off.rejected == 1 and off.done


WEATHER = {"type": "function", "function": {"name": "get_weather", "strict": True, "parameters": {
    "type": "object", "required": ["city", "days"],
    "properties": {"city": {"type": "string"}, "days": {"type": "integer", "minimum": 1, "maximum": 9},
                   "unit": {"enum": ["c", "f"]}, "opts": {"$ref": "#/$defs/opts"}},
    "$defs": {"opts": {"type": "object", "required": ["hourly"],
                      "properties": {"hourly": {"type": "boolean"}, "label": {"type": "string"}}}}}}}
LOOSE = {"type": "function", "function": {"name": "note", "parameters": {"type": "object"}}}


@pytest.fixture(scope="module")
def marks(tok):
    from cluster.parsers import TOOL_MARKERS

    return {m: tok.special_ids_by_token()[m] for m in TOOL_MARKERS}


def feed(tok, marks, guide, pieces) -> str | None:
    """Feed the pieces (a marker, or text encoded) token by token; the first piece with a token the guide's mask does
    not allow (None: all were)."""
    for piece in pieces:
        for t in [marks[piece]] if piece in marks else tok.encode(piece):
            if t not in allowed(guide):
                return piece
            guide.accept([t])
    return None


def test_a_tool_grammar_holds_a_strict_functions_arguments_to_its_schema(tok, guides, marks):
    """GLM's call format, markers by token: a strict function's properties in order (required ones always, optional
    ones or not), a string raw (markers and all, as text), an enum one of its values, an integer within its bounds,
    a $ref'd object as JSON; a loose function any keys and raw values; the markers themselves only where the format
    puts them, never as text inside a value; then another call or a stop token."""
    from cluster.guided import tool_grammar

    source = tool_grammar([WEATHER, LOOSE], marks)
    g = guides.tool_guide(source, tok.encode("hi"))
    assert allowed(g) == {marks["<tool_call>"]}
    call = ["<tool_call>", "get_weather", "<arg_key>", "city", "</arg_key>", "<arg_value>", 'Paris <b> "x"\n',
            "</arg_value>", "<arg_key>", "days", "</arg_key>", "<arg_value>", "3", "</arg_value>", "<arg_key>", "opts",
            "</arg_key>", "<arg_value>", '{"hourly": true}', "</arg_value>", "</tool_call>",
            "<tool_call>", "note", "<arg_key>", "anything", "</arg_key>", "<arg_value>", "goes", "</arg_value>",
            "</tool_call>"]
    assert feed(tok, marks, g, call) is None and g.rejected == 0
    assert set(tok.eos_token_ids) <= allowed(g) <= {*tok.eos_token_ids, marks["<tool_call>"], *tok.encode("\n")}
    for bad in (["<tool_call>", "get_weather", "<arg_key>", "days"],                    # city is first, and required
                ["<tool_call>", "get_weather", "<arg_key>", "city", "</arg_key>", "<arg_value>", "x", "</arg_value>",
                 "<arg_key>", "days", "</arg_key>", "<arg_value>", "0"],                # below the minimum
                ["<tool_call>", "get_weather", "<arg_key>", "city", "</arg_key>", "<arg_value>", "x", "</arg_value>",
                 "<arg_key>", "days", "</arg_key>", "<arg_value>", "2", "</arg_value>", "<arg_key>", "unit",
                 "</arg_key>", "<arg_value>", "k"],                                     # not in the enum
                ["<tool_call>", "get_weather", "<arg_key>", "city", "</arg_key>", "<arg_value>", "x", "<arg_key>"],
                ["<tool_call>", "get_weather", "<arg_key>", "city", "</arg_key>", "<arg_value>", "x", "</arg_value>",
                 "<arg_key>", "days", "</arg_key>", "<arg_value>", "2", "</arg_value>", "<arg_key>", "opts",
                 "</arg_key>", "<arg_value>", '{"hourly": true, "label": "', "<tool_call>"]):  # a marker in JSON text
        g = guides.tool_guide(source, tok.encode("hi"))
        assert feed(tok, marks, g, bad) == bad[-1], bad


def starts(tok, ids: set[int], name: str) -> bool:
    """The tokens ``ids`` are the ways ``name`` may begin (its first token among them)."""
    return tok.encode(name)[0] in ids and all(name.startswith(tok.decode([t])) for t in ids)


def test_a_tool_grammar_named_or_not_parallel_makes_one_call_and_auto_waits_for_the_models_own(tok, guides, marks):
    """A named function (or parallel_tool_calls false) is one call, then a stop token; under tool_choice auto the
    grammar starts after the model's own ``<tool_call>`` (after the reasoning, when the prompt opens it): the text
    before is free."""
    from cluster.guided import tool_grammar

    one = guides.tool_guide(tool_grammar([LOOSE, WEATHER], marks, "note", parallel=False), tok.encode("hi"))
    assert feed(tok, marks, one, ["<tool_call>"]) is None and starts(tok, allowed(one), "note")
    assert feed(tok, marks, one, ["note", "</tool_call>"]) is None
    assert marks["<tool_call>"] not in allowed(one) and set(tok.eos_token_ids) <= allowed(one)
    think = tok.special_ids_by_token()
    auto = guides.tool_guide(tool_grammar([WEATHER], marks, opened=True), [*tok.encode("hi"), think["<think>"]],
                             after=(marks["<tool_call>"],))
    assert auto.mask() is None and not auto.masked                  # its reasoning may end the output: no call due
    auto.accept([*tok.encode("hmm"), think["</think>"], *tok.encode("Let me look.")])
    assert auto.mask() is None and not auto.active                  # free text: no mask
    auto.accept([marks["<tool_call>"]])
    assert auto.active and starts(tok, allowed(auto), "get_weather")
    # a call opened inside the reasoning (before </think>, as GLM-5.1 does at long context) is held too
    for source, after in ((tool_grammar([WEATHER], marks, opened=True), (marks["<tool_call>"],)),
                          (tool_grammar([WEATHER], marks), ())):
        early = guides.tool_guide(source, [*tok.encode("hi"), think["<think>"]], after=after)
        assert not early.active and early.free_drafts(tok.encode("hmm"), [5, marks["<tool_call>"], 6]) == 1
        early.accept([*tok.encode("hmm"), marks["<tool_call>"]])
        assert early.active and starts(tok, allowed(early), "get_weather") and early.rejected == 0
    with pytest.raises(ValueError, match="no function named 'nope'"):
        tool_grammar([WEATHER], marks, "nope")
    bad = {"type": "function", "function": {"name": "f", "strict": True, "parameters": {
        "type": "object", "properties": {"a": {"type": "objectx"}}}}}
    with pytest.raises(ValueError, match="function 'f', argument 'a': .*objectx"):
        tool_grammar([bad], marks)


def test_a_thinking_budget_allows_only_the_reasoning_end_once_spent(tok, guides):
    """A budget alone: free (stop tokens too) while it lasts, then ``</think>`` alone; drafts stop a token short of
    it; the reasoning closed ends it. A schema's guide counts it while it holds the stops; a prompt that does not open
    the reasoning has nothing to count."""
    end = tok.special_ids_by_token()["</think>"]
    prompt = [*tok.encode("hi"), tok.special_ids_by_token()["<think>"]]
    b = guides.budget(prompt, 3)
    assert not b.masked and b.mask() is None and b.masks([5, 6]) == [None] * 3
    assert b.free_drafts([], [5, 6, 7]) == 2 and b.free_drafts([5], [6, 7]) == 1 and b.free_drafts([5, 6], [7]) == 0
    b.accept([5, 6, 7])
    assert b.masked and allowed(b) == {end} and not b.done
    b.accept([end])
    assert b.done and not b.masked
    closed = guides.budget(prompt, 3)
    closed.accept([5, end])                                     # the model closed it first
    assert closed.done and guides.budget(tok.encode("hi"), 3) is None
    g = guides.guide(SCHEMA, prompt, budget=1)
    assert allowed(g) == set(range(6144)) - set(tok.eos_token_ids)
    g.accept([5])
    assert allowed(g) == {end} and [set(np.flatnonzero(np.unpackbits(m.view(np.uint8), bitorder="little")))
                                    for m in g.masks([])] == [{end}]
    g.accept([end])
    assert g.active and tok.encode("{")[0] in allowed(g)


def test_a_thinking_budget_holds_beside_a_strict_tool_under_tool_choice_auto(tok, guides, marks):
    """tool_choice auto with a strict function: the guide waits for the model's ``<tool_call>``, and still counts the
    reasoning the prompt opens — spent, ``</think>`` alone; a call opened first ends the count (session 55's review 5:
    the budget was not applied there)."""
    from cluster.guided import tool_grammar

    think = tok.special_ids_by_token()
    prompt, after = [*tok.encode("hi"), think["<think>"]], (marks["<tool_call>"],)
    source = tool_grammar([WEATHER], marks, opened=True)
    g = guides.tool_guide(source, prompt, after=after, budget=2)
    g.accept([5, 6])
    assert g.masked and allowed(g) == {think["</think>"]}
    g.accept([think["</think>"], 7])
    assert not g.masked and not g.active                        # free text until the model opens a call
    early = guides.tool_guide(source, prompt, after=after, budget=2)
    early.accept([5, marks["<tool_call>"]])
    assert early.active and starts(tok, allowed(early), "get_weather")
    assert guides.tool_guide(source, tok.encode("hi"), after=after, budget=2).left is None   # no reasoning: no count


def test_drafts_stop_before_the_token_that_ends_a_guides_wait(tok, guides):
    """A waiting guide keeps the drafts before the token that would end its wait (counting what the step committed
    first; the rows after would need masks of a state it is not in yet); a wait of two tokens passes the first; once it
    constrains every draft rides (each verify row gets its mask)."""
    a, b, x = 100, 200, 7
    g = guides.guide(SCHEMA, [], after=(a, b))
    assert g.free_drafts([], [x, x, x]) == 3
    assert g.free_drafts([], [x, a, x, b, x]) == 3               # a passes; the drafts stop before b
    assert g.free_drafts([a], [x, b, x]) == 1                    # a committed in this step
    assert g.free_drafts([a, b], [x, x]) == 2                     # the step ended the wait: masks from here
    g.accept([a, b])
    assert g.active and g.free_drafts([], [x]) == 1


def test_a_guides_masks_along_drafts_follow_them_and_leave_it_as_it_was(tok, guides, marks):
    """Row i's mask allows what may follow the first i drafts; past a draft the grammar refuses, None (verification
    rejects there); the guide's state afterwards is what it was (the matcher rolled back, the trie not walked)."""
    g = guides.guide(SCHEMA, tok.encode("hi"))
    drafts = tok.encode('{"a": 1')
    before = allowed(g)
    rows = g.masks(drafts)
    assert len(rows) == len(drafts) + 1 and all(m is not None for m in rows)
    for i, m in enumerate(rows):
        ref = guides.guide(SCHEMA, tok.encode("hi"))
        ref.accept(drafts[:i])
        assert (m == ref.mask()).all(), i
    assert allowed(g) == before
    bad = tok.encode('{"a": "x"')                                 # a string where the schema wants an integer
    quote = next(i for i, t in enumerate(bad) if i > 3 and '"' in tok.decode([t]))      # the value's opening quote
    rows = g.masks(bad)
    assert all(m is not None for m in rows[:quote + 1]) and all(m is None for m in rows[quote + 1:])
    call = marks["<tool_call>"]
    p = guides.prefix([(call, *tok.encode("add"), marks["<arg_key>"])], [])
    rows = p.masks([call, *tok.encode("add"), marks["<arg_key>"], 5])
    assert [m is None for m in rows] == [False] * (len(tok.encode("add")) + 2) + [True, True]   # free once out
    assert allowed(p) == {call} and not p.done


def test_a_strict_string_argument_keeps_its_pattern_lengths_and_enum(tok, guides, marks):
    """Raw string arguments: a pattern holds the whole value, minLength / maxLength bound it (in characters), an enum
    of strings (nullable or untyped) is one of them."""
    from cluster.guided import tool_grammar

    def tool(prop):
        return [{"type": "function", "function": {"name": "f", "strict": True, "parameters": {
            "type": "object", "properties": {"s": prop}, "required": ["s"]}}}]

    head = ["<tool_call>", "f", "<arg_key>", "s", "</arg_key>", "<arg_value>"]
    for prop, good, bad in (({"type": "string", "pattern": "^[0-9]{3}$"}, "123", "12a"),
                            ({"type": "string", "maxLength": 3}, "abc", "abcd"),
                            ({"type": ["string", "null"], "enum": ["yes", None]}, "yes", "no"),
                            ({"enum": ["1", "2"]}, "2", "3")):
        g = guides.tool_guide(tool_grammar(tool(prop), marks), [])
        assert feed(tok, marks, g, [*head, *good, "</arg_value>", "</tool_call>"]) is None, prop
        g = guides.tool_guide(tool_grammar(tool(prop), marks), [])
        assert feed(tok, marks, g, [*head, *bad, "</arg_value>"]) is not None, prop
    short = guides.tool_guide(tool_grammar(tool({"type": "string", "minLength": 2}), marks), [])
    assert feed(tok, marks, short, [*head, "a", "</arg_value>"]) == "</arg_value>"


@pytest.mark.parametrize("params,message", [
    ({"type": "array"}, "object schema"),
    ({"type": "object", "properties": [1]}, "object schema"),
    ({"$ref": "#/$defs/A", "$defs": {"A": {}}}, "not ['$ref']"),
    ({"type": "object", "allOf": [{"properties": {"x": {}}}]}, "not ['allOf']"),
    ({"type": "object", "properties": {"a": {"type": "integer"}}, "required": [1]}, "required must be a list"),
    ({"type": "object", "properties": {"a": {"type": "integer"}}, "required": "a"}, "required must be a list"),
    ({"type": "object", "properties": {"c": {"$ref": "#"}}}, "not '#'"),
    ({"type": "object", "properties": {"c": {"$ref": "http://x/y.json"}}}, "not 'http://x/y.json'"),
    ({"type": "object", "properties": {"s": {"type": "string", "pattern": "(["}}}, "argument 's': pattern"),
    ({"type": "object", "properties": {"s": {"type": "string", "minLength": 9, "maxLength": 1}}}, "argument 's'"),
])
def test_a_strict_schema_the_call_format_cannot_hold_is_refused_naming_it(marks, params, message):
    """What GLM's key-by-key format cannot hold, or the grammar cannot follow, is a ValueError naming the function (and
    the argument) — not a call that silently breaks its schema."""
    from cluster.guided import tool_grammar

    with pytest.raises(ValueError, match="function 'f'") as e:
        tool_grammar([{"type": "function", "function": {"name": "f", "strict": True, "parameters": params}}], marks)
    assert message in str(e.value) and "<[" not in str(e.value), str(e.value)        # no grammar source in it


def test_a_json_values_whitespace_runs_are_bounded(tok, guides):
    """Between a value's tokens whitespace may run to ``MAX_WHITESPACE`` characters, no further: a model stuck on
    spaces cannot fill its max_tokens with them."""
    from cluster.guided import MAX_WHITESPACE

    g = guides.guide(SCHEMA, [])
    space = tok.encode(" ")[0]
    g.accept(tok.encode("{"))
    for _ in range(MAX_WHITESPACE):
        assert space in allowed(g)
        g.accept([space])
    assert space not in allowed(g) and tok.encode('"')[0] in allowed(g) and g.rejected == 0


def test_a_tool_schema_whose_type_holds_an_object_is_a_400():
    """``"type": [{}]`` in a tool's parameter was a TypeError (a 500) in the string-argument check and the strict
    grammar's build."""
    from cluster.config import DEFAULT_MODEL
    from cluster.protocol import ApiError
    from cluster.serve import _tool_guidance
    from models.tokenizer import Tokenizer

    tok = Tokenizer.from_dir(DEFAULT_MODEL)
    sp = tok.special_ids_by_token()
    tool = {"type": "function", "function": {"name": "f", "strict": True, "parameters": {
        "type": "object", "properties": {"a": {"type": [{}]}, "b": {"type": ["string", "null"]}}}}}
    from cluster.parsers import TOOL_MARKERS
    from cluster.protocol import ChatCompletionRequest

    req = ChatCompletionRequest.model_validate({"model": "m", "messages": [{"role": "user", "content": "hi"}],
                                                "tools": [tool], "tool_choice": "required"})
    assert req.string_arguments == {"f": {"b"}}
    with pytest.raises(ApiError) as e:
        _tool_guidance(req, {n: sp[n] for n in TOOL_MARKERS}, tok)
    assert (e.value.status, e.value.param) == (400, "tools"), e.value.message


def test_strict_string_patterns_keep_their_escapes_and_lengths_name_their_bounds():
    from cluster.guided import _lark_regex, _value

    assert _lark_regex("a/b\\/c") == "a\\/b\\/c"            # an escaped slash stays escaped once
    assert _lark_regex("^cost\\$") == "cost\\$" and _lark_regex("^a$") == "a"      # a literal dollar stays
    assert _lark_regex("x\\\\$") == "x\\\\"                  # an escaped backslash, then the anchor
    assert _value({"type": "string", "pattern": "^a/b\\/c$"}, {}) == "/a\\/b\\/c/"
    for bad in ({"minLength": True}, {"maxLength": 10**12}, {"minLength": 3, "maxLength": 2}):
        with pytest.raises(ValueError, match="minLength / maxLength"):
            _value({"type": "string", **bad}, {})


def _takes(tok, guides, grammar, text: str) -> bool:
    """Whether ``grammar``'s guide allows ``text``'s tokens in order and then a stop token."""
    g = guides.guide(None, tok.encode("hi"), grammar=grammar)
    for t in tok.encode(text):
        if t not in allowed(g):
            return False
        g.accept([t])
    return bool(set(tok.eos_token_ids) & allowed(g))


def test_regex_choice_and_grammar_keep_non_ascii_text_and_their_escapes(tok, guides):
    """vLLM's regex / choice / grammar reach the compiler as the client wrote them (xgrammar's printed form would turn
    é + a hex letter into another character, and an emoji into surrogates); a regex's \\xHH is that one byte's char."""
    from cluster.guided import choice_grammar, ebnf_grammar, regex_grammar

    choice = choice_grammar(["über", "😀 yes", 'quote " and \\ back', "tab\there"])
    for text in ("über", "😀 yes", 'quote " and \\ back', "tab\there"):
        assert _takes(tok, guides, choice, text), text
    assert not _takes(tok, guides, choice, "uber")
    assert _takes(tok, guides, ebnf_grammar('root ::= "décembre"'), "décembre")
    assert _takes(tok, guides, regex_grammar("[éa]{4}"), "éaéa")
    assert regex_grammar(r"\x41B|\\x41") == ("regex", r"\u0041B|\\x41")       # an escaped backslash stays as it was
    assert _takes(tok, guides, regex_grammar(r"\x41B"), "AB")
    for bad in ([], [""], ["a\ud800"], "yes"):
        with pytest.raises(ValueError, match="must"):
            choice_grammar(bad)


def test_a_grammar_with_no_output_is_refused_and_a_dead_end_ends_the_output(tok, guides):
    """A grammar that takes no text at all is a ValueError (the request's 400); one that runs into a dead end allows
    the stop tokens there, so no row is sampled with nothing left."""
    from cluster.guided import ebnf_grammar

    for src in ("root ::= []", "root ::= root"):
        with pytest.raises(ValueError, match="allows no output"):
            guides.guide(None, tok.encode("hi"), grammar=ebnf_grammar(src))
    g = guides.guide(None, tok.encode("hi"), grammar=ebnf_grammar('root ::= "ab" []'))
    for t in tok.encode("ab"):
        g.accept([t])
    assert allowed(g) == set(tok.eos_token_ids)


def test_a_strict_functions_non_ascii_key_is_its_own_text(tok, guides, marks):
    """A strict function's property named "décembre" is that text in the call (through xgrammar's printed grammar it
    came out as other text)."""
    from cluster.guided import tool_grammar

    fn = {"name": "f", "strict": True, "parameters": {"type": "object", "properties": {"décembre": {"type": "string"}},
                                                      "required": ["décembre"], "additionalProperties": False}}
    g = guides.tool_guide(tool_grammar([{"type": "function", "function": fn}], marks), tok.encode("hi"))
    call = ["<tool_call>", "f", "<arg_key>", "décembre", "</arg_key>", "<arg_value>", "x", "</arg_value>",
            "</tool_call>"]
    assert feed(tok, marks, g, call) is None and g.rejected == 0
