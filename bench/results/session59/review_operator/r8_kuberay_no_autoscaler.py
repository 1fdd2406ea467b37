"""r8 (static; no Kubernetes here): deploy/kuberay-rayservice.yaml scales Coordinator replicas 1..4 (Serve's
autoscaling_config, each replica 8 GPUs of one node) and gives its GPU worker group minReplicas 1 / maxReplicas 4 — but
does not set `spec.rayClusterConfig.enableInTreeAutoscaling: true`. Without it KubeRay runs no Ray autoscaler: the
worker group stays at `replicas: 1` (KubeRay reads minReplicas / maxReplicas only for the autoscaler; docs.ray.io,
"KubeRay Autoscaling": "set enableInTreeAutoscaling: true" to run the autoscaler sidecar), so replicas 2..4 can
never get their 8 GPUs: each new Coordinator replica waits 300 s for its placement group, fails, and Serve retries.

Also checked here (right): the manifest parses, its rayStartParams values are strings (KubeRay's map[string]string),
its serveConfigV2 validates against Ray Serve's ServeDeploySchema and equals deploy/glm5-8xh200.yaml's application.

Exit 1 while the manifest asks Serve for more Coordinator replicas than its fixed worker nodes can hold and runs no
autoscaler; 0 once enableInTreeAutoscaling is true (or the replicas fit the fixed nodes)."""
import sys

import yaml

import _common as c

doc = yaml.safe_load(open(f"{c.REPO}/deploy/kuberay-rayservice.yaml"))
rc = doc["spec"]["rayClusterConfig"]
problems = []

# what is right
from ray.serve.schema import ServeDeploySchema  # noqa: E402

serve_cfg = yaml.safe_load(doc["spec"]["serveConfigV2"])
ServeDeploySchema.model_validate(serve_cfg) if hasattr(ServeDeploySchema, "model_validate") else \
    ServeDeploySchema.parse_obj(serve_cfg)
gpu = yaml.safe_load(open(f"{c.REPO}/deploy/glm5-8xh200.yaml"))
same = serve_cfg["applications"] == gpu["applications"]
print("serveConfigV2 validates (ServeDeploySchema); equals glm5-8xh200.yaml's applications:", same)
if not same:
    problems.append("serveConfigV2 differs from glm5-8xh200.yaml")
params = [rc["headGroupSpec"]["rayStartParams"]] + [g["rayStartParams"] for g in rc["workerGroupSpecs"]]
nonstr = [(k, v) for p in params for k, v in p.items() if not isinstance(v, str)]
print("rayStartParams values that are not strings:", nonstr)
problems += [f"rayStartParams {k} is {type(v).__name__}" for k, v in nonstr]

# the autoscaling
coord = next(d for d in serve_cfg["applications"][0]["deployments"] if d["name"] == "Coordinator")
want = (coord.get("autoscaling_config") or {}).get("max_replicas", coord.get("num_replicas", 1))
gpus_per_replica = serve_cfg["applications"][0]["args"]["num_workers"]
fixed = sum(int(g.get("replicas", 0)) * int(g["rayStartParams"].get("num-gpus", "0")) for g in rc["workerGroupSpecs"])
auto = rc.get("enableInTreeAutoscaling", False)
print(f"Coordinator replicas up to {want} x {gpus_per_replica} GPUs; worker groups: "
      f"{[(g['groupName'], g.get('replicas'), g.get('minReplicas'), g.get('maxReplicas')) for g in rc['workerGroupSpecs']]}"
      f" -> {fixed} GPUs without an autoscaler; enableInTreeAutoscaling: {rc.get('enableInTreeAutoscaling')}")
if want * gpus_per_replica > fixed and not auto:
    problems.append(f"Serve may scale to {want} replicas ({want * gpus_per_replica} GPUs) but without "
                    f"enableInTreeAutoscaling the cluster keeps {fixed} GPUs")
print("DEFECT:" if problems else "ok", problems)
sys.exit(1 if problems else 0)
