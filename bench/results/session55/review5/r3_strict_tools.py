"""Usage: r3_strict_tools.py [plain] [k2] [eager].
Strict tools (tool_grammar): tool_choice required / named, with and without thinking, several strict tools, a strict
tool among non-strict ones, parallel_tool_calls false, tool_choice auto (the model's own <tool_call>, pushed by a
logit_bias), plain / MTP k=2 / look-ahead engines. Each output replays through a fresh matcher of the grammar; the
calls the front end's parser (cluster/parsers.ToolCalls) reads from a "stop" output are validated (jsonschema) against
their strict function's parameters."""
import json
import sys

import jsonschema
import xgrammar
from common import SamplingParams, check, done, engine, replay, run

from cluster.guided import is_raw_string, tool_grammar
from cluster.parsers import TOOL_MARKERS, ToolCalls

BOOK = {"type": "function", "function": {"name": "book_room", "strict": True, "parameters": {
    "type": "object", "additionalProperties": False, "required": ["city", "nights", "kind", "guests"],
    "properties": {"city": {"type": "string", "maxLength": 8}, "nights": {"type": "integer", "minimum": 1, "maximum": 30},
                   "kind": {"enum": ["hotel", "b&b \"x\"", "naïve\nline", "Zürich"]},
                   "guests": {"type": "object", "additionalProperties": False, "required": ["adults"],
                              "properties": {"adults": {"type": "integer"},
                                             "kids": {"type": "array", "items": {"type": "integer"}, "maxItems": 3}}},
                   "città": {"type": "string", "maxLength": 5}, "flag": {"type": "boolean"},
                   "ratio": {"type": "number"}, "tags": {"type": "array", "items": {"type": "string", "maxLength": 4},
                                                         "maxItems": 2}}}}}
ADD = {"type": "function", "function": {"name": "add", "strict": True, "parameters": {
    "type": "object", "properties": {"a": {"type": "number"}, "b": {"type": "integer"}}, "required": ["a", "b"]}}}
NOARGS = {"type": "function", "function": {"name": "ping", "strict": True, "parameters": {"type": "object", "properties": {}}}}
FREE = {"type": "function", "function": {"name": "search", "parameters": {
    "type": "object", "properties": {"q": {"type": "string"}}, "required": ["q"]}}}


def calls_of(tok, ids_map, tools, events):
    strings = {t["function"]["name"]: {k for k, v in t["function"]["parameters"].get("properties", {}).items()
                                       if is_raw_string(v)} for t in tools}
    p = ToolCalls(ids_map, lambda ids: tok.decode(ids, skip_special_tokens=True), strings)
    content = ""
    for ev in events:
        text, _ = p.feed(ev)
        content += text
    return content, p.calls


def main():
    plain, tok = engine()
    marks = tok.special_ids_by_token()
    ids_map = {m: marks[m] for m in TOOL_MARKERS}
    eos = 0
    bias = ((marks["</arg_value>"], 6.0), (marks["</tool_call>"], 4.0), (eos, 6.0))
    cases = {  # name: (tools, forced, name, parallel, thinking)
        "required/one": ([BOOK], True, None, True, False),
        "required/several": ([BOOK, ADD, NOARGS], True, None, True, False),
        "required/among-free": ([FREE, BOOK], True, None, True, False),
        "named/book": ([FREE, BOOK, ADD], True, "book_room", False, False),
        "required/no-parallel": ([BOOK, ADD], True, None, False, False),
        "required/think": ([BOOK, ADD], True, None, True, True),
        "named/think": ([BOOK, ADD], True, "add", False, True),
        "auto/several": ([FREE, BOOK, ADD], False, None, True, False),
    }
    # argv: which engines (plain by default; "k2", "eager" too) -- each run stays well under a minute
    which = sys.argv[1:] or ["plain"]
    engines = [(n, e) for n, e in (("plain", plain), ("k2", None), ("eager", None)) if n in which]
    engines = [(n, e or engine(**({"speculative_tokens": 2} if n == "k2" else {"cuda_graphs": "eager"}))[0])
               for n, e in engines]
    n_calls = 0
    for case, (tools, forced, name, parallel, thinking) in cases.items():
        src = tool_grammar(tools, ids_map, name, parallel=parallel, opened=not forced)
        compiled = plain.guides._compiled_tools(src)
        prompt = tok.encode_chat([{"role": "user", "content": "Book a room."}], tools=tools, enable_thinking=thinking)
        extra = dict(tool_grammar=src, guide_after=() if forced else (ids_map["<tool_call>"],))
        if thinking:
            extra["thinking_budget"] = 3
        modes = [("greedy", dict(temperature=0.0)), ("s1", dict(temperature=1.0, seed=1)),
                 ("s2", dict(temperature=0.9, seed=2)), ("s3", dict(temperature=1.2, seed=3, top_p=0.9))]
        for ename, eng in engines:
            for mode, kw in modes:
                lb = bias + (((ids_map["<tool_call>"], 12.0),) if not forced else ())
                params = SamplingParams(max_tokens=120, logit_bias=lb, **kw, **extra)
                o = run(eng, {"r": (prompt, params)})["r"]
                skip = None
                out_ids = o["ids"]
                if thinking:
                    skip = marks["</think>"]
                if not forced:          # auto: the grammar starts after the model's own <tool_call>
                    skip = ids_map["<tool_call>"]
                bad, term = replay(eng, compiled, out_ids, skip_until=skip)
                tag = f"{case} {ename} {mode}"
                check(bad == -1 and o["error"] is None,
                      f"{tag}: {len(out_ids)} tokens all allowed by the grammar ({bad}), reason {o['reason']}")
                content, calls = calls_of(tok, ids_map, tools, o["events"])
                if o["reason"] != "stop":
                    continue
                strict = {t["function"]["name"]: t["function"]["parameters"] for t in tools if t["function"].get("strict")}
                ok = bool(calls) or not forced
                for c in calls:
                    n_calls += 1
                    fn = c["function"]
                    try:
                        args = json.loads(fn["arguments"])
                        if fn["name"] in strict:
                            jsonschema.validate(args, strict[fn["name"]])
                        elif fn["name"] not in [t["function"]["name"] for t in tools]:
                            raise ValueError("unknown function")
                    except Exception as e:     # noqa: BLE001
                        ok = False
                        print(f"     call {fn['name']} {fn['arguments']!r}: {str(e)[:150]}")
                if not parallel:
                    ok &= len(calls) <= 1
                if name:
                    ok &= all(c["function"]["name"] == name for c in calls)
                check(ok, f"{tag}: {len(calls)} call(s) parse and validate: "
                          f"{[(c['function']['name'], c['function']['arguments'][:60]) for c in calls]}")
            check(not eng._guides, f"{case} {ename}: guides dropped")
    print(f"   {n_calls} calls validated")
    done()


if __name__ == "__main__":
    main()
