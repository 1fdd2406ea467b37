"""Session 64: a streamed response whose client is gone before its first chunk is sent — Starlette's send fails
(ASGI 2.4) or its disconnect listener cancels the send (earlier ASGI) before the body's generator started, so no
``finally`` of that generator runs — aborts its requests then, not when the collector frees its choices (they are
held here, as a traceback may hold them). No Ray: the ingress on ``test_mut62_serve``'s fake coordinator."""

from __future__ import annotations

import asyncio

import pytest

pytest.importorskip("ray")

from tests.unit.test_mut62_serve import NAME, Coord, G, _hanging, _ingress, _request, _until  # noqa: E402


@pytest.fixture
def held(monkeypatch):
    """The merged choices, held (a reference cycle, a traceback's frames)."""
    kept, merged = [], G["MergedChoices"]
    monkeypatch.setitem(G, "MergedChoices", lambda *a: kept.append(merged(*a)) or kept[-1])
    return kept

ROUTES = [("chat_completions", {"model": NAME, "max_tokens": 10, "messages": [{"role": "user", "content": "hi"}],
                                "n": 2}),
          ("completions", {"model": NAME, "max_tokens": 10, "prompt": "hi"}),
          ("messages", {"model": NAME, "max_tokens": 10, "messages": [{"role": "user", "content": "hi"}]}),
          ("responses", {"model": NAME, "input": "hi", "max_output_tokens": 10})]


async def _gone_before_start(resp, spec: str) -> None:
    """Run the response as Starlette would for a client that left before the response started."""
    async def send(message):
        if spec == "2.4":
            raise OSError("the client is gone")
        await asyncio.Event().wait()            # (earlier ASGI: the disconnect listener cancels this send)

    async def receive():
        return {"type": "http.disconnect"}

    scope = {"type": "http", "asgi": {"spec_version": spec}}
    try:
        await resp(scope, receive, send)
    except Exception:                           # ClientDisconnect (2.4): the server's to handle
        pass


@pytest.mark.parametrize("spec", ["2.4", "2.3"])
@pytest.mark.parametrize("route,body", ROUTES, ids=[r for r, _ in ROUTES])
def test_a_client_gone_before_the_first_chunk_aborts_the_request(held, route, body, spec):
    coord = Coord(_hanging)
    ing = _ingress(coord)
    n = body.get("n", 1)

    async def main():
        resp = await getattr(ing, route)(_request({**body, "stream": True}))
        await asyncio.wait_for(_gone_before_start(resp, spec), 30)     # (a guard against a hang, not a measure)
        return await _until(lambda: len(coord.aborted) == n)

    assert asyncio.run(main()) and len(held) == 1 and ing.in_flight == 0
