"""Session 62's mutation review of the serving front end: ``cluster/serve.py`` (the ingress's routes, error bodies,
limits, streams and disconnects; the Serve application's deployment options), ``cluster/server.py`` (``glmserve
serve``: start, stop flag, drain) and ``cluster/cli.py`` (flags into ``serve`` / ``run-batch``) — each test fails on
a mutant the suite let live (bench/results/session62/review_mut_serve). No Ray: the ingress is the real class on a
fake coordinator, Serve's and Ray's calls are stand-ins."""

from __future__ import annotations

import asyncio
import json
import types
from pathlib import Path

import pytest

pytest.importorskip("ray")

from cluster import serve as serve_mod  # noqa: E402
from cluster.config import DEFAULT_MODEL, EngineConfig  # noqa: E402
from cluster.engine import TokenEvent  # noqa: E402
from cluster.protocol import ApiError, ChatCompletionRequest, CompletionRequest  # noqa: E402
from scheduler.scheduler import AdmissionError  # noqa: E402

BASE = serve_mod.OpenAIIngress.__mro__[1]           # the class under Serve's ASGI wrapper
# serve.ingress pickled the class by value: its methods read names from a copy of the module's globals, which a
# test patches (the module's own attributes do not reach them)
G = BASE.health.__globals__
NAME = Path(DEFAULT_MODEL).name


class Gen:
    """A Ray streaming generator of one request: its events (an exception is raised where it stands), then, unless
    ``ends``, nothing more for ever (a request still generating)."""

    def __init__(self, events, ends=False):
        self.events, self.ends, self.cancelled = list(events), ends, False

    def __aiter__(self):
        return self

    async def __anext__(self):
        if self.events:
            ev = self.events.pop(0)
            if isinstance(ev, BaseException):
                raise ev
            return ev
        if self.ends:
            raise StopAsyncIteration
        await asyncio.Event().wait()

    def cancel(self):
        self.cancelled = True


class Coord:
    """The Coordinator deployment's handle: ``script(ids, params, req_id)`` gives a request's ``Gen``."""

    def __init__(self, script=None, max_model_len=1024):
        self.sent, self.aborted, self.gens = [], [], {}
        self.script = script or (lambda ids, params, rid: Gen([TokenEvent(rid, [5], "a", True, "stop")], ends=True))
        self.generate = types.SimpleNamespace(remote=self._generate)
        self.abort = types.SimpleNamespace(remote=self._abort)
        self.info = types.SimpleNamespace(remote=self._info)
        self.context = max_model_len

    def options(self, **kw):
        assert kw == {"stream": True}
        return self

    def _generate(self, ids, params, req_id):
        self.sent.append((list(ids), params, req_id))
        self.gens[req_id] = self.script(ids, params, req_id)
        return self.gens[req_id]

    async def _abort(self, req_id):
        self.aborted.append(req_id)

    async def _info(self):
        return {"max_model_len": self.context}


def _ingress(coord=None, **cfg):
    ing = BASE.__new__(BASE)
    BASE.__init__(ing, coord or Coord(), {"model": DEFAULT_MODEL, "kv_cache_tokens": 4096, "max_model_len": 1024,
                                          **cfg})
    return ing


def _request(body) -> types.SimpleNamespace:
    async def read():
        return json.dumps(body).encode()
    return types.SimpleNamespace(body=read)


async def _until(cond, ticks=200):
    """Let the loop run until ``cond()`` (cancelled tasks' ``finally`` blocks run a tick or two later)."""
    for _ in range(ticks):
        if cond():
            return True
        await asyncio.sleep(0.005)
    return bool(cond())         # (not the list itself: the loop's shutdown may fill it before an assert reads it)


def _raises(coro) -> ApiError:
    with pytest.raises(ApiError) as e:
        asyncio.run(coro)
    return e.value


