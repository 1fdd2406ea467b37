"""A request's choices as the ingress reads them: their streams interleaved (``MergedChoices``) and the SSE response
that sends them (``ChoicesStream``); either way, when the response ends the choices' streams are closed, and a stream
closed before its request finished aborts it."""

from __future__ import annotations

import asyncio
from typing import Any, AsyncIterator

from starlette.responses import StreamingResponse


async def closing(events: AsyncIterator[str], merged) -> AsyncIterator[str]:
    """``events``, then the choices' streams closed (a client gone mid-stream: its request is aborted)."""
    try:
        async for out in events:
            yield out
    finally:
        await merged.aclose()


class ChoicesStream(StreamingResponse):
    """The SSE response of a request's choices (``merged``): they are closed when the body ends or is closed, and when
    the response ends without reading it — a client gone before the first chunk was sent (Starlette cancels the send;
    a body generator that never started runs no ``finally``), not when the collector frees them."""

    def __init__(self, events: AsyncIterator[str], merged):
        super().__init__(closing(events, merged), media_type="text/event-stream")
        self.merged = merged

    async def __call__(self, scope, receive, send):
        try:
            await super().__call__(scope, receive, send)
        finally:
            await self.merged.aclose()


class MergedChoices:
    """The choices' streams, interleaved as (choice index, event) by ``merge``. ``aclose`` ends every stream, whether
    or not the interleaving began (a response closed before it read its choices: closing a generator that never
    started runs none of its code)."""

    def __init__(self, streams: list[AsyncIterator], first: list):
        self.streams = streams
        self.events = merge(streams, first)

    def __aiter__(self):
        return self

    def __anext__(self):
        return self.events.__anext__()

    async def aclose(self):
        await self.events.aclose()
        for s in self.streams:
            if not s.ag_running:        # (a running one: its pump's cancellation ends it)
                await s.aclose()


async def merge(streams: list[AsyncIterator], first: list) -> AsyncIterator[tuple[int, Any]]:
    """Interleave n streams' events as (choice index, event), starting with their first events."""
    queue: asyncio.Queue = asyncio.Queue()

    async def pump(i, s):
        try:
            async for ev in s:
                await queue.put((i, ev))
        finally:
            await queue.put((i, None))

    for i, ev in enumerate(first):
        await queue.put((i, ev))
    tasks = [asyncio.create_task(pump(i, s)) for i, s in enumerate(streams)]
    live = len(streams)
    try:
        while live:
            i, ev = await queue.get()
            if ev is None:
                live -= 1
                continue
            yield i, ev
    finally:
        for t in tasks:
            t.cancel()
        for s in streams:
            if not s.ag_running:        # else its pump is inside it (aclose raises): the pump's cancellation ends it
                await s.aclose()
