"""r2 (a check): two Coordinator replicas; one is killed (its actor, as a node loss would) while it streams. Its streams
must fail fast with an error (not hang), requests sent right after must all be answered by the living replica (none
lost to the dead one), a conversation whose prefix was on the dead replica must continue on the living one, /health
must stay 200, and the dead replica's worker actors must go with it.

Exit 0 when all hold; 1 otherwise."""
import asyncio
import collections
import json
import sys
import threading
import time
import urllib.request

import _common as c

HEAD = ("And it came to pass in those days, that there went out a decree from Caesar Augustus, that all the world "
        "should be taxed. ") * 8


def stream(base: str, body: dict, out: dict) -> None:
    req = urllib.request.Request(base + "/v1/completions", headers={"content-type": "application/json"},
                                 data=json.dumps({**body, "stream": True}).encode())
    out.update(events=0, error=None, done=False, fp=None)
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
                        out["fp"] = out["fp"] or ev.get("system_fingerprint")
    except Exception as e:  # noqa: BLE001
        out["error"] = f"{type(e).__name__}: {e}"
    out["ended"] = time.time()


def main() -> int:
    ray, serve, base = c.start_ray()
    problems = []
    try:
        from cluster.serve import build_app

        serve.run(build_app({"device": "cpu", "kv_cache_tokens": 8192, "num_replicas": 2}),
                  name="op", route_prefix="/", logging_config={"enable_access_log": False, "log_level": "WARNING"})
        c.wait_ready(base)
        from ray._private import state

        workers = lambda: sorted(k[:8] for k, a in state.actors().items()
                                 if a["State"] == "ALIVE" and "_WorkerActor" in a["ActorClassName"])
        print("worker actors before:", workers())
        s, first = c.post(base, "/v1/completions", {"model": "tiny", "prompt": HEAD + " turn one:", "max_tokens": 4})
        victim = first["system_fingerprint"]
        print("the conversation's first turn went to", victim)
        outs = [dict(), dict()]
        threads = [threading.Thread(target=stream, args=(base, {"model": "tiny", "prompt": HEAD + f" long {i}:",
                                                                 "max_tokens": 1500, "ignore_eos": True,
                                                                 "temperature": 0}, outs[i]))
                   for i in range(2)]
        for t in threads:
            t.start()
        time.sleep(4)
        print("streams' replicas:", [o.get("fp") for o in outs], "events so far:", [o.get("events") for o in outs])
        h = ray.get_actor(f"SERVE_REPLICA::op#Coordinator#{victim}", namespace="serve")
        killed = time.time()
        ray.kill(h, no_restart=True)
        print("killed replica", victim)
        # requests right after the kill: each must be answered by the living replica
        codes, by = collections.Counter(), collections.Counter()

        def one(i):
            st, b = c.post(base, "/v1/completions", {"model": "tiny", "prompt": f"after {i}", "max_tokens": 2}, 60)
            codes[st] += 1
            if st == 200:
                by[b["system_fingerprint"]] += 1
            else:
                print("  a request after the kill:", st, str(b)[:300])

        after = [threading.Thread(target=one, args=(i,)) for i in range(10)]
        for t in after:
            t.start()
        hs, hb = c.get(base, "/health")
        print("/health right after the kill:", hs, hb[:200])
        for t in after:
            t.join()
        print("10 requests right after the kill: status", dict(codes), "by replica", dict(by))
        for t in threads:
            t.join(120)
        for i, o in enumerate(outs):
            ended = o.get("ended", float("inf")) - killed
            print(f"stream {i} on {o.get('fp')}: {o.get('events')} events, done={o.get('done')}, "
                  f"error={str(o.get('error'))[:200]!r}, ended {ended:.1f} s after the kill")
            if o.get("fp") == victim and (o.get("error") is None or ended > 30):
                problems.append(f"stream {i} on the dead replica did not fail fast with an error")
        if codes.get(200, 0) != 10:
            problems.append(f"requests after the kill failed: {dict(codes)}")
        if hs != 200:
            problems.append(f"/health {hs} right after the kill")
        s2, turn2 = c.post(base, "/v1/completions", {"model": "tiny", "prompt": HEAD + " turn one: x turn two:",
                                                     "max_tokens": 4})
        print("the conversation's next turn:", s2, turn2.get("system_fingerprint") if s2 == 200 else turn2)
        if s2 != 200:
            problems.append("the conversation's next turn failed")
        time.sleep(5)
        print("worker actors after:", workers())
    finally:
        c.stop_ray()
    print("problems:", problems or "none")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