# ---- error bodies and status codes ------------------------------------------------------------------------------
def test_error_handlers_keep_the_status_and_headers_in_an_openai_body():
    from starlette.exceptions import HTTPException

    resp = asyncio.run(serve_mod._api_error(None, ApiError(429, "full", None, "rate_limit_error",
                                                           {"Retry-After": "1"})))
    assert resp.status_code == 429 and resp.headers["retry-after"] == "1"
    assert json.loads(resp.body)["error"]["type"] == "rate_limit_error"
    request = types.SimpleNamespace(method="DELETE", url=types.SimpleNamespace(path="/v1/models"))
    resp = asyncio.run(serve_mod._http_error(request, HTTPException(405, "Method Not Allowed",
                                                                    headers={"Allow": "GET"})))
    assert resp.status_code == 405 and resp.headers["allow"] == "GET"
    assert json.loads(resp.body)["error"]["message"] == "Method Not Allowed: DELETE /v1/models"


def test_admission_errors_other_than_a_full_queue():
    e = serve_mod._admission_error(AdmissionError("unavailable", "model", "the worker group is down"))
    assert (e.status, e.type, e.headers) == (503, "service_unavailable", {"Retry-After": "5"})
    e = serve_mod._admission_error(AdmissionError("kv_capacity", "prompt", "more KV than the pool holds"))
    assert (e.status, e.param, e.code) == (400, "prompt", "context_length_exceeded")


def test_a_replica_that_fails_before_its_first_event_is_a_503():
    coord = Coord(lambda ids, params, rid: Gen([RuntimeError("ActorDiedError (pid=1)")]))
    ing = _ingress(coord)
    body = CompletionRequest.model_validate({"model": NAME, "prompt": [1, 2, 3]})
    e = _raises(ing._start(body, [[1, 2, 3]], None, chat=False))
    assert (e.status, e.type) == (503, "server_error") and ing.in_flight == 0


def test_a_sampling_params_refusal_is_a_400():
    ing = _ingress()
    body = CompletionRequest.model_validate({"model": NAME, "prompt": [1, 2, 3]})
    body.temperature = -1.0                           # (past the request's own check: SamplingParams refuses it)
    e = _raises(ing._start(body, [[1, 2, 3]], None, chat=False))
    assert e.status == 400 and "temperature" in e.message


def test_parse_answers_a_draining_server_a_wrong_model_and_a_priority_without_its_policy():
    ing = _ingress()
    ask = {"model": NAME, "prompt": "hi", "priority": -1}
    e = _raises(ing._parse(_request({**ask, "model": "other"}), CompletionRequest))
    assert (e.status, e.param, e.code) == (404, "model", "model_not_found")
    e = _raises(ing._parse(_request(ask), CompletionRequest))           # under fcfs every priority is 0
    assert (e.status, e.param) == (400, "priority")
    assert asyncio.run(_ingress(scheduling_policy="priority")._parse(_request(ask), CompletionRequest)).priority == -1
    assert asyncio.run(ing.drain()) == 0
    e = _raises(ing._parse(_request({"model": NAME, "prompt": "hi"}), CompletionRequest))
    assert (e.status, e.type, e.headers) == (503, "server_error", {"Retry-After": "1"})


def test_parse_learns_the_context_of_a_pool_sized_to_memory():
    ing = _ingress(Coord(max_model_len=777))
    ing.max_model_len = ing.max_prompt_chars = None           # as where the workers size their KV pool to memory
    asyncio.run(ing._parse(_request({"model": NAME, "prompt": "hi"}), CompletionRequest))
    assert ing.max_model_len == 777 and ing.max_prompt_chars == 777 * ing.longest_token


def test_a_responses_error_names_the_responses_field():
    ing = _ingress()

    async def refuse(*a, **kw):
        raise ApiError(400, "max_completion_tokens (5000) exceeds the context", "max_completion_tokens")

    ing._start, ing._chat_ids = refuse, _prompt_of(2)
    e = _raises(ing.responses(_request({"model": NAME, "input": "hi"})))
    assert e.param == "max_output_tokens" and "max_output_tokens (5000)" in e.message


