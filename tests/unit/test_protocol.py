"""The HTTP edge without a server: error mapping, request validation, reasoning split."""

from __future__ import annotations

import asyncio

import pytest

pytest.importorskip("ray")

from cluster.engine import TokenEvent  # noqa: E402
from cluster.protocol import ChatCompletionRequest, CompletionRequest, validation_error  # noqa: E402
from cluster.serve import _admission_error, _Formatter  # noqa: E402
from scheduler.scheduler import AdmissionError  # noqa: E402


def test_queue_full_is_429_with_retry_after():
    e = _admission_error(AdmissionError("queue_full", "queue", "waiting queue is full"))
    assert e.status == 429 and e.headers == {"Retry-After": "1"} and e.body()["error"]["type"] == "rate_limit_error"
    e = _admission_error(AdmissionError("too_long", "max_tokens", "too long"))
    assert e.status == 400 and e.param == "max_tokens"


@pytest.mark.parametrize("body,param", [({"max_tokens": "x"}, "max_tokens"), ({"temperature": -1}, "temperature"),
                                        ({"stop": ["a", "b", "c", "d", "e"]}, "stop"), ({"n": 0}, "n")])
def test_validation_errors_name_the_field(body, param):
    from pydantic import ValidationError

    with pytest.raises(ValidationError) as e:
        CompletionRequest.model_validate({"model": "m", "prompt": "p", **body})
    assert validation_error(e.value).param == param


def test_image_part_rejected_naming_the_part():
    from pydantic import ValidationError

    with pytest.raises(ValidationError) as e:
        ChatCompletionRequest.model_validate({"model": "m", "messages": [
            {"role": "user", "content": [{"type": "text", "text": "hi"}, {"type": "image_url", "image_url": {}}]}]})
    err = validation_error(e.value)
    assert err.param == "messages.0.content" and "image_url" in err.message


class _FakeIngress:
    model_name, tokenizer, think_end = "m", None, 22


async def _events(evs):
    for i, ev in enumerate(evs):
        yield 0, ev


def test_reasoning_split_whole_and_stream():
    evs = [TokenEvent("r", [100], "Let me think."), TokenEvent("r", [22], ""),
           TokenEvent("r", [101], "Answer.", finished=True, finish_reason="stop")]
    fmt = _Formatter(_FakeIngress(), "chatcmpl-1", True, 5, None, thinking=True)
    body = asyncio.run(fmt.whole(_events(evs), 1))
    msg = body["choices"][0]["message"]
    assert msg == {"role": "assistant", "content": "Answer.", "reasoning_content": "Let me think."}

    async def collect():
        return [c async for c in _Formatter(_FakeIngress(), "c", True, 5, None, thinking=True).sse(_events(evs), False)]

    chunks = asyncio.run(collect())
    assert '"reasoning_content": "Let me think."' in chunks[0] and '"content": "Answer."' in chunks[2]
    assert chunks[-1] == "data: [DONE]\n\n"
