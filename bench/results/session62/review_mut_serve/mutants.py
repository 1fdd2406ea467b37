"""Mutation testing of glmserve's serving front end (session 62's review): hand-picked mutants of cluster/serve.py (the
FastAPI ingress and the Serve application), cluster/server.py (``glmserve serve``: start, progress, drain),
cluster/cli.py (flags into ``serve`` / ``run-batch``) and cluster/async_engine.py where the front end uses it, each a
one-place string replace, run against the unit tests that cover its file (and tests/unit/test_mut62_serve.py, where
REPO_DIR has it). No Ray integration test is run here (each starts Ray + Serve: the report says which mutants a few
``-k``-selected ones were tried on).

    python mutants.py REPO_DIR [--without-new] [--only ID,ID...] [--list]

REPO_DIR is copied (without .git, .venv, bench) to a temporary folder and each mutant applied there, so REPO_DIR is
never touched. Prints one row per mutant (killed / SURVIVED / equivalent) and exits 0 when every non-equivalent mutant
is killed, 1 otherwise (2: the unmutated tests fail). ``--without-new``: leave test_mut62_serve.py out (the suite as
it was). Run it with the project's interpreter (.venv/bin/python): it runs pytest with ``sys.executable``."""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time

NEW = "tests/unit/test_mut62_serve.py"
# the unit tests that import cluster.serve (test_guided only for the tool-call helpers)
SRV = ["tests/unit/test_ingress_lifecycle.py", "tests/unit/test_protocol.py", "tests/unit/test_generation_defaults.py",
       "tests/unit/test_chat_messages.py", "tests/unit/test_completions_batch.py", "tests/unit/test_review59.py",
       "tests/unit/test_kv_memory.py"]
TOOLS = SRV + ["tests/unit/test_guided.py"]
APP = ["tests/unit/test_review59.py", "tests/unit/test_group_plumbing.py", "tests/unit/test_kv_memory.py"]
SERVER = ["tests/unit/test_group_plumbing.py", "tests/unit/test_mut61_config.py", "tests/unit/test_dummy_load.py"]
CLI = ["tests/unit/test_mut61_config.py", "tests/unit/test_group_plumbing.py", "tests/unit/test_dummy_load.py",
       "tests/unit/test_kv_memory.py", "tests/unit/test_run_batch.py"]
AENG = ["tests/integration/test_mut61_engine.py"]   # (no Ray: an Engine on a recording executor; no unit test has it)

