"""``OpenAIChatModel`` through the official ``openai`` client against a real loopback server."""

from __future__ import annotations

import json
import socket
import sys
from typing import Any

import anyio
import pytest
from openai import AsyncOpenAI

from guardstack.guards import RepeatToolReminder, ToolCallTimeoutPolicy, UsageLimit
from guardstack.integrations.openai import OpenAIChatModel, chat_messages
from guardstack.pipeline import (
    INVALID_ARGUMENTS,
    MODEL_FAILED,
    MODEL_RATE_LIMITED,
    MODEL_REJECTED,
    MODEL_TIMEOUT,
    MODEL_UNAVAILABLE,
    TOOL_TIMEOUT,
    AssistantMessage,
    Harness,
    ModelError,
    ModelReply,
    Session,
    StepStart,
    ToolCallRequest,
    ToolDefinition,
    ToolResultEvent,
    Usage,
    UserMessage,
)
from guardstack.wrappers import Metrics, Retry, Timeout
from tests.integrations.chat_server import Answer, ChatServer, Fail, Hang, Paused, Raw
from tests.wrappers.otel import MetricRig

USER = [{"role": "user", "content": "hi"}]
TOOL = {
    "type": "function",
    "function": {"name": "look", "description": "", "parameters": {"type": "object"}},
}


def client_for(server: ChatServer, **options: Any) -> AsyncOpenAI:
    options.setdefault("max_retries", 0)
    return AsyncOpenAI(base_url=server.base_url, api_key="test-key", **options)


async def test_a_reply_carries_text_usage_reasoning_model_and_finish_reason(
    chat_server: ChatServer,
) -> None:
    chat_server.script = [Answer("Hello.", usage=(40, 12), reasoning="Greet back.", model="m-v2")]
    async with client_for(chat_server) as client:
        reply = await OpenAIChatModel(client, "m", temperature=0).complete(USER, [])
    assert reply == ModelReply(
        "Hello.",
        usage=Usage(input_tokens=40, output_tokens=12, cached_input_tokens=20),
        reasoning="Greet back.",
        model="m-v2",
        finish_reason="stop",
    )
    sent = chat_server.requests[0]
    assert sent == {"model": "m", "messages": USER, "temperature": 0}  # no empty tool list


async def test_with_model_is_a_copy_asking_for_the_other_model(chat_server: ChatServer) -> None:
    """A ``UsageLimit``'s downgrade switches the model through ``with_model``: the copy
    asks for the cheaper model with the same client and settings; the original is as it
    was (the shipped adapters share this, ``integrations._provider.ProviderModel``)."""
    chat_server.script = [Answer("a"), Answer("b")]
    async with client_for(chat_server) as client:
        model = OpenAIChatModel(client, "m", temperature=0)
        cheaper = model.with_model("m-mini")
        await cheaper.complete(USER, [])
        await model.complete(USER, [])
    assert [sent["model"] for sent in chat_server.requests] == ["m-mini", "m"]
    assert chat_server.requests[0]["temperature"] == 0
    assert cheaper.client is model.client
    assert cheaper.reports_chunks
    assert (type(cheaper), model.model) == (OpenAIChatModel, "m")


async def test_parallel_tool_calls_keep_their_ids_order_and_raw_arguments(
    chat_server: ChatServer,
) -> None:
    chat_server.script = [
        Answer(tool_calls=(("call_a", "look", '{"at": "a"}'), ("call_b", "look", '{"at": ')))
    ]
    async with client_for(chat_server) as client:
        reply = await OpenAIChatModel(client, "m").complete(USER, [TOOL])
    assert reply.tool_calls == (
        ToolCallRequest("look", {"at": "a"}, "call_a"),
        ToolCallRequest("look", '{"at": ', "call_b"),  # malformed JSON stays the raw text
    )
    assert reply.finish_reason == "tool_calls"
    assert chat_server.requests[0]["tools"] == [TOOL]


