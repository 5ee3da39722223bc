"""``AnthropicModel`` through the official ``anthropic`` client against a real loopback
server speaking the Messages API (JSON and the SSE event stream)."""

from __future__ import annotations

import json
import socket
import sys
from typing import Any

import anyio
import pytest
from anthropic import AsyncAnthropic

from guardstack.guards import RepeatToolReminder, ToolCallTimeoutPolicy, UsageLimit
from guardstack.integrations.anthropic import AnthropicModel
from guardstack.pipeline import (
    INVALID_ARGUMENTS,
    MODEL_FAILED,
    MODEL_OVERLOADED,
    MODEL_RATE_LIMITED,
    MODEL_REJECTED,
    MODEL_TIMEOUT,
    MODEL_UNAVAILABLE,
    TOOL_TIMEOUT,
    AssistantMessage,
    Harness,
    ModelError,
    Session,
    StepStart,
    ToolCallRequest,
    ToolResultEvent,
    Usage,
    UserMessage,
    tool,
)
from guardstack.wrappers import Retry, Timeout
from tests.integrations.chat_server import Broken, Fail, Hang, Paused, Raw
from tests.integrations.messages_server import (
    Cut,
    MessagesServer,
    Reply,
    StreamError,
    signature,
)

USER = [{"role": "user", "content": "hi"}]
TOOL = {
    "type": "function",
    "function": {
        "name": "look",
        "description": "Look somewhere.",
        "parameters": {"type": "object", "properties": {"at": {"type": "string"}}},
    },
}
THINKING = {"type": "enabled", "budget_tokens": 1024}


def client_for(server: MessagesServer, **options: Any) -> AsyncAnthropic:
    options.setdefault("max_retries", 0)
    return AsyncAnthropic(base_url=server.base_url, api_key="test-key", **options)


async def test_a_reply_carries_text_cache_usage_model_and_stop_reason(
    messages_server: MessagesServer,
) -> None:
    messages_server.script = [Reply("Hello.", usage=(40, 12, 300, 50), model="claude-x-1")]
    messages = [{"role": "system", "content": "Be brief."}, *USER]
    async with client_for(messages_server) as client:
        model = AnthropicModel(client, "claude-x", max_tokens=256, stop_sequences=["END"])
        reply = await model.complete(messages, [])
    assert reply.text == "Hello."
    assert reply.tool_calls == ()
    # all input counted (plain + cache reads + cache writes), the cache parts named
    assert reply.usage == Usage(
        input_tokens=390, output_tokens=12, cached_input_tokens=300, cache_write_tokens=50
    )
    assert (reply.model, reply.finish_reason, reply.thinking_blocks) == (
        "claude-x-1",
        "end_turn",
        (),
    )
    sent = messages_server.requests[0]
    assert sent == {
        "max_tokens": 256,
        "messages": [{"role": "user", "content": "hi"}],
        "model": "claude-x",
        "system": "Be brief.",  # top-level, never a message
        "stop_sequences": ["END"],
    }  # and no empty tool list
    sent_headers = messages_server.headers[0]
    assert "anthropic-version" in sent_headers
    assert "test-key" in sent_headers.get("x-api-key", sent_headers.get("authorization", ""))


