import sys, time, json
sys.path.insert(0, '.')
from common import *
from cluster.guided import check_schema
from scheduler.scheduler import AdmissionError
eng, tok = engine()
prompt = tok.encode_chat([{"role": "user", "content": "JSON"}], enable_thinking=False)
cases = {
 "req_no_props": {"type":"object","required":["a"],"additionalProperties":False},
 "req_false_prop": {"type":"object","properties":{"a":False},"required":["a"]},
 "items_minmax": {"type":"array","minItems":2,"maxItems":1},
 "str_minmax": {"type":"string","minLength":3,"maxLength":1},
 "anyOf_empty": {"anyOf":[]},
 "type_empty": {"type":[]},
 "ref_missing": {"$ref":"#/$defs/missing"},
 "ref_root": {"type":"object","properties":{"a":{"$ref":"#"}}},
 "bad_pattern": {"type":"string","pattern":"["},
 "multipleOf0": {"type":"integer","multipleOf":0},
 "nested_enum_empty": {"type":"object","properties":{"a":{"enum":[]}},"required":["a"]},
 "items_false_min": {"type":"array","items":False,"minItems":1},
 "const_obj": {"const": {"a": [1, "x"]}},
 "int_excl": {"type":"integer","exclusiveMinimum":1,"exclusiveMaximum":2},
 "num_excl": {"type":"number","minimum":1,"maximum":1},
 "prefix_items": {"type":"array","prefixItems":[{"type":"integer"}],"items":False,"minItems":2},
}
for name, s in cases.items():
    t = time.time()
    try:
        check_schema(json.dumps(s))
        stage = "check ok"
    except Exception as e:
        stage = f"check: {type(e).__name__}: {str(e)[:80]}"
    try:
        o = run(eng, {"r": (prompt, SamplingParams(max_tokens=30, temperature=0.0, json_schema=json.dumps(s)))})["r"]
        r = f"ran: {o['reason']} {o['text']!r}"
    except AdmissionError as e:
        r = f"400 {e.field}: {str(e)[:90]}"
    except Exception as e:
        r = f"{type(e).__name__}: {str(e)[:90]}"
    print(f"{name}: {time.time()-t:.2f}s [{stage}] {r}", flush=True)
print("guides", eng._guides)