async def test_streaming_reports_text_deltas_and_reassembles_tool_calls(
    chat_server: ChatServer,
) -> None:
    answer = Answer(
        "Let me look at both.",
        tool_calls=(("c1", "look", '{"at": "north wing"}'), ("c2", "look", '{"at": "south"}')),
        usage=(30, 9),
        reasoning="Two places to check.",
    )
    chat_server.script = [answer, answer]
    plain: list[str] = []
    awaited: list[str] = []

    async def on_delta(text: str) -> None:
        await anyio.lowlevel.checkpoint()
        awaited.append(text)

    async with client_for(chat_server) as client:
        reply = await OpenAIChatModel(client, "m", stream=True, on_delta=plain.append).complete(
            USER, [TOOL]
        )
        again = await OpenAIChatModel(client, "m", stream=True, on_delta=on_delta).complete(
            USER, [TOOL]
        )
    assert len(plain) > 1
    assert "".join(plain) == "".join(awaited) == "Let me look at both."
    assert reply == again
    assert reply.text == "Let me look at both."
    assert reply.reasoning == "Two places to check."
    assert reply.tool_calls == (
        ToolCallRequest("look", {"at": "north wing"}, "c1"),
        ToolCallRequest("look", {"at": "south"}, "c2"),
    )
    assert reply.usage == Usage(30, 9, 15)
    assert chat_server.requests[0]["stream"] is True
    assert chat_server.requests[0]["stream_options"] == {"include_usage": True}


@pytest.mark.parametrize(
    ("step", "code", "retry_after"),
    [
        (Fail(429, "slow down", {"Retry-After": "2"}), MODEL_RATE_LIMITED, 2.0),
        (Fail(429, "slow down", {"retry-after-ms": "250"}), MODEL_RATE_LIMITED, 0.25),
        (Fail(429, "slow down"), MODEL_RATE_LIMITED, None),
        (Fail(500, "boom"), MODEL_UNAVAILABLE, None),
        (Fail(503, "overloaded", {"Retry-After": "1"}), MODEL_UNAVAILABLE, 1.0),
        (Fail(400, "This model's maximum context length is 65536 tokens"), MODEL_REJECTED, None),
        (Fail(401, "Authentication Fails"), MODEL_REJECTED, None),
        (Fail(408, "timeout"), MODEL_TIMEOUT, None),
    ],
)
async def test_http_failures_map_to_model_error_codes(
    chat_server: ChatServer, step: Fail, code: str, retry_after: float | None
) -> None:
    chat_server.script = [step]
    async with client_for(chat_server) as client:
        with pytest.raises(ModelError) as raised:
            await OpenAIChatModel(client, "m").complete(USER, [])
    assert raised.value.code == code
    assert raised.value.retry_after_s == retry_after
    assert raised.value.message == f"HTTP {step.status}: {step.message}"


async def test_the_clients_own_timeout_is_a_model_timeout(chat_server: ChatServer) -> None:
    chat_server.script = [Hang()]
    async with client_for(chat_server, timeout=0.2) as client:
        with pytest.raises(ModelError) as raised:
            await OpenAIChatModel(client, "m").complete(USER, [])
    assert raised.value.code == MODEL_TIMEOUT


async def test_a_provider_that_cannot_be_reached_is_unavailable() -> None:
    with socket.socket() as probe:  # a loopback port nobody listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    async with AsyncOpenAI(
        base_url=f"http://127.0.0.1:{port}/v1", api_key="k", max_retries=0
    ) as client:
        with pytest.raises(ModelError) as raised:
            await OpenAIChatModel(client, "m").complete(USER, [])
    assert raised.value.code == MODEL_UNAVAILABLE


@pytest.mark.parametrize(
    ("body", "says"),
    [
        (
            '{"id": "x", "object": "chat.completion", "created": 1, "model": "m", "choices": []}',
            "no choices",
        ),
        ("this is not json", "not a chat completion"),
    ],
)
async def test_a_reply_it_cannot_use_is_a_clear_model_failure(
    chat_server: ChatServer, body: str, says: str
) -> None:
    chat_server.script = [Raw(body, "application/json" if body.startswith("{") else "text/plain")]
    async with client_for(chat_server) as client:
        with pytest.raises(ModelError) as raised:
            await OpenAIChatModel(client, "m").complete(USER, [])
    assert raised.value.code == MODEL_FAILED
    assert says in raised.value.message


async def test_malformed_tool_arguments_reach_the_registry_as_invalid_arguments(
    chat_server: ChatServer,
) -> None:
    chat_server.script = [
        Answer(tool_calls=(("c1", "look", '{"at": "a"'),)),
        Answer("I will fix my arguments."),
    ]
    async with client_for(chat_server) as client:
        harness = Harness(OpenAIChatModel(client, "m"))
        harness.tools.register(ToolDefinition("look", _look))
        agent = harness.loop.create("s")
        result = await agent.prompt("look")
    assert result.reason == "completed"
    [answer] = [e for e in agent.session.events if isinstance(e, ToolResultEvent)]
    assert answer.result.code == INVALID_ARGUMENTS
    sent = chat_server.requests[1]["messages"][1]["tool_calls"][0]["function"]["arguments"]
    assert sent == '{"at": "a"'  # the model's own text goes back unchanged


