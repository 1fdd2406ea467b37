"""``glmserve run-batch``: an OpenAI Batch API input file through a server's endpoints, offline.

Each input line is a request — ``{"custom_id": ..., "method": "POST", "url": "/v1/chat/completions", "body": {...}}``
(``url``: any of ``ENDPOINTS``) — and each output line its result, in the Batch API's form and in the input's order:
``{"id", "custom_id", "response": {"status_code", "request_id", "body"}, "error": null}``, the body what the endpoint
answered (an error body with its status where it refused the request), or ``"response": null`` with an ``error``
where a line is no request (not UTF-8 or not JSON, a field missing, a streamed body, a ``custom_id`` seen before;
its message names the input line) or the server could not be reached (a refused connection is tried again until the
server has refused every line for ``REFUSED_S`` seconds: one restarting comes back, one gone fails the rest fast).
Up to ``max_concurrency`` requests are in flight; a 429 or 503 (back-pressure, a replica restarting) is retried after
its ``Retry-After``, so a batch larger than the queue still completes.
"""

from __future__ import annotations

import http.client
import json
import queue
import sys
import threading
import time
import urllib.error
import urllib.request
import uuid
from collections import deque
from collections.abc import Callable, Iterable
from concurrent.futures import Future
from typing import TextIO

ENDPOINTS = ("/v1/chat/completions", "/v1/completions", "/v1/responses", "/v1/messages")
RETRIES = 600           # a 429 / 503 answer is tried again this many times (after Retry-After, 1 s by default):
                        # ten minutes of back-pressure at least before a line is given up
REFUSED_S = 60.0        # refused connections (no request reached a server: one restarting) are tried again, a second
                        # apart, until the server has refused every line this long without answering one
TIMEOUT_S = 3600.0      # one request's wait for its answer

Post = Callable[[str, dict], "tuple[int, dict, dict[str, str]]"]   # (path, body) -> (status, body, headers)


class LineError(ValueError):
    """An input line that is no request: its result is an error line."""


def parse_line(text: str | bytes, seen: set[str]) -> tuple[str, str, dict]:
    """(custom_id, url, body) of one input line (UTF-8 bytes, or text); raises LineError naming what is wrong. Its
    custom_id counts as used (``seen``) once the line is a request."""
    try:
        line = json.loads(text.decode("utf-8-sig") if isinstance(text, bytes) else text.removeprefix("\ufeff"))
    except UnicodeDecodeError as e:
        raise LineError(f"the line is not UTF-8: {e}") from None
    except ValueError as e:
        raise LineError(f"the line is not JSON: {e}") from None
    if not isinstance(line, dict):
        raise LineError("the line must be a JSON object with custom_id, method, url and body")
    custom_id, url, body = line.get("custom_id"), line.get("url"), line.get("body")
    if not isinstance(custom_id, str) or not custom_id:
        raise LineError("custom_id must be a non-empty string")
    if custom_id in seen:
        raise LineError(f"custom_id {custom_id!r} is used by an earlier line: each must be unique")
    if line.get("method", "POST") != "POST":
        raise LineError(f"method must be POST, not {line.get('method')!r}")
    if url not in ENDPOINTS:
        raise LineError(f"url must be one of {list(ENDPOINTS)}, not {url!r}")
    if not isinstance(body, dict):
        raise LineError("body must be a JSON object (the endpoint's request body)")
    if body.get("stream"):
        raise LineError("a batch request is answered whole: body.stream must be false")
    seen.add(custom_id)
    return custom_id, url, body


def _result(custom_id: str | None, response: dict | None, error: dict | None) -> dict:
    return {"id": f"batch_req_{uuid.uuid4().hex[:24]}", "custom_id": custom_id, "response": response, "error": error}


class Outage:
    """Since when the server has refused every connection (None: it answered the last one), shared by a batch's
    lines: a server gone fails them ``REFUSED_S`` after it went, not each line after its own wait."""

    def __init__(self, clock: Callable[[], float] = time.monotonic):
        self.clock, self.since = clock, None

    def refused(self) -> bool:
        """A connection was refused: whether to try again (the outage is younger than ``REFUSED_S``)."""
        if self.since is None:
            self.since = self.clock()
        return self.clock() - self.since < REFUSED_S


def answer(custom_id: str, url: str, body: dict, post: Post, sleep: Callable[[float], None] = time.sleep,
           outage: Outage | None = None) -> dict:
    """One request's result line: posted, and again after a 429 / 503's Retry-After (``RETRIES`` times at most) or a
    refused connection (a second apart, while ``outage`` is younger than ``REFUSED_S``). A connection reset or cut
    short once the request was sent is the line's error: the server may have run it."""
    outage = outage or Outage()
    attempt = 0
    while True:
        try:
            status, out, headers = post(url, body)
        except (OSError, http.client.HTTPException) as e:   # refused; reset, cut short, timed out
            if isinstance(e, ConnectionRefusedError) and outage.refused():
                sleep(1.0)
                continue
            return _result(custom_id, None, {"code": "server_unreachable", "message": f"{type(e).__name__}: {e}"})
        outage.since = None
        if status not in (429, 503) or attempt == RETRIES:
            return _result(custom_id, {"status_code": status, "request_id": out.get("id", ""), "body": out}, None)
        attempt += 1
        sleep(_seconds(headers.get("retry-after")))


