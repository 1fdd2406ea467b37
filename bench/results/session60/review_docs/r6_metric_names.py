"""Every `glmserve_*` metric deploy/README.md names must be a series /metrics exposes (a `*` name: a prefix of one);
prints the exposed families no doc names (README.md, deploy/README.md). deploy/README.md:247 names
`glmserve_kv_transfer_lost`, exposed as `glmserve_kv_transfer_lost_total` (cluster/coordinator.py:73, a prometheus
Counter). Builds a CPU engine on the embedded tiny model (~5 s). Exit 1 while a documented name is not exposed."""
import re
import sys
from pathlib import Path

from cluster.config import EngineConfig
from cluster.coordinator import Metrics
from cluster.local import build_local_engine

root = Path(__file__).resolve().parents[4]
engine, _ = build_local_engine(EngineConfig(device="cpu", kv_cache_tokens=1024))
from cluster.metrics_hub import _http_counts, http_text

_http_counts()[0].labels("/v1/completions", "200").inc()      # the ingress's HTTP counter (cluster/metrics_hub.py)
text = Metrics(engine).text() + http_text()
series = {line.split("{")[0].split()[0] for line in text.splitlines() if line and not line.startswith("#")}
families = {l.split()[2] for l in text.splitlines() if l.startswith("# TYPE") and not l.split()[2].endswith("_created")}
docs = {p: (root / p).read_text() for p in ("deploy/README.md", "README.md")}
bad = []
for path, doc in docs.items():
    for i, line in enumerate(doc.splitlines(), 1):
        for name in re.findall(r"`(glmserve_[a-z_]+\*?)(?:\{[^}`]*\})?`", line):
            ok = any(s.startswith(name[:-1]) for s in series) if name.endswith("*") else (
                name in series or name in families or any(s.startswith(name + "_") for s in series if s.endswith(("_bucket", "_sum", "_count"))))
            if not ok:
                bad.append(f"{path}:{i}: `{name}` is not exposed" +
                           (f" (exposed: {name}_total)" if name + "_total" in series else ""))
named = " ".join(docs.values())
undocumented = sorted(f for f in families if f not in named and f.removesuffix("_total") not in named
                      and not f.startswith(("glmserve_prefix_cache_", "glmserve_spec_")))
print("families no doc names:", undocumented)
for b in bad:
    print("WRONG:", b)
sys.exit(1 if bad else 0)
