"""r10: `glmserve serve`'s own output on a normal start and stop carries Ray lines that read as problems:
at start "Connecting to existing Serve app in namespace "serve". New http_options/controller_options will not be
applied." (serve.run after serve.start, cluster/server.py:76-85: the --port/--host given ARE applied), and on a clean
Ctrl-C / SIGTERM "(raylet) Task ServeController.listen_for_change failed ... The actor is dead because it was killed
by `ray.kill`" (serve.shutdown then ray.shutdown, cluster/server.py:47-51). An operator (or a log alert on
"failed") reads a clean stop as a failure.

Starts `glmserve serve --port 8416`, waits for ready, sends SIGTERM on an idle server. Exit 1 when either line
appears; 0 otherwise.
"""
import os
import signal
import sys

sys.path.insert(0, os.path.dirname(__file__))
from common import Server  # noqa: E402

s = Server(["--port", "8416", "--stats-interval", "0"], "/tmp/r10_serve.log")
try:
    if not s.wait_for(r"ready in", 180):
        print(s.text()[-3000:])
        sys.exit(2)
    s.signal(signal.SIGTERM)
    rc = s.wait_exit(90)
finally:
    s.kill_all()
text = s.text()
print(text)
noise = [ln for ln in text.splitlines() if "will not be applied" in ln or ("failed" in ln and "ray.kill" in ln)]
print(f"exit status {rc}; misleading lines: {len(noise)}")
print("ok" if not noise else "PRESENT: a clean start / stop prints Ray lines that read as failures")
sys.exit(1 if noise else 0)