def test_a_strict_function_refuses_ignore_eos_naming_it():
    """Its calls end at EOS: ignore_eos is a 400 on ignore_eos (left to SamplingParams it was a 400 naming nothing)."""
    ing = _ingress()
    tool = {"type": "function", "function": {"name": "f", "strict": True, "parameters": {
        "type": "object", "properties": {"a": {"type": "string"}}, "required": ["a"]}}}
    body = ChatCompletionRequest.model_validate({"model": NAME, "messages": [{"role": "user", "content": "hi"}],
                                                 "tools": [tool], "ignore_eos": True})
    with pytest.raises(ApiError) as e:
        serve_mod._tool_guidance(body, ing.tool_ids, ing.tokenizer)
    assert (e.value.status, e.value.param) == (400, "ignore_eos")


# ---- limits and their bounds ------------------------------------------------------------------------------------
def test_the_size_and_context_bounds_admit_what_just_fits():
    from cluster.serve import TRUNCATED_MAX_CHARS, _check_context, _fits

    _fits(100, 100, "prompt")
    with pytest.raises(ApiError):
        _fits(101, 100, "prompt")
    chat = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
    _check_context(ChatCompletionRequest.model_validate({**chat, "max_tokens": 56}), [1] * 8, 56, True, 64)
    with pytest.raises(ApiError) as e:       # the prompt alone fills the context: the prompt is to blame
        _check_context(ChatCompletionRequest.model_validate({**chat, "max_tokens": 1}), [1] * 64, 1, True, 64)
    assert e.value.param == "messages"
    ing = _ingress()
    cut = CompletionRequest.model_validate({"model": NAME, "prompt": "x", "truncate_prompt_tokens": 1024})
    assert ing._truncated(cut, list(range(2000))) == list(range(976, 2000))        # max_model_len itself: valid
    assert ing._max_chars(cut) == max(ing.max_prompt_chars, TRUNCATED_MAX_CHARS)
    vocab = ing.model_config.vocab_size
    ing._check_ids([vocab - 1], "prompt")
    with pytest.raises(ApiError) as e:
        ing._check_ids([vocab], "prompt")
    assert e.value.param == "prompt"


def test_detokenize_refuses_ids_outside_the_vocabulary():
    ing = _ingress()
    e = _raises(ing.detokenize(_request({"model": NAME, "tokens": [1, ing.model_config.vocab_size]})))
    assert (e.status, e.param) == (400, "tokens")


def test_n_up_to_what_the_engine_admits_at_once():
    ing = _ingress(max_num_seqs=2, max_waiting=3)                  # admits 5 choices at once
    body = CompletionRequest.model_validate({"model": NAME, "prompt": [1, 2, 3], "n": 5})
    asyncio.run(ing._start(body, [[1, 2, 3]], None, chat=False))
    assert len(ing.coord.sent) == 5
    e = _raises(ing._start(body.model_copy(update={"n": 6}), [[1, 2, 3]], None, chat=False))
    assert (e.status, e.param) == (400, "n")


def test_a_batchs_choices_have_their_own_request_ids():
    ing = _ingress()
    body = CompletionRequest.model_validate({"model": NAME, "prompt": [[1, 2], [3, 4]], "n": 2})
    asyncio.run(ing._start(body, [[1, 2], [3, 4]], None, chat=False))
    rids = [rid for _, _, rid in ing.coord.sent]
    assert len(set(rids)) == 4 and [r.rsplit("-", 1)[1] for r in rids] == ["0", "1", "2", "3"]


