"""Structured output, tool calls, forced paths and thinking budgets with MTP drafts (k = 1, 2, 3) against plain
decoding (k = 0): json_schema (several schemas), regex and EBNF grammars, a strict tool's grammar under tool_choice
auto (``guide_after`` <tool_call>, the guide waits) and required (from the answer's start), forced paths (a non-strict
tool_choice), a thinking budget alone and with a schema, a strict tool whose call closes (enums) under parallel or not, with
``single_tool_call`` or not; greedy and seeded (top-p, penalties), with logprobs, stop
strings, ``parallel_tool_calls: false`` (single_tool_call) and n = 3 choices (seed + i, run together: drafts resume as
they finish). Oracle: the same tokens, text, finish reason, stop_str, usage and logprobs (1e-4) as the plain engine;
every engine idle after; accepted drafts > 0 overall.

    PYTHONPATH=. .venv/bin/python bench/results/session60/review_spec/c2_guided_spec.py
"""
from __future__ import annotations

import json
from dataclasses import replace

import _s
from _s import SamplingParams, check, collect, idle, make_engine, tok
from cluster.guided import tool_grammar

PERSON = {"type": "object", "required": ["name", "age"],
          "properties": {"name": {"type": "string", "maxLength": 40}, "age": {"type": "integer"},
                         "tags": {"type": "array", "items": {"type": "string", "maxLength": 12}, "maxItems": 2}}}
SCHEMAS = [PERSON, {"type": "object"}, {"type": "array", "items": {"type": "integer"}, "maxItems": 6},
           {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"enum": ["yes", "no", "maybe"]}},
            "required": ["a", "b"]},
           {"type": "string", "maxLength": 30}]
WEATHER = [{"type": "function", "function": {"name": "get_weather", "strict": True, "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
    "required": ["city", "days"]}}},
    {"type": "function", "function": {"name": "add", "parameters": {"type": "object", "properties": {
        "a": {"type": "integer"}, "b": {"type": "integer"}}}}}]


ENUMS = [{"type": "function", "function": {"name": "get_weather", "strict": True, "parameters": {
    "type": "object", "properties": {"city": {"enum": ["Paris", "Rome"]}, "days": {"enum": [1, 2, 3]}},
    "required": ["city", "days"]}}}]


def same(tag, got, want):
    for f in ("tokens", "text", "reason", "stop_str", "n_out", "error"):
        if got[f] != want[f]:
            return check(False, f"{tag}: {f} {str(got[f])[:160]!r} != plain {str(want[f])[:160]!r}")
    if len(got["lps"]) != len(want["lps"]) or any(abs(a - b) > 1e-4 for a, b in zip(got["lps"], want["lps"])):
        return check(False, f"{tag}: logprobs differ")
    if [[t for t, _ in x] for x in got["tops"]] != [[t for t, _ in x] for x in want["tops"]]:
        return check(False, f"{tag}: top ids differ")
    return True


