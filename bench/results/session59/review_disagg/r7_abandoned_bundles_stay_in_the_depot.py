"""A bundle staged in a prefill replica's ``KVDepot`` whose decode replica never takes it — its client went away
between the prefill's end and the take (the decode replica's ``_prefilled`` is cancelled while the prefill replica
stages the rows or their result is on its way; ``Coordinator.prefill`` cannot unstage: ``stage_bundle``'s put has
been submitted) — stays in the depot (host memory of the prefill node, its object-store copy pinned) for ``ttl_s``
= ``FETCH_TIMEOUT_S`` (120 s) at least, and past that until some later bundle is staged: ``KVDepot`` drops expired
items only inside ``put``. The docstring says "one not taken within ``ttl_s`` (its request gone) is dropped".

Part A (real Ray Serve app, 1 prefill replica): three prompts prefilled through the ``PrefillCoordinator`` handle as a
decode replica calls it (``options(stream=True).prefill.remote``), their results read and never taken — as when the
decode replica's request is cancelled at that point. The depot then holds 3 bundles and their bytes, with the tiers
idle. Part B (the ``KVDepot`` class as the actor runs it, ``ttl_s`` = 0.2 s): a bundle put and never taken is still
held 1 s later — no later put came.

Exit 1 while an abandoned bundle outlives its ttl without a later put; 0 once expiry does not wait for a put."""

from __future__ import annotations

import sys
import time

sys.path.insert(0, "/work/main/bench/results/session59/review_disagg")
from serve_common import MODEL, STORY, deploy, start_ray, stop_ray  # noqa: E402

from cluster.config import DEFAULT_MODEL  # noqa: E402

ENGINE = {"model": DEFAULT_MODEL, "served_model_name": MODEL, "device": "cpu", "kv_cache_tokens": 4096,
          "max_model_len": 1024}


def part_a() -> tuple[int, int]:
    import ray
    from ray import serve

    from cluster.local import load_tokenizer
    from scheduler.request import SamplingParams

    tk = load_tokenizer(DEFAULT_MODEL)
    start_ray()
    try:
        deploy({**ENGINE, "prefill": {"num_replicas": 1}}, "depot", "/depot")
        h = serve.get_deployment_handle("PrefillCoordinator", "depot")
        depot = None
        for i in range(3):
            ids = tk.encode(f"[abandoned {i}] " + STORY * 6)
            items = list(h.options(stream=True).prefill.remote(ids, SamplingParams(max_tokens=8), f"gone{i}", 0))
            depot, key = items[-1].bundle             # where the rows wait; never taken
        time.sleep(2.0)
        held = ray.get(depot.__ray_call__.remote(
            lambda self: (len(self.items), sum(r.nbytes for _, b in self.items.values() for r in b.rows))))
        print(f"A: the prefill replica's depot holds {held[0]} abandoned bundles, {held[1] / 1e6:.2f} MB of rows, "
              f"ttl {ray.get(depot.__ray_call__.remote(lambda self: self.ttl_s))} s (the tiny model: 3.6 KiB a token; "
              "GLM-5.2 in FP8: ~55 KB a token)")
        serve.delete("depot")
    finally:
        stop_ray()
    return held


def part_b() -> bool:
    import numpy as np

    from cluster.disagg import KVBundle, KVDepot

    d = KVDepot(ttl_s=0.2)
    d.put("k", KVBundle((1, 2, 3), ((4, "uint8"),), False, (np.zeros((2, 4), np.uint8),)))
    time.sleep(1.0)
    kept = "k" in d.items
    print(f"B: KVDepot(ttl_s=0.2): 1.0 s after its put, with no later put, the untaken bundle is "
          f"{'still held' if kept else 'dropped'}")
    return kept


def main() -> int:
    held = part_a()
    kept = part_b()
    bad = kept
    print("RESULT:", "DEFECT: abandoned bundles stay in the depot past their ttl until another bundle is staged"
          if bad else "ok")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
