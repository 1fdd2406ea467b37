"""``Coordinator.abort(req_id)`` — what the ingress's ``close_streams`` (``glmserve serve``'s drain timeout: "end every
request still in flight ... rather than a connection cut mid-stream") sends for each open request — is lost for a
request of a disaggregated app whose prompt is still being computed on the prefill tier: the request is not yet in
the decode engine (``Engine.abort`` finds no rank for it), nothing marks it, and once its KV arrives it is admitted
and decodes to ``max_tokens``. On a plain replica the same abort ends the request at once (finish_reason abort).

Part A: the real Coordinators in-process (``harness.py``); the prompt is computed in 8-token chunks so that its
prefill lasts long enough to abort it. Part B: a real Serve app (1 prefill + 1 decode replica); a streamed request
whose prompt the prefill replica is computing when the ingress's ``close_streams`` runs (the drain's end): the stream
should end with the error event "the server shut down before the request finished"; it goes on to ``max_tokens``
instead (``glmserve serve`` then shuts Serve down under it: a connection cut mid-stream, what close_streams is for).

Exit 1 while the aborted request still decodes; 0 once it ends as aborted."""

from __future__ import annotations

import asyncio
import sys
import time

sys.path.insert(0, "/work/main/bench/results/session59/review_disagg")
from harness import DEFAULT_MODEL, collect, counters, make_pair, plain, shutdown, tokens  # noqa: E402

from cluster.local import load_tokenizer  # noqa: E402
from scheduler.request import SamplingParams  # noqa: E402

TK = load_tokenizer(DEFAULT_MODEL)
STORY = "Once upon a time, in a quiet village by the sea, there lived a fisherman and his wife. "
PARAMS = SamplingParams(max_tokens=60, temperature=0.0, ignore_eos=True)
SLOW = {"max_num_batched_tokens": 8, "max_num_seqs": 4}


async def abort_while_computing(coord, computing, rid):
    ids = TK.encode("[abort me] " + STORY * 9)
    task = asyncio.ensure_future(collect(coord, ids, PARAMS, rid))
    t0 = time.monotonic()
    while not computing() and time.monotonic() - t0 < 30:
        await asyncio.sleep(0.01)
    at = time.monotonic() - t0
    await coord.abort(rid)                  # as the ingress's close_streams does
    evs = await asyncio.wait_for(task, 120)
    return len(ids), at, evs


def part_b() -> bool:
    import json
    import threading
    import urllib.request

    from ray import serve

    from serve_common import MODEL, deploy, start_ray, stop_ray

    url = start_ray()
    try:
        deploy({"model": DEFAULT_MODEL, "served_model_name": MODEL, "device": "cpu", "kv_cache_tokens": 4096,
                "max_model_len": 1024, "prefill": {"num_replicas": 1, **SLOW}}, "drain", "/drain")
        body = {"model": MODEL, "prompt": "[drain] " + STORY * 9, "max_tokens": 200, "temperature": 0,
                "ignore_eos": True, "stream": True}
        got = {"events": []}

        def client():
            req = urllib.request.Request(url + "/drain/v1/completions", data=json.dumps(body).encode(),
                                         headers={"content-type": "application/json"})
            with urllib.request.urlopen(req, timeout=120) as r:
                for line in r:
                    line = line.decode().strip()
                    if line.startswith("data: ") and line != "data: [DONE]":
                        got["events"].append(json.loads(line[6:]))
        th = threading.Thread(target=client)
        th.start()
        pre = serve.get_deployment_handle("PrefillCoordinator", "drain")
        t0 = time.monotonic()
        while time.monotonic() - t0 < 30 and pre.info.remote().result()["running"] == 0:
            time.sleep(0.02)
        ended = serve.get_app_handle("drain").close_streams.remote().result(timeout_s=10)
        th.join(120)
        evs = got["events"]
        texts = "".join(c.get("text", "") for e in evs for c in e.get("choices", []))
        errors = [e["error"] for e in evs if "error" in e]
        finish = [c["finish_reason"] for e in evs for c in e.get("choices", []) if c.get("finish_reason")]
        print(f"B (Serve app): close_streams while the prefill replica computed the prompt: it ended {ended} "
              f"stream(s); the stream then carried {len(texts)} characters of text, finish {finish}, "
              f"error events {errors}")
        serve.delete("drain")
    finally:
        stop_ray()
    return not errors


def main() -> int:
    ref = plain(SLOW)
    n, at, evs = asyncio.run(abort_while_computing(
        ref, lambda: counters(ref)["running"] > 0 and ref.engine.stats["steps"] > 2, "p"))
    print(f"plain replica: a {n}-token prompt aborted {at:.2f} s in, while computed: ended "
          f"{evs[-1].finish_reason!r} after {len(tokens(evs))} tokens")
    plain_ok = evs[-1].finish_reason == "abort"
    shutdown(ref)

    dec, pre, tier = make_pair(prefill=SLOW)
    n, at, evs = asyncio.run(abort_while_computing(
        dec, lambda: counters(pre)["running"] > 0 and pre.engine.stats["steps"] > 2, "d"))
    print(f"disaggregated: the same prompt aborted {at:.2f} s in, while the prefill replica computed it: ended "
          f"{evs[-1].finish_reason!r} after {len(tokens(evs))} tokens; imported {dec.engine.stats['kv_imported_tokens']} "
          f"tokens of KV; decode {counters(dec)}, prefill {counters(pre)}")
    lost = evs[-1].finish_reason != "abort"
    shutdown(dec, pre)
    lost = part_b() or lost
    print("RESULT:", "DEFECT: an abort during the prefill phase is lost; the request decodes to max_tokens" if lost
          else "ok", "(plain replica aborted: %s)" % plain_ok)
    return 1 if lost else 0


if __name__ == "__main__":
    sys.exit(main())
