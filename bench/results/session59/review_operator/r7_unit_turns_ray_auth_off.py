"""r7: deploy/glmserve.service sets RAY_AUTH_MODE=disabled for a server on --host 0.0.0.0. `glmserve serve` keeps Ray's
token auth since session 56 (its Ray listens beyond loopback whatever --host says: review_ops r1); the unit turns it
off again, so anyone who reaches the node's GCS port can attach a driver and run code as the service's user.

The script starts `glmserve serve` (tiny model, API on 127.0.0.1) twice — with the unit's Environment= and with none —
and each time attaches a second driver *without a token* to the server's GCS at the node's non-loopback address and
runs a task there. Exit 1 while the unit's environment lets that stranger run code; 0 once it does not (the unit no
longer disables auth, or the server refuses to start so)."""
import os
import re
import shlex
import signal
import subprocess
import sys
import tempfile
import time

import _common as c

UNIT = open(f"{c.REPO}/deploy/glmserve.service").read()


def unit_env() -> dict:
    env = {}
    for line in UNIT.splitlines():
        if line.startswith("Environment="):
            for kv in shlex.split(line[len("Environment="):]):
                k, v = kv.split("=", 1)
                env[k] = v
    return env


def listening_ports(pid: int) -> list[int]:
    """The TCP ports a process listens on (its socket inodes in /proc/net/tcp*, state 0A)."""
    inodes = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            link = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if link.startswith("socket:["):
            inodes.add(link[8:-1])
    ports = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in open(table).read().splitlines()[1:]:
            f = line.split()
            if f[3] == "0A" and f[9] in inodes:
                ports.append(int(f[1].rsplit(":", 1)[1], 16))
    return sorted(set(ports))


def run_server(extra: dict) -> tuple[str, bool]:
    env = {k: v for k, v in c.cli_env().items() if k != "RAY_AUTH_MODE"}
    env.update(extra)
    tmp = tempfile.mkdtemp(prefix="opr7", dir="/tmp")
    env["RAY_TMPDIR"] = tmp
    env["HOME"] = tmp           # (Ray writes a made token to ~/.ray/auth_token: kept out of the real HOME)
    port = c.free_port()
    log = open(os.path.join(tmp, "serve.log"), "w")
    proc = subprocess.Popen([os.path.join(c.BIN, "glmserve"), "serve", "--port", str(port), "--stats-interval", "0",
                             "--drain-timeout", "1"], env=env, stdout=log, stderr=subprocess.STDOUT,
                            start_new_session=True, cwd=c.REPO)
    try:
        deadline = time.time() + 150
        while "ready" not in open(log.name).read():
            if proc.poll() is not None or time.time() > deadline:
                return "server did not start: " + open(log.name).read()[-800:], False
            time.sleep(1)
        gcs = None
        for p in c.head_pids({"rt": tmp, "gcs": -1}):
            try:
                cmd = open(f"/proc/{p}/cmdline", "rb").read().decode(errors="replace")
            except OSError:
                continue
            if "gcs_server" in cmd:
                gcs = listening_ports(p)[0]
        from ray._private.services import get_node_ip_address

        ip = get_node_ip_address()
        # a stranger: no token, RAY_AUTH_MODE=disabled, a HOME without ~/.ray/auth_token
        stranger = {**c.cli_env(), "RAY_AUTH_MODE": "disabled", "HOME": tempfile.mkdtemp(prefix="opr7h", dir="/tmp"),
                    "RAY_TMPDIR": tempfile.mkdtemp(prefix="opr7s", dir="/tmp")}
        code = ("import ray, os; ray.init(address=%r, log_to_driver=False); "
                "print('REMOTE CODE RAN as uid', ray.get(ray.remote(num_cpus=0)(lambda: os.getuid()).remote()))"
                % f"{ip}:{gcs}")
        try:
            r = subprocess.run([sys.executable, "-c", code], env=stranger, capture_output=True, text=True, timeout=45)
            out = (r.stdout + r.stderr).strip().splitlines()
            ran = "REMOTE CODE RAN" in r.stdout
            said = [ln for ln in out if "REMOTE CODE RAN" in ln or "Error" in ln or "rror:" in ln][-1:] or out[-1:]
        except subprocess.TimeoutExpired:
            ran, said = False, ["(the connection attempt timed out)"]
        return f"GCS at {ip}:{gcs}; a driver without a token: {said}", ran
    finally:
        try:
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(60)
        except Exception:  # noqa: BLE001
            pass
        for p in c.head_pids({"rt": tmp, "gcs": -1}):
            try:
                os.kill(p, signal.SIGKILL)
            except OSError:
                pass


def main() -> int:
    env = unit_env()
    host = re.search(r"--host (\S+)", UNIT)
    print("the unit's Environment=:", env, "| its --host:", host and host.group(1))
    said, ran_unit = run_server(env)
    print("with the unit's environment:", said)
    said, ran_default = run_server({k: v for k, v in env.items() if k != "RAY_AUTH_MODE"})
    print("with glmserve's default (RAY_AUTH_MODE unset):", said)
    if ran_unit:
        print("DEFECT: under the unit's environment a driver without a token runs code on the server's Ray")
    return 1 if ran_unit else 0


if __name__ == "__main__":
    sys.exit(main())
