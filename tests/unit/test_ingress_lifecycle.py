"""The ingress's life cycle without a server: /health while the model loads, the drain's end, a replica failing
mid-request, closing merged choices (split from test_protocol.py)."""

from __future__ import annotations

import asyncio

import pytest

pytest.importorskip("ray")


def test_health_is_503_until_the_model_answers(monkeypatch):
    """The ingress is up before the coordinator has loaded the model: /health says 503 "loading" until the coordinator
    first answers, then 200 while it says it can serve — 503 with its reason while its worker group is down (session
    57's metrics review: 200 after the first answer whatever came later), 503 when it stops answering — and 503
    "shutting down" once draining."""
    import types

    from cluster import serve as serve_mod
    from cluster.protocol import ApiError

    # (the ingress's methods read a copy of the module's globals: `serve.ingress` copies them)
    monkeypatch.setitem(serve_mod.OpenAIIngress.health.__globals__, "HEALTH_PROBE_S", 0.05)
    calls = []

    async def unhealthy():
        calls.append(1)
        if not ingress.loaded:
            await asyncio.sleep(10)                   # the coordinator replica still loading its weights (or stuck)
        return ingress.down

    ingress = types.SimpleNamespace(draining=False, ready=False, loaded=False, down=None,
                                    coord=types.SimpleNamespace(unhealthy=types.SimpleNamespace(remote=unhealthy)))
    health = serve_mod.OpenAIIngress.health
    with pytest.raises(ApiError) as e:
        asyncio.run(health(ingress))
    assert e.value.status == 503 and e.value.message == "the model is loading"
    ingress.loaded = True
    assert asyncio.run(health(ingress)) == {"status": "ok"} and asyncio.run(health(ingress)) == {"status": "ok"}
    ingress.down = "the worker group is down: rank 1 died"
    with pytest.raises(ApiError) as e:
        asyncio.run(health(ingress))
    assert e.value.status == 503 and "rank 1 died" in e.value.message
    ingress.down, ingress.loaded = None, False
    with pytest.raises(ApiError) as e:
        asyncio.run(health(ingress))
    assert e.value.status == 503 and e.value.message == "the model replica does not answer"
    assert len(calls) == 5
    ingress.draining = True
    with pytest.raises(ApiError) as e:
        asyncio.run(health(ingress))
    assert e.value.status == 503 and "shutting down" in e.value.message


def test_close_streams_ends_open_requests_with_an_error():
    """The drain's time ran out (``glmserve serve``): every stream still open is aborted, and its abort event carries
    an error (503 to the client: an error event, not a cut connection); a request that finished is left alone."""
    import types

    from cluster import serve as serve_mod
    from cluster.engine import TokenEvent

    aborted: list[str] = []
    queues: dict[str, asyncio.Queue] = {}

    async def generate(ids, params, req_id):
        q = queues.setdefault(req_id, asyncio.Queue())
        while True:
            ev = await q.get()
            yield ev
            if ev.finished:
                return

    async def abort(req_id):
        aborted.append(req_id)
        await queues[req_id].put(TokenEvent(req_id, [], "", finished=True, finish_reason="abort"))

    coord = types.SimpleNamespace(
        options=lambda **kw: types.SimpleNamespace(generate=types.SimpleNamespace(remote=generate)),
        abort=types.SimpleNamespace(remote=abort))
    ingress = types.SimpleNamespace(coord=coord, in_flight=0, open_ids=set(), draining=False, closing=False)
    open_ = serve_mod.OpenAIIngress._open

    async def main():
        streams = [open_(ingress, [1, 2], None, f"r{i}") for i in range(2)]
        firsts = []
        for i, s in enumerate(streams):
            queues.setdefault(f"r{i}", asyncio.Queue())
            await queues[f"r{i}"].put(TokenEvent(f"r{i}", [5], "a"))
            firsts.append(await s.__anext__())
        assert ingress.in_flight == 2 and ingress.open_ids == {"r0", "r1"}
        assert await serve_mod.OpenAIIngress.close_streams(ingress) == 2 and ingress.closing and ingress.draining
        last = [await s.__anext__() for s in streams]
        for s in streams:
            with pytest.raises(StopAsyncIteration):
                await s.__anext__()
        return firsts, last

    firsts, last = asyncio.run(main())
    assert sorted(aborted) == ["r0", "r1"] and not any(ev.error for ev in firsts)
    assert all(ev.finished and ev.error == "the server shut down before the request finished" for ev in last)
    assert ingress.in_flight == 0 and not ingress.open_ids
    err = serve_mod.Formatter._api_error(types.SimpleNamespace(ing=ingress), last[0])
    assert err.status == 503 and err.body()["error"]["type"] == "server_error"


def test_a_replica_failing_mid_request_ends_it_with_an_error():
    """The coordinator replica died (or its stream broke) after the first tokens: the request ends with an error event
    (a 500 / an error chunk), not as a cut answer that looks whole (200, finish_reason null, [DONE]); before the first
    event the exception still reaches ``_respond`` (an AdmissionError is a 400 / 429)."""
    import types

    from cluster import serve as serve_mod
    from cluster.engine import TokenEvent

    aborted: list[str] = []

    class Stream:                           # a Ray ObjectRefGenerator: its replica dies after ``events``
        def __init__(self, events):
            self.events = list(events)

        def __aiter__(self):
            return self

        async def __anext__(self):
            if not self.events:
                raise RuntimeError("ActorDiedError: the actor died unexpectedly (pid=1234, ip=10.0.0.1)")
            return self.events.pop(0)

        def cancel(self):
            pass

    async def abort(req_id):
        aborted.append(req_id)

    def ingress(events):
        coord = types.SimpleNamespace(
            options=lambda **kw: types.SimpleNamespace(generate=types.SimpleNamespace(
                remote=lambda ids, params, req_id: Stream(events))), abort=types.SimpleNamespace(remote=abort))
        return types.SimpleNamespace(coord=coord, in_flight=0, open_ids=set(), closing=False)

    async def run(ing):
        return [ev async for ev in serve_mod.OpenAIIngress._open(ing, [1, 2], None, "r0")]

    ing = ingress([TokenEvent("r0", [5], "a")])
    evs = asyncio.run(run(ing))
    assert [ev.text for ev in evs] == ["a", ""] and evs[-1].finished and "replica failed" in evs[-1].error
    assert "pid" not in evs[-1].error and ing.in_flight == 0 and not aborted     # it ended with its replica
    err = serve_mod.Formatter._api_error(types.SimpleNamespace(ing=ing), evs[-1])
    assert err.status == 500 and err.body()["error"]["type"] == "server_error"
    with pytest.raises(RuntimeError, match="ActorDiedError"):       # before the first event: raised as it was
        asyncio.run(run(ingress([])))


def test_closing_the_merged_choices_while_their_streams_are_busy():
    """A stream response ends early (an error event, a client gone) while other choices' pumps are inside their
    streams: closing them raised "aclose(): asynchronous generator is already running", which cut the response after
    its [DONE]. Each stream still ends (its pump's cancellation closes it)."""
    from cluster.choices import merge as _merge

    closed = []

    async def stream(i):
        try:
            yield i
            for _ in range(3):
                await asyncio.sleep(0.01)
                yield i
            await asyncio.sleep(10)
            yield i
        finally:
            closed.append(i)

    async def main():
        streams = [stream(0), stream(1)]
        merged = _merge(streams, [await s.__anext__() for s in streams])
        for _ in range(5):
            await merged.__anext__()
        await merged.aclose()
        await asyncio.sleep(0.05)

    asyncio.run(main())
    assert sorted(closed) == [0, 1]