# (id, file, old, new, tests, equivalent: None, or why no test can tell the mutant from the original)
MUTANTS: list[tuple[str, str, str, str, list[str], str | None]] = [
    # ---- cluster/serve.py: error bodies and status codes
    ("E01", "cluster/serve.py", "return JSONResponse(e.body(), status_code=e.status, headers=e.headers)",
     "return JSONResponse(e.body(), status_code=e.status)", SRV, None),
    ("E02", "cluster/serve.py", "status_code=e.status_code, headers=e.headers)", "status_code=404, headers=e.headers)",
     SRV, None),
    ("E03", "cluster/serve.py", 'return ApiError(429, str(e), None, "rate_limit_error", {"Retry-After": "1"})',
     'return ApiError(503, str(e), None, "rate_limit_error", {"Retry-After": "1"})', SRV, None),
    ("E04", "cluster/serve.py", 'return ApiError(503, str(e), None, "service_unavailable", {"Retry-After": "5"})',
     'return ApiError(503, str(e), None, "service_unavailable")', SRV, None),
    ("E05", "cluster/serve.py", 'code="context_length_exceeded" if e.reason in ("too_long", "kv_capacity") else None)',
     'code="context_length_exceeded" if e.reason == "too_long" else None)', SRV, None),
    ("E06", "cluster/serve.py", "return e.cause if isinstance(e, RayTaskError) and e.cause is not None else e",
     "return e", SRV, None),
    ("E07", "cluster/serve.py", 'raise ApiError(503, f"the model replica is unavailable: {f}", None, "server_error")',
     'raise ApiError(500, f"the model replica is unavailable: {f}", None, "server_error")', SRV, None),
    ("E08", "cluster/serve.py", 'raise ApiError(503, "the server is shutting down", None, "server_error", '
     '{"Retry-After": "1"})', 'raise ApiError(503, "the server is shutting down", None, "server_error")', SRV, None),
    ("E09", "cluster/serve.py", 'raise ApiError(404, f"the model {body.model!r} does not exist; this server serves '
     '{self.model_name!r}",', 'raise ApiError(400, f"the model {body.model!r} does not exist; this server serves '
     '{self.model_name!r}",', SRV, None),
    ("E10", "cluster/serve.py", "if getattr(body, \"priority\", 0) and self.cfg.scheduling_policy != \"priority\":",
     "if getattr(body, \"priority\", 0) > 0 and self.cfg.scheduling_policy != \"priority\":", SRV, None),
    ("E11", "cluster/serve.py", "        except ValueError as e:\n            raise ApiError(400, str(e)) from None",
     "        except ValueError as e:\n            raise ApiError(500, str(e)) from None", SRV, None),
    ("E12", "cluster/serve.py", "            raise ApiError(400, str(e), \"messages\") from None",
     "            raise ApiError(400, str(e)) from None", SRV, None),
    ("E13", "cluster/serve.py", "            raise responses_param(e) from None", "            raise", SRV, None),
    # ---- request admission: sizes, limits, off-by-ones
    ("L01", "cluster/serve.py", "    if size > max_chars:", "    if size >= max_chars:", SRV, None),
    ("L02", "cluster/serve.py", "if len(ids) + max_tokens <= context:", "if len(ids) + max_tokens < context:", SRV,
     None),
    ("L03", "cluster/serve.py", "fits = body.max_tokens and len(ids) < context",
     "fits = body.max_tokens and len(ids) <= context", SRV, None),
    ("L04", "cluster/serve.py", "if choices > (admits := self.cfg.max_num_seqs + self.cfg.max_waiting):",
     "if choices >= (admits := self.cfg.max_num_seqs + self.cfg.max_waiting):", SRV, None),
    ("L05", "cluster/serve.py", "if choices > (admits := self.cfg.max_num_seqs + self.cfg.max_waiting):",
     "if choices > (admits := self.cfg.max_waiting):", SRV, None),
    ("L06", "cluster/serve.py", "max(1, self.max_model_len - len(ids)) if chat else 16, cap)",
     "max(1, self.max_model_len - len(ids)) if chat else 16, self.max_model_len)", SRV, None),
    ("L07", "cluster/serve.py", "if k is not None and k > self.max_model_len:",
     "if k is not None and k >= self.max_model_len:", SRV, None),
    ("L08", "cluster/serve.py", "max(self.max_prompt_chars, TRUNCATED_MAX_CHARS)", "self.max_prompt_chars", SRV, None),
    ("L09", "cluster/serve.py", "if not 0 <= t < self.model_config.vocab_size", "if not 0 <= t <= self.model_config."
     "vocab_size", SRV, None),
    ("L10", "cluster/serve.py", "        self._check_ids(body.tokens, \"tokens\")\n", "", SRV, None),
    ("L11", "cluster/serve.py", "if len(ids) >= self.max_model_len:", "if len(ids) > self.max_model_len:", SRV, None),
    ("L12", "cluster/serve.py", "chat.max_tokens = min(chat.max_tokens, self.max_model_len - len(ids))",
     "chat.max_tokens = min(chat.max_tokens, self.max_model_len - len(ids) - 1)", SRV, None),
    ("L13", "cluster/serve.py", "logprobs = (body.top_logprobs or 0) if body.logprobs else None",
     "logprobs = body.top_logprobs if body.logprobs else None", SRV, None),
    ("L14", "cluster/serve.py", "        if body.max_completion_tokens is not None:\n            body.max_tokens = "
     "body.max_completion_tokens\n", "", SRV, None),
    ("L15", "cluster/serve.py", "ids, text = kept, self.tokenizer.decode(kept) "
     "if body.echo and self.tokenizer else \"\"",
     "ids = kept", SRV, None),
    ("L16", "cluster/serve.py", "        await self._limits()\n        return body", "        return body", SRV, None),
    ("L17", "cluster/serve.py", "    if body.ignore_eos:\n        raise ApiError(400, \"ignore_eos cannot",
     "    if False:\n        raise ApiError(400, \"ignore_eos cannot", TOOLS, None),
    ("L18", "cluster/serve.py", "streams = [self._open(p, params[i], f\"{rid}-{k * body.n + i}\")",
     "streams = [self._open(p, params[i], f\"{rid}-{i}\")", SRV, None),
    # ---- streams: cancellation on disconnect, leaked slots, SSE
    ("S01", "cluster/serve.py", "                await asyncio.gather(*[x.aclose() for x in streams], "
     "return_exceptions=True)\n", "", SRV, None),
    ("S02", "cluster/serve.py", "            if not finished and gen is not None:",
     "            if not started and gen is not None:", SRV, None),
    ("S03", "cluster/serve.py", "            self.open_ids.discard(req_id)\n", "", SRV, None),
    ("S04", "cluster/serve.py", "if finished and ev.finish_reason == \"abort\" and self.closing and not ev.error:",
     "if finished and ev.finish_reason == \"abort\" and not ev.error:", SRV, None),
    ("S05", "cluster/serve.py", "if ev.refused is not None and not started:", "if ev.refused is not None and started:",
     SRV, None),
    ("S06", "cluster/serve.py", "    finally:\n        await merged.aclose()\n\n\nasync def _merge",
     "    finally:\n        pass\n\n\nasync def _merge", SRV, None),
    ("S07", "cluster/serve.py", "        for t in tasks:\n            t.cancel()\n", "", SRV, None),
    ("S08", "cluster/serve.py", "return StreamingResponse(fmt.sse(merged, body.include_usage), "
     "media_type=\"text/event-stream\")", "return StreamingResponse(fmt.sse(merged, body.include_usage))", SRV, None),
    ("S09", "cluster/serve.py", "events = MessageEvents(body, self.model_name, fmt.num_prompt, clamped)\n"
     "        if body.stream:\n            return StreamingResponse(_closing(events.sse(fmt.chunks(merged)), merged),",
     "events = MessageEvents(body, self.model_name, fmt.num_prompt, clamped)\n"
     "        if body.stream:\n            return StreamingResponse(events.sse(fmt.chunks(merged)),", SRV, None),
    ("S10", "cluster/serve.py", "            return JSONResponse(await events.whole(fmt.chunks(merged)))\n"
     "        except ApiError as e:\n            return anthropic_error(e)\n        finally:\n"
     "            await merged.aclose()\n",
     "            return JSONResponse(await events.whole(fmt.chunks(merged)))\n        except "
     "ApiError as e:\n            return anthropic_error(e)\n", SRV, None),
    ("S11", "cluster/serve.py", "            if not s.ag_running:        # else its pump",
     "            if True:        # else its pump", SRV, None),
    # ---- health, drain, metrics
    ("H01", "cluster/serve.py", "        self.ready = True\n        return {\"status\": \"ok\"}",
     "        return {\"status\": \"ok\"}", SRV, None),
    ("H02", "cluster/serve.py", "        if why is not None:\n            raise ApiError(503, "
     "f\"the model replica cannot",
     "        if why is None:\n            raise ApiError(503, f\"the model replica cannot", SRV, None),
    ("H03", "cluster/serve.py", "        self.draining = True\n        return self.in_flight",
     "        return self.in_flight", SRV, None),
    ("H04", "cluster/serve.py", "        self.draining = self.closing = True\n        ids = list(self.open_ids)",
     "        self.closing = True\n        ids = list(self.open_ids)", SRV, None),
    ("H05", "cluster/serve.py", "        texts[replica] = text\n", "        texts.setdefault(replica, text)\n", SRV,
     None),
    # ---- the Serve application: config -> deployment options
    ("D01", "cluster/serve.py", "INGRESS_MAX_ONGOING = 4096", "INGRESS_MAX_ONGOING = 256", APP, None),
    ("D02", "cluster/serve.py", "coord = _coordinator(\"Coordinator\", cfg.to_dict(), scaling, *pd)",
     "coord = _coordinator(\"Coordinator\", cfg.to_dict(), {}, *pd)", APP, None),
    ("D03", "cluster/serve.py", "    if engine[\"prefix_caching\"]:   # several replicas",
     "    if not engine[\"prefix_caching\"]:   # several replicas", APP, None),
    ("D04", "cluster/serve.py", "for k in (\"num_replicas\", \"autoscaling_config\") if k in args}",
     "for k in (\"num_replicas\",) if k in args}", APP, None),
    # ---- cluster/server.py: glmserve serve's start, stop flag, drain
    ("W01", "cluster/server.py", "            return e.errno == errno.EADDRINUSE", "            return True", SERVER,
     None),
    ("W02", "cluster/server.py", "while not self.flag and (end is None or time.monotonic() < end):",
     "while end is None or time.monotonic() < end:", SERVER, None),
    ("W03", "cluster/server.py", "            if left == 0 or time.time() >= deadline:",
     "            if time.time() >= deadline:", SERVER, None),
    ("W04", "cluster/server.py", "    if left > 0:                    # each open stream",
     "    if left >= 0:                    # each open stream", SERVER, None),
    ("W05", "cluster/server.py", "    stop.clear()\n    _drain(stop, drain_timeout_s)",
     "    _drain(stop, drain_timeout_s)", SERVER, None),
    ("W06", "cluster/server.py", "if state in (\"DEPLOY_FAILED\", \"UNHEALTHY\"):", "if state == \"DEPLOY_FAILED\":",
     SERVER, None),
    ("W07", "cluster/server.py", "        if state == \"RUNNING\":",
     "        if state in (\"RUNNING\", \"DEPLOYING\"):", SERVER, None),
    ("W08", "cluster/server.py", "args = cfg.to_dict() | ({\"prefill\": {\"num_replicas\": prefill_replicas}} if "
     "prefill_replicas else {})", "args = cfg.to_dict()", SERVER, None),
    ("W09", "cluster/server.py", "                return f\"  {name}: {lines[-1]}\"",
     "                return f\"  {name}: {lines[0]}\"", SERVER, None),
    # ---- cluster/cli.py: flags into serve / run-batch
    ("C01", "cluster/cli.py", "drain_timeout_s=a.drain_timeout,", "drain_timeout_s=30.0,", CLI, None),
    ("C02", "cluster/cli.py", "return run_server(cfg, host=a.host, port=a.port,",
     "return run_server(cfg, host=a.host, port=8000,", CLI, None),
    ("C03", "cluster/cli.py", "    finally:\n        stop_server()\n", "    finally:\n        pass\n", CLI, None),
    ("C04", "cluster/cli.py", "    except (ValueError, FileNotFoundError) as e:", "    except ValueError as e:", CLI,
     None),
    ("C05", "cluster/cli.py", "return run_batch_file(a.input, a.output, f\"http://127.0.0.1:{port}\", "
     "a.max_concurrency)",
     "return run_batch_file(a.input, a.output, f\"http://127.0.0.1:{port}\", 64)", CLI, None),
    # ---- cluster/async_engine.py where the front end uses it
    ("X01", "cluster/async_engine.py", "                self._queues.pop(req_id, None)\n                "
     "self.engine.abort(req_id)\n", "                self._queues.pop(req_id, None)\n", AENG, None),
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
                             text=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=timeout)
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
    tmp = tempfile.mkdtemp(prefix="mut62_serve_")
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
            print(f"{mid:4} {path + ':' + str(line):29} {verdict:10} rc={rc:<3} {secs:5.1f} s"
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