async def test_parallel_tool_uses_and_their_results_pair_up_as_anthropic_requires(
    messages_server: MessagesServer,
) -> None:
    """tool_use ids survive; the next request answers every one with a tool_result at the
    head of the user message (the failed one with is_error), the reminder after them."""
    messages_server.script = [
        Reply(
            "Both wings.",
            tool_uses=(("toolu_a", "look", {"at": "north"}), ("toolu_b", "look", {"at": "x"})),
        ),
        Reply("Done."),
    ]

    @tool
    def look(at: str) -> str:
        """Look somewhere.

        Args:
            at: where to look.
        """
        if at == "x":
            raise RuntimeError("no such wing")
        return f"saw {at}"

    async with client_for(messages_server) as client:
        harness = Harness(AnthropicModel(client, "claude-x", max_tokens=100), system="Look.")
        harness.tools.register(look)
        result = await harness.loop.create("pairs").prompt("Where is it?")
    assert result.reason == "completed"
    second = messages_server.requests[1]
    assert second["system"] == "Look."
    assert second["tools"] == [
        {
            "name": "look",
            "description": "Look somewhere.",
            "input_schema": look.parameters,
        }
    ]
    assistant, answers = second["messages"][1:]
    assert assistant == {
        "role": "assistant",
        "content": [
            {"type": "text", "text": "Both wings."},
            {"type": "tool_use", "id": "toolu_a", "name": "look", "input": {"at": "north"}},
            {"type": "tool_use", "id": "toolu_b", "name": "look", "input": {"at": "x"}},
        ],
    }
    assert answers["role"] == "user"
    first, failed = answers["content"]
    assert first == {"type": "tool_result", "tool_use_id": "toolu_a", "content": "saw north"}
    assert failed["tool_use_id"] == "toolu_b"
    assert failed["is_error"] is True
    assert "no such wing" in failed["content"]


async def test_the_server_refuses_an_unanswered_tool_use(messages_server: MessagesServer) -> None:
    """The pairing rule the tests above rely on really is enforced (so they can fail)."""
    messages_server.script = [Reply("unreachable")]
    unanswered: list[dict[str, Any]] = [
        *USER,
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [{"id": "t1", "type": "function", "function": {"name": "look"}}],
        },
        {"role": "user", "content": "and?"},
    ]
    async with client_for(messages_server) as client:
        with pytest.raises(ModelError) as raised:
            await AnthropicModel(client, "m", max_tokens=10).complete(unanswered, [TOOL])
    assert raised.value.code == MODEL_REJECTED
    assert "`tool_use` ids were found without `tool_result`" in raised.value.message


@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
async def test_thinking_blocks_come_back_unchanged_with_their_signatures(
    messages_server: MessagesServer, stream: bool
) -> None:
    messages_server.script = [
        Reply(thinking="The north wing first.", tool_uses=(("toolu_1", "look", {"at": "n"}),)),
        Reply("Found it.", thinking="It was there."),
    ]

    @tool
    def look(at: str) -> str:
        """Look somewhere."""
        return f"saw {at}"

    async with client_for(messages_server) as client:
        model = AnthropicModel(client, "m", max_tokens=2048, stream=stream, thinking=THINKING)
        harness = Harness(model)
        harness.tools.register(look)
        agent = harness.loop.create("thinking")
        result = await agent.prompt("Find it.")
    assert result.reason == "completed", result.error
    block = {
        "type": "thinking",
        "thinking": "The north wing first.",
        "signature": signature("The north wing first."),
    }
    [first, _] = [e for e in agent.session.events if isinstance(e, AssistantMessage)]
    assert [dict(b) for b in first.thinking_blocks] == [block]
    assert first.reasoning == "The north wing first."
    assert messages_server.requests[1]["messages"][1]["content"][0] == block
    # and the log keeps them: a session loaded from JSONL rebuilds the same request
    loaded = Session.from_jsonl(agent.session.to_jsonl())
    reloaded = next(e for e in loaded.events if isinstance(e, AssistantMessage))
    assert [dict(b) for b in reloaded.thinking_blocks] == [block]


@pytest.mark.parametrize("change", ["signature", "dropped"])
async def test_the_server_refuses_a_changed_or_dropped_thinking_block(
    messages_server: MessagesServer, change: str
) -> None:
    block = {"type": "thinking", "thinking": "Plan.", "signature": signature("Plan.")}
    if change == "signature":
        block = block | {"thinking": "Plan, edited."}
    assistant: dict[str, Any] = {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {"id": "t1", "type": "function", "function": {"name": "look", "arguments": "{}"}}
        ],
    }
    if change != "dropped":
        assistant["thinking_blocks"] = [block]
    messages = [*USER, assistant, {"role": "tool", "tool_call_id": "t1", "content": "ok"}]
    messages_server.script = [Reply("unreachable")]
    async with client_for(messages_server) as client:
        model = AnthropicModel(client, "m", max_tokens=2048, thinking=THINKING)
        with pytest.raises(ModelError) as raised:
            await model.complete(messages, [TOOL])
    assert raised.value.code == MODEL_REJECTED
    expected = "Invalid `signature`" if change == "signature" else "must start with a thinking"
    assert expected in raised.value.message