async def _look(arguments: Any, call: Any) -> str:
    return f"looked at {arguments.get('at')}"


def test_a_missing_extra_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "openai", None)  # as if not installed
    with pytest.raises(ImportError, match=r"pip install 'guardstack\[openai\]'"):
        OpenAIChatModel(object(), "m")  # type: ignore[arg-type]


async def _slow_search(arguments: Any, call: Any) -> str:
    await anyio.sleep(30)
    return "never"


async def _read_file(arguments: Any, call: Any) -> str:
    return f"contents of {arguments['path']}"


async def test_a_whole_guarded_agent_against_a_real_server(chat_server: ChatServer) -> None:
    """Tools, both guards, a 429 and a hang survived on the model stage, a usage stop."""
    chat_server.require_reasoning = True  # DeepSeek's thinking mode
    read = ("read_file", '{"path": "a.txt"}')
    chat_server.script = [
        Answer(
            tool_calls=(("c1", "slow_search", '{"q": "x"}'), ("c2", *read)),
            reasoning="Search and read.",
        ),
        Fail(429, "Rate limit reached", {"retry-after-ms": "50"}),
        Answer(tool_calls=(("c3", *read),), reasoning="Read again."),
        Hang(),
        Answer(tool_calls=(("c4", *read),), reasoning="And again."),
        Answer(tool_calls=(("c5", "read_file", '{"path": "b.txt"}'),), reasoning="Other file."),
        Answer("never sent: the usage limit stops the turn first"),
    ]
    async with client_for(chat_server) as client:
        harness = Harness(OpenAIChatModel(client, "deepseek-chat"), system="You are careful.")
        harness.tools.register(ToolDefinition("slow_search", _slow_search, timeout_ms=100))
        harness.tools.register(ToolDefinition("read_file", _read_file))
        harness.plugin(ToolCallTimeoutPolicy())
        harness.plugin(RepeatToolReminder())
        # each call reserves its input (a token per 4 characters: more than this server
        # reports) and one output token; the seventh's reservation would pass the limit
        harness.plugin(UsageLimit(tokens_per_turn=140, estimate_output_tokens=1))
        harness.plugin(Retry(stage="model", attempts=3, backoff_ms=10, max_backoff_ms=100))
        harness.plugin(Timeout(ms=500, stage="model"))
        agent = harness.loop.create("whole")
        result = await agent.prompt("Find the answer.")

    assert result.reason == "blocked"
    assert result.error is not None
    assert result.error.startswith(
        "usage-limit: this turn used 60 tokens and the limit is 140 per turn (this call's "
        "reservation of"
    )
    assert result.usage == Usage(40, 20, 20)
    assert len(chat_server.requests) == 6
    results = {e.call_id: e.result for e in agent.session.events if isinstance(e, ToolResultEvent)}
    assert results["c1"].code == TOOL_TIMEOUT
    assert results["c2"].content == "contents of a.txt"
    reminders = [
        e
        for e in agent.session.events
        if isinstance(e, UserMessage) and e.source.plugin == "repeat-tool-reminder"
    ]
    assert len(reminders) == 1  # the third identical read_file
    assert chat_server.requests[5]["messages"][-1]["content"] == reminders[0].text

    # The saved log rebuilds every request the server received, byte for byte: each
    # step's request, rebuilt from the loaded log and sent again through the same
    # client, is the very body the server got (retries resend the same request).
    saved = Session.from_jsonl(agent.session.to_jsonl())
    rebuilt, replay = [], Session("replay")
    for event in saved.events:
        if isinstance(event, StepStart):
            rebuilt.append(replay.messages())
        replay.append(event)
    received = chat_server.bodies
    per_step = [0, 1, 1, 2, 2, 3]  # which step each received request belongs to
    assert len(rebuilt) == 5  # four answered steps, and the one the limit stopped
    again = ChatServer()
    again.script = [Answer("ok")] * len(per_step)
    try:
        async with AsyncOpenAI(base_url=again.base_url, api_key="test-key", max_retries=0) as c:
            model = OpenAIChatModel(c, "deepseek-chat")
            tools = harness.tools.schemas()
            for step in per_step:
                await model.complete(rebuilt[step], tools)
    finally:
        again.stop()
    assert again.bodies == received
    sent = [json.loads(body)["messages"] for body in received]
    assert sent == [chat_messages(rebuilt[s]) for s in per_step]
    # the timed-out result is marked for Anthropic in the log's request, never on this wire
    assert any(message.get("is_error") for message in rebuilt[1])
    assert not any("is_error" in message for messages in sent for message in messages)


