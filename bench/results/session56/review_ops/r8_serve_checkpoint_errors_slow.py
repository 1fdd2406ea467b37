"""r8: `glmserve serve` learns of a checkpoint problem only inside the Coordinator replica: with --model /no/such/dir,
or a --max-model-len past the checkpoint's positions (tiny: 2048), it starts Ray and Serve, lets Serve try the
Coordinator's constructor, and only then prints the error (~25-30 s here; on a GPU cluster the start of Ray and of
the actors takes longer), where `glmserve generate` says the same in about a second: cmd_serve (cluster/cli.py:142-149)
reads nothing of the checkpoint (config.json: ModelConfig, EngineConfig.check_model) before start_server.

Exit 1 when such an error takes more than 10 s or Ray was started for it; 0 otherwise.
"""
import os
import sys
import time

sys.path.insert(0, os.path.dirname(__file__))
from common import Server, cli  # noqa: E402

bad = []
for args in (["--model", "/no/such/dir"], ["--max-model-len", "4096"]):
    t0 = time.time()
    rc_g, out_g = cli("generate", *args, "x", timeout=120)
    print(f"generate {' '.join(args)}: exit {rc_g} after {time.time() - t0:.1f} s: {out_g.strip().splitlines()[-1]}")
    s = Server(["--port", "8415", *args, "--stats-interval", "0"], "/tmp/r8_serve.log")
    t0 = time.time()
    rc = s.wait_exit(150)
    dt = time.time() - t0
    text = s.text()
    left = s.leftovers(10)
    s.kill_all()
    started_ray = "Started a local Ray instance" in text
    err = [ln for ln in text.splitlines() if "error" in ln.lower() and "raylet" not in ln]
    print(f"serve {' '.join(args)}: exit {rc} after {dt:.1f} s; Ray started: {started_ray}; leftovers: "
          f"{list(left.values())}\n   " + "\n   ".join(err[-2:]))
    if rc in (None, 0) or dt > 10 or started_ray:
        bad.append(" ".join(args))
print("ok" if not bad else f"PRESENT: checkpoint errors reported only after Ray and Serve started: {bad}")
sys.exit(1 if bad else 0)
