"""Loops inside a streamed answer, behind the model proxy (``LoopDetector(text=True)`` in
its stack): the stream is cut where a block starts repeating, and the official client
of each API reads a clean end of message with the stop's text — never an error, never
half-written JSON — while the upstream's stream is not read to its end."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest

from guardstack.guards import LoopDetector
from guardstack.pipeline import Harness
from tests.gateway.model_proxy.test_app import serve
from tests.integrations.stream_server import Recorded

LOOPING = "I will check the configuration file once more to be certain. "
ANSWER = "Plan: read the config.\n" + LOOPING * 300
STOP = "Stopped by loop-detector"


def _pieces(size: int = 12) -> list[str]:
    return [ANSWER[i : i + size] for i in range(0, len(ANSWER), size)]


def _sse(event: str | None, data: Any, sep: str = "\n\n") -> str:
    named = f"event: {event}\n" if event else ""
    return f"{named}data: {json.dumps(data)}{sep}"


def chat_stream() -> bytes:
    head = {"id": "c1", "object": "chat.completion.chunk", "created": 1, "model": "m"}
    out = [
        _sse(
            None,
            {
                **head,
                "choices": [{"index": 0, "delta": {"role": "assistant"}, "finish_reason": None}],
            },
        )
    ]
    out += [
        _sse(
            None,
            {**head, "choices": [{"index": 0, "delta": {"content": piece}, "finish_reason": None}]},
        )
        for piece in _pieces()
    ]
    out.append(
        _sse(None, {**head, "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]})
    )
    return ("".join(out) + "data: [DONE]\n\n").encode()


def anthropic_stream() -> bytes:
    start: dict[str, Any] = {
        "id": "msg_1",
        "type": "message",
        "role": "assistant",
        "model": "m",
        "content": [],
        "stop_reason": None,
        "stop_sequence": None,
        "usage": {"input_tokens": 10, "output_tokens": 1},
    }
    out = [
        _sse("message_start", {"type": "message_start", "message": start}),
        _sse(
            "content_block_start",
            {
                "type": "content_block_start",
                "index": 0,
                "content_block": {"type": "text", "text": ""},
            },
        ),
    ]
    out += [
        _sse(
            "content_block_delta",
            {
                "type": "content_block_delta",
                "index": 0,
                "delta": {"type": "text_delta", "text": piece},
            },
        )
        for piece in _pieces()
    ]
    out += [
        _sse("content_block_stop", {"type": "content_block_stop", "index": 0}),
        _sse(
            "message_delta",
            {
                "type": "message_delta",
                "delta": {"stop_reason": "end_turn"},
                "usage": {"output_tokens": 9000},
            },
        ),
        _sse("message_stop", {"type": "message_stop"}),
    ]
    return "".join(out).encode()


def responses_stream() -> bytes:
    response = {
        "id": "resp_1",
        "object": "response",
        "created_at": 1,
        "status": "in_progress",
        "model": "m",
        "output": [],
        "usage": None,
    }
    item = {
        "id": "msg_1",
        "type": "message",
        "status": "in_progress",
        "role": "assistant",
        "content": [],
    }
    ids = {"item_id": "msg_1", "output_index": 0, "content_index": 0}
    number = iter(range(10_000))
    out = [
        _sse(
            "response.created",
            {"type": "response.created", "sequence_number": next(number), "response": response},
        ),
        _sse(
            "response.output_item.added",
            {
                "type": "response.output_item.added",
                "sequence_number": next(number),
                "output_index": 0,
                "item": item,
            },
        ),
        _sse(
            "response.content_part.added",
            {
                "type": "response.content_part.added",
                "sequence_number": next(number),
                **ids,
                "part": {"type": "output_text", "text": "", "annotations": []},
            },
        ),
    ]
    out += [
        _sse(
            "response.output_text.delta",
            {
                "type": "response.output_text.delta",
                "sequence_number": next(number),
                **ids,
                "delta": piece,
                "logprobs": [],
            },
        )
        for piece in _pieces()
    ]
    done = {
        **response,
        "status": "completed",
        "output": [
            {
                **item,
                "status": "completed",
                "content": [{"type": "output_text", "text": ANSWER, "annotations": []}],
            }
        ],
        "usage": {"input_tokens": 10, "output_tokens": 9000, "total_tokens": 9010},
    }
    out.append(
        _sse(
            "response.completed",
            {"type": "response.completed", "sequence_number": next(number), "response": done},
        )
    )
    return "".join(out).encode()


def gemini_stream() -> bytes:
    return "".join(
        _sse(
            None,
            {
                "candidates": [
                    {"content": {"parts": [{"text": piece}], "role": "model"}, "index": 0}
                ],
                "modelVersion": "gemini-x",
            },
            "\r\n\r\n",
        )
        for piece in _pieces()
    ).encode()


async def read_chat(port: int) -> str:
    from openai import AsyncOpenAI

    client = AsyncOpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="k", max_retries=0)
    text, finish = "", None
    async with client:
        stream = await client.chat.completions.create(
            model="m", messages=[{"role": "user", "content": "check"}], stream=True
        )
        async for chunk in stream:
            for choice in chunk.choices:
                text += choice.delta.content or ""
                finish = choice.finish_reason or finish
    assert finish == "stop"
    return text


async def read_anthropic(port: int) -> str:
    from anthropic import AsyncAnthropic

    client = AsyncAnthropic(base_url=f"http://127.0.0.1:{port}", api_key="k", max_retries=0)
    async with (
        client,
        client.messages.stream(
            model="m", max_tokens=100, messages=[{"role": "user", "content": "check"}]
        ) as stream,
    ):
        message = await stream.get_final_message()
    assert message.stop_reason == "end_turn"
    return "".join(block.text for block in message.content if block.type == "text")


async def read_responses(port: int) -> str:
    from openai import AsyncOpenAI

    client = AsyncOpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="k", max_retries=0)
    async with client, client.responses.stream(model="m", input="check") as stream:
        response = await stream.get_final_response()
    assert response.status == "completed"
    return response.output_text


async def read_gemini(port: int) -> str:
    from google import genai
    from google.genai import types

    client = genai.Client(
        api_key="k", http_options=types.HttpOptions(base_url=f"http://127.0.0.1:{port}")
    )
    chunks = [
        chunk
        async for chunk in await client.aio.models.generate_content_stream(
            model="gemini-x", contents="check"
        )
    ]
    assert (chunks[-1].candidates or [])[0].finish_reason == types.FinishReason.STOP
    return "".join(chunk.text or "" for chunk in chunks)


APIS = {
    "chat": (chat_stream, read_chat),
    "anthropic": (anthropic_stream, read_anthropic),
    "responses": (responses_stream, read_responses),
    "gemini": (gemini_stream, read_gemini),
}


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture
def recorded() -> Iterator[Recorded]:
    with Recorded() as upstream:
        yield upstream


@pytest.mark.filterwarnings("ignore:Inheritance class AiohttpClientSession:DeprecationWarning")
@pytest.mark.parametrize("api", sorted(APIS))
async def test_a_looping_stream_ends_cleanly_with_the_stop_for_the_official_client(
    api: str, recorded: Recorded
) -> None:
    make, read = APIS[api]
    recorded.raw = make()
    recorded.name = "chat-usage-chunk"  # its twin is never asked for here
    recorded.cuts = list(range(0, len(recorded.raw), 200))
    recorded.delay_s = 0.002

    class Upstream:
        base_url = recorded.url

    harness = Harness()
    harness.plugin(LoopDetector(text=True))
    async for served in serve(harness, Upstream()):
        text = await read(served.port)
    assert text.startswith("Plan: read the config.\n" + LOOPING)
    assert STOP in text
    assert text.count(LOOPING) < 8  # a few copies went out before the cut; not 300
    assert recorded.finished == 0  # the upstream's stream was not read to its end