def test_chat_fields_reach_the_engine():
    """logprobs without top_logprobs: the chosen token's (0, not none); max_completion_tokens is the limit."""
    ing, got = _ingress(), []

    async def respond(body, prompts, logprobs, chat):
        got.append((body.max_tokens, logprobs))

    ing._respond = respond
    chat = {"model": NAME, "messages": [{"role": "user", "content": "hi"}]}
    asyncio.run(ing.chat_completions(_request({**chat, "logprobs": True, "max_completion_tokens": 7})))
    asyncio.run(ing.chat_completions(_request({**chat, "max_tokens": 9})))
    assert got == [(7, 0), (9, None)]


def test_echo_of_a_truncated_prompt_is_what_the_model_read():
    ing = _ingress()
    prompt = ing.tokenizer.encode("one two three four five six")
    resp = asyncio.run(ing.completions(_request({"model": NAME, "prompt": prompt, "echo": True, "max_tokens": 1,
                                                 "truncate_prompt_tokens": 2})))
    assert ing.coord.sent[-1][0] == prompt[-2:]
    assert json.loads(resp.body)["choices"][0]["text"] == ing.tokenizer.decode(prompt[-2:]) + "a"


def test_messages_refuse_a_prompt_that_fills_the_context_and_cut_max_tokens_to_the_room_left():
    ing = _ingress()                                  # max_model_len 1024
    body = {"model": NAME, "max_tokens": 100, "messages": [{"role": "user", "content": "hi"}]}
    ing._chat_ids = _prompt_of(1024)
    resp = asyncio.run(ing.messages(_request(body)))
    assert resp.status_code == 400 and "prompt is too long: 1024 tokens > 1023 maximum" in resp.body.decode()
    ing._chat_ids = _prompt_of(1000)
    assert asyncio.run(ing.messages(_request(body))).status_code == 200
    assert ing.coord.sent[-1][1].max_tokens == 24


def _prompt_of(size):
    async def ids(chat):
        return [1] * size
    return ids


# ---- streams: disconnects, leaks, framing ------------------------------------------------------------------------
def _hanging(ids, params, rid):
    return Gen([TokenEvent(rid, [5], "a")])


def test_a_choice_refused_at_its_first_event_closes_the_choices_already_open():
    """n = 2 where the second is refused (the queue is full): the 429 goes out, and the first — admitted,
    generating — is aborted rather than left running for a client that got an error."""
    def script(ids, params, rid):
        if rid.endswith("-1"):
            return Gen([TokenEvent(rid, [], "", refused=AdmissionError("queue_full", "queue", "the queue is full"))])
        return _hanging(ids, params, rid)

    ing = _ingress(Coord(script))
    body = CompletionRequest.model_validate({"model": NAME, "prompt": [1, 2, 3], "n": 2})

    async def main():
        with pytest.raises(ApiError) as e:
            await ing._start(body, [[1, 2, 3]], None, chat=False)
        assert e.value.status == 429
        return ing.in_flight, set(ing.open_ids), list(ing.coord.aborted)

    in_flight, open_ids, aborted = asyncio.run(main())
    assert in_flight == 0 and not open_ids and sorted(a[-2:] for a in aborted) == ["-0", "-1"]


def test_a_client_leaving_mid_stream_aborts_its_request_and_a_refusal_first_is_raised():
    coord = Coord(_hanging)
    ing = _ingress(coord)

    async def leave():
        s = ing._open([1, 2], None, "r0")
        ev = await s.__anext__()
        await s.aclose()                    # the client went away after the first tokens
        return ev

    ev = asyncio.run(leave())
    assert ev.text == "a" and coord.aborted == ["r0"] and coord.gens["r0"].cancelled
    refused = AdmissionError("queue_full", "queue", "full")
    coord.script = lambda ids, params, rid: Gen([TokenEvent(rid, [], "", refused=refused)])
    with pytest.raises(AdmissionError):
        asyncio.run(ing._open([1, 2], None, "r1").__anext__())


