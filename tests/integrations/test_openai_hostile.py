"""Hostile providers: garbage on the wire is a ``ModelError`` a Retry can classify, never a crash.

Each case is a real loopback server answering something a broken provider (or a
proxy in front of one) has sent, through the official ``openai`` client; the
agent's log must stay loadable and every request rebuilt from it valid.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from guardstack.integrations.openai import OpenAIChatModel
from guardstack.pipeline import (
    MODEL_FAILED,
    MODEL_UNAVAILABLE,
    UNKNOWN_TOOL,
    Harness,
    ModelError,
    Session,
    ToolDefinition,
    ToolResultEvent,
)
from tests.integrations.chat_server import ChatServer, Raw
from tests.integrations.test_openai import USER, client_for


def completion(message: Any, **extra: Any) -> str:
    body = {
        "id": "c1",
        "object": "chat.completion",
        "created": 0,
        "model": "m",
        "choices": [{"index": 0, "message": message, "finish_reason": "stop"}],
        **extra,
    }
    return json.dumps(body)


GARBAGE = {
    "message null": completion(None),
    "choices a string": json.dumps({"id": "c", "object": "chat.completion", "choices": "abc"}),
    "choices [null]": json.dumps({"id": "c", "object": "chat.completion", "choices": [None]}),
    "content a number": completion({"role": "assistant", "content": 5}),
    "html from a proxy": "<html><body>502 Bad Gateway</body></html>",
}


@pytest.mark.parametrize("case", sorted(GARBAGE))
async def test_a_garbage_reply_is_model_failed(chat_server: ChatServer, case: str) -> None:
    content_type = "text/html" if case.startswith("html") else "application/json"
    chat_server.script = [Raw(GARBAGE[case], content_type)]
    async with client_for(chat_server) as client:
        with pytest.raises(ModelError) as raised:
            await OpenAIChatModel(client, "m").complete(USER, [])
    assert raised.value.code == MODEL_FAILED


def sse(*events: str) -> str:
    return "".join(f"data: {event}\n\n" for event in events)


CHUNK = json.dumps(
    {
        "id": "c",
        "object": "chat.completion.chunk",
        "created": 0,
        "model": "m",
        "choices": [{"index": 0, "delta": {"role": "assistant", "content": "Hel"}}],
    }
)

BROKEN_STREAMS = {
    "not json mid-stream": sse(CHUNK, "{not json", "[DONE]"),
    "cut mid-chunk": sse(CHUNK) + 'data: {"id": "c", "choi',
    "content a number": sse(CHUNK.replace('"Hel"', "5"), "[DONE]"),
}


@pytest.mark.parametrize("case", sorted(BROKEN_STREAMS))
async def test_a_broken_stream_is_a_model_error(chat_server: ChatServer, case: str) -> None:
    """Garbage is MODEL_FAILED; a stream cut off mid-reply is MODEL_UNAVAILABLE (retried)."""
    chat_server.script = [Raw(BROKEN_STREAMS[case], "text/event-stream")]
    async with client_for(chat_server) as client:
        with pytest.raises(ModelError) as raised:
            await OpenAIChatModel(client, "m", stream=True).complete(USER, [])
    assert raised.value.code == (MODEL_UNAVAILABLE if case == "cut mid-chunk" else MODEL_FAILED)


def tool_call_reply(calls: list[dict[str, Any]]) -> str:
    return completion({"role": "assistant", "content": None, "tool_calls": calls})


def a_call(call_id: Any, name: Any, arguments: str = "{}") -> dict[str, Any]:
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}


async def test_hostile_tool_calls_keep_the_log_loadable_and_every_id_answered_once(
    chat_server: ChatServer, tmp_path: Any
) -> None:
    """Two calls under one id, a null name, a numeric name and id: the turn goes on, the
    saved log loads, and the next request answers every call id exactly once."""
    chat_server.script = [
        Raw(
            tool_call_reply(
                [
                    a_call("dup", "look"),
                    a_call("dup", "look", '{"q": 2}'),
                    a_call("x", None),
                    a_call(7, 42),
                ]
            )
        ),
        Raw(completion({"role": "assistant", "content": "done"})),
    ]

    async def look(arguments: Any, call: Any) -> str:
        return "seen"

    async with client_for(chat_server) as client:
        harness = Harness(OpenAIChatModel(client, "m"))
        harness.tools.register(ToolDefinition("look", look))
        agent = harness.loop.create("hostile")
        turn = await agent.prompt("go")
    assert turn.reason == "completed"
    path = tmp_path / "hostile.jsonl"
    agent.session.save(path)
    loaded = Session.load(path)
    assert loaded.messages() == agent.session.messages()
    second = chat_server.requests[1]["messages"]
    [assistant] = [m for m in second if m["role"] == "assistant"]
    ids = [call["id"] for call in assistant["tool_calls"]]
    answered = [m["tool_call_id"] for m in second if m["role"] == "tool"]
    assert len(set(ids)) == 4
    assert answered == ids
    results = {m["tool_call_id"]: m["content"] for m in second if m["role"] == "tool"}
    assert results[ids[2]] == 'Error: unknown tool ""'
    assert results[ids[3]] == 'Error: unknown tool "42"'
    codes = [e.result.code for e in agent.session.events if isinstance(e, ToolResultEvent)]
    assert codes == [None, None, UNKNOWN_TOOL, UNKNOWN_TOOL]
