"""r5: EngineConfig fields that deploy/README.md tells an operator to set have no `glmserve serve` flag, so the
one-command server (and the systemd unit built on it) cannot set them: step_timeout_s (the 8xH200 file sets 120),
cuda_graphs ("`cuda_graphs: eager` ... for debugging a suspected capture problem"), lm_head_split ("if your NVLink
phases cost more ... `lm_head_split: false`"), piece_graphs, block_size. (log_stats_interval_s has --stats-interval.)

Static: compares EngineConfig's fields with `glmserve serve --help`. Exit 1 when a field has no flag; 0 otherwise.
"""
import os
import subprocess
import sys
from dataclasses import fields

REPO = os.environ.get("REPO", "/work/main")
PY = os.environ.get("PY", "/work/main/.venv/bin/python")
sys.path.insert(0, REPO)
from cluster.config import EngineConfig  # noqa: E402

help_text = subprocess.run([PY, "-m", "cluster.cli", "serve", "--help"], capture_output=True, text=True,
                           env={**os.environ, "PYTHONPATH": REPO}, cwd="/tmp").stdout
aliases = {"log_stats_interval_s": "--stats-interval", "prefix_caching": "--no-prefix-caching"}
missing = [f.name for f in fields(EngineConfig)
           if aliases.get(f.name, "--" + f.name.replace("_", "-")) not in help_text]
readme = open(os.path.join(REPO, "deploy", "README.md")).read()
for name in missing:
    print(f"no flag for {name} (default {getattr(EngineConfig(), name)!r}; named in deploy/README.md: "
          f"{name in readme})")
print("ok" if not missing else f"PRESENT: {len(missing)} engine fields cannot be set by `glmserve serve`")
sys.exit(1 if missing else 0)