def test_only_the_servers_own_shutdown_makes_an_abort_an_error():
    coord = Coord(lambda ids, params, rid: Gen([TokenEvent(rid, [], "", True, "abort")], ends=True))
    ing = _ingress(coord)

    async def events():
        return [ev async for ev in ing._open([1, 2], None, "r0")]

    assert [ev.error for ev in asyncio.run(events())] == [None]
    ing.closing = True
    assert [ev.error for ev in asyncio.run(events())] == ["the server shut down before the request finished"]


def test_closing_a_messages_or_responses_stream_closes_its_choices():
    from cluster.choices import closing as _closing

    closed = []

    class Merged:
        async def aclose(self):
            closed.append(True)

    async def events():
        yield "a"
        yield "b"

    async def main():
        c = _closing(events(), Merged())
        assert await c.__anext__() == "a"
        await c.aclose()

    asyncio.run(main())
    assert closed == [True]


def test_closing_the_merged_choices_ends_each_choices_stream_now():
    """Each choice's pump is inside its stream (waiting for the engine) when the response ends: closing the merged
    choices cancels the pumps, so each stream's ``finally`` (its request's abort) runs then, not at the loop's end."""
    from cluster.choices import merge as _merge

    closed = []

    async def stream(i):
        try:
            yield i
            await asyncio.Event().wait()
            yield i
        finally:
            closed.append(i)

    async def main():
        streams = [stream(0), stream(1)]
        merged = _merge(streams, [await s.__anext__() for s in streams])
        assert await merged.__anext__() == (0, 0)
        assert await _until(lambda: all(s.ag_running for s in streams))        # each pump waits inside its stream
        await merged.aclose()
        return await _until(lambda: len(closed) == 2)

    assert asyncio.run(main())


def test_a_chat_stream_is_server_sent_events_ending_with_done():
    ing = _ingress()
    chat = {"model": NAME, "messages": [{"role": "user", "content": "hi"}], "stream": True}

    async def main():
        resp = await ing.chat_completions(_request(chat))
        return resp, [x async for x in resp.body_iterator]

    resp, frames = asyncio.run(main())
    assert resp.media_type == "text/event-stream" and resp.headers["content-type"].startswith("text/event-stream")
    assert frames[-1] == "data: [DONE]\n\n" and all(f.startswith("data: ") for f in frames)


@pytest.fixture
def kept(monkeypatch):
    """The choices' merged streams, held here as a middleware or a traceback may hold them: closing the response
    must close them, not the collector's finalizing what nothing references any more."""
    held = []
    merged = G["MergedChoices"]
    monkeypatch.setitem(G, "MergedChoices", lambda *a: held.append(merged(*a)) or held[-1])
    return held


def test_a_messages_stream_whose_client_left_aborts_the_request(kept):
    coord = Coord(_hanging)
    ing = _ingress(coord)
    body = {"model": NAME, "max_tokens": 10, "messages": [{"role": "user", "content": "hi"}], "stream": True}

    async def main():
        resp = await ing.messages(_request(body))
        while "content_block_delta" not in await resp.body_iterator.__anext__():
            pass
        await resp.body_iterator.aclose()           # the client went away
        return await _until(lambda: coord.aborted)

    assert asyncio.run(main()) and len(coord.aborted) == 1 and len(kept) == 1


def test_a_message_that_fails_while_it_is_formed_frees_its_request(monkeypatch, kept):
    """A non-streamed message whose forming raises (a bug) is a 500 — and its request is aborted then, not left
    generating until the exception's frames are collected."""
    coord = Coord(_hanging)
    ing = _ingress(coord)
    body = {"model": NAME, "max_tokens": 10, "messages": [{"role": "user", "content": "hi"}]}

    class Failing(serve_mod.MessageEvents):
        async def whole(self, chunks):
            await chunks.__anext__()
            raise RuntimeError("a formatter bug")

    monkeypatch.setitem(G, "MessageEvents", Failing)

    async def main():
        with pytest.raises(RuntimeError) as e:
            await asyncio.wait_for(ing.messages(_request(body)), 30)     # (a guard, not a measure)
        return e, await _until(lambda: coord.aborted)            # (``e`` holds the failed frames)

    assert asyncio.run(main())[1]


