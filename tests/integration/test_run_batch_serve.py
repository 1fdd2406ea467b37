"""``glmserve run-batch`` against real Ray Serve: an OpenAI Batch API file over every endpoint — each result the
endpoint's own answer (greedy: what a direct request gets), in the input's order, a refused request its 400, a line
that is no request its error line — through ``--base-url``, and with a server the command starts and stops itself."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.integration.conftest import REPO
from tests.integration.test_serve import MODEL, post

pytestmark = pytest.mark.ray


@pytest.fixture(scope="module")
def url(serve_session, text_ckpt):
    from ray import serve

    from cluster.serve import build_app

    serve.run(build_app({"model": str(text_ckpt), "served_model_name": MODEL, "device": "cpu", "kv_cache_tokens": 4096,
                         "max_num_seqs": 4, "max_waiting": 2}),
              name="batch", route_prefix="/batch", logging_config={"enable_access_log": False, "log_level": "WARNING"})
    yield serve_session + "/batch"
    serve.delete("batch")


def _requests(model: str = MODEL) -> list[dict]:
    chat = lambda text: {"model": model, "messages": [{"role": "user", "content": text}], "max_tokens": 6,
                         "temperature": 0, "ignore_eos": True}
    lines = [{"custom_id": f"chat-{i}", "method": "POST", "url": "/v1/chat/completions", "body": chat(text)}
             for i, text in enumerate(["Hi", "Tell me a story", "Weather?", "Hello there", "Say yes.", "Count"])]
    lines += [{"custom_id": "cmpl", "method": "POST", "url": "/v1/completions",
               "body": {"model": model, "prompt": ["Once upon", "The king"], "max_tokens": 4, "temperature": 0,
                        "echo": True, "logprobs": 1}},
              {"custom_id": "resp", "method": "POST", "url": "/v1/responses",
               "body": {"model": model, "input": "Hi", "max_output_tokens": 4, "temperature": 0}},
              {"custom_id": "msg", "method": "POST", "url": "/v1/messages",
               "body": {"model": model, "max_tokens": 4, "messages": [{"role": "user", "content": "Hi"}]}},
              {"custom_id": "refused", "method": "POST", "url": "/v1/completions",
               "body": {"model": model, "prompt": "x", "temperature": -1}}]
    return lines


def _write(tmp_path, lines: list) -> tuple[str, str]:
    inp, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    inp.write_text("".join((x if isinstance(x, str) else json.dumps(x)) + "\n" for x in lines))
    return str(inp), str(out)


def test_a_batch_file_through_every_endpoint(url, tmp_path):
    """Ten requests (more than the replica runs and queues at once: its 429s are retried) and a line that is no
    request, two at a time and eight at a time: the same results, each a direct request's."""
    from cluster.batch import run_batch_file

    lines = _requests()
    inp, out = _write(tmp_path, lines[:3] + ["{oops"] + lines[3:])
    assert run_batch_file(inp, out, url, max_concurrency=2) == 1            # the refused one and the bad line
    got = [json.loads(x) for x in open(out)]
    assert [r["custom_id"] for r in got] == ["chat-0", "chat-1", "chat-2", None] + [x["custom_id"] for x in lines[3:]]
    by_id = {r["custom_id"]: r for r in got}
    assert got[3]["response"] is None and "not JSON" in got[3]["error"]["message"]
    assert by_id["refused"]["response"]["status_code"] == 400
    assert by_id["refused"]["response"]["body"]["error"]["param"] == "temperature"
    for line in lines[:-1]:
        r = by_id[line["custom_id"]]
        assert r["error"] is None and r["response"]["status_code"] == 200, r
        assert r["response"]["request_id"] == r["response"]["body"]["id"]
    for line in lines[:6] + lines[6:7]:                                      # greedy: a direct request's answer
        status, direct = post(url, line["url"], line["body"])
        field = "message" if "chat" in line["url"] else "text"
        assert status == 200 and [c[field] for c in direct["choices"]] == \
            [c[field] for c in by_id[line["custom_id"]]["response"]["body"]["choices"]]
    assert len(by_id["cmpl"]["response"]["body"]["choices"]) == 2
    again = tmp_path / "again.jsonl"
    assert run_batch_file(inp, str(again), url, max_concurrency=8) == 1
    strip = lambda r: (r["custom_id"], r["response"] and r["response"]["status_code"],
                       r["response"] and [c.get("text", c.get("message")) for c in r["response"]["body"].get(
                           "choices", [])])
    assert [strip(json.loads(x)) for x in open(again)] == [strip(r) for r in got]


def test_the_command_with_a_server_of_its_own(tmp_path):
    """``glmserve run-batch`` with no ``--base-url`` starts a server (Ray and Serve in its process), answers the file
    and stops it: exit 0, every line answered."""
    import tempfile

    lines = [x for x in _requests("tiny") if x["custom_id"] in ("chat-0", "cmpl")]
    inp, out = _write(tmp_path, lines)
    env = {**os.environ, "RAY_TMPDIR": tempfile.mkdtemp(prefix="rb", dir="/tmp"), "RAY_AUTH_MODE": "disabled",
           "RAY_USAGE_STATS_ENABLED": "0"}
    env.pop("RAY_ADDRESS", None)
    exe = os.path.join(os.path.dirname(sys.executable), "glmserve")
    run = subprocess.run([exe, "run-batch", "-i", inp, "-o", out, "--kv-cache-tokens", "4096"], env=env, cwd=REPO,
                         capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, (run.stdout[-2000:], run.stderr[-2000:])
    got = [json.loads(x) for x in open(out)]
    assert [r["custom_id"] for r in got] == ["chat-0", "cmpl"]
    assert all(r["response"]["status_code"] == 200 for r in got) and "2/2 lines, 0 failed" in run.stderr
