"""Mutation run over glmserve's worker-group plumbing (session 61 review).

Usage: python mutants.py REPO_DIR [ID ...]   — applies each mutant to REPO_DIR (a git clone), runs its targeted
tests, reverts with ``git checkout -- FILE``. Prints a table; exit 0 when every non-equivalent mutant is killed.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

UNIT = ["tests/unit/test_group_plumbing.py", "tests/unit/test_comm_device.py", "tests/unit/test_metrics_hub.py",
        "tests/unit/test_kv_memory.py", "tests/unit/test_routing.py"]
NEW = "tests/unit/test_mut61_group.py"
COMM = ["tests/integration/test_comm.py"]
W, C, D, I, T, K, M, Y = ("cluster/workers.py", "workers/comm.py", "workers/comm_device.py", "workers/comm_ipc.py",
                          "workers/comm_torch.py", "workers/worker.py", "cluster/metrics_hub.py", "workers/memory.py")
R = "cluster/routing.py"

# id, file, old, new, extra test files (beyond UNIT + NEW), equivalent (reason) or None
MUTANTS = [
    ("W01", W, "setup_timeout_s=0.9 * setup_timeout_s)", "setup_timeout_s=setup_timeout_s)", [], None),
    ("W02", W, "timeout_s=min(cfg.step_timeout_s, 30.0)", "timeout_s=max(cfg.step_timeout_s, 30.0)", [], None),
    ("W03", W, "max_rows = cfg.num_workers * next_pow2(", "max_rows = next_pow2(", [], None),
    ("W04", W, '_send(conn, ("error", f"{type(e).__name__}: {e}"))\n        if msg',
     '_send(conn, ("ok", f"{type(e).__name__}: {e}"))\n        if msg', [], None),
    ("W05", W, "rest = bytearray(8 * count + size)", "rest = bytearray(8 * count + size - 1)", [], None),
    ("W06", W, "max(0.0, deadline - time.monotonic()) * 1000)", "max(0.0, deadline - time.monotonic()))", [], None),
    ("W07", W, "if n == 0 and not write:", "if n == 0 and write:", [], None),
    ("W08", W, "return [out[r] for r in range(len(self.conns))]", "return list(out.values())", [], None),
    ("W09", W, "deadline = time.monotonic() + timeout_s\n        out:",
     "deadline = time.monotonic() + 10 * timeout_s\n        out:", [], None),
    ("W10", W, "missing = [r for r in range(len(self.conns)) if r not in out]",
     "missing = [r for r in range(len(self.conns)) if r in out]", [], None),
    ("W11", W, "elif (why := self._dead(rank)) is not None:", "elif False and (why := self._dead(rank)) is not None:",
     [], None),
    ("W12", W, 'return f"rank {self.conns.index(ready[0])} died', 'return f"rank {0} died', [], None),
    ("W13", W, "if len(set(blocks)) != 1 or (self.num_blocks and blocks[0] != self.num_blocks):",
     "if len(set(blocks)) != 1:", [], None),
    ("W14", W, "for rank, (conn, step) in enumerate(zip(self.conns, steps)):",
     "for rank, (conn, step) in enumerate(zip(self.conns, steps[::-1])):", [], None),
    ("W15", W, "_send(conn, step, deadline)", "_send(conn, step)", [], None),
    ("W16", W, "return (tail[-1] if tail else type(e).__name__)[:500]",
     "return (tail[0] if tail else type(e).__name__)[:500]", [], None),
    ("W17", W, 'replace(s, device=f"cuda:{s.rank % count}")', 'replace(s, device=f"cuda:{s.rank // count}")', [], None),
    ("W18", W, "if kind == \"error\":", "if kind == \"err\":", [], None),
    ("W19", W, 'return None if proc.is_alive() else f"exit code {proc.exitcode}"',
     'return None if proc.exitcode is None or proc.exitcode == 0 else f"exit code {proc.exitcode}"', [],
     "a live process's exitcode is None; a rank's process never exits 0 while the group holds it (only at "
     "shutdown, after its channel is closed) — equivalent while a step runs"),
    ("C01", C, "failed = {r: m for r in range(self.world_size)", "failed = {r: m for r in range(1, self.world_size)",
     COMM, None),
    ("C02", C, "            self.check_failures()\n            if time.monotonic() > deadline:\n"
     "                raise CommTimeout(f\"rendezvous: ranks",
     "            if time.monotonic() > deadline:\n                raise CommTimeout(f\"rendezvous: ranks", COMM, None),
    ("C03", C, "if total_rows(rowmap) > max_rows:", "if total_rows(rowmap) >= max_rows:", COMM, None),
    ("C04", C, "not 0 <= owner < rowmap.num_ranks:", "not 0 <= owner <= rowmap.num_ranks:", COMM, None),
    ("C05", C, 'rendezvous.fail(rank, f"{type(exc).__name__}: {exc}")',
     'rendezvous.fail(0, f"{type(exc).__name__}: {exc}")', COMM, None),
    ("C06", C, "for p in parts[1:]:", "for p in parts[2:]:", COMM, None),
    ("D01", D, "self.rows * H, R * H\n        wide = 4 // x.dtype.itemsize",
     "self.rows * H, R * H\n        wide = 1", [], None),
    ("D02", D, "sources, parity_stride, mine = 1, N * N * slot * wide, self.rank * N * slot",
     "sources, parity_stride, mine = 1, N * N * slot * wide, self.rank * slot", [], None),
    ("D03", D, "max(1.0, timeout_s) * SPINS_PER_S", "max(1.0, timeout_s) * SPINS_PER_S // 1000", [], None),
    ("D04", D, "[r for r, v in enumerate(row) if v != expired]", "[r for r, v in enumerate(row) if v == expired]",
     [], None),
    ("I01", I, "deadline = time.monotonic() + self.timeout_s\n        polls",
     "deadline = time.monotonic() + 10 * self.timeout_s\n        polls", COMM, None),
    ("I02", I, "missing = [int(r) for r in np.nonzero(flags != epoch)[0]]",
     "missing = [int(r) for r in np.nonzero(flags == epoch)[0]]", COMM, None),
    ("I03", I, "packets[: total_rows(rowmap), self.rank].copy_(partial)",
     "packets[: total_rows(rowmap), 0].copy_(partial)", COMM, None),
    ("I04", I, "Dp(self.world_size, min(step, rowmap.rows_per_rank - r))", "Dp(self.world_size, step)", COMM, None),
    ("T01", T, "self._run(\"AG\", lambda: dist.broadcast(bucket, src=owner))",
     "self._run(\"AG\", lambda: dist.broadcast(bucket, src=0))", COMM, None),
    ("T02", T, "num_mine = send_splits[self.rank]", "num_mine = send_splits[0]", COMM, None),
    ("K01", K, "if step.graph is not None:\n            self.comm.check()",
     "if step.graph is None:\n            self.comm.check()", [], None),
    ("K02", K, "self._real_dev[:num_local].fill_(True)", "self._real_dev[:num_local + 1].fill_(True)", [], None),
    ("K03", K, "return self.rowmap.num_rows if self.rank == self.owner else 0",
     "return self.rowmap.num_rows if self.rank == 0 else 0", [], None),
    ("K04", K, 'self.spec.world_size > 1 and not self.comm.capturable:',
     'self.spec.world_size > 1 and self.comm.capturable:', [], None),
    ("K05", K, 'rendezvous.wait_all_ready(spec.rank, spec.setup_timeout_s, tag="loaded")',
     'rendezvous.wait_all_ready(spec.rank, spec.timeout_s, tag="loaded")', [], None),
    ("M01", M, "if now - t < MAX_AGE_S}", "if now - t > MAX_AGE_S}", [], None),
    ("M02", M, '_http_counts()[0].labels(_route(scope), str(message["status"])).inc()',
     '_http_counts()[0].labels(str(message["status"]), _route(scope)).inc()', [], None),
    ("M03", M, "family = parts[2] if len(parts) > 2 else family", "family = parts[1] if len(parts) > 2 else family",
     [], None),
    ("Y01", Y, "free = min(total, limit[0]), min(free, max(0, limit[0] - limit[1]))",
     "free = min(total, limit[0]), min(free, limit[0])", [], None),
    ("Y02", Y, 'rendezvous.publish(f"kv-memory/{rank}", tuple(share))',
     'rendezvous.publish(f"kv-memory/{0}", tuple(share))', [], None),
    ("W20", W, '"shutdown", 10.0)\n            self._collect(10.0, "shutdown")', '"shutdown", 10.0)', [], None),
    ("W21", W, "\n        if msg is None:\n            return\n", "\n", [],
     "after the close message the driver closes the connection (``_close_conns``, ``_kill``): the rank's next read "
     "ends the loop on EOF instead"),
    ("W22", W, 'raise GroupFailure(f"{what}: rank {refs.index(ready[0])} failed: {_root_cause(e)}")',
     'raise GroupFailure(f"{what}: rank 0 failed: {_root_cause(e)}")', [], None),
    ("W23", W, "return [done[r] for r in refs]", "return list(done.values())", [], None),
    ("W24", W, "sorted(refs.index(r) for r in pending)", "sorted(refs.index(r) for r in refs)", [], None),
    ("R01", R, 'call_method not in ("generate", "prefill")', 'call_method not in ("generate",)', [], None),
    ("R02", R, 'salt = getattr(pending.args[1], "cache_salt", None) if len(pending.args) > 1 else None',
     "salt = None", [], None),
    ("R03", R, "            self._owner.move_to_end(key)\n", "", [], None),
    ("R04", R, "> self.imbalance:", ">= self.imbalance:", [], None),
    ("R05", R, "range(self.span, len(ids), self.span)", "range(self.span, len(ids) + 1, self.span)", [], None),
    ("R06", R, "self.affinity.record(prompt[0], replica_id, prompt[1])", "self.affinity.record(prompt[0], replica_id)",
     [], None),
    ("R07", R, "if r == replica]", "if r != replica]", [], None),
]


def run(repo: Path, files: list[str]) -> int:
    env = {**os.environ, "RAY_AUTH_MODE": "disabled", "RAY_USAGE_STATS_ENABLED": "0", "PYTHONPATH": str(repo)}
    files = [f for f in files if (repo / f).exists()]
    cmd = ["timeout", "120", sys.executable, "-m", "pytest", *files, "-x", "-q", "-p", "no:cacheprovider"]
    return subprocess.run(cmd, cwd=repo, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL).returncode


def main() -> int:
    repo = Path(sys.argv[1]).resolve()
    only = set(sys.argv[2:])
    rows, survivors = [], 0
    for mid, path, old, new, extra, equivalent in MUTANTS:
        if only and mid not in only:
            continue
        target = repo / path
        text = target.read_text()
        assert text.count(old) == 1, f"{mid}: {old!r} matches {text.count(old)} times in {path}"
        target.write_text(text.replace(old, new))
        try:
            rc = run(repo, [NEW] + UNIT + extra)
        finally:
            subprocess.run(["git", "checkout", "--", path], cwd=repo, check=True)
        verdict = "killed" if rc != 0 else ("equivalent" if equivalent else "SURVIVED")
        survivors += verdict == "SURVIVED"
        rows.append((mid, path, rc, verdict))
        print(f"{mid:4} {path:24} rc={rc:<4} {verdict}", flush=True)
    print(f"{len(rows)} mutants, {sum(r[3] == 'killed' for r in rows)} killed, "
          f"{sum(r[3] == 'equivalent' for r in rows)} equivalent, {survivors} survived")
    return 1 if survivors else 0


if __name__ == "__main__":
    sys.exit(main())
