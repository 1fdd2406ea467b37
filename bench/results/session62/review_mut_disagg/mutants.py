"""Mutation testing of glmserve's disaggregated prefill (session 62's review): hand-picked mutants of cluster/disagg.py
(all but ``prefill_plan``, reviewed before: check_bundle, adopt_bundle, Imports, HeldPrefix, hold_prefix, KVDepot,
stage / fetch / drop_bundle) and cluster/coordinator.py (the decode side ``_prefilled`` / ``_asked`` /
``_worth_asking``, the prefill side ``prefill``, ``generate``'s holds and aborts, ``_unless``, the metrics), each a
one-place string replace, run against the tests that cover it (and tests/unit/test_mut62_disagg.py, where REPO_DIR
has it).

    python mutants.py REPO_DIR [--without-new] [--only ID,ID...] [--list] [--map]

REPO_DIR is copied (without .git, .venv, bench) to a temporary folder and each mutant applied there, so REPO_DIR is
never touched. Prints one row per mutant (killed / SURVIVED / equivalent) and exits 0 when every non-equivalent mutant
is killed, 1 otherwise (2: the unmutated tests fail). ``--without-new``: leave test_mut62_disagg.py out (the suite as
it was). Run it with the project's interpreter (.venv/bin/python): it runs pytest with ``sys.executable``. None of the
tests used needs Ray (the depot is a fake actor around a real ``KVDepot``; tests/integration/test_disagg.py runs two
engines on the trained tiny model, ~55 s, and is used only for check_bundle / adopt_bundle)."""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time

NEW = "tests/unit/test_mut62_disagg.py"
R61 = ["tests/unit/test_review59.py", "tests/unit/test_review60.py", "tests/unit/test_review61.py"]
DEPOT = R61
UNIT = ["tests/unit/test_disagg.py", "tests/integration/test_disagg_review53.py"]
HOLDS = ["tests/unit/test_disagg_holds.py", "tests/unit/test_disagg.py"]
KV = ["tests/unit/test_disagg.py", "tests/unit/test_review60.py", "tests/integration/test_disagg.py"]
IMP = ["tests/unit/test_disagg.py", "tests/integration/test_disagg_review53.py", "tests/unit/test_disagg_holds.py"]
COORD = ["tests/unit/test_disagg.py", *R61, "tests/unit/test_disagg_holds.py"]
GP = "tests/unit/test_group_plumbing.py::"
STATS = [GP + "test_stats_line_reads_rates_between_two_readings_and_stays_quiet_when_idle",
         GP + "test_the_coordinator_logs_its_stats_line_while_requests_come",
         "tests/unit/test_metrics_hub.py"]

