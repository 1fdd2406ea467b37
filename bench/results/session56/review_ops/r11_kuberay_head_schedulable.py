"""r11 (risk): deploy/kuberay-rayservice.yaml gives the head 8 CPUs schedulable by Ray (rayStartParams has no
num-cpus: "0") while the Coordinator asks for num_cpus 1 and nothing pins it to a GPU node; only its 8 worker ranks
are placed (STRICT_PACK placement group, cluster/workers.py:320-336). A Coordinator replica placed on the CPU head
pod sends every step to its ranks over the pod network (step_channel socket), and up to 4 replicas plus 2 ingress
replicas share the head's 8 CPUs. (cluster/workers.py:67-70 already expects a coordinator "on a node without any
[GPU] (a KubeRay head)".)

Static. Exit 1 when the head is schedulable for CPU work and the Coordinator is not pinned (custom resource /
node label / num_cpus 0 head); 0 otherwise.
"""
import os
import sys

import yaml

REPO = os.environ.get("REPO", "/work/main")
k = yaml.safe_load(open(os.path.join(REPO, "deploy", "kuberay-rayservice.yaml")))
head = k["spec"]["rayClusterConfig"]["headGroupSpec"]["rayStartParams"]
serve_cfg = yaml.safe_load(k["spec"]["serveConfigV2"])
coord = next(d for d in serve_cfg["applications"][0]["deployments"] if d["name"] == "Coordinator")
opts = coord.get("ray_actor_options", {})
head_cpus = str(head.get("num-cpus", "from the container's limit"))
pinned = bool(opts.get("resources")) or bool(opts.get("label_selector"))
print(f"head rayStartParams: {head}; Coordinator ray_actor_options: {opts}")
risk = head_cpus != "0" and opts.get("num_cpus", 0) > 0 and not pinned
print("ok" if not risk else "PRESENT: Coordinator replicas may be scheduled on the CPU-only head, away from their GPUs")
sys.exit(1 if risk else 0)