async def test_redacted_thinking_goes_back_as_it_came(messages_server: MessagesServer) -> None:
    messages_server.script = [
        Reply(thinking="secret", redacted=True, tool_uses=(("t1", "look", {"at": "a"}),)),
        Reply("ok"),
    ]

    @tool
    def look(at: str) -> str:
        """Look."""
        return at

    async with client_for(messages_server) as client:
        harness = Harness(AnthropicModel(client, "m", max_tokens=2048, thinking=THINKING))
        harness.tools.register(look)
        result = await harness.loop.create("r").prompt("go")
    assert result.reason == "completed", result.error
    [sent] = messages_server.requests[1]["messages"][1]["content"][:1]
    assert sent["type"] == "redacted_thinking"
    assert sent["data"] in messages_server.redacted_issued


async def test_streaming_reports_text_and_reassembles_tool_input(
    messages_server: MessagesServer,
) -> None:
    step = Reply(
        "Let me look at both.",
        tool_uses=(("t1", "look", {"at": "north wing"}), ("t2", "look", {"at": "south"})),
        thinking="Two places.",
        usage=(30, 9, 100, 20),
    )
    messages_server.script = [step, step, step]
    plain: list[str] = []
    awaited: list[str] = []

    async def on_delta(text: str) -> None:
        await anyio.lowlevel.checkpoint()
        awaited.append(text)

    async with client_for(messages_server) as client:
        streamed = await AnthropicModel(
            client, "m", max_tokens=50, stream=True, on_delta=plain.append
        ).complete(USER, [TOOL])
        again = await AnthropicModel(
            client, "m", max_tokens=50, stream=True, on_delta=on_delta
        ).complete(USER, [TOOL])
        whole = await AnthropicModel(client, "m", max_tokens=50).complete(USER, [TOOL])
    assert len(plain) > 1
    assert "".join(plain) == "".join(awaited) == "Let me look at both."
    assert streamed == again == whole  # the stream rebuilds exactly the JSON reply
    assert streamed.tool_calls == (
        ToolCallRequest("look", {"at": "north wing"}, "t1"),
        ToolCallRequest("look", {"at": "south"}, "t2"),
    )
    assert streamed.usage == Usage(150, 9, 100, cache_write_tokens=20)
    assert streamed.finish_reason == "tool_use"
    assert messages_server.requests[0]["stream"] is True


@pytest.mark.parametrize(
    ("step", "code", "retry_after"),
    [
        (Fail(429, "slow down", {"retry-after": "2"}), MODEL_RATE_LIMITED, 2.0),
        (Fail(429, "slow down"), MODEL_RATE_LIMITED, None),
        (Fail(529, "Overloaded"), MODEL_OVERLOADED, None),
        (Fail(500, "boom"), MODEL_UNAVAILABLE, None),
        (Fail(503, "unavailable", {"retry-after": "1"}), MODEL_UNAVAILABLE, 1.0),
        (Fail(400, "prompt is too long: 210000 tokens > 200000 maximum"), MODEL_REJECTED, None),
        (Fail(401, "invalid x-api-key"), MODEL_REJECTED, None),
        (Fail(408, "timeout"), MODEL_TIMEOUT, None),
    ],
)
async def test_http_failures_map_to_model_error_codes(
    messages_server: MessagesServer, step: Fail, code: str, retry_after: float | None
) -> None:
    messages_server.script = [step]
    async with client_for(messages_server) as client:
        with pytest.raises(ModelError) as raised:
            await AnthropicModel(client, "m", max_tokens=10).complete(USER, [])
    assert raised.value.code == code
    assert raised.value.retry_after_s == retry_after
    assert step.message in raised.value.message


