"""r5: `serve deploy` of a changed deploy file whose value only a replica checks takes the serving app down.

A running app (deploy/tiny.yaml's shape, 1 worker for speed) is redeployed with `max_model_len: 4096` (past the tiny
model's 2048 positions: `EngineConfig.check_model` refuses it — in the Coordinator's constructor) and then, after the
good file again, with a mistyped `model:` path. Serve's rolling update stops the one old replica first; the new ones
fail 3 times; the app ends DEPLOY_FAILED with no replica at all: every request gets 503 until the operator deploys a
good file. A misspelt field name, which build_app checks, leaves the old app serving (shown first, as the contrast).

Run with --model-path for the second case too (over 3 minutes; its log: r5_bad_redeploy_takes_app_down_full.log).
A request that meets the app without a Coordinator waits (status 0 here: no answer within 20 s) or gets 503.

Exit 1 while a bad value in a redeploy leaves the app without replicas (requests 503); 0 when the redeploy is refused
before the running replicas are touched (as for an unknown field)."""
import sys
import time

import yaml

import _common as c

BASE = yaml.safe_load(open(f"{c.REPO}/deploy/tiny.yaml"))


def config(port: int, **args) -> str:
    cfg = yaml.safe_load(yaml.safe_dump(BASE))
    cfg["http_options"]["port"] = port
    app = cfg["applications"][0]
    app["args"].update(num_workers=1, **args)
    app["args"] = {k: v for k, v in app["args"].items() if v is not None}
    path = f"/tmp/operator-r5-{port}-{len(args)}-{abs(hash(str(args)))}.yaml"
    with open(path, "w") as f:
        yaml.safe_dump(cfg, f)
    return path


def settle(h: dict, timeout: float = 150) -> dict:
    deadline = time.time() + timeout
    while time.time() < deadline:
        time.sleep(3)
        st = (c.app_status(h).get("applications") or {}).get("glmserve") or {}
        if st.get("status") in ("RUNNING", "DEPLOY_FAILED"):
            return st
    return st


def probe(base: str) -> int:
    try:
        return c.post(base, "/v1/completions", {"model": "tiny", "prompt": "The old man said", "max_tokens": 2}, 20)[0]
    except OSError:
        return 0


def main() -> int:
    h = c.start_head()
    port = c.free_port()
    base = f"http://127.0.0.1:{port}"
    bad = []
    try:
        good = config(port)
        c.serve_cli(h, "deploy", good)
        st = settle(h)
        print("good file:", st.get("status"), "request:", probe(base))
        c.serve_cli(h, "deploy", config(port, kv_cache_token=4096))
        st = settle(h)
        print("redeploy with a misspelt field (kv_cache_token):", st.get("status"), "| request:", probe(base),
              "| message names it:", "kv_cache_token" in str(st.get("message")))
        cases = [("max_model_len: 4096 (the model has 2048 positions)", {"max_model_len": 4096})]
        if "--model-path" in sys.argv:      # (~1 min more: r5_bad_redeploy_takes_app_down_full.log)
            cases.append(("model: /no/such/ckpt", {"model": "/no/such/ckpt"}))
        for name, args in cases:
            c.serve_cli(h, "deploy", good)
            st = settle(h)
            before = probe(base)
            t0 = time.time()
            c.serve_cli(h, "deploy", config(port, **args))
            st = settle(h)
            deps = st.get("deployments") or {}
            replicas = {d: v.get("replica_states") for d, v in deps.items()}
            code = probe(base)
            msg = [ln.strip() for ln in str((deps.get("Coordinator") or {}).get("message", "")).splitlines()
                   if ln.strip()][-1:]
            print(f"redeploy with {name}: status {st.get('status')} after {time.time() - t0:.0f} s; request before "
                  f"{before}, after {code}; replicas {replicas}; Coordinator's message ends {msg}")
            if code != 200:
                bad.append(name)
    finally:
        c.stop_head(h)
    print("DEFECT: a redeploy with a bad value left the app without replicas:" if bad else "the app kept serving", bad)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
