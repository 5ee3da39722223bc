"""The proxy's stream parser, fuzzed: any split of an upstream stream into chunks relays
the same bytes (less the usage-only event the client did not ask for) and reads the same
usage; any garbage is relayed as it came and never raises. Seeds that once broke it
run as ordinary cases."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import anyio
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from guardstack.gateway.model_proxy.app import ModelProxy
from guardstack.gateway.model_proxy.conversations import Conversation
from guardstack.gateway.model_proxy.request import Caller, Estimate, ProxyRequest
from guardstack.gateway.model_proxy.responses import RESPONSES
from guardstack.gateway.model_proxy.upstream import DEFAULT, Upstream
from guardstack.gateway.model_proxy.wires import ANTHROPIC, OPENAI, Wire
from guardstack.pipeline import Harness, ScriptedModel, Usage


class Arrived:
    """What an upstream's streamed answer looks like to the relay: its status, its
    headers and its raw chunks (this is the parser's input, not a stand-in for a client:
    the clients are exercised end to end in test_model_proxy*.py)."""

    status_code = 200
    headers: Any = {"content-type": "text/event-stream"}  # noqa: RUF012

    def __init__(self, chunks: list[bytes]) -> None:
        self.chunks = chunks

    async def aiter_raw(self) -> AsyncIterator[bytes]:
        for chunk in self.chunks:
            yield chunk


def upstream_for(wire: Wire, strip: bool) -> tuple[Upstream, list[bytes]]:
    proxy = ModelProxy(Harness(), "http://127.0.0.1:9")
    sent: list[bytes] = []

    async def send(message: dict[str, Any]) -> None:
        if message["type"] == "http.response.body":
            sent.append(message["body"])

    data: dict[str, Any] = {"model": "m", "stream": True}
    agent = proxy.harness.loop.create("c1", model=ScriptedModel([]))
    request = ProxyRequest(
        wire=wire,
        target=proxy.upstreams[DEFAULT],
        path=wire.path,
        data=data,
        body=b"{}",
        headers={},
        caller=Caller(),
        conversation=Conversation(agent, ("", "c1")),
        fresh=True,
        model="m",
        stream=True,
        messages=[],
        history=[],
        estimate=Estimate(1, 1_000),
        started=0.0,
    )
    made = Upstream(request, data, b"{}", targets=proxy.upstreams)
    made.send, made.strip_usage = send, strip
    made.closer = proxy  # type: ignore[attr-defined]
    return made, sent


def chat_stream(texts: list[str], usage: tuple[int, int] | None) -> tuple[bytes, bytes]:
    """An OpenAI chat stream, and the same without its usage-only event."""
    events = [json.dumps({"choices": [{"index": 0, "delta": {"content": text}}]}) for text in texts]
    kept = b"".join(f"data: {event}\n\n".encode() for event in events)
    usage_event = b""
    if usage is not None:
        reported = {"prompt_tokens": usage[0], "completion_tokens": usage[1]}
        usage_event = f"data: {json.dumps({'choices': [], 'usage': reported})}\n\n".encode()
    done = b"data: [DONE]\n\n"
    return kept + usage_event + done, kept + done


def split(data: bytes, cuts: list[int]) -> list[bytes]:
    points = sorted({cut % (len(data) + 1) for cut in cuts})
    pieces, start = [], 0
    for point in [*points, len(data)]:
        pieces.append(data[start:point])
        start = point
    return pieces


async def relay(wire: Wire, chunks: list[bytes], strip: bool) -> tuple[bytes, Usage | None]:
    made, sent = upstream_for(wire, strip)
    try:
        reply = await made._relay(Arrived(chunks), made.targets[DEFAULT])
    finally:
        await made.closer.aclose()  # type: ignore[attr-defined]
    return b"".join(sent), reply.usage


@settings(max_examples=200, deadline=None)
@given(
    texts=st.lists(st.text(max_size=12), max_size=6),
    usage=st.none() | st.tuples(st.integers(0, 10**6), st.integers(0, 10**6)),
    cuts=st.lists(st.integers(0, 10_000), max_size=12),
    strip=st.booleans(),
)
@example(texts=["a\nb"], usage=(1, 2), cuts=[5, 6, 7], strip=True)
@example(
    texts=[], usage=(100, 100), cuts=[275], strip=True
)  # between the usage event's two newlines
def test_any_split_relays_the_same_bytes_and_reads_the_same_usage(
    texts: list[str], usage: tuple[int, int] | None, cuts: list[int], strip: bool
) -> None:
    whole, without = chat_stream(texts, usage)
    got, read = anyio.run(relay, OPENAI, split(whole, cuts), strip)
    assert got == (without if strip else whole)
    assert read == (None if usage is None else Usage(*usage))


@settings(max_examples=200, deadline=None)
@given(data=st.binary(max_size=300), cuts=st.lists(st.integers(0, 400), max_size=8))
@example(data=b'data: {"usage": {"prompt_tokens": -1}}\n\n', cuts=[])
@example(data=b'data: {"choices": [], "usage": null}\n\n', cuts=[3])
@example(data=b"data: " + b"[" * 5000 + b"\n", cuts=[])
@example(data=b'data: {"type": "message_delta", "usage": {"output_tokens": 1e999}}\n', cuts=[])
def test_garbage_is_relayed_as_it_came_and_never_raises(data: bytes, cuts: list[int]) -> None:
    for wire in (OPENAI, ANTHROPIC, RESPONSES):
        got, _ = anyio.run(relay, wire, split(data, cuts), False)
        assert got == data


@pytest.mark.parametrize(
    ("wire", "events", "expected"),
    [
        (
            ANTHROPIC,
            [
                {
                    "type": "message_start",
                    "message": {
                        "usage": {
                            "input_tokens": 20,
                            "output_tokens": 1,
                            "cache_read_input_tokens": 40,
                        }
                    },
                },
                {"type": "message_delta", "usage": {"output_tokens": 35}},
            ],
            Usage(60, 35, 40),
        ),
        (
            RESPONSES,
            [
                {
                    "type": "response.completed",
                    "response": {"usage": {"input_tokens": 12, "output_tokens": 6}},
                }
            ],
            Usage(12, 6),
        ),
        (
            RESPONSES,
            [
                {
                    "type": "response.completed",
                    "response": {"usage": {"input_tokens": -12, "output_tokens": 6}},
                }
            ],
            None,
        ),
    ],
    ids=["messages", "responses", "responses-garbage-usage"],
)
def test_each_api_streams_usage_as_it_reports_it(
    wire: Wire, events: list[dict[str, Any]], expected: Usage | None
) -> None:
    data = b"".join(f"data: {json.dumps(event)}\n\n".encode() for event in events)
    got, read = anyio.run(relay, wire, [data], False)
    assert got == data
    assert read == expected


def test_an_estimate_counts_every_input_and_inline_media_at_a_fixed_size() -> None:
    """``estimates.input_chars``: text, keys and structure as JSON writes them (at least
    the request's JSON, never less), a base64 image at ``MEDIA_CHARS`` however large."""
    from guardstack.gateway.model_proxy.estimates import MEDIA_CHARS, input_chars

    body = {"messages": [{"role": "user", "content": "hello " * 100}], "tools": [{"a": 1}]}
    assert input_chars(body) >= len(json.dumps(body)) - 20
    image = {"inlineData": {"mimeType": "image/png", "data": "A" * 1_000_000}}
    assert MEDIA_CHARS <= input_chars(image) < MEDIA_CHARS + 100
    assert input_chars({"url": "data:image/png;base64," + "B" * 50_000}) < MEDIA_CHARS + 20