@pytest.mark.parametrize(
    ("step", "code", "says"),
    [
        (StreamError("overloaded_error", "Overloaded"), MODEL_OVERLOADED, "Overloaded"),
        (StreamError("api_error", "Internal"), MODEL_UNAVAILABLE, "Internal"),
        (StreamError("invalid_request_error", "bad"), MODEL_UNAVAILABLE, "bad"),
        (Cut(), MODEL_UNAVAILABLE, "no message_stop"),
        # the connection dropped mid-body: httpx's RemoteProtocolError, retried as a
        # dropped connection is (the OpenAI-compatible adapter's meaning too)
        (Broken(), MODEL_UNAVAILABLE, "connection"),
        (Raw("event: message_start\ndata: {not json\n\n", "text/event-stream"), MODEL_FAILED, ""),
    ],
)
async def test_a_stream_that_fails_midway_is_a_model_error(
    messages_server: MessagesServer, step: Any, code: str, says: str
) -> None:
    messages_server.script = [step]
    async with client_for(messages_server) as client:
        with pytest.raises(ModelError) as raised:
            await AnthropicModel(client, "m", max_tokens=10, stream=True).complete(USER, [])
    assert raised.value.code == code
    assert says in raised.value.message


async def test_the_clients_own_timeout_is_a_model_timeout(messages_server: MessagesServer) -> None:
    messages_server.script = [Hang()]
    async with client_for(messages_server, timeout=0.2) as client:
        with pytest.raises(ModelError) as raised:
            await AnthropicModel(client, "m", max_tokens=10).complete(USER, [])
    assert raised.value.code == MODEL_TIMEOUT


async def test_a_provider_that_cannot_be_reached_is_unavailable() -> None:
    with socket.socket() as probe:  # a loopback port nobody listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    async with AsyncAnthropic(
        base_url=f"http://127.0.0.1:{port}", api_key="k", max_retries=0
    ) as client:
        with pytest.raises(ModelError) as raised:
            await AnthropicModel(client, "m", max_tokens=10).complete(USER, [])
    assert raised.value.code == MODEL_UNAVAILABLE


@pytest.mark.parametrize(
    "body",
    ['{"type": "message", "content": "not blocks"}', '{"type": "completion"}', "not json"],
)
async def test_a_reply_it_cannot_use_is_a_clear_model_failure(
    messages_server: MessagesServer, body: str
) -> None:
    messages_server.script = [
        Raw(body, "application/json" if body.startswith("{") else "text/plain")
    ]
    async with client_for(messages_server) as client:
        with pytest.raises(ModelError) as raised:
            await AnthropicModel(client, "m", max_tokens=10).complete(USER, [])
    assert raised.value.code == MODEL_FAILED


async def test_streamed_tool_input_that_does_not_parse_is_answered_invalid_arguments(
    messages_server: MessagesServer,
) -> None:
    broken = (
        'event: message_start\ndata: {"type":"message_start","message":{"id":"m","type":'
        '"message","role":"assistant","model":"m","content":[],"stop_reason":null,'
        '"stop_sequence":null,"usage":{"input_tokens":3,"output_tokens":1}}}\n\n'
        'event: content_block_start\ndata: {"type":"content_block_start","index":0,'
        '"content_block":{"type":"tool_use","id":"t1","name":"look","input":{}}}\n\n'
        'event: content_block_delta\ndata: {"type":"content_block_delta","index":0,'
        '"delta":{"type":"input_json_delta","partial_json":"{\\"at\\": "}}\n\n'
        'event: content_block_stop\ndata: {"type":"content_block_stop","index":0}\n\n'
        'event: message_delta\ndata: {"type":"message_delta","delta":{"stop_reason":'
        '"tool_use","stop_sequence":null},"usage":{"output_tokens":4}}\n\n'
        'event: message_stop\ndata: {"type":"message_stop"}\n\n'
    )
    messages_server.script = [Raw(broken, "text/event-stream"), Reply("I will fix it.")]

    @tool
    def look(at: str) -> str:
        """Look."""
        return at

    async with client_for(messages_server) as client:
        harness = Harness(AnthropicModel(client, "m", max_tokens=10, stream=True))
        harness.tools.register(look)
        agent = harness.loop.create("s")
        result = await agent.prompt("look")
    assert result.reason == "completed"
    [answer] = [e for e in agent.session.events if isinstance(e, ToolResultEvent)]
    assert answer.result.code == INVALID_ARGUMENTS
    assert messages_server.requests[1]["messages"][1]["content"][0]["input"] == {}


