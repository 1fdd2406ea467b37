"""Session 63's review of the ingress's stream closing: a response closed before it read its choices (a client gone
right after the first event of a Messages / Responses stream, a non-streamed answer whose forming fails) aborts its
requests then — not when the collector frees the choices' streams. The merged choices are held here, as a middleware
or a traceback may hold them. No Ray: the ingress on ``test_mut62_serve``'s fake coordinator."""

from __future__ import annotations

import asyncio

import pytest

pytest.importorskip("ray")

from tests.unit.test_mut62_serve import NAME, Coord, G, _hanging, _ingress, _request, _until  # noqa: E402


@pytest.fixture
def held(monkeypatch):
    """The merged choices and the streams they were made of, held (a reference cycle, a traceback's frames)."""
    kept = []
    merged = G["MergedChoices"]
    monkeypatch.setitem(G, "MergedChoices", lambda *a: kept.append((merged(*a), a)) or kept[-1][0])
    return kept


CHAT = {"model": NAME, "max_tokens": 10, "messages": [{"role": "user", "content": "hi"}]}


@pytest.mark.parametrize("route,body,first", [
    ("messages", CHAT, "message_start"),
    ("responses", {"model": NAME, "input": "hi", "max_output_tokens": 10}, "response.created")])
def test_a_stream_closed_after_its_first_event_aborts_the_request(held, route, body, first):
    coord = Coord(_hanging)
    ing = _ingress(coord)

    async def main():
        resp = await getattr(ing, route)(_request({**body, "stream": True}))
        assert first in await resp.body_iterator.__anext__()
        await resp.body_iterator.aclose()           # the client went away before any token was sent
        return await _until(lambda: coord.aborted)

    assert asyncio.run(main()) and len(coord.aborted) == 1 and len(held) == 1 and ing.in_flight == 0


def test_a_completion_that_fails_while_it_is_formed_frees_its_requests(monkeypatch, held):
    """A non-streamed chat completion (n = 2) whose forming raises (a bug) after the first event: both choices are
    aborted then."""
    coord = Coord(_hanging)
    ing = _ingress(coord)

    async def whole(self, merged, n):
        await merged.__anext__()
        raise RuntimeError("a formatter bug")

    monkeypatch.setattr(G["Formatter"], "whole", whole)

    async def main():
        with pytest.raises(RuntimeError) as e:
            await asyncio.wait_for(ing.chat_completions(_request({**CHAT, "n": 2})), 30)   # (a guard, not a measure)
        return e, await _until(lambda: len(coord.aborted) == 2)

    assert asyncio.run(main())[1] and ing.in_flight == 0


def test_closing_merged_choices_that_were_never_read_closes_each_stream():
    closed = []

    async def stream(i):
        try:
            yield i
            await asyncio.Event().wait()
        finally:
            closed.append(i)

    async def main():
        streams = [stream(0), stream(1)]
        merged = G["MergedChoices"](streams, [await s.__anext__() for s in streams])
        await merged.aclose()
        return list(closed)

    assert asyncio.run(main()) == [0, 1]