# ---- health, drain, metrics --------------------------------------------------------------------------------------
def test_metrics_take_this_replicas_fresh_text_over_the_hubs_copy(monkeypatch):
    merged = {}

    async def metrics_text():
        return "coord-a", "fresh"

    async def hub_get():
        return {"coord-a": "stale", "coord-b": "other"}

    ing = _ingress()
    ing.coord.metrics_text = types.SimpleNamespace(remote=metrics_text)
    monkeypatch.setitem(G, "app_metrics_hub", lambda: types.SimpleNamespace(get=types.SimpleNamespace(remote=hub_get)))
    monkeypatch.setitem(G, "http_text", lambda: "")
    monkeypatch.setitem(G, "merge", lambda texts: merged.update(texts) or "merged")
    resp = asyncio.run(ing.metrics())
    assert merged == {"coord-a": "fresh", "coord-b": "other"} and resp.body == b"merged"
    assert resp.media_type == "text/plain; version=0.0.4"


# ---- the Serve application: config -> deployment options ---------------------------------------------------------
def _built(monkeypatch, args):
    from ray import serve

    made = {}

    def deployment(cls, name, **kw):
        made[name] = kw
        return types.SimpleNamespace(bind=lambda *a, **k: name)

    monkeypatch.setattr(serve, "deployment", deployment)
    serve_mod.build_app(args)
    return made


def test_the_apps_scaling_and_routing_reach_the_coordinator_deployment(monkeypatch):
    args = {"model": DEFAULT_MODEL, "device": "cpu"}
    made = _built(monkeypatch, {**args, "num_replicas": 2})
    assert made["Coordinator"]["num_replicas"] == 2
    assert made["Coordinator"]["request_router_config"].request_router_class == "cluster.routing.PrefixAffinityRouter"
    auto = {"min_replicas": 1, "max_replicas": 3}
    made = _built(monkeypatch, {**args, "autoscaling_config": auto, "prefix_caching": False})
    assert made["Coordinator"]["autoscaling_config"] == auto and "request_router_config" not in made["Coordinator"]


def test_the_ingress_holds_more_requests_than_the_engine_admits(monkeypatch):
    """A full engine must answer its own 429: the ingress deployment holds at least max_num_seqs + max_waiting of the
    8×H200 deploy file (else Serve's proxy queues and drops requests with a plain-text 503)."""
    import yaml

    deploy = Path(__file__).resolve().parents[2] / "deploy" / "glm5-8xh200.yaml"
    app = yaml.safe_load(deploy.read_text())["applications"][0]["args"]
    cfg = EngineConfig.from_dict({k: v for k, v in app.items() if k not in ("num_replicas", "autoscaling_config")})
    made = _built(monkeypatch, {"model": DEFAULT_MODEL, "device": "cpu"})
    assert made["OpenAIIngress"]["max_ongoing_requests"] >= cfg.max_num_seqs + cfg.max_waiting


# ---- cluster/server.py: glmserve serve ---------------------------------------------------------------------------
class _Flag:
    """A stop flag that sets itself after ``after`` waits (a second Ctrl-C), counting them."""

    def __init__(self, after=3):
        self.flag, self.after, self.waits = False, after, 0

    def is_set(self):
        return self.flag

    def set(self):
        self.flag = True

    def clear(self):
        self.flag = False

    def wait(self, timeout=None):
        self.waits += 1
        self.flag = self.flag or self.waits >= self.after
        return self.flag


class _Handle:
    def __init__(self, left):
        self.left, self.drains, self.closes = list(left), 0, 0
        self.drain = types.SimpleNamespace(remote=self._drain)
        self.close_streams = types.SimpleNamespace(remote=self._close)

    def _drain(self):
        self.drains += 1
        return types.SimpleNamespace(result=lambda timeout_s: self.left.pop(0) if len(self.left) > 1 else self.left[0])

    def _close(self):
        self.closes += 1
        self.left = [0]
        return types.SimpleNamespace(result=lambda timeout_s: 2)