# (id, file, old, new, tests, equivalent: None, or why no test can tell the mutant from the original)
MUTANTS: list[tuple[str, str, str, str, list[str], str | None]] = [
    # ---- cluster/disagg.py: what a bundle carries and whether this engine can take it
    ("K01", "cluster/disagg.py", "return max(0, (prompt_len - 1) // block_size)",
     "return max(0, prompt_len // block_size)", KV, None),
    ("K02", "cluster/disagg.py", "if layout is None or not caching:", "if layout is None:", KV, None),
    ("K03", "cluster/disagg.py", "    if bundle.mtp and not drafts:\n", "    if False:\n", KV, None),
    ("K04", "cluster/disagg.py", "!= bundle.token_ids or len(bundle.token_ids) > len(prompt_ids):",
     "!= bundle.token_ids:", KV,
     "a bundle longer than the prompt fails the comparison before it: prompt_ids[:n] with n > len(prompt_ids) is the "
     "whole (shorter) prompt, which never equals the longer bundle.token_ids — the length test can never decide"),
    ("K05", "cluster/disagg.py", "if bundle.start % block_size or not 0 <= bundle.start <= bundle.num_tokens:",
     "if not 0 <= bundle.start <= bundle.num_tokens:", KV, None),
    ("K06", "cluster/disagg.py", "if bundle.start % block_size or not 0 <= bundle.start <= bundle.num_tokens:",
     "if bundle.start % block_size or not 0 <= bundle.start < bundle.num_tokens:", KV, None),
    ("K07", "cluster/disagg.py", "if len(bundle.rows) != len(layout) or any(", "if any(", KV, None),
    # ---- adopt_bundle: the bundle's blocks into the decode replica's prefix cache
    ("A01", "cluster/disagg.py", "    if len(nodes) < first:\n        return None", "    if len(nodes) <= first:\n"
     "        return None", KV, None),
    ("A02", "cluster/disagg.py", "room = pool.num_free - pool.num_kept", "room = pool.num_free", KV, None),
    ("A03", "cluster/disagg.py", "    pool.free(cached)\n    if not blocks:", "    if not blocks:", KV, None),
    ("A04", "cluster/disagg.py", "spans.append(j - first)", "spans.append(j)", KV, None),
    ("A05", "cluster/disagg.py", "if spans == list(range(spans[0], spans[0] + len(spans))):", "if True:", KV,
     "the adopted spans are always one run: once pool.adopt returns a new block at j, the key of block j + 1 has that "
     "new node (a fresh id, never reused) as parent, so no later block is cached already — and the loop only stops "
     "early (room); the gather branch after the test is dead code"),
    ("A06", "cluster/disagg.py", "        if len(blocks) == room:\n            break",
     "        if len(blocks) > room:\n            break", KV, None),
    # ---- Imports: a rank's imported rows, a few blocks a step
    ("I01", "cluster/disagg.py", "if not (self.paced and beside and self.rate and self.windows):",
     "if not (self.paced and self.rate and self.windows):", IMP, None),
    ("I02", "cluster/disagg.py",
     "return min(self.budget, max(least, int(self.rate * min(self.windows) / 1e3 * share)))",
     "return max(least, int(self.rate * min(self.windows) / 1e3 * share))", IMP, None),
    ("I03", "cluster/disagg.py", "max(left // (bs * sum(r.shape[1] for r in rows)), 0 if writes else 1))",
     "max(left // (bs * sum(r.shape[1] for r in rows)), 1))", IMP, None),
    ("I04", "cluster/disagg.py", "self.writing.append((req, blocks[at - k:at], at == len(blocks)))",
     "self.writing.append((req, blocks[at - k:at], True))", IMP, None),
    ("I05", "cluster/disagg.py", "return Take(tuple(writes), bool(self.landing))",
     "return Take(tuple(writes), bool(self.writing))", IMP, None),
    ("I06", "cluster/disagg.py", "if fill and fill[0] >= 1 << 20:", "if fill:", IMP, None),
    ("I07", "cluster/disagg.py", "if work_ms > 0 and self._beside:", "if work_ms > 0:", IMP, None),
    ("I08", "cluster/disagg.py", "if sched.get(req.req_id) is req:", "if sched.get(req.req_id) is not None:", IMP,
     "Scheduler.imported(req, ...) is passed the import's own request, and returns at once unless it is WAITING: a "
     "live request of another object under the id means the import's one has ended (status finished), so nothing is "
     "kept either way; a WAITING request that is not its rank's live one would have moved, which an importing one "
     "never does"),
    ("I09", "cluster/disagg.py", "landed, self.landing, self.writing = [*self.landing, *self.writing], [], []",
     "landed, self.landing, self.writing = [*self.landing], [], []", IMP, None),
    ("I10", "cluster/disagg.py",
     "        for req in reqs.values():\n            req.importing = req.imported = False\n",
     "", IMP, None),
    # ---- HeldPrefix / hold_prefix: the decode replica's cached prefix, held while the rest is computed elsewhere
    ("H01", "cluster/disagg.py", "    def release(self) -> None:\n        self.admitted()\n",
     "    def release(self) -> None:\n", HOLDS, None),
    ("H02", "cluster/disagg.py", "pinned, self._pinned = self._pinned, ()", "pinned = self._pinned", HOLDS, None),
    ("H03", "cluster/disagg.py", "if pool.num_free - sum(map(pool.is_idle, blocks)) < pool.num_blocks // 4:",
     "if pool.num_free < pool.num_blocks // 4:", HOLDS, None),
    ("H04", "cluster/disagg.py", "run, blocks = list(takewhile(pool.has_host_copy, run)), []",
     "run, blocks = list(filter(pool.has_host_copy, run)), []", HOLDS, None),
    ("H05", "cluster/disagg.py", "    pool.hold(blocks)\n    return HeldPrefix(", "    return HeldPrefix(", HOLDS,
     None),
    # ---- KVDepot and staging: bundles waiting for their decode replica
    ("D01", "cluster/disagg.py", "if self.dropped.pop(key, None) is None:", "if self.dropped.get(key) is None:", DEPOT,
     None),
    ("D02", "cluster/disagg.py",
     "        with self._lock:\n            self._expire()\n            return self.items.pop",
     "        with self._lock:\n            return self.items.pop", DEPOT, None),
    ("D03", "cluster/disagg.py",
     "        self.dropped = {k: t for k, t in self.dropped.items() if now - t < self.ttl_s}\n",
     "", DEPOT, None),
    ("D04", "cluster/disagg.py", "            if self.items.pop(key, None) is None:\n                self.dropped[key]",
     "            if self.items.pop(key, None) is not None:\n                self.dropped[key]", DEPOT, None),
    ("D05", "cluster/disagg.py", "if self._sweeper is None:", "if True:", DEPOT, None),
    ("D06", "cluster/disagg.py", "key = key or uuid.uuid4().hex", "key = uuid.uuid4().hex", DEPOT, None),
    ("D07", "cluster/disagg.py", "        put.add_done_callback(lambda _: drop_bundle((depot, key)))\n", "", DEPOT,
     None),
    ("D08", "cluster/disagg.py", "    except BaseException:       # timed out, or its request cancelled",
     "    except asyncio.TimeoutError:       # timed out, or its request cancelled", DEPOT, None),
    ("D09", "cluster/disagg.py", "return await asyncio.wait_for(depot.take.remote(key), timeout_s)",
     "return await depot.take.remote(key)", DEPOT, None),
    # ---- cluster/coordinator.py, a decode replica's side (_prefilled, _asked, _worth_asking)
    ("C01", "cluster/coordinator.py", "        if params.prompt_logprobs is not None:\n            return None, None\n",
     "", COORD, None),
    ("C02", "cluster/coordinator.py", "            held.release()      # another request asks for most",
     "            pass      # another request asks for most", COORD, None),
    ("C03", "cluster/coordinator.py", "            if time.monotonic() < self.prefill_paused_until:       # that ask",
     "            if False:       # that ask", COORD, None),
    ("C04", "cluster/coordinator.py", '.labels("cached" if self._worth_asking(len(ids), 0) else "short").inc()\n'
     "            held.release()\n", '.labels("cached" if self._worth_asking(len(ids), 0) else "short").inc()\n',
     COORD, None),
    ("C05", "cluster/coordinator.py", "        except AdmissionError:\n            held.release()\n            raise\n"
     "        self._ask", "        except AdmissionError:\n            raise\n        self._ask", COORD, None),
    ("C06", "cluster/coordinator.py", "        self._promised += 1\n", "", COORD, None),
    ("C07", "cluster/coordinator.py", "        self._ask(req_id, ids, params.cache_salt)\n", "", COORD, None),
    ("C08", "cluster/coordinator.py", "where = await asyncio.wait_for(gen.__anext__(), PREFILL_REACH_S)",
     "where = await asyncio.wait_for(gen.__anext__(), PREFILL_WAIT_S)", COORD, None),
    ("C09", "cluster/coordinator.py",
     "                self.prefill_paused_until = time.monotonic() + PREFILL_PAUSE_S\n",
     "", COORD, None),
    ("C10", "cluster/coordinator.py", "                    gen.cancel()\n", "", COORD, None),
    ("C11", "cluster/coordinator.py", 'if res.refused is not None and res.refused.reason == "queue_full":',
     "if res.refused is not None:", COORD, None),
    ("C12", "cluster/coordinator.py", "        except AdmissionError:\n            held.release()\n"
     "            self._asked_end(req_id)\n", "        except AdmissionError:\n            held.release()\n", COORD,
     None),
    ("C13", "cluster/coordinator.py", "        except BaseException:           # cancelled: the client went away\n"
     "            held.release()\n", "        except BaseException:           # cancelled: the client went away\n",
     COORD, None),
    ("C14", "cluster/coordinator.py", "        finally:\n            self._promised -= 1\n", "", COORD, None),
    ("C15", "cluster/coordinator.py", "            self.metrics.kv_lost.inc()      # disagree",
     "            pass  # disagree", COORD, None),
    ("C16", "cluster/coordinator.py", "and (length - 1) // theirs * theirs // bs * bs > start",
     "and length // theirs * theirs // bs * bs > start", COORD, None),
    ("C17", "cluster/coordinator.py", "if their_salt == salt and shared > 0 and 4 * shared >= len(ids) - start:",
     "if shared > 0 and 4 * shared >= len(ids) - start:", COORD, None),
    ("C18", "cluster/coordinator.py", "shared = (common_prefix(ids, other) - 1) // bs * bs - start",
     "shared = common_prefix(ids, other) // bs * bs - start", COORD, None),
    ("C19", "cluster/coordinator.py", "            ask[2].set()\n", "            pass\n", COORD, None),
    # ---- a prefill replica's side (Coordinator.prefill)
    ("C20", "cluster/coordinator.py", "key = where[1] if where is not None else None", "key = None", COORD, None),
    ("C21", "cluster/coordinator.py", "            yield PrefillResult(refused=e)\n            return",
     "            yield PrefillResult(error=str(e))\n            return", COORD, None),
    ("C22", "cluster/coordinator.py", "        elif ev.kv is None:            # no whole block",
     "        elif False:            # no whole block", COORD, None),
    ("C23", "cluster/coordinator.py", "            except BaseException:       # (closed unread: the decode replica"
     " gave up on it, its client gone)\n                drop_bundle(staged)\n",
     "            except BaseException:       # (closed unread: the decode replica gave up on it, its client gone)\n",
     COORD, None),
    # ---- generate: holds released, asks ended, aborts reaching a request computed elsewhere
    ("C24", "cluster/coordinator.py", "                if first:               # (its prompt's KV is here: settled, "
     "matchable — not only adopted)\n                    self._asked_end(req_id)\n",
     "                if first:               # (its prompt's KV is here: settled, matchable — not only adopted)\n",
     COORD, None),
    ("C25", "cluster/coordinator.py",
     "                    if held is not None:\n                        held.release()\n                now",
     "                now", COORD, None),
    ("C26", "cluster/coordinator.py", "            if held is not None:            # (where the engine never saw the "
     "request, or it gave no token)\n                held.release()\n",
     "            if held is not None:            # (where the engine never saw the request, or it gave no token)\n"
     "                pass\n", COORD, None),
    ("C27", "cluster/coordinator.py", "            if held is not None:\n                held.admitted()\n", "", COORD,
     None),
    ("C28", "cluster/coordinator.py", "            if aborted.is_set():\n                self.aengine.abort(req_id)\n",
     "", COORD, None),
    ("C29", "cluster/coordinator.py", "            if self._early.get(req_id) is aborted:\n                del "
     "self._early[req_id]\n\n    async def _prefilled", "\n    async def _prefilled", COORD, None),
    ("C30", "cluster/coordinator.py", "            early.set()\n", "            pass\n", COORD, None),
    ("C31", "cluster/coordinator.py", "return_when=asyncio.FIRST_COMPLETED", "return_when=asyncio.ALL_COMPLETED", COORD,
     None),
    # ---- metrics and the stats line
    ("M01", "cluster/coordinator.py", "if not ev.error and ev.finish_reason != FinishReason.ABORT:",
     "if not ev.error:", STATS, None),
    ("M02", "cluster/coordinator.py",
     'if before is None or not (info["running"] or info["waiting"] or s != before[1]):',
     'if before is None or not (info["running"] or info["waiting"]):', STATS, None),
]


