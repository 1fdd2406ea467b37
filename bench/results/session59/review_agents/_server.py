"""Shared by the review scripts: a `glmserve serve` of the embedded tiny model with the GLM parsers, started on a free
port (or the one at $AGENTS_URL, for development), and small helpers.

    with server() as url: ...
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx2 as httpx  # the openai SDK's transport (httpx2: its module name)

REPO = Path(__file__).resolve().parents[4]
PY = str(REPO / ".venv/bin/python")
# the anthropic SDK is not in the venv: a copy installed with `pip install --target /tmp/agents/pylib anthropic`
# (only anthropic and docstring_parser put on the path; the rest is the venv's)
ANTH = "/tmp/agents/anth"
if os.path.isdir(ANTH) and ANTH not in sys.path:
    sys.path.append(ANTH)

MODEL = "tiny"
SERVE_ARGS = ["--tool-parser", "glm", "--reasoning-parser", "glm", "--stats-interval", "0"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def server(extra: list[str] | None = None, log: str | None = None):
    """The server's base URL (no /v1). Reuses $AGENTS_URL where set (and no extra flags asked)."""
    if os.environ.get("AGENTS_URL") and not extra:
        yield os.environ["AGENTS_URL"]
        return
    port = free_port()
    env = dict(os.environ, RAY_AUTH_MODE="disabled", RAY_USAGE_STATS_ENABLED="0", PYTHONPATH=str(REPO))
    out = open(log or f"/tmp/agents_serve_{port}.log", "w")
    proc = subprocess.Popen([str(REPO / ".venv/bin/glmserve"), "serve", "--port", str(port), *SERVE_ARGS,
                             *(extra or [])], cwd=REPO, env=env, stdout=out, stderr=subprocess.STDOUT,
                            start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        t0 = time.time()
        import httpx2 as hx
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"glmserve serve exited {proc.returncode}: see {out.name}")
            try:
                if hx.get(url + "/health", timeout=2).status_code == 200:
                    break
            except Exception:   # noqa: BLE001
                pass
            if time.time() - t0 > 150:
                raise RuntimeError("glmserve serve did not become ready in 150 s")
            time.sleep(1)
        yield url
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.send_signal(signal.SIGINT)         # a second Ctrl-C stops at once
            try:
                proc.wait(20)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        out.close()


def metrics(url: str) -> dict[str, float]:
    """/metrics' samples (name{labels} → value), summed over replicas per name for the gauges asked."""
    import httpx2 as hx
    out: dict[str, float] = {}
    for line in hx.get(url + "/metrics", timeout=10).text.splitlines():
        if line.startswith("#") or not line.strip():
            continue
        key, _, value = line.rpartition(" ")
        name = key.split("{")[0]
        try:
            out[name] = out.get(name, 0.0) + float(value)
        except ValueError:
            pass
    return out
