"""A prefill replica whose ``KVDepot`` actor has died (it holds every staged bundle in host memory, so it is the
process Ray's memory monitor is likeliest to kill; or any crash) keeps the dead handle for good
(``Coordinator._depot`` is made once, ``new_depot`` only where it is None): from then on every prompt it computes
fails at ``stage_bundle`` — after the prefill's whole work — the decode replica logs a failed prefill, pauses the tier
for ``PREFILL_PAUSE_S`` and computes the prompt again itself, and after each pause the next prompt pays the same
double computation. The prefill replica's health check still passes (``check_health`` looks only at its engine), so
Serve never replaces it: disaggregation is off for the replica's life, silently but for the log.

Real Serve app (1 prefill + 1 decode replica): a request through both tiers; the depot killed; then two requests
``PREFILL_PAUSE_S`` apart; then Serve's view of the prefill replica after a health-check period.
Exit 1 while the prefill replica stays healthy with a dead depot and no prompt's KV moves again; 0 once it makes a
new depot (KV moves again) or is found unhealthy and replaced."""

from __future__ import annotations

import sys
import time

sys.path.insert(0, "/work/main/bench/results/session59/review_disagg")
from serve_common import MODEL, STORY, deploy, post, start_ray, stop_ray  # noqa: E402

from cluster.config import DEFAULT_MODEL  # noqa: E402
from cluster.coordinator import PREFILL_PAUSE_S  # noqa: E402

ENGINE = {"model": DEFAULT_MODEL, "served_model_name": MODEL, "device": "cpu", "kv_cache_tokens": 4096,
          "max_model_len": 1024}


def main() -> int:
    import ray
    from ray import serve

    from cluster.local import load_tokenizer
    from scheduler.request import SamplingParams

    tk = load_tokenizer(DEFAULT_MODEL)
    url = start_ray()
    bad = True
    try:
        deploy({**ENGINE, "prefill": {"num_replicas": 1}}, "depot", "/dp")
        u = url + "/dp"
        pre = serve.get_deployment_handle("PrefillCoordinator", "depot")
        dec = serve.get_deployment_handle("Coordinator", "depot")

        def stats():
            p, d = pre.info.remote().result()["stats"], dec.info.remote().result()["stats"]
            return p["kv_exported_tokens"], d["kv_imported_tokens"]

        def ask(tag):
            status, out = post(u, "/v1/completions", {"model": MODEL, "prompt": f"[{tag}] " + STORY * 5,
                                                      "max_tokens": 6, "temperature": 0})
            return status, stats()
        print("first request:", ask("first"), "(exported, imported)")
        items = list(pre.options(stream=True).prefill.remote(tk.encode("[probe] " + STORY * 3),
                                                             SamplingParams(max_tokens=1), "probe", 0))
        depot, key = items[-1].bundle
        ray.get(depot.take.remote(key))
        ray.kill(depot, no_restart=True)
        time.sleep(1.0)
        print("the prefill replica's KVDepot actor killed")
        a = ask("after 1")
        print("request after:", a)
        time.sleep(PREFILL_PAUSE_S + 1)
        b = ask("after 2")
        print(f"request {PREFILL_PAUSE_S + 1:.0f} s later:", b)
        time.sleep(12)              # a health-check period (10 s) and more
        st = serve.status().applications["depot"].deployments["PrefillCoordinator"]
        replicas = [a for a in ray.util.list_named_actors(all_namespaces=True) if "PrefillCoordinator" in a["name"]]
        c = ask("after 3")
        print(f"Serve's view of PrefillCoordinator 12 s later: {st.status.value}, replicas "
              f"{[r['name'].rsplit('#', 1)[-1] for r in replicas]}; a request then: {c}")
        moved_again = c[1][1] > b[1][1] or b[1][1] > a[1][1]
        computed_twice = b[1][0] > a[1][0] or a[1][0] > 0
        print(f"KV moved again after the depot died: {moved_again}; prompts still computed on the prefill replica "
              f"(exported grew) and again on the decode replica: {computed_twice}")
        bad = not moved_again and st.status.value == "HEALTHY"
        serve.delete("depot")
    finally:
        stop_ray()
    print("RESULT:", "DEFECT: a prefill replica with a dead KVDepot stays healthy and never moves KV again" if bad
          else "ok")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
