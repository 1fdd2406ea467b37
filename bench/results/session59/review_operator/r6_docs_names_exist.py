"""r6 (a check): every flag, engine field, endpoint and metric README.md and deploy/README.md name exists.

- `--flags`: in `glmserve serve|generate|run-batch|make-checkpoint --help` (or ray start's `--head --address
  --dashboard-host`, tools.eval_tiny's `--text`);
- `` `field: value` `` in backticks: an EngineConfig field (or Serve's `log_level`, the responses API's `include`,
  a request's `max_tokens`), and the value one the field takes;
- `/v1/...`, `/health`, `/metrics`, `/ping`, `/version`, `/tokenize`, `/detokenize`: a route of the ingress app with the
  method the docs use;
- `glmserve_*` metric names: series of a coordinator's /metrics text (built in-process on the tiny model, one request
  run) or the ingress's HTTP counter.
Exit 0 when all exist; 1 (listing them) otherwise."""
import re
import subprocess
import sys
from dataclasses import fields

import _common as c

DOCS = {p: open(f"{c.REPO}/{p}").read() for p in ("README.md", "deploy/README.md")}
TEXT = "\n".join(DOCS.values())
missing = []

# flags
helps = "".join(subprocess.run([f"{c.BIN}/glmserve", sub, "--help"], capture_output=True, text=True, env=c.cli_env()
                               ).stdout for sub in ("serve", "generate", "run-batch", "make-checkpoint"))
known_flags = set(re.findall(r"--[a-z][a-z0-9-]+", helps)) | {"--head", "--address", "--dashboard-host", "--text"}
flags = sorted(set(re.findall(r"(?<![\w-])--[a-z][a-z0-9-]+", TEXT)))
missing += [f"flag {f}" for f in flags if f not in known_flags]
print(f"{len(flags)} flags named; unknown: {[f for f in flags if f not in known_flags]}")

# engine fields with a value
from cluster.config import EngineConfig  # noqa: E402

names = {f.name for f in fields(EngineConfig)}
pairs = sorted(set(re.findall(r"`([a-z_]+): ([^`|]+?)`", TEXT)))
others = {"log_level", "include", "max_tokens"}
for name, value in pairs:
    if name in others:
        continue
    if name not in names:
        missing.append(f"field {name}")
        continue
    import yaml

    v = yaml.safe_load(value)
    if isinstance(v, str) and v.startswith("/"):
        continue        # a path
    try:
        EngineConfig.from_dict({name: v} | ({"device": "cuda"} if name == "prefill_activations" else {}))
    except ValueError as e:
        missing.append(f"value {name}: {value} ({e})")
print(f"{len(pairs)} `field: value` pairs checked")

# routes
# (the ingress's routes sit in Serve's class-based router: read from the decorators of cluster/*.py)
import glob  # noqa: E402

routes = {(m.upper(), p) for f in glob.glob(f"{c.REPO}/cluster/*.py")
          for m, p in re.findall(r'@app\.(get|post|put|delete)\("([^"]+)"', open(f).read())}
want = {("POST", "/v1/completions"), ("POST", "/v1/chat/completions"), ("GET", "/v1/models"), ("GET", "/health"),
        ("GET", "/metrics"), ("GET", "/ping"), ("GET", "/version"), ("POST", "/tokenize"), ("POST", "/detokenize"),
        ("POST", "/v1/responses"), ("POST", "/v1/messages"), ("POST", "/v1/messages/count_tokens")}
for path in sorted(set(re.findall(r"`(?:POST )?(/(?:v1/)?[a-z_/]+)`", TEXT))):
    if path in ("/models",):        # (deploy/README: "`/models` (a read-only PVC)" — the mount, not a route)
        continue
    if not any(p == path for _, p in routes):
        missing.append(f"route {path}")
missing += [f"route {m} {p}" for m, p in sorted(want - routes)]
print(f"routes: {sorted(p for _, p in routes if not p.startswith(('/docs', '/openapi', '/redoc')))}")

# metrics
from cluster.coordinator import Metrics  # noqa: E402
from cluster.engine import SamplingParams  # noqa: E402
from cluster.local import build_local_engine  # noqa: E402
from cluster.metrics_hub import _http_counts  # noqa: E402

engine, tok = build_local_engine(EngineConfig(device="cpu", kv_cache_tokens=2048), progress=False)
engine.add_request(tok.encode("The old man said"), SamplingParams(max_tokens=4), "r0")
while engine.has_unfinished():
    engine.step()
counter, registry = _http_counts()
counter.labels("/v1/completions", "200").inc()
from prometheus_client import generate_latest  # noqa: E402

text = Metrics(engine, "serve").text() + Metrics(engine, "decode").text() + generate_latest(registry).decode()
series = set(re.findall(r"^(glmserve_[a-z_]+)", text, re.M)) | set(re.findall(r"^# TYPE (glmserve_[a-z_]+)", text, re.M))
named = sorted(set(re.findall(r"glmserve_[a-z_]+", DOCS["deploy/README.md"] + DOCS["README.md"])))
for n in named:
    if n.endswith("_"):          # a family's prefix (`glmserve_prefix_cache_*`)
        ok = any(s.startswith(n) for s in series)
    else:
        ok = n in series or any(s.startswith(n + "_") or s == n + "_total" for s in series)
    if not ok:
        missing.append(f"metric {n}")
print(f"{len(named)} metric names named; the text holds {len(series)} series names")
print("missing:", missing or "none")
sys.exit(1 if missing else 0)