def _run(root: str, tests: list[str], timeout: int = 300, failed: list[str] | None = None) -> tuple[int, float]:
    """pytest's exit status on ``tests`` (124: timed out) and its seconds; ``failed``: run them all (no -x) and
    collect the names of those that failed."""
    env = dict(os.environ, RAY_AUTH_MODE="disabled", RAY_USAGE_STATS_ENABLED="0", PYTHONPATH=root,
               PYTHONDONTWRITEBYTECODE="1")
    start = time.monotonic()
    flags = ["-q", "-rf", "-p", "no:cacheprovider"] if failed is not None else ["-x", "-q", "-p", "no:cacheprovider"]
    try:
        out = subprocess.run([sys.executable, "-m", "pytest", *tests, *flags], check=False, cwd=root, env=env,
                             text=True,
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=timeout)
        rc = out.returncode
        if failed is not None:
            failed += [line.split("::", 1)[1].split(" ")[0] for line in out.stdout.splitlines()
                       if line.startswith("FAILED ") and "::" in line]
    except subprocess.TimeoutExpired:
        rc = 124
    return rc, time.monotonic() - start


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("repo")
    ap.add_argument("--without-new", action="store_true", help=f"leave {NEW} out")
    ap.add_argument("--only", default="", help="comma-separated mutant ids")
    ap.add_argument("--list", action="store_true")
    ap.add_argument("--map", action="store_true", help=f"run {NEW} alone on each mutant and name the tests that fail")
    args = ap.parse_args()
    chosen = [m for m in MUTANTS if not args.only or m[0] in args.only.split(",")]
    if args.list:
        for mid, path, old, new, _, _ in chosen:
            print(f"{mid}  {path}: {old.strip()[:70]!r} -> {new.strip()[:70]!r}")
        return 0
    tmp = tempfile.mkdtemp(prefix="mut62_disagg_")
    root = os.path.join(tmp, "repo")
    shutil.copytree(os.path.abspath(args.repo), root, ignore=shutil.ignore_patterns(
        ".git", ".venv", "bench", "__pycache__", "*.pyc", ".pytest_cache", ".ruff_cache"))
    if args.without_new and os.path.exists(os.path.join(root, NEW)):
        os.remove(os.path.join(root, NEW))
    extra = [NEW] if os.path.exists(os.path.join(root, NEW)) else []
    if args.map and not extra:
        ap.error(f"--map needs {NEW} in REPO_DIR")
    try:
        every = sorted({t for m in chosen for t in m[4]} | set(extra))
        rc, secs = _run(root, every, 900)
        print(f"baseline (unmutated): {'pass' if rc == 0 else f'FAIL rc={rc}'} ({secs:.0f} s; {len(every)} files)",
              flush=True)
        if rc != 0:
            return 2
        rows, survivors = [], []
        for mid, path, old, new, tests, equivalent in chosen:
            file = os.path.join(root, path)
            with open(file, encoding="utf-8") as f:
                original = f.read()
            assert original.count(old) == 1, f"{mid}: {old!r} occurs {original.count(old)} times in {path}"
            line = original[:original.index(old)].count("\n") + 1
            with open(file, "w", encoding="utf-8") as f:
                f.write(original.replace(old, new))
            names: list[str] | None = [] if args.map else None
            try:
                rc, secs = _run(root, extra if args.map else extra + tests, failed=names)   # (new first: -x stops)
            finally:
                with open(file, "w", encoding="utf-8") as f:
                    f.write(original)
            verdict = "killed" if rc != 0 else "equivalent" if equivalent else "SURVIVED"
            if verdict == "SURVIVED":
                survivors.append(mid)
            rows.append(verdict)
            print(f"{mid:4} {path + ':' + str(line):26} {verdict:10} rc={rc:<3} {secs:5.1f} s"
                  + (f"  {' '.join(names)}" if names else ""), flush=True)
        print(f"\n{len(rows)} mutants: {rows.count('killed')} killed, {len(survivors)} survived, "
              f"{rows.count('equivalent')} equivalent ({'with' if extra else 'without'} {NEW})")
        if survivors:
            print("survived:", " ".join(survivors))
        return 1 if survivors else 0
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
