"""r4: an in-place update of the app (`serve deploy` of a changed file; here `serve.run` of changed args, the same
controller path) ends a streamed answer ~20 s after the update starts — Serve's default graceful_shutdown_timeout_s,
which neither build_app nor any deploy file sets (the systemd unit drains for 60 s, `glmserve serve` for 30). The same
timeout applies when the 8xH200 files' autoscaler removes a replica. Which replica dies first decides what the client
sees: here (the Coordinator first) an error event; in a `serve deploy` run by hand (the ingress first) curl got a
truncated chunked stream, exit 18, no error event and no [DONE].

Exit 1 while the stream in flight (800 tokens, ~100 s at this speed) is ended before its answer; 0 when it
finishes."""
import http.client
import json
import sys
import threading
import time
import urllib.request

import _common as c

ARGS = {"device": "cpu", "num_workers": 2, "kv_cache_tokens": 4096}


def stream(base: str, out: dict) -> None:
    body = {"model": "tiny", "prompt": "The old man said", "max_tokens": 800, "ignore_eos": True, "stream": True}
    req = urllib.request.Request(base + "/v1/completions", headers={"content-type": "application/json"},
                                 data=json.dumps(body).encode())
    out.update(events=0, done=False, error=None, finish=None, cut=None)
    try:
        with urllib.request.urlopen(req, timeout=300) as resp:
            for raw in resp:
                line = raw.decode().strip()
                if line == "data: [DONE]":
                    out["done"] = True
                elif line.startswith("data: "):
                    ev = json.loads(line[6:])
                    if "error" in ev:
                        out["error"] = ev["error"]
                    else:
                        out["events"] += 1
                        out["finish"] = ev["choices"][0].get("finish_reason") or out["finish"]
    except (http.client.IncompleteRead, ConnectionError, OSError) as e:
        out["cut"] = f"{type(e).__name__}: {e}"[:200]
    out["ended"] = time.time()


def main() -> int:
    ray, serve, base = c.start_ray()
    try:
        from cluster.serve import build_app

        run = lambda args: serve.run(build_app(args), name="op", route_prefix="/",
                                     logging_config={"enable_access_log": False, "log_level": "WARNING"})
        run(ARGS)
        c.wait_ready(base)
        out = {}
        t = threading.Thread(target=stream, args=(base, out))
        t.start()
        time.sleep(3)
        print(f"stream running: {out['events']} events after 3 s")
        t0 = time.time()
        def update():
            try:
                run({**ARGS, "served_model_name": "tiny-b"})
            except Exception as e:  # noqa: BLE001 — the cluster is shut down under it at the end
                print("(the update's serve.run:", type(e).__name__, ")")

        threading.Thread(target=update, daemon=True).start()
        t.join(280)
        print(f"update started; the stream ended {out['ended'] - t0:.1f} s later after {out['events']} events: "
              f"finish_reason={out['finish']}, [DONE]={out['done']}, error event={out['error']}, cut={out['cut']}")
        ok = out["finish"] is not None and out["error"] is None and out["cut"] is None
        print("the stream finished its answer" if ok else
              f"DEFECT: the answer in flight was ended {out['ended'] - t0:.0f} s into the update, unfinished")
        return 0 if ok else 1
    finally:
        c.stop_ray()


if __name__ == "__main__":
    sys.exit(main())
