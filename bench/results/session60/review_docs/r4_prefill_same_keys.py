"""deploy/README.md:238 ("Rules ... `model`, `dtype` and `kv_cache_dtype` equal on both sides") and
deploy/glm5-pd-8xh200.yaml:5 ("model, dtype and kv_cache_dtype must be the same") omit load_format, which
cluster/disagg.py:369 (SAME_KEYS) also requires equal: prefill_plan refuses a prefill section that changes it.
Exit 1 while a key the code requires equal is missing from either doc."""
import sys
from pathlib import Path

from cluster.config import EngineConfig
from cluster.disagg import SAME_KEYS, prefill_plan

root = Path(__file__).resolve().parents[4]
readme = next(l for l in (root / "deploy/README.md").read_text().splitlines() if l.startswith("- Rules (checked"))
yml = next(l for l in (root / "deploy/glm5-pd-8xh200.yaml").read_text().splitlines() if "must be the same" in l)
try:
    prefill_plan(EngineConfig(device="cpu").to_dict(), {"load_format": "dummy"})
    refused = None
except ValueError as e:
    refused = str(e)
print("SAME_KEYS:", SAME_KEYS, "(+ dtype)")
print("prefill load_format dummy under auto ->", refused)
bad = [(doc, k) for doc, text in (("deploy/README.md", readme), ("glm5-pd-8xh200.yaml", yml))
       for k in SAME_KEYS if k not in text]
for doc, k in bad:
    print(f"WRONG: {doc} does not name {k}, which must be equal on both sides")
sys.exit(1 if bad else 0)
