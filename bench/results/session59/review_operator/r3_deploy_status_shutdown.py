"""r3 (a check): deploy/README.md's cluster path with deploy/tiny.yaml (8 CPU ranks) — `ray start --head --num-cpus 16`
(a fresh cluster of this script's own), `serve deploy` (a copy with a free port: the file fixes 8000), `serve status`
until RUNNING, the README's curl request, `/health` and `/v1/models`, then `serve shutdown -y` leaves no actor alive;
the cluster is stopped by pid (never `ray stop`). Exit 0 when all hold."""
import subprocess
import sys
import time

import yaml

import _common as c


def main() -> int:
    h = c.start_head()
    port = c.free_port()
    base = f"http://127.0.0.1:{port}"
    problems = []
    try:
        cfg = yaml.safe_load(open(f"{c.REPO}/deploy/tiny.yaml"))
        cfg["http_options"]["port"] = port
        path = f"/tmp/operator-r3-{port}.yaml"
        yaml.safe_dump(cfg, open(path, "w"))
        t0 = time.time()
        r = c.serve_cli(h, "deploy", path)
        print("serve deploy:", r.returncode, r.stdout.strip().splitlines()[-1:] or r.stderr.strip().splitlines()[-1:])
        st = {}
        while time.time() - t0 < 150:
            time.sleep(3)
            st = (c.app_status(h).get("applications") or {}).get("glmserve") or {}
            if st.get("status") in ("RUNNING", "DEPLOY_FAILED"):
                break
        deps = {d: (v.get("status"), v.get("replica_states")) for d, v in (st.get("deployments") or {}).items()}
        print(f"serve status: {st.get('status')} after {time.time() - t0:.0f} s; {deps}")
        if st.get("status") != "RUNNING":
            problems.append(f"status {st.get('status')}")
        curl = subprocess.run(["curl", "-s", f"{base}/v1/completions", "-H", "content-type: application/json", "-d",
                               '{"model": "tiny", "prompt": "The old man said", "max_tokens": 16}'],
                              capture_output=True, text=True, timeout=60)
        import json

        body = json.loads(curl.stdout or "{}")
        print("README's curl:", body.get("usage"), repr(((body.get("choices") or [{}])[0]).get("text")))
        if not 1 <= ((body.get("usage") or {}).get("completion_tokens") or 0) <= 16:   # (EOS may end it: sampled)
            problems.append("curl")
        print("/health:", c.get(base, "/health"), "| /v1/models:", c.get(base, "/v1/models")[1][:120])
        r = c.serve_cli(h, "shutdown", "-y")
        time.sleep(8)
        import ray
        from ray._private import state

        ray.init(address=f"127.0.0.1:{h['gcs']}", log_to_driver=False)
        alive = [a["ActorClassName"] for a in state.actors().values() if a["State"] == "ALIVE"]
        ray.shutdown()
        print("serve shutdown:", r.returncode, "| actors alive after:", alive)
        if alive:
            problems.append(f"actors left: {alive}")
    finally:
        c.stop_head(h)
    print("problems:", problems or "none", "| processes of the cluster left:", c.head_pids(h))
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