def cases():
    t = tok()
    marks = t.special_ids_by_token()
    ids = {m: marks[m] for m in ("<tool_call>", "</tool_call>", "<arg_key>", "</arg_key>", "<arg_value>",
                                  "</arg_value>")}
    span = (ids["<tool_call>"], ids["</tool_call>"])
    chat = lambda c, **kw: t.encode_chat([{"role": "user", "content": c}], enable_thinking=False, **kw)
    tools_prompt = t.encode_chat([{"role": "user", "content": "Weather in Paris?"}], tools=WEATHER,
                                 enable_thinking=False)
    think_prompt = t.encode_chat([{"role": "user", "content": "Hi there"}])
    out = []
    for i, schema in enumerate(SCHEMAS):
        for seed in (None, 11 + i):
            p = SamplingParams(max_tokens=80, temperature=0.0 if seed is None else 0.9, seed=seed,
                               json_schema=json.dumps(schema), logprobs=2,
                               top_p=1.0 if seed is None else 0.95, frequency_penalty=0.0 if i % 2 else 0.4)
            out.append((f"schema{i}-{seed}", chat("A person as JSON." if i == 0 else "Give me JSON."), p))
    out.append(("schema0-stop", chat("A person as JSON."),
                SamplingParams(max_tokens=80, temperature=0.0, json_schema=json.dumps(PERSON), stop=('"', "a"))))
    out.append(("regex", t.encode("The number is"), SamplingParams(max_tokens=40, temperature=0.0,
                                                                    grammar=("regex", r"[0-9]{2,12}( apples)?"))))
    out.append(("regex-seeded", t.encode("The number is"), SamplingParams(
        max_tokens=40, temperature=1.0, seed=3, grammar=("regex", r"(yes|no|[a-z]{3,9})(, (yes|no|[a-z]{3,9})){0,5}"))))
    out.append(("ebnf", t.encode("And it came to pass"), SamplingParams(
        max_tokens=40, temperature=0.0, grammar=("ebnf", 'root ::= ("the" | " LORD" | " said" | ",")+ "."'))))
    auto = tool_grammar(WEATHER, ids, None, parallel=True, opened=True)
    required = tool_grammar(WEATHER, ids, None, parallel=False, opened=False)
    for seed in (None, 4):
        temp = 0.0 if seed is None else 0.8
        out.append((f"tools-auto-{seed}", tools_prompt, SamplingParams(
            max_tokens=80, temperature=temp, seed=seed, tool_grammar=auto, guide_after=(ids["<tool_call>"],),
            tool_call_span=span, text_breaks=tuple(sorted(ids.values())), logprobs=1)))
        out.append((f"tools-required-{seed}", tools_prompt, SamplingParams(
            max_tokens=80, temperature=temp, seed=seed, tool_grammar=required, tool_call_span=span,
            single_tool_call=True, text_breaks=tuple(sorted(ids.values())))))
        paths = ((ids["<tool_call>"], *t.encode("get_weather"), ids["<arg_key>"]),
                 (ids["<tool_call>"], *t.encode("add"), ids["<arg_key>"]))
        out.append((f"forced-{seed}", tools_prompt, SamplingParams(
            max_tokens=40, temperature=temp, seed=seed, forced_paths=paths, tool_call_span=span,
            text_breaks=tuple(sorted(ids.values())), stop=("a",))))
        out.append((f"think-{seed}", think_prompt, SamplingParams(
            max_tokens=40, temperature=temp, seed=seed, thinking_budget=6, stop=("e",))))
        out.append((f"think-schema-{seed}", think_prompt, SamplingParams(
            max_tokens=60, temperature=temp, seed=seed, thinking_budget=3, json_schema=json.dumps(SCHEMAS[3]))))
    enum_prompt = t.encode_chat([{"role": "user", "content": "Weather in Paris?"}], tools=ENUMS, enable_thinking=False)
    for par in (True, False):
        for single in (True, False):
            g = tool_grammar(ENUMS, ids, None, parallel=par, opened=False)
            for seed in (None, 2):
                out.append((f"closed-call-par{par}-single{single}-{seed}", enum_prompt, SamplingParams(
                    max_tokens=120, temperature=0.0 if seed is None else 1.0, seed=seed, tool_grammar=g,
                    tool_call_span=span, single_tool_call=single, text_breaks=tuple(sorted(ids.values())),
                    logprobs=1)))
    return out


def main():
    _s.model()
    total_rounds = total_acc = 0
    engines = {k: make_engine(k=k) for k in (0, 1, 2, 3)}
    for name, prompt, params in cases():
        want = collect(engines[0], {name: (prompt, params)})[name]
        ok = True
        for k in (1, 2, 3):
            got = collect(engines[k], {name: (prompt, params)})[name]
            ok &= same(f"{name} k={k}", got, want)
        if ok:
            print(f"ok   {name}: {want['reason']} {len(want['tokens'])} tokens {want['text'][:70]!r}")
    # n = 3 choices (seed + i), run together: drafts are suppressed, then resume as the choices end
    for name, prompt, params in [c for c in cases() if c[0] in ("schema0-11", "tools-auto-4", "regex-seeded")]:
        reqs = {f"{name}#{i}": (prompt, replace(params, seed=params.seed + i, max_tokens=params.max_tokens - 7 * i))
                for i in range(3)}
        want = collect(engines[0], reqs)
        for k in (1, 3):
            got = collect(engines[k], reqs)
            ok = all(same(f"{rid} n=3 k={k}", got[rid], want[rid]) for rid in reqs)
            if ok:
                print(f"ok   {name} n=3 k={k}")
    for k, e in engines.items():
        check(not idle(e), f"engine k={k} idle after")
        if k:
            m = e.spec_metrics()
            total_rounds += m["rounds"]
            total_acc += m["accepted"]
            print(f"     k={k}: {m}")
    check(total_acc > 0, f"drafts accepted on guided rows ({total_acc} in {total_rounds} rounds)")
    _s.done()


if __name__ == "__main__":
    main()
