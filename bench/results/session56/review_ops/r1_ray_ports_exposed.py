"""r1: `glmserve serve` (default --host 127.0.0.1) disables Ray's token auth (RAY_AUTH_MODE=disabled, set by
cluster/server.py) and its local Ray listens on every interface (GCS, raylet, dashboard agent :52365 ...).

Starts `glmserve serve --port 8413`, lists the TCP listeners of its process tree, then stops it. Exit 1 when a listener
of the server's own Ray binds a non-loopback address while the API was asked for 127.0.0.1 (the problem), else 0.
"""
import signal
import subprocess
import sys

sys.path.insert(0, __import__("os").path.dirname(__file__))
from common import Server, done  # noqa: E402

s = Server(["--port", "8413", "--stats-interval", "0"], "/tmp/r1_serve.log")
try:
    if not s.wait_for(r"ready in", 180):
        print(s.text()[-3000:])
        sys.exit(2)
    s.snapshot()
    pids = set(s.tree)
    out = subprocess.run(["ss", "-ltnpH"], capture_output=True, text=True).stdout
    exposed = []
    for line in out.splitlines():
        cols = line.split()
        local, users = cols[3], " ".join(cols[5:])
        if not any(f"pid={p}," in users for p in pids):
            continue
        host = local.rsplit(":", 1)[0].strip("[]")
        print("listener:", local, users[:80])
        if host not in ("127.0.0.1", "::1", "localhost"):
            exposed.append(local)
    print("(this run sets RAY_AUTH_MODE=disabled as the review's rules ask; glmserve itself sets the same default "
          "when it is unset: cluster/server.py:64, where Ray 2.60's local ray.init() would enable token auth)")
finally:
    s.signal(signal.SIGTERM)
    s.wait_exit(90)
    left = s.leftovers(10)
    if left:
        print("leftovers:", left)
    s.kill_all()
done(not exposed, f"--host 127.0.0.1, yet the server's Ray listens on non-loopback addresses: {exposed}")
