"""``LiteLLMModel`` through the real ``litellm`` package against real loopback servers:
the chat-completions one (LiteLLM's ``openai/`` provider) and the Messages one
(its ``anthropic/`` provider). asyncio only, as LiteLLM is."""

from __future__ import annotations

import sys
from typing import Any

import anyio
import pytest

from guardstack.integrations.litellm import LiteLLMModel
from guardstack.pipeline import (
    MODEL_FAILED,
    MODEL_OVERLOADED,
    MODEL_RATE_LIMITED,
    MODEL_REJECTED,
    MODEL_TIMEOUT,
    MODEL_UNAVAILABLE,
    AssistantMessage,
    Harness,
    ModelError,
    ModelReply,
    ToolCallRequest,
    Usage,
    tool,
)
from guardstack.wrappers import Retry, no_backoff
from tests.integrations.chat_server import Answer, ChatServer, Fail, Hang, Raw
from tests.integrations.messages_server import MessagesServer, Reply, signature

# LiteLLM's streaming code trips pydantic's warnings about LiteLLM's own types (its
# TypedDicts' ReadOnly items, instance access to model_computed_fields); the suite turns
# warnings into errors, and these are upstream's, about upstream's code.
pytestmark = [
    pytest.mark.filterwarnings("ignore:Item '.*' on TypedDict class:UserWarning"),
    pytest.mark.filterwarnings("ignore::pydantic.warnings.PydanticDeprecatedSince211"),
]

USER = [{"role": "user", "content": "hi"}]
TOOL = {
    "type": "function",
    "function": {"name": "look", "description": "Look.", "parameters": {"type": "object"}},
}


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"  # LiteLLM's async API runs on asyncio only


def over(server: ChatServer, **params: Any) -> LiteLLMModel:
    params.setdefault("max_retries", 0)
    return LiteLLMModel("openai/test-model", api_base=server.base_url, api_key="test-key", **params)


@tool
def look(at: str) -> str:
    """Look somewhere."""
    if at == "x":
        raise RuntimeError("nothing there")
    return f"saw {at}"


async def test_a_reply_carries_text_usage_reasoning_and_model(chat_server: ChatServer) -> None:
    chat_server.script = [Answer("Hello.", usage=(40, 12), reasoning="Greet.", model="m-v2")]
    reply = await over(chat_server, temperature=0).complete(USER, [])
    assert reply == ModelReply(
        "Hello.",
        usage=Usage(input_tokens=40, output_tokens=12, cached_input_tokens=20),
        reasoning="Greet.",
        model="m-v2",
        finish_reason="stop",
    )
    sent = chat_server.requests[0]
    assert sent["model"] == "test-model"  # the provider prefix is LiteLLM's routing
    assert sent["messages"] == USER
    assert sent["temperature"] == 0
    assert "tools" not in sent


async def test_a_guarded_agent_runs_its_tools_and_no_error_flag_reaches_the_wire(
    chat_server: ChatServer,
) -> None:
    chat_server.script = [
        Fail(503, "try later"),
        Answer(tool_calls=(("c1", "look", '{"at": "a"}'), ("c2", "look", '{"at": "x"}'))),
        Answer("Done."),
    ]
    harness = Harness(over(chat_server))
    harness.tools.register(look)
    harness.plugin(Retry(stage="model", attempts=2, backoff_ms=1))
    result = await harness.loop.create("s").prompt("look twice")
    assert result.reason == "completed"
    assert result.text == "Done."
    last = chat_server.requests[-1]["messages"]
    assert [m["role"] for m in last] == ["user", "assistant", "tool", "tool"]
    assert last[2] == {"role": "tool", "tool_call_id": "c1", "content": "saw a"}
    assert "is_error" not in last[3]
    assert "nothing there" in last[3]["content"]
    assert chat_server.requests[1]["tools"][0]["function"]["name"] == "look"


async def test_streaming_reports_text_and_reassembles_tool_calls(chat_server: ChatServer) -> None:
    chat_server.script = [
        Answer(
            "Let me look.",
            tool_calls=(("c1", "look", '{"at": "north wing"}'),),
            usage=(30, 9),
        )
    ]
    deltas: list[str] = []
    reply = await over(chat_server, stream=True, on_delta=deltas.append).complete(USER, [TOOL])
    assert "".join(deltas) == "Let me look."
    assert len(deltas) > 1
    assert reply.tool_calls == (ToolCallRequest("look", {"at": "north wing"}, "c1"),)
    assert reply.usage is not None
    assert (reply.usage.input_tokens, reply.usage.output_tokens) == (30, 9)
    assert reply.finish_reason == "tool_calls"