def test_a_missing_extra_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "anthropic", None)  # as if not installed
    with pytest.raises(ImportError, match=r"pip install 'guardstack\[anthropic\]'"):
        AnthropicModel(object(), "m", max_tokens=1)  # type: ignore[arg-type]


def test_bad_arguments_are_refused_at_construction() -> None:
    client = AsyncAnthropic(base_url="http://127.0.0.1:9", api_key="k")
    with pytest.raises(ValueError, match="max_tokens"):
        AnthropicModel(client, "m", max_tokens=0)
    with pytest.raises(TypeError, match=r"anthropic\.AsyncAnthropic"):
        AnthropicModel(object(), "m", max_tokens=1)  # type: ignore[arg-type]
    with pytest.raises(
        TypeError, match=r"takes no 'stop_sequence' \(did you mean 'stop_sequences'\?\)"
    ):
        AnthropicModel(client, "m", max_tokens=1, stop_sequence=["x"])
    with pytest.raises(TypeError, match="sets messages itself"):
        AnthropicModel(client, "m", max_tokens=1, messages=[])
    with pytest.raises(TypeError, match="on_delta"):
        AnthropicModel(client, "m", max_tokens=1, on_delta="print")  # type: ignore[arg-type]


async def test_a_whole_guarded_agent_against_a_real_server(
    messages_server: MessagesServer,
) -> None:
    """A Claude agent with thinking, three typed tools and the original system's guards;
    then every request the server received is rebuilt from the saved log and sent again,
    equal byte for byte."""

    @tool(timeout_ms=100)
    async def slow_search(q: str) -> str:
        """Search the web.

        Args:
            q: what to search for.
        """
        await anyio.sleep(30)
        return "never"

    @tool
    def read_file(path: str) -> str:
        """Read a file."""
        return f"contents of {path}"

    @tool
    def count(items: list[str]) -> int:
        """Count items."""
        return len(items)

    read = ("read_file", {"path": "a.txt"})
    messages_server.script = [
        Reply(
            thinking="Search and read.",
            tool_uses=(("t1", "slow_search", {"q": "x"}), ("t2", *read)),
            usage=(20, 10, 0, 100),
        ),
        Fail(529, "Overloaded"),  # the model-stage Retry takes it
        Reply(thinking="Again.", tool_uses=(("t3", *read),), usage=(5, 5, 100, 0)),
        Reply(
            thinking="Count too.", tool_uses=(("t4", *read), ("t5", "count", {"items": ["a", "b"]}))
        ),
        Reply("The answer is in a.txt."),
    ]
    async with client_for(messages_server) as client:
        model = AnthropicModel(client, "claude-x", max_tokens=4096, thinking=THINKING)
        harness = Harness(model, system="You are careful.")
        harness.tools.register(slow_search)
        harness.tools.register(read_file)
        harness.tools.register(count)
        harness.plugin(ToolCallTimeoutPolicy())
        harness.plugin(RepeatToolReminder())
        harness.plugin(UsageLimit(tokens_per_turn=10_000))
        harness.plugin(Retry(stage="model", attempts=3, backoff_ms=10, max_backoff_ms=50))
        harness.plugin(Timeout(ms=2000, stage="model"))
        agent = harness.loop.create("whole")
        result = await agent.prompt("Find the answer.")

    assert result.reason == "completed", result.error
    assert result.text == "The answer is in a.txt."
    assert len(messages_server.requests) == 5
    results = {e.call_id: e.result for e in agent.session.events if isinstance(e, ToolResultEvent)}
    assert results["t1"].code == TOOL_TIMEOUT
    assert results["t5"].content == "2"
    reminders = [
        e
        for e in agent.session.events
        if isinstance(e, UserMessage) and e.source.plugin == "repeat-tool-reminder"
    ]
    assert len(reminders) == 1  # the third identical read_file
    last_user = messages_server.requests[4]["messages"][-1]
    assert last_user["content"][-1] == {"type": "text", "text": reminders[0].text}
    assert [b["type"] for b in last_user["content"]] == ["tool_result", "tool_result", "text"]
    assert result.usage == Usage(245, 25, 100, cache_write_tokens=100)

    saved = Session.from_jsonl(agent.session.to_jsonl())
    rebuilt, replay = [], Session("replay")
    for event in saved.events:
        if isinstance(event, StepStart):
            rebuilt.append(replay.messages())
        replay.append(event)
    per_step = [0, 1, 1, 2, 3]  # the 529 was step 2's first attempt
    again = MessagesServer()
    again.script = [Reply("ok")] * len(per_step)
    try:
        async with AsyncAnthropic(base_url=again.base_url, api_key="test-key", max_retries=0) as c:
            replayed = AnthropicModel(c, "claude-x", max_tokens=4096, thinking=THINKING)
            tools = harness.tools.schemas()
            for step in per_step:
                await replayed.complete(rebuilt[step], tools)
    finally:
        again.stop()
    assert again.bodies == messages_server.bodies
    assert json.loads(again.bodies[-1])["messages"][1]["content"][0]["signature"] == signature(
        "Search and read."
    )


