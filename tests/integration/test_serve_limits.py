"""A replica's limits on real Ray Serve: the context its KV holds, back-pressure (the engine's 429, not Serve's 503)
and the priority policy's refusals. Each test deploys an app of its own beside test_serve.py's."""

from __future__ import annotations

import json
import time
import urllib.request
from pathlib import Path

import pytest

from tests.integration.conftest import REPO
from tests.integration.test_serve import MODEL, metric, post

pytestmark = pytest.mark.ray


def coordinator_logs():
    """The Coordinator replicas' Serve logs of this Ray session."""
    import ray

    return Path(ray._private.worker._global_node.get_logs_dir_path()).glob("serve/replica_*Coordinator*.log")


def test_context_limit_is_the_schedulers_with_odd_kv_cache_tokens(serve_session, text_ckpt):
    """kv_cache_tokens 100 holds 6 whole blocks of 16: /v1/models, the ingress check and a chat request's default
    max_tokens all use the scheduler's 96."""
    from ray import serve

    from cluster.serve import build_app

    serve.run(build_app({"model": str(text_ckpt), "served_model_name": MODEL, "device": "cpu", "kv_cache_tokens": 100}),
              name="odd", route_prefix="/odd", logging_config={"enable_access_log": False, "log_level": "WARNING"})
    try:
        url = serve_session + "/odd"
        models = json.loads(urllib.request.urlopen(url + "/v1/models", timeout=30).read())
        assert models["data"][0]["max_model_len"] == 96
        chat = {"model": MODEL, "messages": [{"role": "user", "content": "Hi"}], "temperature": 0, "ignore_eos": True}
        status, out = post(url, "/v1/chat/completions", chat)
        assert status == 200 and out["usage"]["total_tokens"] == 96, out
        status, err = post(url, "/v1/completions", {"model": MODEL, "prompt": [5] * 90, "max_tokens": 10})
        assert status == 400 and "context length 96" in err["error"]["message"], err
        assert post(url, "/v1/nowhere", {})[0] == 404
        # the ingress's own answers in /metrics (session 57's metrics review: its 400s reached no metric)
        http = 'glmserve_http_requests_total{{route="{}",status="{}"}}'
        assert [metric(url, http.format(r, c)) for r, c in (("/v1/completions", 400), ("/v1/chat/completions", 200),
                                                             ("/v1/models", 200), ("other", 404))] == [1, 1, 1, 1]
    finally:
        serve.delete("odd")


def test_a_full_engine_answers_429_not_a_proxy_503(serve_session, text_ckpt):
    """Past what the engine admits (1 running + 1 waiting here) requests get the engine's 429 — an OpenAI error body
    and Retry-After — while the admitted ones finish; the ingress holds more requests than the engine admits (the
    8×H200 file's 128 + 1024 did not fit its 256 before: Serve's proxy queued them, then dropped the rest with a
    plain-text 503)."""
    from concurrent.futures import ThreadPoolExecutor

    from ray import serve

    from cluster.serve import INGRESS_MAX_ONGOING, build_app

    serve.run(build_app({"model": str(text_ckpt), "served_model_name": MODEL, "device": "cpu", "kv_cache_tokens": 2048,
                         "max_num_seqs": 1, "max_waiting": 1}),
              name="full", route_prefix="/full", logging_config={"enable_access_log": False, "log_level": "WARNING"})
    try:
        body = json.dumps({"model": MODEL, "prompt": "Once", "max_tokens": 64, "ignore_eos": True}).encode()

        def one(_):
            req = urllib.request.Request(serve_session + "/full/v1/completions", data=body,
                                         headers={"content-type": "application/json"})
            try:
                with urllib.request.urlopen(req, timeout=120) as r:
                    return r.status, json.loads(r.read()), None
            except urllib.error.HTTPError as e:
                return e.code, json.loads(e.read()), e.headers.get("Retry-After")

        with ThreadPoolExecutor(8) as pool:
            results = list(pool.map(one, range(8)))
        statuses = sorted(r[0] for r in results)
        assert set(statuses) == {200, 429}, statuses
        assert metric(serve_session + "/full", 'glmserve_refused_requests_total{reason="queue_full"}') == \
            statuses.count(429)
        for status, out, retry in results:
            if status == 429:
                assert out["error"]["type"] == "rate_limit_error" and retry == "1", out
            else:
                assert out["usage"]["completion_tokens"] == 64
        # more choices than it admits at once: a 400 naming n, not a 429 that a retry never gets past
        status, err = post(serve_session + "/full", "/v1/completions", {"model": MODEL, "prompt": "Once", "n": 3})
        assert status == 400 and err["error"]["param"] == "n", err
        # a refusal is an answer, not a failure: the replica logs no error (Serve logged each raise with its traceback)
        logs = list(coordinator_logs())
        assert logs and not [p.name for p in logs if "AdmissionError" in p.read_text(errors="replace")]
    finally:
        serve.delete("full")
    for path in ("glm5-8xh200.yaml", "kuberay-rayservice.yaml"):     # the shipped files' engines can say 429
        text = (REPO / "deploy" / path).read_text()
        admitted = sum(int(text.split(f"{key}: ")[1].split()[0]) for key in ("max_num_seqs", "max_waiting"))
        assert admitted < INGRESS_MAX_ONGOING, (path, admitted)


def test_a_priority_replica_gives_a_queued_lower_priority_request_the_429(serve_session, text_ckpt):
    """``scheduling_policy: priority``, full at 1 running + 1 waiting: a priority-0 request is admitted in place of the
    waiting priority-5 one, whose client gets the 429 (its answer had not started) while the running one streams on."""
    from concurrent.futures import ThreadPoolExecutor

    from ray import serve

    from cluster.serve import build_app

    serve.run(build_app({"model": str(text_ckpt), "served_model_name": MODEL, "device": "cpu", "kv_cache_tokens": 4096,
                         "max_num_seqs": 1, "max_waiting": 1, "scheduling_policy": "priority"}),
              name="prio", route_prefix="/prio", logging_config={"enable_access_log": False, "log_level": "WARNING"})
    url = serve_session + "/prio"
    try:
        long = urllib.request.urlopen(urllib.request.Request(url + "/v1/completions", data=json.dumps({
            "model": MODEL, "prompt": "Once", "max_tokens": 1000, "ignore_eos": True, "stream": True, "priority": 5,
        }).encode(), headers={"content-type": "application/json"}), timeout=60)
        long.readline()                                              # it runs
        with ThreadPoolExecutor(1) as pool:
            queued = pool.submit(post, url, "/v1/completions", {"model": MODEL, "prompt": "Twice", "max_tokens": 4,
                                                                 "priority": 5})
            deadline = time.time() + 30
            while metric(url, "glmserve_queue_depth") < 1:           # it waits
                assert time.time() < deadline
                time.sleep(0.1)
            status, out = post(url, "/v1/completions", {"model": MODEL, "prompt": "Now", "max_tokens": 4,
                                                         "priority": 0})
            assert status == 200 and out["usage"]["completion_tokens"] == 4, out
            status, err = queued.result(timeout=60)
        assert status == 429 and "higher priority" in err["error"]["message"], err
        assert metric(url, 'glmserve_refused_requests_total{reason="queue_full"}') == 1
        long.close()
    finally:
        serve.delete("prio")
