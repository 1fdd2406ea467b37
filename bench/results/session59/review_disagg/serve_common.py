"""Ray / Serve plumbing for the review's HTTP scripts (one Ray, one app at a time; free ports; shut down at exit)."""

from __future__ import annotations

import json
import os
import socket
import sys
import time
import urllib.error
import urllib.request

os.environ.setdefault("RAY_AUTH_MODE", "disabled")
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
sys.path.insert(0, "/work/main")

MODEL = "tiny-test"
STORY = "Once upon a time, in a quiet village by the sea, there lived a fisherman and his wife, who "


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_ray():
    import ray
    from ray import serve

    os.environ["PYTHONPATH"] = "/work/main"
    ray.init(address="local", num_cpus=32, num_gpus=0, include_dashboard=False, log_to_driver=False,
             namespace="review-disagg", runtime_env={"env_vars": {"PYTHONPATH": "/work/main",
                                                                  "RAY_AUTH_MODE": "disabled"}})
    port = free_port()
    serve.start(http_options={"host": "127.0.0.1", "port": port},
                logging_config={"enable_access_log": False, "log_level": "ERROR"})
    return f"http://127.0.0.1:{port}"


def stop_ray():
    import ray
    from ray import serve

    try:
        serve.shutdown()
    finally:
        ray.shutdown()


def deploy(args: dict, name: str, prefix: str):
    from ray import serve

    from cluster.serve import build_app

    serve.run(build_app(args), name=name, route_prefix=prefix,
              logging_config={"enable_access_log": False, "log_level": "ERROR"})


def post(url, path, body, timeout=120, headers=False):
    req = urllib.request.Request(url + path, data=json.dumps(body).encode(),
                                 headers={"content-type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            out = r.status, json.loads(r.read())
            return (*out, dict(r.headers)) if headers else out
    except urllib.error.HTTPError as e:
        raw = e.read()
        try:
            body = json.loads(raw)
        except ValueError:
            body = raw.decode(errors="replace")
        return (e.code, body, dict(e.headers)) if headers else (e.code, body)


def get(url, path, timeout=30):
    try:
        with urllib.request.urlopen(url + path, timeout=timeout) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def metric_series(url, name) -> dict[str, float]:
    from prometheus_client.parser import text_string_to_metric_families

    text = urllib.request.urlopen(url + "/metrics", timeout=30).read().decode()
    base, _, labels = name.partition("{")
    want = dict(pair.split("=", 1) for pair in labels.rstrip("}").split(",") if pair)
    want = {k: v.strip('"') for k, v in want.items()}
    out: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name == base and all(s.labels.get(k) == v for k, v in want.items()):
                out[s.labels.get("replica", "")] = out.get(s.labels.get("replica", ""), 0.0) + s.value
    return out


def wait_idle(url, timeout=30.0):
    """Until no replica runs or queues a request (by /metrics)."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if sum(metric_series(url, "glmserve_running_requests").values()) == 0 and \
                sum(metric_series(url, "glmserve_queue_depth").values()) == 0:
            return True
        time.sleep(0.5)
    return False
