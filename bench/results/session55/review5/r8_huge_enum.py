"""A huge enum in a json_schema (or a strict tool's argument) has no bound: the edge's check (check_schema, a parse
without the vocabulary) passes in milliseconds, then the engine's compile against the vocabulary grows superlinearly
with the enum's size -- seconds at a few thousand values on the tiny model's 6144-token vocabulary (GLM-5's is ~25x
larger), ~27 s at 20000 values, minutes at 100000 -- with no 400 and no way to stop it (a client that leaves only aborts
the request once the compile is done). Expected: a clear 400 naming the field past a size bound, or a compile bounded
in time."""
import json
import time

from common import check, done, engine

from cluster.guided import check_schema, schema_of


def main():
    eng, tok = engine()
    for n in (1000, 4000, 8000):
        schema = {"type": "object", "properties": {"code": {"enum": [f"option value {i}" for i in range(n)]}},
                  "required": ["code"]}
        t = time.perf_counter()
        try:                            # (session 55: the edge refuses past MAX_ENUM_VALUES, a 400)
            text = schema_of({"type": "json_schema", "json_schema": {"name": "x", "schema": schema}})   # the edge
            check_schema(text)
        except ValueError as e:
            print(f"   enum of {n}: refused at the edge: {e}")
            continue
        edge = time.perf_counter() - t
        t = time.perf_counter()
        try:
            eng._guide(tok.encode("hi"), __import__("scheduler.request", fromlist=["SamplingParams"]).SamplingParams(
                max_tokens=8, json_schema=text))
            what = "admitted"
        except Exception as e:      # noqa: BLE001
            what = f"refused: {e}"
        took = time.perf_counter() - t
        print(f"   enum of {n}: edge check {edge * 1000:.0f} ms, engine compile {took:.2f} s, {what}", flush=True)
        if n == 8000:
            check(what != "admitted" or took < 2.0,
                  f"an {n}-value enum is refused or compiles within 2 s (took {took:.1f} s, {what})")
    done()


if __name__ == "__main__":
    main()
