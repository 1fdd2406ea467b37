"""json_schema outputs across decoding modes: every emitted token is one a fresh xgrammar matcher allows (after the
reasoning, where a thinking budget closes it), every "stop" output parses and validates (jsonschema), guides dropped.
Modes: plain greedy / seeded / unseeded, batched beside others, MTP k=2 and k=3 (solo), eager look-ahead, thinking
budget before the schema, cut by max_tokens."""
import json

import jsonschema
from common import SamplingParams, check, done, engine, replay, run

SCHEMAS = {
    "person": {"type": "object", "required": ["name", "age"],
               "properties": {"name": {"type": "string", "maxLength": 40}, "age": {"type": "integer"},
                              "tags": {"type": "array", "items": {"type": "string", "maxLength": 12}, "maxItems": 2}}},
    "rich": {"type": "object", "additionalProperties": False,
             "required": ["kind", "n", "ok", "inner", "list"],
             "properties": {"kind": {"enum": ["a", "b\"q", "c\n", "é"]}, "n": {"type": "number", "minimum": 0},
                            "ok": {"type": "boolean"}, "nul": {"type": "null"},
                            "inner": {"type": "object", "required": ["x"], "additionalProperties": False,
                                      "properties": {"x": {"type": "integer", "minimum": -5, "maximum": 5},
                                                     "y": {"anyOf": [{"type": "string", "maxLength": 5},
                                                                     {"type": "integer"}]}}},
                            "list": {"type": "array", "items": {"type": "integer"}, "minItems": 1, "maxItems": 3}}},
    "object": {"type": "object"},
    "top_array": {"type": "array", "items": {"type": "string", "maxLength": 6}, "minItems": 2, "maxItems": 2},
    "const": {"type": "object", "properties": {"v": {"const": 3}}, "required": ["v"]},
}


def verify(eng, tok, tag, prompt, schema_name, params, o, think=False):
    schema = json.dumps(SCHEMAS[schema_name])
    compiled = eng.guides._compiler.compile_json_schema(schema)     # fresh compile, unbounded whitespace
    ids = o["ids"]
    end = tok.special_ids_by_token()["</think>"]
    bad, term = replay(eng, compiled, ids, skip_until=end if think else None)
    ok = check(bad == -1 and o["error"] is None,
               f"{tag}/{schema_name}: {len(ids)} tokens, all allowed ({'' if bad == -1 else f'token {bad} = {ids[bad]} rejected'}), reason {o['reason']}")
    if think:
        ok &= check(end in ids and (params.thinking_budget is None or ids.index(end) <= params.thinking_budget),
                    f"{tag}/{schema_name}: </think> at {ids.index(end) if end in ids else None} (budget {params.thinking_budget})")
    if o["reason"] == "stop":
        answer = tok.decode(ids[ids.index(end) + 1:] if think else ids, skip_special_tokens=True)
        try:
            jsonschema.validate(json.loads(answer), SCHEMAS[schema_name])
            check(True, f"{tag}/{schema_name}: stop output validates: {answer[:70]!r}")
        except Exception as e:      # noqa: BLE001
            check(False, f"{tag}/{schema_name}: stop output {answer!r} invalid: {str(e)[:120]}")
    return ok


def main():
    plain, tok = engine()
    chat = tok.encode_chat([{"role": "user", "content": "Some JSON please."}], enable_thinking=False)
    think = tok.encode_chat([{"role": "user", "content": "Some JSON please."}])
    assert think[-1] == tok.special_ids_by_token()["<think>"]
    base = [("greedy", dict(temperature=0.0)), ("seeded", dict(temperature=1.0, seed=11)),
            ("seeded2", dict(temperature=1.3, top_p=0.95, seed=5, presence_penalty=0.5)),
            ("free", dict(temperature=1.0)), ("topk", dict(temperature=0.8, top_k=20, seed=2))]
    # batched: every schema x mode together
    reqs = {f"{m}/{s}": (chat, SamplingParams(max_tokens=150, json_schema=json.dumps(SCHEMAS[s]), **kw))
            for m, kw in base for s in SCHEMAS}
    reqs["short/person"] = (chat, SamplingParams(max_tokens=4, temperature=0.0, json_schema=json.dumps(SCHEMAS["person"])))
    out = run(plain, reqs)
    for rid, (p, params) in reqs.items():
        verify(plain, tok, "batched-" + rid.split("/")[0], p, rid.split("/")[1], params, out[rid])
    check(out["short/person"]["reason"] == "length", "max_tokens=4 cut: reason length")
    check(not plain._guides, "plain engine: guides dropped")
    n_stop = sum(o["reason"] == "stop" for o in out.values())
    print(f"   ({n_stop} of {len(out)} batched requests finished with stop)")
    # thinking budget before the schema (plain, batched)
    treqs = {f"b{b}-{m}/{s}": (think, SamplingParams(max_tokens=150, thinking_budget=b, json_schema=json.dumps(SCHEMAS[s]), **kw))
             for b in (0, 3, 9) for m, kw in base[:3] for s in ("person", "rich")}
    tout = run(plain, treqs)
    for rid, (p, params) in treqs.items():
        verify(plain, tok, "think-" + rid.split("/")[0], p, rid.split("/")[1], params, tout[rid], think=True)
    check(not plain._guides, "plain engine after budgets: guides dropped")
    # MTP k=2 / 3 and eager look-ahead: each request alone (drafts ride only solo); equal to plain for greedy/seeded
    for kw in ({"speculative_tokens": 2}, {"speculative_tokens": 3}, {"cuda_graphs": "eager"}):
        eng, _ = engine(**kw)
        tag = ",".join(f"{k}={v}" for k, v in kw.items())
        for rid in [r for r in reqs if r.split("/")[0] in ("greedy", "seeded2", "free", "short")
                    and r.split("/")[1] in ("person", "rich", "top_array")] + \
                   [r for r in treqs if r.startswith(("b3-greedy", "b9-seeded/"))]:
            p, params = reqs.get(rid) or treqs[rid]
            o = run(eng, {rid: (p, params)})[rid]
            verify(eng, tok, f"{tag} {rid.split('/')[0]}", p, rid.split("/")[1], params, o, think=rid.startswith("b"))
            if not rid.startswith("free"):
                want = (out.get(rid) or tout.get(rid))
                check(o["ids"] == want["ids"], f"{tag} {rid}: same tokens as the plain engine")
        check(not eng._guides, f"{tag}: guides dropped")
        print(f"   {tag} stats: drafts {eng.stats['drafts_proposed']}/{eng.stats['drafts_accepted']} ahead {eng.stats['ahead_steps']}")
    done()


if __name__ == "__main__":
    main()