class _Workers:
    """``n`` daemon threads answering what is submitted. Not a ThreadPoolExecutor: its threads are joined at exit, so
    Ctrl-C would wait for every request in flight to be answered (an hour each at most); these end with the process,
    their connections dropped (the server aborts those requests)."""

    def __init__(self, n: int):
        self._jobs: queue.SimpleQueue = queue.SimpleQueue()
        self._threads = [threading.Thread(target=self._run, daemon=True) for _ in range(n)]
        for t in self._threads:
            t.start()

    def submit(self, fn: Callable, *args) -> Future:
        future: Future = Future()
        self._jobs.put((future, fn, args))
        return future

    def close(self) -> None:
        for _ in self._threads:
            self._jobs.put(None)

    def _run(self) -> None:
        while (job := self._jobs.get()) is not None:
            future, fn, args = job
            try:
                future.set_result(fn(*args))
            except BaseException as e:  # noqa: BLE001 — handed to the waiting caller
                future.set_exception(e)


def _seconds(retry_after: str | None) -> float:
    """A Retry-After header's wait: its seconds, or 1 where it is missing or an HTTP date."""
    try:
        return max(0.0, float(retry_after))
    except (TypeError, ValueError):
        return 1.0


def run_batch(lines: Iterable[str | bytes], out: TextIO, post: Post, max_concurrency: int = 32,
              progress: Callable[[int, int], None] | None = None) -> tuple[int, int]:
    """Every line of ``lines`` (blank ones skipped) answered through ``post``, its result written to ``out`` in the
    lines' order — up to ``max_concurrency`` requests at once, the first unanswered one holding the writing back,
    ``4 * max_concurrency`` lines ahead of it at most. ``progress(done, failed)`` after each line. Returns (lines,
    lines whose result is an error or a non-200 response)."""
    seen: set[str] = set()
    outage = Outage()
    window: deque[Future | dict] = deque()
    done = failed = 0

    def write_oldest() -> None:
        nonlocal done, failed
        head = window.popleft()
        result = head.result() if isinstance(head, Future) else head
        out.write(json.dumps(result, ensure_ascii=False) + "\n")
        out.flush()                     # a batch cut short (Ctrl-C, a crash) leaves every result it got
        done += 1
        failed += result["error"] is not None or result["response"]["status_code"] != 200
        if progress is not None:
            progress(done, failed)

    pool = _Workers(max_concurrency)
    try:
        for number, text in enumerate(lines, start=1):
            if not text.strip():
                continue
            try:
                custom_id, url, body = parse_line(text, seen)
            except LineError as e:
                cid = _custom_id(text)
                window.append(_result(cid, None, {"code": "invalid_request", "message": f"input line {number}: {e}"}))
            else:
                window.append(pool.submit(answer, custom_id, url, body, post, time.sleep, outage))
            while window and (len(window) > 4 * max_concurrency or not isinstance(window[0], Future)
                              or window[0].done()):
                write_oldest()
        while window:
            write_oldest()
    finally:
        pool.close()
        out.flush()
    return done, failed


def _custom_id(text: str) -> str | None:
    """The custom_id of a line that is no request, where it has one (its error line says which it was)."""
    try:
        cid = json.loads(text).get("custom_id")          # (json.loads takes UTF-8 bytes too)
    except (ValueError, AttributeError):
        return None
    return cid if isinstance(cid, str) else None


def http_post(base_url: str, timeout_s: float = TIMEOUT_S) -> Post:
    """``Post`` over HTTP to ``base_url`` (the server's root; a trailing /v1, as OpenAI clients take it, is dropped): a
    non-JSON answer (a proxy's plain text) becomes an error body with its text."""
    root = base_url.rstrip("/").removesuffix("/v1")

    def post(path: str, body: dict) -> tuple[int, dict, dict[str, str]]:
        req = urllib.request.Request(root + path, data=json.dumps(body).encode(),
                                     headers={"content-type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=timeout_s) as r:
                status, data, headers = r.status, r.read(), r.headers
        except urllib.error.HTTPError as e:
            status, data, headers = e.code, e.read(), e.headers
        except urllib.error.URLError as e:      # no answer: the connection's own error (refused: tried again)
            raise e.reason if isinstance(e.reason, OSError) else e from None
        try:
            out = json.loads(data)
        except ValueError:
            out = {"error": {"message": data.decode(errors="replace")[:2000], "type": "server_error"}}
        return status, out, {k.lower(): v for k, v in headers.items()}
    return post


def run_batch_file(inp: str, out: str, base_url: str, max_concurrency: int = 32) -> int:
    """``glmserve run-batch``'s work against a running server: the file ``inp`` answered into ``out``, a progress
    line on stderr; returns the exit code (0: every line answered 200; 1: some not)."""
    with open(inp, "rb") as f:
        total = sum(1 for line in f if line.strip())
    start, last, written = time.monotonic(), [0.0], [0]

    def progress(done: int, failed: int) -> None:
        now, written[0] = time.monotonic(), done
        if now - last[0] >= 1.0 or done == total:
            last[0] = now
            print(f"\rrun-batch: {done}/{total} lines, {failed} failed, {done / max(now - start, 1e-9):.1f} "
                  "lines/s", end="\n" if done == total else "", file=sys.stderr, flush=True)

    with open(inp, "rb") as f, open(out, "w", encoding="utf-8") as o:
        try:
            done, failed = run_batch(f, o, http_post(base_url), max_concurrency, progress)
        except KeyboardInterrupt:       # the requests in flight are dropped (their threads end with the process)
            print(f"\nrun-batch: interrupted: {written[0]} of {total} results written to {out}", file=sys.stderr)
            raise
    print(f"run-batch: wrote {done} results to {out} ({failed} failed) in {time.monotonic() - start:.1f} s",
          file=sys.stderr, flush=True)
    return 1 if failed else 0
