"""Strict tool grammar, matcher-level (tokens fed by hand): valid GLM calls are taken, ones breaking the schema are
refused (wrong enum, missing required key, extra key, wrong type, nested object breaking its schema, a second call under
parallel_tool_calls false); unicode / quoted keys and enum values round-trip. Then tool_choice required / named without a
strict function (forced_paths, a Prefix) with thinking and a budget: plain, MTP k=2, look-ahead: the answer after
</think> starts with one of the paths and the guide is dropped. Also: whitespace inside a strict non-string JSON value."""
import xgrammar
from common import SamplingParams, check, done, engine, run

from cluster.guided import tool_grammar
from cluster.parsers import TOOL_MARKERS

FN = {"type": "function", "function": {"name": "réserve", "strict": True, "parameters": {
    "type": "object", "required": ["città", "kind", "guests"], "additionalProperties": False,
    "properties": {"città": {"type": "string"}, "kind": {"enum": ["b&b \"x\"", "naïve\nline"]},
                   "guests": {"type": "object", "required": ["adults"], "additionalProperties": False,
                              "properties": {"adults": {"type": "integer"}}},
                   "k\"ey": {"type": "boolean"}}}}}


def main():
    eng, tok = engine()
    marks = tok.special_ids_by_token()
    M = {m: marks[m] for m in TOOL_MARKERS}
    enc = lambda s: tok.encode_pieces([(s, True)])     # noqa: E731

    def call(name, args, nl=True):
        out = [M["<tool_call>"], *enc(name)] + (enc("\n") if nl else [])
        for k, v in args:
            out += [M["<arg_key>"], *enc(k), M["</arg_key>"], *(enc("\n") if nl else []), M["<arg_value>"], *enc(v),
                    M["</arg_value>"], *(enc("\n") if nl else [])]
        return out + [M["</tool_call>"]]

    def takes(src, ids):
        m = xgrammar.GrammarMatcher(eng.guides._compiled_tools(src))
        return all(m.accept_token(t) for t in ids) and m.accept_token(0) and m.is_terminated()

    src = tool_grammar([FN], M, None, parallel=True)
    one = tool_grammar([FN], M, None, parallel=False)
    good = [("città", "Zürich \"centre\"\nline 2"), ("kind", "naïve\nline"), ("guests", '{"adults": 2}')]
    cases = [
        ("valid call", src, call("réserve", good), True),
        ("valid, no newlines", src, call("réserve", good, nl=False), True),
        ("valid with optional quoted key", src, call("réserve", good + [("k\"ey", "true")]), True),
        ("two calls, parallel", src, call("réserve", good) + enc("\n") + call("réserve", good), True),
        ("two calls, parallel_tool_calls false", one, call("réserve", good) + enc("\n") + call("réserve", good), False),
        ("wrong enum", src, call("réserve", [good[0], ("kind", "hotel"), good[2]]), False),
        ("missing required", src, call("réserve", [good[0], good[2]]), False),
        ("extra key", src, call("réserve", good + [("zzz", "1")]), False),
        ("nested wrong type", src, call("réserve", good[:2] + [("guests", '{"adults": "2"}')]), False),
        ("nested missing required", src, call("réserve", good[:2] + [("guests", '{}')]), False),
        ("wrong name", src, call("reserve", good), False),
        ("boolean as text", src, call("réserve", good + [("k\"ey", "yes")]), False),
    ]
    for name, s, ids, want in cases:
        check(takes(s, ids) == want, f"matcher {'takes' if want else 'refuses'}: {name}")
    # whitespace inside a strict non-string value (json_schema outputs are bounded to MAX_WHITESPACE = 32)
    spaced = call("réserve", good[:2] + [("guests", "{" + " " * 400 + '"adults": 2}')])
    print(f"   note: a strict object value with 400 spaces inside is {'taken' if takes(src, spaced) else 'refused'}"
          " (json_schema bounds a whitespace run at 32)")

    # forced_paths (no strict function) with thinking and a budget
    paths = ((M["<tool_call>"], *tok.encode("get_weather"), M["<arg_key>"]),
             (M["<tool_call>"], *tok.encode("add"), M["</tool_call>"]))
    prompt = tok.encode_chat([{"role": "user", "content": "Weather?"}])
    end = marks["</think>"]
    for ename, e in (("plain", eng), ("k2", engine(speculative_tokens=2)[0]), ("eager", engine(cuda_graphs="eager")[0])):
        for kw in (dict(temperature=0.0), dict(temperature=1.0, seed=3)):
            o = run(e, {"r": (prompt, SamplingParams(max_tokens=30, forced_paths=paths, thinking_budget=3, **kw))})["r"]
            ids = o["ids"]
            after = ids[ids.index(end) + 1:] if end in ids else []
            check(end in ids and ids.index(end) == 3 and any(tuple(after[:len(p)]) == p for p in paths),
                  f"{ename} {kw}: </think> at 3 then a forced path: {ids[:12]}")
        check(not e._guides, f"{ename}: guides dropped")
    done()


if __name__ == "__main__":
    main()
