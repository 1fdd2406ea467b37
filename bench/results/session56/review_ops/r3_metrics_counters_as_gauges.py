"""r3: /metrics exports running totals ("so far": prompt tokens admitted, preemptions, prefix-cache tokens looked up
and hit, steps, spec drafts ...) as Prometheus *gauges* without a _total suffix (cluster/coordinator.py:73-114),
while the README lists `glmserve_prompt_tokens` beside `glmserve_generated_tokens`, which is a counter exposed as
`glmserve_generated_tokens_total` (a query for the documented name finds nothing).

Starts `glmserve serve --port 8414`, sends one request, scrapes /metrics, stops it. Exit 1 when a monotonic total is
typed gauge or a documented name has no series; 0 otherwise.
"""
import re
import signal
import sys

sys.path.insert(0, __import__("os").path.dirname(__file__))
from common import Server, done, http  # noqa: E402

TOTALS = ["glmserve_prompt_tokens", "glmserve_preemptions", "glmserve_prefix_cache_queried_tokens",
          "glmserve_prefix_cache_hit_tokens", "glmserve_prefix_cache_host_loads", "glmserve_steps",
          "glmserve_graph_steps", "glmserve_step_seconds", "glmserve_rank_moves", "glmserve_spec_drafts_proposed",
          "glmserve_spec_drafts_accepted", "glmserve_kv_exported_tokens", "glmserve_kv_imported_tokens"]
DOCUMENTED = ["glmserve_prompt_tokens", "glmserve_generated_tokens", "glmserve_queue_depth", "glmserve_kv_usage"]
s = Server(["--port", "8414", "--stats-interval", "0"], "/tmp/r3_serve.log")
try:
    if not s.wait_for(r"ready in", 180):
        print(s.text()[-3000:])
        sys.exit(2)
    print(http("POST", "http://127.0.0.1:8414/v1/completions", {"model": "tiny", "prompt": "The old man said",
                                                                 "max_tokens": 8})[0])
    code, text = http("GET", "http://127.0.0.1:8414/metrics")
finally:
    s.kill_all()
types = dict(re.findall(r"^# TYPE (\S+) (\S+)$", text, re.M))
samples = {m.split("{")[0] for m in re.findall(r"^(glmserve_[^\s]+)", text, re.M)}
bad = [f"{n} ({types.get(n)}): {re.search(rf'^# HELP {n} (.*)$', text, re.M).group(1)}" for n in TOTALS
       if types.get(n) == "gauge"]
missing = [n for n in DOCUMENTED if n not in samples]
for b in bad:
    print("running total typed gauge:", b)
for m in missing:
    print("documented name with no series:", m, "| present instead:",
          sorted(x for x in samples if x.startswith(m) and not x.endswith("_created")))
done(not bad and not missing, f"{len(bad)} running totals exported as gauges; documented names missing: {missing}")
