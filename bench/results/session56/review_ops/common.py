"""Shared harness of the operator review's scripts (session 56, review_ops).

REPO (default /work/main) is the checkout under test, put first on PYTHONPATH; PY (default /work/main/.venv/bin/python)
runs it. A server is started as ``python -m cluster.cli serve ...`` in a session of its own with SIGINT at its
default (a shell's background job ignores it), its process tree is recorded while it runs (Ray's processes re-parent
to init when their parent dies), and ``leftovers()`` lists those still alive after it ended.
"""

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.request

REPO = os.environ.get("REPO", "/work/main")
PY = os.environ.get("PY", "/work/main/.venv/bin/python")
ENV = {**os.environ, "PYTHONPATH": REPO, "RAY_AUTH_MODE": os.environ.get("RAY_AUTH_MODE", "disabled"),
       "RAY_USAGE_STATS_ENABLED": "0", "PYTHONUNBUFFERED": "1"}


def cli(*args, timeout=120, env=None):
    """``glmserve ARGS`` (the checkout's ``cluster.cli``) to completion: (rc, stdout + stderr)."""
    p = subprocess.run([PY, "-m", "cluster.cli", *args], env=env or ENV, cwd="/tmp", capture_output=True, text=True,
                       timeout=timeout)
    return p.returncode, p.stdout + p.stderr


def _start_time(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[19]
    except OSError:
        return None


def _children():
    kids = {}
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                with open(f"/proc/{d}/stat") as f:
                    ppid = int(f.read().rsplit(")", 1)[1].split()[1])
                kids.setdefault(ppid, []).append(int(d))
            except (OSError, ValueError, IndexError):
                pass
    return kids


def _cmd(pid):
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace").strip()[:120]
    except OSError:
        return "?"


class Server:
    def __init__(self, args, log_path):
        self.log_path = log_path
        self.log = open(log_path, "w")
        self.p = subprocess.Popen([PY, "-m", "cluster.cli", "serve", *args], env=ENV, cwd="/tmp", stdout=self.log,
                                  stderr=subprocess.STDOUT, start_new_session=True,
                                  preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
        self.tree = {}          # pid -> (start time, cmdline): every descendant seen
        self._stop = False
        self._t = threading.Thread(target=self._watch, daemon=True)
        self._t.start()

    def _watch(self):
        while not self._stop:
            self.snapshot()
            time.sleep(0.3)

    def snapshot(self):
        kids, todo = _children(), [self.p.pid]
        while todo:
            pid = todo.pop()
            if pid not in self.tree and (st := _start_time(pid)) is not None:
                self.tree[pid] = (st, _cmd(pid))
            todo += kids.get(pid, [])
        # Ray's processes whose parent died before we saw them under it: the same session
        for pid in kids.get(1, []):
            try:
                if pid not in self.tree and os.getpgid(pid) == self.p.pid:
                    self.tree[pid] = (_start_time(pid), _cmd(pid))
            except OSError:
                pass

    def text(self):
        self.log.flush()
        with open(self.log_path) as f:
            return f.read()

    def wait_for(self, pattern, timeout):
        end = time.time() + timeout
        while time.time() < end:
            if re.search(pattern, self.text()):
                return True
            if self.p.poll() is not None:
                return bool(re.search(pattern, self.text()))
            time.sleep(0.2)
        return False

    def signal(self, sig):
        self.p.send_signal(sig)

    def wait_exit(self, timeout):
        try:
            return self.p.wait(timeout)
        except subprocess.TimeoutExpired:
            return None

    def leftovers(self, grace=5.0):
        """Descendants still alive ``grace`` seconds after the server's process ended."""
        self._stop = True
        self._t.join()
        end = time.time() + grace
        while True:
            alive = {pid: c for pid, (st, c) in self.tree.items() if pid != self.p.pid and _start_time(pid) == st}
            if not alive or time.time() > end:
                return alive
            time.sleep(0.5)

    def kill_all(self):
        """Clean up whatever this server left (only processes it started)."""
        self._stop = True
        if self.p.poll() is None:
            self.p.send_signal(signal.SIGTERM)
            self.wait_exit(60)
        for pid, (st, _) in list(self.tree.items()):
            if _start_time(pid) == st:
                try:
                    os.kill(pid, signal.SIGKILL)
                except OSError:
                    pass


def _alive(pid):
    return _start_time(pid) is not None


def http(method, url, body=None, timeout=30):
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url, data=data, method=method, headers={"content-type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def done(ok, what):
    print(("ABSENT: " if ok else "PRESENT: ") + what, flush=True)
    sys.exit(0 if ok else 1)
