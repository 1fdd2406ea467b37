import json, _s
from _s import *
from tests.integration.test_engine import PERSON
t = tok()
schema = json.dumps(PERSON)
small = '{"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}'
prompt = t.encode_chat([{"role": "user", "content": "A person as JSON."}], enable_thinking=False)
for sch in (small, schema):
  for ie in (False, True):
    for seed in (None, 5):
        params = SamplingParams(max_tokens=60, temperature=0.0 if seed is None else 0.9, seed=seed, json_schema=sch, ignore_eos=ie, logprobs=2)
        res = {}
        for k in (0, 1, 3):
            e = make_engine(k=k)
            o = collect(e, {"r": (prompt, params)})["r"]
            res[k] = o
        print(len(sch), ie, seed, [ (res[k]["reason"], len(res[k]["tokens"])) for k in res], repr(res[0]["text"][-40:]))
        for k in (1, 3):
            if res[k]["tokens"] != res[0]["tokens"]:
                i = next((i for i,(a,b) in enumerate(zip(res[k]["tokens"],res[0]["tokens"])) if a!=b), None)
                print("   DIFF k", k, "at", i, res[0]["tokens"][i-2:i+5] if i else None, res[k]["tokens"][i-2:i+5] if i else None, repr(res[k]["text"][-60:]))
