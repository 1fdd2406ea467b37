"""r6 (risk, outside the prefix cache): compiled structured-output grammars are cached per replica by their schema
text alone (cluster/guided.py ``Guides._compiled`` / ``check_schema``: functools.lru_cache), not by cache_salt — so the
time a request with a json_schema takes to be admitted tells whether any tenant used that exact schema recently. This
script measures it: the admission of a schema compiled before (by 'tenant A') vs a fresh one of the same size, for
'tenant B' with another salt. It exits 1 when the cached schema is admitted measurably faster (the side channel)."""
import json
import statistics
import time

from common import SamplingParams, engine, ids

eng = engine(kv_tokens=1024, max_len=256)


def schema(tag: str) -> str:
    props = {f"{tag}_field_{i}": {"type": "string", "enum": [f"{tag}-secret-{i}-{j}" for j in range(8)]}
             for i in range(12)}
    return json.dumps({"type": "object", "properties": props, "required": list(props)})


def admit(s: str, salt: str, rid: str) -> float:
    t = time.perf_counter()
    eng.add_request(ids(20, 1), SamplingParams(max_tokens=1, json_schema=s, cache_salt=salt), rid)
    dt = time.perf_counter() - t
    eng.abort(rid)
    return dt


fresh, seen = [], []
for k in range(8):
    s_a = schema(f"a{k}")
    admit(s_a, "tenant-A", f"a{k}")                     # tenant A's request compiles it
    seen.append(admit(s_a, "tenant-B", f"b{k}"))        # tenant B probes A's schema
    fresh.append(admit(schema(f"x{k}"), "tenant-B", f"x{k}"))   # and one nobody used
mf, ms = statistics.median(fresh), statistics.median(seen)
print(f"admission of a fresh schema: median {mf * 1e3:.2f} ms; of the schema tenant A used: {ms * 1e3:.2f} ms "
      f"({mf / ms:.1f}x)")
leak = ms * 2 < mf and max(seen) < min(fresh)
print("FAIL the compiled-grammar cache tells tenant B which schema tenant A used" if leak else "ok   no difference")
raise SystemExit(1 if leak else 0)