@pytest.mark.parametrize(
    ("step", "code", "retry_after"),
    [
        (Fail(429, "slow down", {"retry-after": "2"}), MODEL_RATE_LIMITED, 2.0),
        (Fail(500, "boom"), MODEL_UNAVAILABLE, None),
        (Fail(503, "unavailable"), MODEL_UNAVAILABLE, None),
        (Fail(529, "Overloaded"), MODEL_OVERLOADED, None),
        (
            Fail(400, "This model's maximum context length is 8192 tokens"),
            MODEL_REJECTED,
            None,
        ),
        (Fail(401, "Incorrect API key provided"), MODEL_REJECTED, None),
        (Fail(404, "The model does not exist"), MODEL_REJECTED, None),
    ],
)
async def test_litellm_exceptions_map_to_model_error_codes(
    chat_server: ChatServer, step: Fail, code: str, retry_after: float | None
) -> None:
    chat_server.script = [step]
    with pytest.raises(ModelError) as raised:
        await over(chat_server).complete(USER, [])
    assert raised.value.code == code, raised.value
    assert raised.value.retry_after_s == retry_after
    assert step.message in raised.value.message


async def test_a_context_window_error_says_so(chat_server: ChatServer) -> None:
    chat_server.script = [Fail(400, "This model's maximum context length is 8192 tokens")]
    with pytest.raises(ModelError, match="longer than the context window"):
        await over(chat_server).complete(USER, [])


async def test_litellms_own_timeout_is_a_model_timeout(chat_server: ChatServer) -> None:
    chat_server.script = [Hang()]
    with pytest.raises(ModelError) as raised:
        await over(chat_server, timeout=0.3).complete(USER, [])
    assert raised.value.code == MODEL_TIMEOUT


async def test_claude_through_litellm_gets_its_thinking_blocks_back_unchanged(
    messages_server: MessagesServer,
) -> None:
    """LiteLLM's anthropic provider against the loopback Messages server, which refuses
    a changed or dropped thinking block: the blocks survive the log and LiteLLM."""
    messages_server.script = [
        Reply(thinking="North first.", tool_uses=(("toolu_1", "look", {"at": "n"}),)),
        Reply("Found it."),
    ]
    model = LiteLLMModel(
        "anthropic/claude-sonnet-4-5",
        api_base=messages_server.base_url,
        api_key="test-key",
        max_tokens=2048,
        thinking={"type": "enabled", "budget_tokens": 1024},
        num_retries=0,
    )
    harness = Harness(model)
    harness.tools.register(look)
    agent = harness.loop.create("claude")
    result = await agent.prompt("Find it.")
    assert result.reason == "completed", result.error
    block = {"type": "thinking", "thinking": "North first.", "signature": signature("North first.")}
    first = next(e for e in agent.session.events if isinstance(e, AssistantMessage))
    assert [dict(b) for b in first.thinking_blocks] == [block]
    sent = messages_server.requests[1]["messages"][1]["content"][0]
    assert sent == block


def test_on_trio_it_says_asyncio_only() -> None:
    model = LiteLLMModel("openai/m", api_base="http://127.0.0.1:9", api_key="k")

    async def main() -> None:
        await model.complete(USER, [])

    with pytest.raises(RuntimeError, match="asyncio only"):
        anyio.run(main, backend="trio")


def test_bad_arguments_are_refused_at_construction() -> None:
    with pytest.raises(ValueError, match="LiteLLM model name"):
        LiteLLMModel("")
    with pytest.raises(TypeError, match="sets messages itself"):
        LiteLLMModel("openai/m", messages=[])
    with pytest.raises(TypeError, match="on_delta"):
        LiteLLMModel("openai/m", on_delta=3)  # type: ignore[arg-type]


def test_a_missing_extra_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "litellm", None)  # as if not installed
    with pytest.raises(ImportError, match=r"pip install 'guardstack\[litellm\]'"):
        LiteLLMModel("openai/m")


@pytest.mark.parametrize(
    "body",
    ['{"id": "c", "choices": "not a list"}', "<html>not json</html>", '{"choices": [{}]}'],
)
async def test_a_200_reply_litellm_cannot_read_is_a_model_failure_not_retried(
    chat_server: ChatServer, body: str
) -> None:
    """LiteLLM raises its own 500 for a reply it cannot parse; the provider answered,
    so it is MODEL_FAILED (docs/models.md), and a model Retry does not send it again."""
    chat_server.script = [Raw(body), Raw(body), Raw(body)]
    harness = Harness(over(chat_server))
    harness.plugin(Retry(stage="model", attempts=3, backoff_ms=1))
    with no_backoff():
        result = await harness.loop.create("s").prompt("hi")
    assert result.reason == "error"
    assert result.error is not None
    assert MODEL_FAILED in result.error, result.error
    assert len(chat_server.requests) == 1


async def test_a_429_prints_nothing_litellms_chatter_goes_to_logging(
    chat_server: ChatServer, capfd: pytest.CaptureFixture[str]
) -> None:
    chat_server.script = [Fail(429, "Rate limit reached", {"retry-after": "2"})]
    with pytest.raises(ModelError):
        await over(chat_server).complete(USER, [])
    printed = capfd.readouterr()
    assert printed.out == ""
    assert "Give Feedback" not in printed.err
