"""r2: Ctrl-C / SIGTERM while `glmserve serve` starts (before "ready"): run_server installs its SIGINT/SIGTERM handlers
only after start_server returned (cluster/server.py:33-37), so during ray.init() and the deploy the signal meets Python's
default KeyboardInterrupt or Ray's own SIGTERM handling: Ray's C++ handler prints a crash dump ("*** SIGTERM received
... PC: @ ..."), the exit status is a signal's (15, or -6 = SIGABRT in one run), and a signal during ray.init() leaves Ray's agent
processes running after glmserve exited.

Three starts on port 8413: SIGTERM 3 s after "starting Ray" (inside ray.init), SIGINT 3 s after it, SIGTERM while the
deployments are "updating". Exit 1 when any of them crashes (a negative status or Ray's crash dump) or leaves a process
of its tree alive 10 s after it exited; 0 when each stops cleanly.
"""
import signal
import sys
import time

sys.path.insert(0, __import__("os").path.dirname(__file__))
from common import Server, done  # noqa: E402

problems = []
for name, sig, pattern, delay in [("SIGTERM during ray.init", signal.SIGTERM, r"starting Ray", 3),
                                  ("SIGINT during ray.init", signal.SIGINT, r"starting Ray", 3),
                                  ("SIGTERM during the deploy", signal.SIGTERM, r"updating", 0)]:
    s = Server(["--port", "8413", "--stats-interval", "0"], f"/tmp/r2_{name.split()[0]}_{delay}.log")
    try:
        s.wait_for(pattern, 120)
        time.sleep(delay)
        if s.p.poll() is not None or "ready in" in s.text():
            print(f"== {name}: not in start-up when signalled (skipped)")
            continue
        t0 = time.time()
        s.signal(sig)
        rc = s.wait_exit(90)
        dt = time.time() - t0
        left = s.leftovers(10)
        text = s.text()
        dump = "received at time=" in text
        print(f"== {name}: exit status {rc} after {dt:.1f} s; Ray crash dump printed: {dump}; processes of its tree "
              f"alive 10 s after: {[c.split('site-packages/')[-1][:70] for c in left.values()]}")
        print("   its last lines:\n     " + "\n     ".join(text.strip().splitlines()[-4:]))
        if rc is None or rc < 0 or dump or left:
            problems.append(name)
    finally:
        s.kill_all()
        time.sleep(2)
done(not problems, f"a signal during start-up crashes or leaves processes: {problems}")
