"""``glmserve run-batch`` (``cluster/batch.py``) over a fake server: results in the input's order whatever order the
answers come in, lines that are no request answered with an error line, back-pressure retried, an unreachable server
an error line — nothing lost, nothing answered twice."""

from __future__ import annotations

import io
import json
import random
import threading
import time

import pytest

import cluster.batch as batch
from cluster.batch import answer, parse_line, run_batch


def _line(cid, url="/v1/chat/completions", body=None, **extra) -> str:
    return json.dumps({"custom_id": cid, "method": "POST", "url": url,
                       "body": body if body is not None else {"model": "m", "messages": []}, **extra})


def _results(out: io.StringIO) -> list[dict]:
    return [json.loads(line) for line in out.getvalue().splitlines()]


def test_results_keep_the_input_order_whatever_order_answers_come_in():
    rng, calls, lock = random.Random(0), [], threading.Lock()

    def post(path, body):
        time.sleep(rng.random() * 0.01)
        with lock:
            calls.append(body["n"])
        return 200, {"id": f"r{body['n']}", "echo": body["n"]}, {}

    lines = [_line(f"c{i}", body={"n": i}) for i in range(60)]
    out = io.StringIO()
    assert run_batch(lines, out, post, max_concurrency=8) == (60, 0)
    got = _results(out)
    assert [r["custom_id"] for r in got] == [f"c{i}" for i in range(60)] and sorted(calls) == list(range(60))
    assert all(r["response"] == {"status_code": 200, "request_id": f"r{i}", "body": {"id": f"r{i}", "echo": i}}
               and r["error"] is None for i, r in enumerate(got))
    assert len({r["id"] for r in got}) == 60


@pytest.mark.parametrize("text,message", [
    ("not json", "not JSON"), ("[1]", "JSON object"), (json.dumps({"url": "/v1/completions", "body": {}}), "custom_id"),
    (_line("x", url="/v1/embeddings"), "url must be one of"), (_line("x", method="GET"), "method must be POST"),
    (_line("x", body={"stream": True}), "stream must be false"), (_line("x", body=[1]), "body must be"),
])
def test_a_line_that_is_no_request_gets_an_error_line(text, message):
    with pytest.raises(batch.LineError, match=message):
        parse_line(text, set())
    out = io.StringIO()
    sent = []
    assert run_batch([_line("a"), text, "", _line("b")], out, lambda p, b: (sent.append(p), (200, {}, {}))[1]) \
        == (3, 1)
    first, bad, last = _results(out)
    assert bad["response"] is None and message in bad["error"]["message"] and len(sent) == 2
    assert (first["custom_id"], last["custom_id"]) == ("a", "b")


def test_a_repeated_custom_id_is_an_error_line():
    out = io.StringIO()
    run_batch([_line("a"), _line("a")], out, lambda p, b: (200, {}, {}))
    assert _results(out)[1]["error"]["message"].startswith("input line 2: custom_id 'a' is used by an earlier line")


def test_back_pressure_is_retried_and_refusals_are_results(monkeypatch):
    """A 429 / 503 is sent again after its Retry-After; a 400 is the line's result (a response with its status),
    and so is a 429 still there after RETRIES tries; a connection refused is tried again until the server has refused
    for REFUSED_S (a later line in the same outage: not again), one cut short is an error line at once."""
    answers = iter([(429, {"error": {}}, {"retry-after": "2"}), (503, {"error": {}}, {}), (200, {"id": "ok"}, {})])
    slept = []
    got = answer("a", "/v1/completions", {}, lambda p, b: next(answers), slept.append)
    assert got["response"]["status_code"] == 200 and slept == [2.0, 1.0]
    bad = answer("b", "/v1/completions", {}, lambda p, b: (400, {"error": {"message": "no"}}, {}), slept.append)
    assert bad["response"] == {"status_code": 400, "request_id": "", "body": {"error": {"message": "no"}}}
    monkeypatch.setattr(batch, "RETRIES", 2)
    full = answer("c", "/v1/completions", {}, lambda p, b: (429, {}, {"retry-after": "0"}), lambda s: None)
    assert full["response"]["status_code"] == 429

    def refused(path, body):
        raise ConnectionRefusedError(111, "Connection refused")

    def cut(path, body):
        import http.client

        raise http.client.IncompleteRead(b"{")

    monkeypatch.setattr(batch, "REFUSED_S", 3.0)
    clock = [0.0]

    def tick(seconds):
        slept.append(seconds)
        clock[0] += seconds

    outage = batch.Outage(lambda: clock[0])
    # refused: tried again for REFUSED_S; cut short: not (it ran); refused again in the same outage: not either
    for broken, waits in ((refused, [1.0] * 3), (cut, []), (refused, [])):
        slept.clear()
        gone = answer("d", "/v1/completions", {}, broken, tick, outage)
        assert gone["response"] is None and gone["error"]["code"] == "server_unreachable"
        assert slept == waits, (broken, slept)
    back = iter([ConnectionRefusedError(111, "refused"), (200, {"id": "up"}, {})])

    def restarting(path, body):
        got = next(back)
        if isinstance(got, Exception):
            raise got
        return got

    assert answer("f", "/v1/completions", {}, restarting, lambda s: None)["response"]["status_code"] == 200

    dated = iter([(429, {}, {"retry-after": "Wed, 21 Oct 2026 07:28:00 GMT"}), (200, {}, {})])
    slept.clear()
    assert answer("e", "/v1/completions", {}, lambda p, b: next(dated), slept.append)["response"]["status_code"] == 200
    assert slept == [1.0]                               # an HTTP date: a second


