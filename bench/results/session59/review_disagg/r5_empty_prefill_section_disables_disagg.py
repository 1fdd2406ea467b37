"""A deploy file's ``prefill:`` section left empty (its fields commented out, e.g. to take the defaults) is YAML null:
``build_app`` then builds no ``PrefillCoordinator`` at all — disaggregated prefill silently off — while ``prefill: {}``
and ``prefill: true`` build one with the defaults, and ``cluster/disagg.py``'s ``prefill_plan`` itself takes None as
the defaults (``if spec is True or spec is None: spec = {}``).

Builds the Serve application graph offline (no Ray cluster) for each form and lists its deployments.
Exit 1 while an empty ``prefill:`` section builds no prefill deployment and raises nothing; 0 once it either builds
the defaults (as ``prefill_plan`` reads None) or is refused with an error naming ``prefill``."""

from __future__ import annotations

import os
import sys

os.environ.setdefault("RAY_AUTH_MODE", "disabled")
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
sys.path.insert(0, "/work/main")

import yaml  # noqa: E402

from cluster.serve import build_app  # noqa: E402


def deployments(app) -> list[str]:
    out = []

    def walk(a):
        bd = a._bound_deployment
        out.append(bd.name)
        for x in (*bd.init_args, *bd.init_kwargs.values()):
            if hasattr(x, "_bound_deployment"):
                walk(x)
    walk(app)
    return out


def main() -> int:
    doc = """
applications:
  - name: glm5
    import_path: cluster.serve:build_app
    args:
      device: cpu
      prefix_caching: true
      prefill:
        # num_replicas: 2           # (the defaults: one replica)
        # min_prompt_tokens: 2048
"""
    args = yaml.safe_load(doc)["applications"][0]["args"]
    print("the deploy file's args as Serve passes them:", args)
    results = {}
    for label, spec in (("prefill: {num_replicas: 1}", {"num_replicas": 1}), ("prefill: {}", {}),
                        ("prefill: true", True), ("prefill: (empty section)", args["prefill"])):
        try:
            results[label] = deployments(build_app({**args, "prefill": spec}))
        except Exception as e:  # noqa: BLE001
            results[label] = f"refused: {type(e).__name__}: {e}"
        print(f"{label:28s} -> {results[label]}")
    from cluster.config import EngineConfig
    from cluster.disagg import prefill_plan
    plan = prefill_plan(EngineConfig(device="cpu").to_dict(), None)
    print("prefill_plan(decode, None) ->", {"deployment": plan.deployment, "min_prompt_tokens": plan.min_prompt_tokens})
    empty = results["prefill: (empty section)"]
    silent = isinstance(empty, list) and "PrefillCoordinator" not in empty
    print("RESULT:", "DEFECT: an empty prefill: section silently builds an app without prefill replicas" if silent
          else "ok")
    return 1 if silent else 0


if __name__ == "__main__":
    sys.exit(main())
