"""Shared helpers of session 59's operator review scripts (not a test)."""
from __future__ import annotations

import json
import os
import socket
import sys
import time
import urllib.error
import urllib.request

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", "..", ".."))
sys.path.insert(0, REPO)
os.environ.setdefault("RAY_AUTH_MODE", "disabled")
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
os.environ.pop("RAY_ADDRESS", None)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def post(base: str, path: str, body: dict, timeout: float = 120):
    req = urllib.request.Request(base + path, data=json.dumps(body).encode(),
                                 headers={"content-type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, json.loads(r.read() or b"null")
    except urllib.error.HTTPError as e:
        raw = e.read()
        try:
            return e.code, json.loads(raw)
        except ValueError:
            return e.code, raw.decode(errors="replace")


def get(base: str, path: str, timeout: float = 30):
    try:
        with urllib.request.urlopen(base + path, timeout=timeout) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode(errors="replace")


def start_ray():
    """An in-process local Ray (logical resources, as the brief asks) and Serve on a free port: (ray, serve, base)."""
    import ray
    from ray import serve

    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [REPO, os.environ.get("PYTHONPATH")]))
    ray.init(address="local", num_cpus=32, num_gpus=0, include_dashboard=False, log_to_driver=False,
             namespace="operator-review", runtime_env={"env_vars": {"PYTHONPATH": os.environ["PYTHONPATH"]}})
    port = free_port()
    serve.start(http_options={"host": "127.0.0.1", "port": port},
                logging_config={"enable_access_log": False, "log_level": "WARNING"})
    return ray, serve, f"http://127.0.0.1:{port}"


def stop_ray():
    import ray
    from ray import serve

    try:
        serve.shutdown()
    finally:
        ray.shutdown()


def wait_ready(base: str, timeout: float = 180, model: str = "tiny") -> None:
    deadline = time.time() + timeout
    while time.time() < deadline:
        try:
            status, body = post(base, "/v1/completions", {"model": model, "prompt": "Hi", "max_tokens": 1}, 30)
            if status == 200:
                return
        except OSError:
            pass
        time.sleep(1)
    raise RuntimeError("the app did not answer")


# ---- a `ray start --head` cluster of our own (free ports, its own temp dir); never `ray stop` (it ends every Ray
# on the machine, other people's too): its processes are found by their temp dir / GCS address and ended by pid
BIN = os.path.join(REPO, ".venv", "bin")


def cli_env() -> dict:
    env = {**os.environ, "RAY_AUTH_MODE": "disabled", "RAY_USAGE_STATS_ENABLED": "0",
           "PYTHONPATH": os.pathsep.join(filter(None, [REPO, os.environ.get("PYTHONPATH")]))}
    env.pop("RAY_ADDRESS", None)
    return env


def start_head(num_cpus: int = 16) -> dict:
    import subprocess
    import tempfile

    rt = tempfile.mkdtemp(prefix="rop", dir="/tmp")
    h = {"rt": rt, "gcs": free_port(), "dash": free_port()}
    cmd = [os.path.join(BIN, "ray"), "start", "--head", "--num-cpus", str(num_cpus), "--port", str(h["gcs"]),
           "--dashboard-host", "127.0.0.1", "--dashboard-port", str(h["dash"]), "--temp-dir", rt,
           "--disable-usage-stats"]
    for flag in ("--dashboard-agent-listen-port", "--dashboard-agent-grpc-port", "--runtime-env-agent-port",
                 "--metrics-export-port", "--ray-client-server-port", "--node-manager-port", "--object-manager-port"):
        cmd += [flag, str(free_port())]
    r = subprocess.run(cmd, env=cli_env(), capture_output=True, text=True, timeout=120)
    if r.returncode:
        raise RuntimeError("ray start failed:\n" + r.stdout[-2000:] + r.stderr[-2000:])
    h["dash_url"] = f"http://127.0.0.1:{h['dash']}"
    return h


def serve_cli(h: dict, *args: str, timeout: float = 120):
    import subprocess

    return subprocess.run([os.path.join(BIN, "serve"), args[0], "-a", h["dash_url"], *args[1:]], env=cli_env(),
                          capture_output=True, text=True, timeout=timeout)


def app_status(h: dict) -> dict:
    import yaml

    r = serve_cli(h, "status")
    try:
        return yaml.safe_load(r.stdout) or {}
    except Exception:  # noqa: BLE001
        return {}


def _tree() -> dict:
    kids = {}
    for p in os.listdir("/proc"):
        if p.isdigit():
            try:
                ppid = int(open(f"/proc/{p}/stat").read().rsplit(")", 1)[1].split()[1])
            except OSError:
                continue
            kids.setdefault(ppid, []).append(int(p))
    return kids


def head_pids(h: dict) -> list[int]:
    roots = []
    for p in os.listdir("/proc"):
        if p.isdigit():
            try:
                cmd = open(f"/proc/{p}/cmdline", "rb").read().decode(errors="replace")
            except OSError:
                continue
            if h["rt"] in cmd or f":{h['gcs']}" in cmd:
                roots.append(int(p))
    kids, out, todo = _tree(), set(), list(roots)
    while todo:
        p = todo.pop()
        if p not in out:
            out.add(p)
            todo += kids.get(p, [])
    out.discard(os.getpid())
    return sorted(out)


def stop_head(h: dict) -> None:
    import shutil
    import signal

    for sig, wait in ((signal.SIGTERM, 8), (signal.SIGKILL, 2)):
        pids = head_pids(h)
        for p in pids:
            try:
                os.kill(p, sig)
            except OSError:
                pass
        deadline = time.time() + wait
        while time.time() < deadline and head_pids(h):
            time.sleep(0.5)
    shutil.rmtree(h["rt"], ignore_errors=True)