def test_http_post_raises_a_refused_connection_as_such():
    """urllib wraps a refused connection in a URLError: ``http_post`` raises the refusal itself, which ``answer``
    tries again."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]                       # closed once the block ends: nothing listens there
    with pytest.raises(ConnectionRefusedError):
        batch.http_post(f"http://127.0.0.1:{port}/v1")("/v1/completions", {})


def test_ctrl_c_stops_at_once_with_what_was_written(tmp_path):
    """SIGINT while requests hang on a server that never answers: the command exits 130 within seconds (not when the
    requests would time out), the results answered before it written."""
    import http.server
    import os
    import signal
    import subprocess
    import sys

    release = threading.Event()

    class Slow(http.server.BaseHTTPRequestHandler):
        def do_POST(self):
            body = json.loads(self.rfile.read(int(self.headers["content-length"])))
            if body.get("slow"):
                release.wait(60)
            data = json.dumps({"id": "x"}).encode()
            try:
                self.send_response(200)
                self.send_header("content-length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)
            except OSError:             # the client went away (interrupted)
                pass

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Slow)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    inp, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    inp.write_text("\n".join([_line("fast", body={})] + [_line(f"slow{i}", body={"slow": True}) for i in range(4)]))
    proc = subprocess.Popen([sys.executable, "-m", "cluster.cli", "run-batch", "-i", str(inp), "-o", str(out),
                             "--base-url", f"http://127.0.0.1:{server.server_address[1]}", "--max-concurrency", "2"],
                            cwd=os.path.dirname(os.path.dirname(os.path.dirname(__file__))), stderr=subprocess.PIPE,
                            text=True)
    try:
        deadline = time.time() + 60
        while time.time() < deadline and not (out.exists() and out.read_text()):
            time.sleep(0.1)
        time.sleep(0.5)
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=15)
    finally:
        release.set()
        proc.kill()
        server.shutdown()
    assert proc.returncode == 130 and "interrupted: 1 of 5 results" in err, err
    assert [json.loads(x)["custom_id"] for x in out.read_text().splitlines()] == ["fast"]


def test_a_line_that_is_not_utf8_is_its_own_error_and_a_bad_line_uses_no_id():
    """Bytes in: a line that is not UTF-8 gets its error line (naming its input line), the others are answered; a
    line refused for another field leaves its custom_id free for a later line."""
    lines = [_line("a").encode(), b'{"custom_id": "b\xff"}', b"\n", _line("c", method="GET").encode(),
             _line("c").encode()]
    out = io.StringIO()
    assert run_batch(lines, out, lambda p, b: (200, {}, {})) == (4, 2)
    a, bad, get, c = _results(out)
    assert bad["error"]["message"].startswith("input line 2: the line is not UTF-8")
    assert "input line 4" in get["error"]["message"] and c["response"]["status_code"] == 200


def test_a_base_url_with_v1_reaches_the_same_endpoints(monkeypatch):
    sent = []

    class Answer:
        status, headers = 200, {}

        def __enter__(self):
            return self

        def __exit__(self, *a):
            return False

        def read(self):
            return b"{}"

    monkeypatch.setattr(batch.urllib.request, "urlopen", lambda req, timeout: (sent.append(req.full_url), Answer())[1])
    for base in ("http://h:8000", "http://h:8000/", "http://h:8000/v1", "http://h:8000/v1/"):
        batch.http_post(base)("/v1/completions", {})
    assert sent == ["http://h:8000/v1/completions"] * 4


def test_a_file_saved_with_a_byte_order_mark_loses_no_line():
    """Windows editors save UTF-8 with a BOM: the first line was "not JSON" and never sent (session 58's completions
    review); it is read as the server reads a body (utf-8-sig)."""
    line = _line("a")
    for text in ("\ufeff" + line, ("\ufeff" + line).encode()):
        assert parse_line(text, set())[0] == "a"