def test_the_stop_flag_set_before_a_wait_returns_at_once(monkeypatch):
    from cluster import server

    def no_sleep(_):
        raise AssertionError("waited with the flag set")

    monkeypatch.setattr(server.time, "sleep", no_sleep)
    stop = server._Stop()
    stop.set()
    assert stop.wait(None) is True and stop.wait(5) is True


def test_the_drain_waits_only_while_requests_are_in_flight(monkeypatch, capsys):
    from ray import serve

    from cluster import server

    idle = _Handle([0])
    monkeypatch.setattr(serve, "get_app_handle", lambda name: idle)
    server._drain(_Flag(), 30.0)
    assert (idle.drains, idle.closes) == (1, 0) and "ended with an error" not in capsys.readouterr().out
    busy = _Handle([2])
    monkeypatch.setattr(serve, "get_app_handle", lambda name: busy)
    server._drain(_Flag(), 0.0)                       # the time is up at once: the streams still open are ended
    out = capsys.readouterr().out
    assert busy.closes == 1 and "2 output stream(s) (one a choice) still in flight ended with an error" in out


def test_run_server_drains_after_the_stop_signal(monkeypatch):
    from ray import serve

    from cluster import server

    handle, stopped = _Handle([0]), []

    def started(cfg, host, port, note, prefill, stop):
        stop.set()                                    # Ctrl-C as soon as it is up
        return 0

    monkeypatch.setattr(server, "start_server", started)
    monkeypatch.setattr(server, "stop_server", lambda: stopped.append(True))
    monkeypatch.setattr(serve, "get_app_handle", lambda name: handle)
    assert server.run_server(EngineConfig(device="cpu"), stats_interval_s=0) == 0
    assert handle.drains == 1 and stopped == [True]


def _status(app, **deployments):
    return types.SimpleNamespace(applications={"glmserve": types.SimpleNamespace(
        status=types.SimpleNamespace(value=app), message=f"app {app.lower()}", deployments={
            name: types.SimpleNamespace(status=types.SimpleNamespace(value=s), message=m)
            for name, (s, m) in deployments.items()})})


def _start(monkeypatch, statuses, prefill=0, stop=None):
    """``start_server`` with Ray's and Serve's calls stood in for; the app's status goes through ``statuses``."""
    import signal

    import ray
    from ray import serve

    from cluster import server

    seen = {"status": 0, "stopped": 0}

    def status():
        seen["status"] += 1
        return statuses[min(seen["status"], len(statuses)) - 1]

    monkeypatch.setattr(server, "_port_taken", lambda host, port: False)
    monkeypatch.setattr(signal, "signal", lambda *a: None)
    monkeypatch.setattr(ray, "init", lambda **kw: seen.update(init=kw))
    monkeypatch.setattr(ray, "is_initialized", lambda: True)
    monkeypatch.setattr(serve, "start", lambda **kw: None)
    monkeypatch.setattr(serve, "status", status)
    monkeypatch.setattr(serve, "RunTarget", lambda app, **kw: app)
    monkeypatch.setattr(serve, "run_many", lambda targets, **kw: seen.update(targets=targets))
    monkeypatch.setattr(server, "build_app", lambda args: args)
    monkeypatch.setattr(server, "stop_server", lambda: seen.update(stopped=seen["stopped"] + 1))
    code = server.start_server(EngineConfig(device="cpu"), "127.0.0.1", 8000, "", prefill, stop)
    return code, seen