@pytest.mark.parametrize(
    "usage", [(10**400, 5, 0, 0), (10, 10**400, 0, 0), (10, 5, 10**400, 0), (10, 5, 0, -1)]
)
@pytest.mark.parametrize("stream", [False, True])
async def test_a_token_count_no_call_could_report_is_unknown_usage(
    messages_server: MessagesServer, usage: tuple[int, int, int, int], stream: bool
) -> None:
    """400 digits (or a negative cache count) is garbage: the reply's usage is unknown,
    which a spend cap charges at its reservation; nothing overflows adding it up."""
    messages_server.script = [Reply("Hello.", usage=usage)]
    async with client_for(messages_server) as client:
        reply = await AnthropicModel(client, "claude-x", max_tokens=64, stream=stream).complete(
            USER, []
        )
    assert (reply.text, reply.usage) == ("Hello.", None)


# -- streams that stall (Timeout's first_byte_ms and idle_ms) ---------------------------


async def test_a_messages_stream_that_does_not_start_is_retried_and_one_that_stalls_is_cut(
    messages_server: MessagesServer,
) -> None:
    text = "The answer is forty-two, as computed by the long method."
    messages_server.script = [
        Paused(Reply("never seen"), at=0, pause_s=3.0),
        Paused(Reply(text), at=4, pause_s=3.0),
    ]
    async with client_for(messages_server) as client:
        harness = Harness(AnthropicModel(client, "m", max_tokens=100, stream=True))
        harness.plugin(Retry(stage="model", attempts=2, backoff_ms=1, jitter=False))
        harness.plugin(Timeout(stage="model", first_byte_ms=300, idle_ms=300))
        agent = harness.loop.create("stalls")
        started = anyio.current_time()
        result = await agent.prompt("go")
        elapsed = anyio.current_time() - started
    assert result.reason == "error"
    assert result.error is not None
    assert "MODEL_TIMEOUT" in result.error
    assert "the stream stalled: no chunk for 300ms after" in result.error  # the SDK's events
    assert len(messages_server.requests) == 2
    assert elapsed < 2.0
    said = [e.text for e in agent.session.events if isinstance(e, AssistantMessage)]
    assert said[-1]
    assert text.startswith(said[-1])
