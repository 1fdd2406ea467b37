"""JSON-schema keywords xgrammar accepts but does not hold, which check_schema's _unheld does not refuse: the engine
admits the request and ends it with finish_reason "stop" on output that does not validate against the schema.
(_unheld refuses not / uniqueItems / allOf of several / external $ref, measured the same way.)
Each schema: either a 400 (AdmissionError naming response_format) or every "stop" output validates (jsonschema)."""
import json

import jsonschema
from common import SamplingParams, check, done, engine, run

from scheduler.scheduler import AdmissionError

SCHEMAS = {
    "required key not in properties": {"type": "object", "required": ["id"]},
    "required key beside other properties": {"type": "object", "properties": {"name": {"type": "string", "maxLength": 5}},
                                             "required": ["name", "id"]},
    "if/then": {"type": "object", "properties": {"kind": {"const": "a"}}, "required": ["kind"],
                "if": {"properties": {"kind": {"const": "a"}}}, "then": {"required": ["extra"]}},
    "number multipleOf": {"type": "number", "multipleOf": 0.25, "minimum": 0, "maximum": 100},
    "anyOf []": {"anyOf": []},
    "oneOf overlapping": {"oneOf": [{"type": "integer", "minimum": 0, "maximum": 9},
                                    {"type": "number", "minimum": 0, "maximum": 9}]},
}


def main():
    eng, tok = engine()
    prompt = tok.encode_chat([{"role": "user", "content": "JSON please."}], enable_thinking=False)
    modes = [dict(temperature=0.0)] + [dict(temperature=1.0, seed=s) for s in range(6)]
    for name, schema in SCHEMAS.items():
        reqs = {f"{name}#{i}": (prompt, SamplingParams(max_tokens=60, json_schema=json.dumps(schema), **kw))
                for i, kw in enumerate(modes)}
        try:
            out = run(eng, reqs)
        except AdmissionError as e:
            check(e.field == "response_format", f"{name}: refused (400 {e.field}: {e})")
            continue
        bad = []
        stops = 0
        for rid, o in out.items():
            if o["reason"] != "stop":
                continue
            stops += 1
            try:
                jsonschema.Draft202012Validator(schema).validate(json.loads(o["text"]))
            except Exception as e:      # noqa: BLE001
                bad.append((o["text"], type(e).__name__ + ": " + str(e).split("\n")[0][:60]))
        check(not bad, f"{name}: admitted; {stops} stop outputs, {len(bad)} invalid: {bad[:3]}")
    check(not eng._guides, "guides dropped")
    # the same gap in a strict tool's argument (tool_grammar's %json of the property's schema, checked by check_schema)
    import xgrammar

    from cluster.guided import tool_grammar
    from cluster.parsers import TOOL_MARKERS
    M = {m: tok.special_ids_by_token()[m] for m in TOOL_MARKERS}
    fn = {"type": "function", "function": {"name": "f", "strict": True, "parameters": {
        "type": "object", "properties": {"obj": {"type": "object", "required": ["id"]}}, "required": ["obj"]}}}
    try:
        src = tool_grammar([fn], M)
        m = xgrammar.GrammarMatcher(eng.guides._compiled_tools(src))
        ids = [M["<tool_call>"], *tok.encode("f"), M["<arg_key>"], *tok.encode("obj"), M["</arg_key>"], M["<arg_value>"],
               *tok.encode("{}"), M["</arg_value>"], M["</tool_call>"], 0]
        took = all(m.accept_token(t) for t in ids) and m.is_terminated()
        check(not took, f"strict tool argument {{'type': 'object', 'required': ['id']}}: the grammar "
                        f"{'takes' if took else 'refuses'} the value {{}} (jsonschema: invalid)")
    except ValueError as e:
        check(True, f"strict tool refused: {e}")
    done()


if __name__ == "__main__":
    main()