def test_start_server_says_ready_only_once_the_app_runs_and_passes_the_prefill_replicas(monkeypatch, capsys):
    code, seen = _start(monkeypatch, [_status("DEPLOYING", Coordinator=("UPDATING", "")),
                                      _status("RUNNING", Coordinator=("HEALTHY", ""))], prefill=1, stop=_Flag(50))
    out = capsys.readouterr().out
    assert code == 0 and seen["status"] == 2 and out.index("Coordinator updating") < out.index("ready in")
    assert seen["targets"][0]["prefill"] == {"num_replicas": 1}


def test_start_server_gives_up_on_an_unhealthy_app_naming_the_cause(monkeypatch, capsys):
    trace = "Traceback (most recent call last):\n  File \"x.py\", line 1\nValueError: max_model_len 9999 is too big"
    code, seen = _start(monkeypatch, [_status("UNHEALTHY", Coordinator=("UNHEALTHY", trace))], stop=_Flag(after=50))
    out = capsys.readouterr().out
    assert code == 2 and seen["stopped"] == 1 and "  Coordinator: ValueError: max_model_len 9999 is too big" in out


def test_port_taken_only_where_something_listens():
    from cluster.server import _port_taken

    assert _port_taken("192.0.2.1", 8000) is False          # TEST-NET: no address here — not "in use"


# ---- cluster/cli.py: the flags reach serve and run-batch ---------------------------------------------------------
def test_serve_passes_its_own_flags_to_the_server(monkeypatch):
    from cluster.cli import main

    got = {}
    monkeypatch.setattr("cluster.server.run_server", lambda cfg, **kw: got.update(kw) or 0)
    assert main(["serve", "--host", "0.0.0.0", "--port", "8123", "--drain-timeout", "5", "--stats-interval", "0",
                 "--prefill-replicas", "1"]) == 0
    assert got == {"host": "0.0.0.0", "port": 8123, "drain_timeout_s": 5.0, "stats_interval_s": 0.0,
                   "prefill_replicas": 1}


def test_run_batch_on_its_own_server_passes_the_concurrency_and_stops_the_server(monkeypatch, tmp_path, capsys):
    from cluster.cli import main

    calls = []
    inp = tmp_path / "in.jsonl"
    inp.write_text("{}\n")
    monkeypatch.setattr("cluster.server.start_server", lambda cfg, host, port: calls.append("start") or 0)
    monkeypatch.setattr("cluster.server.stop_server", lambda: calls.append("stop"))
    monkeypatch.setattr("cluster.batch.run_batch_file", lambda i, o, url, n: calls.append(n) or 0)
    assert main(["run-batch", "-i", str(inp), "-o", str(tmp_path / "out.jsonl"), "--max-concurrency", "3"]) == 0
    assert calls == ["start", 3, "stop"]
    assert main(["run-batch", "-i", str(tmp_path / "none.jsonl"), "-o", str(tmp_path / "out.jsonl")]) == 2
    assert "no input file" in capsys.readouterr().err


# ---- cluster/async_engine.py: what the front end relies on -------------------------------------------------------
def test_a_stream_left_early_aborts_its_request_in_the_engine():
    from cluster.async_engine import AsyncEngine
    from scheduler.request import SamplingParams

    class Engine:
        def __init__(self):
            self.added, self.aborted = [], []

        def has_work(self):
            return False

        def probe(self):
            return []

        def add_request(self, ids, params, req_id, *a, **kw):
            self.added.append(req_id)

        def abort(self, req_id):
            self.aborted.append(req_id)

    engine = Engine()
    aeng = AsyncEngine(engine)

    async def main():
        s = aeng.generate([1, 2], SamplingParams(max_tokens=4), "r0")
        first = asyncio.ensure_future(s.__anext__())
        await _until(lambda: engine.added)
        aeng._deliver(TokenEvent("r0", [5], "a"))
        assert (await first).text == "a"
        await s.aclose()                            # the client went away

    try:
        asyncio.run(main())
    finally:
        aeng.shutdown()
    assert engine.aborted == ["r0"] and "r0" not in aeng._queues