async def test_the_server_refuses_a_thinking_conversation_without_its_reasoning(
    chat_server: ChatServer,
) -> None:
    """The rule the whole-agent test relies on really is enforced (so that test can fail)."""
    chat_server.require_reasoning = True
    chat_server.script = [Answer("unreachable")]
    forgetful: list[dict[str, Any]] = [
        *USER,
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "look", "arguments": "{}"}}
            ],
        },
        {"role": "tool", "tool_call_id": "c1", "content": "seen"},
    ]
    async with client_for(chat_server) as client:
        with pytest.raises(ModelError) as raised:
            await OpenAIChatModel(client, "deepseek-reasoner").complete(forgetful, [TOOL])
    assert raised.value.code == MODEL_REJECTED
    assert "Missing `reasoning_content` field" in raised.value.message


@pytest.mark.parametrize("usage", [(10**400, 5), (10, 10**400)])
async def test_a_400_digit_token_count_is_unknown_usage_not_an_overflow(
    chat_server: ChatServer, usage: tuple[int, int]
) -> None:
    """A count no call could report is garbage: the reply's usage is unknown (a spend cap
    charges its reservation), and neither the metrics nor a usage limit overflow on it."""
    chat_server.script = [Answer("Hello.", usage=usage), Answer("Again.")]
    async with client_for(chat_server) as client:
        harness = Harness(OpenAIChatModel(client, "m"))
        meters = MetricRig()
        harness.plugin(Metrics(stage="model", meter_provider=meters.provider))
        harness.plugin(UsageLimit(tokens_per_turn=10_000, estimate_output_tokens=1))
        agent = harness.loop.create("huge")
        first = await agent.prompt("hi")
        second = await agent.prompt("again")
    assert (first.reason, first.text) == ("completed", "Hello.")
    assert first.usage == Usage(0, 0)
    assert (second.reason, second.text, second.usage) == ("completed", "Again.", Usage(10, 5, 5))
    assert meters.total("gen_ai.client.operation.duration") == 2
    # only the second reply's usage was counted
    assert [p.sum for p in meters.points("gen_ai.client.token.usage")] == [10, 5]


# -- streams that stall (Timeout's first_byte_ms and idle_ms) ---------------------------


async def test_a_stream_that_does_not_start_is_retried_and_one_that_stalls_is_cut(
    chat_server: ChatServer,
) -> None:
    """Against real streams: the first is paused before its first byte (a retryable
    MODEL_TIMEOUT, sent again by the Retry outside); the second stalls after a few
    chunks (cut by idle_ms; the text that had arrived is logged)."""
    text = "The answer is forty-two, as computed."
    chat_server.script = [
        Paused(Answer("never seen"), at=0, pause_s=3.0),
        Paused(Answer(text), at=4, pause_s=3.0),
    ]
    async with client_for(chat_server) as client:
        harness = Harness(OpenAIChatModel(client, "m", stream=True))
        harness.plugin(Retry(stage="model", attempts=2, backoff_ms=1, jitter=False))
        harness.plugin(Timeout(stage="model", first_byte_ms=300, idle_ms=300))
        agent = harness.loop.create("stalls")
        started = anyio.current_time()
        result = await agent.prompt("go")
        elapsed = anyio.current_time() - started
    assert result.reason == "error"
    assert result.error is not None
    assert "MODEL_TIMEOUT" in result.error
    assert "the stream stalled: no chunk for 300ms after 4 chunks" in result.error
    assert len(chat_server.requests) == 2  # the first attempt never started: sent again
    assert elapsed < 2.0  # neither pause was waited out
    said = [e.text for e in agent.session.events if isinstance(e, AssistantMessage)]
    assert said[-1]
    assert text.startswith(said[-1])  # what arrived, logged


async def test_a_long_stream_that_keeps_coming_is_not_cut(chat_server: ChatServer) -> None:
    chat_server.script = [Paused(Answer("slow but steady"), at=2, pause_s=0.15)]
    async with client_for(chat_server) as client:
        harness = Harness(OpenAIChatModel(client, "m", stream=True))
        harness.plugin(Timeout(stage="model", first_byte_ms=1_000, idle_ms=1_000))
        result = await harness.loop.create("steady").prompt("go")
    assert result.reason == "completed"
    assert result.text == "slow but steady"
