import sys, json
sys.path.insert(0, '.')
from common import *
import xgrammar, jsonschema
from cluster.guided import check_schema
eng, tok = engine()
g = eng.guides
def accepts(schema, text):
    m = xgrammar.GrammarMatcher(g._compiled(json.dumps(schema)))
    for t in tok.encode(text) + [0]:
        if not m.accept_token(t):
            return False
    return m.is_terminated()
cases = [
 ({"type":"object","required":["a"]}, '{}'),
 ({"type":"object","required":["a"],"properties":{"b":{"type":"integer"}}}, '{"b": 1}'),
 ({"type":"object","minProperties":1}, '{}'),
 ({"type":"object","maxProperties":1}, '{"a": 1, "b": 2}'),
 ({"type":"object","dependentRequired":{"a":["b"]}}, '{"a": 1}'),
 ({"type":"object","propertyNames":{"pattern":"^x"}}, '{"a": 1}'),
 ({"type":"object","patternProperties":{"^x":{"type":"integer"}},"additionalProperties":False}, '{"a": 1}'),
 ({"type":"object","patternProperties":{"^x":{"type":"integer"}}}, '{"xa": "s"}'),
 ({"type":"array","contains":{"type":"integer"}}, '["a"]'),
 ({"type":"string","format":"date"}, '"zzz"'),
 ({"type":"string","format":"email"}, '"zzz"'),
 ({"type":"integer","multipleOf":3}, '4'),
 ({"type":"number","multipleOf":0.5}, '0.3'),
 ({"type":"number","exclusiveMaximum":1}, '1'),
 ({"if":{"properties":{"a":{"const":1}}},"then":{"required":["b"]}}, '{"a": 1}'),
 ({"type":"object","properties":{"a":{"type":"integer"}},"additionalProperties":False,"required":["a"]}, '{"a": 1, "a": 2}'),
 ({"type":"array","items":{"type":"integer"},"maxItems":1}, '[1, 2]'),
 ({"anyOf":[]}, ''),
 ({"oneOf":[{"type":"integer"},{"type":"number"}]}, '1'),
 ({"type":"string","minLength":2}, '"é"'),
 ({"type":"string","maxLength":1}, '"éé"'),
 ({"type":"string","maxLength":1}, '"\\u00e9\\u00e9"'),
 ({"type":"string","maxLength":1}, '"\\n\\n"'),
 ({"enum":["a"]}, '"\\u0061"'),
 ({"type":"integer","minimum":1e20}, '5'),
 ({"type":"integer","maximum":2.5}, '3'),
 ({"type":"number","minimum":0.5}, '0.4'),
 ({"type":"string","pattern":"a"}, '"bab"'),
 ({"type":"object","properties":{"a":{"type":"integer"}},"additionalProperties":False}, '{"a": 1, "b": 1}'),
 ({"type":"object","properties":{"a":{"type":"integer"}}, "unevaluatedProperties": False}, '{"b": 1}'),
 ({"type": "object", "properties": {"a": {"type": "integer", "default": 1}}}, '{}'),
 ({"type":"number"}, '1e999'),
 ({"type":"number"}, 'NaN'),
 ({"type":"integer"}, '1.0'),
 ({"type":"integer"}, '-0'),
 ({"type":"integer"}, '1e2'),
]
for schema, text in cases:
    try:
        check_schema(json.dumps(schema)); refused = None
    except ValueError as e:
        refused = str(e)[:60]
    try:
        valid = jsonschema.Draft202012Validator(schema).is_valid(json.loads(text))
    except Exception as e:
        valid = f"unparseable"
    acc = None if refused else accepts(schema, text)
    flag = "  <-- grammar accepts invalid" if acc and valid is not True else ("  <-- grammar rejects valid" if acc is False and valid is True else "")
    print(f"{json.dumps(schema)[:80]:80s} {text!r:22s} valid={valid} accepts={acc} refused={refused}{flag}")
