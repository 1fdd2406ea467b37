"""Check 1 (passes today): every Serve config in deploy/ validates against Ray Serve's own schema and its app builds
through the project's loader, cluster.serve:build_app (EngineConfig.from_dict, prefill_plan, the deployments). No Ray
cluster is started. Exit 1 if any file is rejected."""
import sys
from pathlib import Path

import yaml
from ray.serve.schema import ServeDeploySchema

from cluster.serve import build_app

root = Path(__file__).resolve().parents[4]
d = root / "deploy"
confs = {f: yaml.safe_load((d / f).read_text()) for f in ("tiny.yaml", "glm5-8xh200.yaml", "glm5-pd-8xh200.yaml")}
confs["kuberay-rayservice.yaml (serveConfigV2)"] = yaml.safe_load(
    yaml.safe_load((d / "kuberay-rayservice.yaml").read_text())["spec"]["serveConfigV2"])
bad = 0
for name, conf in confs.items():
    try:
        ServeDeploySchema.model_validate(conf) if hasattr(ServeDeploySchema, "model_validate") else \
            ServeDeploySchema.parse_obj(conf)
        for app in conf["applications"]:
            build_app(app["args"])
        print(f"ok     {name}")
    except Exception as e:        # noqa: BLE001
        bad += 1
        print(f"WRONG  {name}: {type(e).__name__}: {e}")
sys.exit(1 if bad else 0)
