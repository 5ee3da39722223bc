"""Tracing: a span per call and per layer, nested in registration order."""

from __future__ import annotations

import json
from typing import Any

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.trace import SpanKind, StatusCode

from guardstack.guards import GENTLE_TEXT, RepeatToolReminder, ToolCallTimeoutPolicy
from guardstack.pipeline import (
    TOOL_TIMEOUT,
    Harness,
    ModelReply,
    ScriptedModel,
    ToolCall,
    ToolDefinition,
)
from guardstack.pipeline.testing import Hang, Raise, RecordingLayer, ScriptedTool
from guardstack.wrappers import CONTEXT_EVENT, Metrics, Retry, Timeout, Tracing
from tests.helpers import call, calls
from tests.wrappers.otel import SpanRig


def by_name(spans: list[ReadableSpan], name: str) -> list[ReadableSpan]:
    return [span for span in spans if span.name == name]


def parent_of(span: ReadableSpan, spans: list[ReadableSpan]) -> ReadableSpan | None:
    if span.parent is None:
        return None
    return next(s for s in spans if s.context.span_id == span.parent.span_id)


async def test_each_call_gets_an_execute_tool_span_with_genai_attributes() -> None:
    rig = SpanRig()
    harness = Harness()
    ScriptedTool("grep", ["found"], description="finds things").register(harness.tools)
    harness.plugin(Tracing(rig.provider))
    await harness.tools.execute(call("grep", call_id="call-42"))
    [span] = rig.spans
    assert span.name == "execute_tool grep"
    assert span.kind == SpanKind.INTERNAL
    assert dict(span.attributes or {}) == {
        "gen_ai.operation.name": "execute_tool",
        "gen_ai.tool.name": "grep",
        "gen_ai.tool.call.id": "call-42",
        "gen_ai.tool.type": "function",
        "gen_ai.tool.description": "finds things",
    }
    assert span.status.status_code == StatusCode.UNSET


async def test_layer_spans_nest_in_registration_order_under_the_call_span() -> None:
    rig = SpanRig()
    harness = Harness()
    ScriptedTool("grep").register(harness.tools)
    harness.plugin(Tracing(rig.provider))
    harness.plugin(Metrics())
    harness.plugin(Timeout(ms=1000))
    harness.tools.dispatch.use(RecordingLayer("innermost"))
    await harness.tools.execute(call("grep"))
    spans = rig.spans
    chain = []
    span: ReadableSpan | None = by_name(spans, "innermost")[0]
    while span is not None:
        chain.append(span)
        span = parent_of(span, spans)
    assert [s.name for s in chain] == ["innermost", "timeout", "metrics", "execute_tool grep"]
    assert [(s.attributes or {}).get("guardstack.layer.index") for s in chain[:3]] == [2, 1, 0]
    assert [(s.attributes or {}).get("guardstack.layer") for s in chain[:3]] == [
        "innermost",
        "timeout",
        "metrics",
    ]


async def test_an_error_result_marks_every_span_that_returned_it() -> None:
    rig = SpanRig()
    harness = Harness()
    ScriptedTool("hang", [Hang()], timeout_ms=100).register(harness.tools)
    harness.plugin(Tracing(rig.provider))
    harness.plugin(Metrics())
    harness.plugin(ToolCallTimeoutPolicy())
    harness.tools.dispatch.use(RecordingLayer("inside"))
    await harness.tools.execute(call("hang"))
    spans = {span.name: span for span in rig.spans}
    for name in ("execute_tool hang", "metrics", "tool-call-timeout-policy"):
        assert spans[name].status.status_code == StatusCode.ERROR, name
        assert (spans[name].attributes or {})["error.type"] == TOOL_TIMEOUT
    assert (spans["inside"].attributes or {})["error.type"] == "cancelled"


async def test_layers_inside_a_retry_show_one_span_per_attempt() -> None:
    rig = SpanRig()
    harness = Harness()
    ScriptedTool("hang", [Hang()]).register(harness.tools)
    harness.plugin(Tracing(rig.provider))
    harness.plugin(Retry(attempts=3, backoff_ms=0))
    harness.plugin(Timeout(ms=10))
    await harness.tools.execute(call("hang"))
    spans = rig.spans
    [retry] = by_name(spans, "retry")
    attempts = by_name(spans, "timeout")
    assert [(s.attributes or {})["guardstack.attempt"] for s in attempts] == [1, 2, 3]
    assert all(parent_of(s, spans) is retry for s in attempts)
    assert (retry.attributes or {})["guardstack.attempt"] == 1


async def test_reminders_appear_as_span_events() -> None:
    rig = SpanRig()
    harness = Harness(model=ScriptedModel([calls(("grep", {}))] * 3 + [ModelReply("ok")]))
    ScriptedTool("grep").register(harness.tools)
    harness.plugin(Tracing(rig.provider))
    harness.plugin(RepeatToolReminder())
    await harness.loop.create("a").prompt("go")
    spans = by_name(rig.spans, "execute_tool grep")
    contexts = [[e for e in span.events if e.name == CONTEXT_EVENT] for span in spans]
    assert [len(found) for found in contexts] == [0, 0, 1]
    event = contexts[2][0]
    assert event.name == CONTEXT_EVENT
    assert dict(event.attributes or {}) == {  # the text is content: not sent by default
        "gen_ai.tool.name": "grep",
        "gen_ai.tool.call.id": "call_1_3_0",
        "guardstack.context.source": "repeat-tool-reminder",
        "guardstack.context.chars": len(GENTLE_TEXT),
    }
    rig.clear()
    harness = Harness(model=ScriptedModel([calls(("grep", {}))] * 3 + [ModelReply("ok")]))
    ScriptedTool("grep").register(harness.tools)
    harness.plugin(Tracing(rig.provider, capture_content=True))
    harness.plugin(RepeatToolReminder())
    await harness.loop.create("a").prompt("go")
    [event] = [
        e for e in by_name(rig.spans, "execute_tool grep")[2].events if e.name == CONTEXT_EVENT
    ]
    assert dict(event.attributes or {})["guardstack.context.text"] == GENTLE_TEXT


async def test_the_tool_runs_inside_the_innermost_layer_span() -> None:
    rig = SpanRig()
    current: list[Any] = []

    async def look(arguments: Any, tool_call: ToolCall) -> str:
        current.append(trace.get_current_span().get_span_context().span_id)
        return "ok"

    harness = Harness()
    harness.tools.register(ToolDefinition("look", look))
    harness.plugin(Tracing(rig.provider))
    harness.plugin(Timeout(ms=1000))
    await harness.tools.execute(call("look"))
    assert current == [by_name(rig.spans, "timeout")[0].context.span_id]


async def test_with_tracing_off_no_span_is_made() -> None:
    started: list[str] = []

    class CountingTracer:
        def __init__(self, tracer: Any) -> None:
            self.tracer = tracer

        def start_span(self, name: str, **kwargs: Any) -> Any:
            started.append(name)
            return self.tracer.start_span(name, **kwargs)

    rig = SpanRig()
    tracing = Tracing(rig.provider)
    tracing.tracer = CountingTracer(tracing.tracer)  # type: ignore[assignment]
    harness = Harness()
    ScriptedTool("t").register(harness.tools)
    harness.plugin(Timeout(ms=1000))
    handle = harness.plugin(tracing)
    await harness.tools.execute(call("t"))
    assert started == ["execute_tool t", "timeout"]
    handle.dispose()
    await harness.tools.execute(call("t"))
    assert started == ["execute_tool t", "timeout"]
    assert len(rig.spans) == 2


async def test_layer_spans_can_be_turned_off_keeping_the_call_span() -> None:
    rig = SpanRig()
    harness = Harness()
    ScriptedTool("hang", [Hang()]).register(harness.tools)
    harness.plugin(Tracing(rig.provider, layer_spans=False))
    harness.plugin(Retry(attempts=2, backoff_ms=0))
    harness.plugin(Timeout(ms=10))
    await harness.tools.execute(call("hang"))
    [span] = rig.spans
    assert span.name == "execute_tool hang"
    assert (span.attributes or {})["error.type"] == TOOL_TIMEOUT


async def test_an_exception_whose_str_raises_is_blamed_on_its_own_layer_not_tracing() -> None:
    """Telemetry never changes an outcome."""

    class Unprintable(Exception):
        def __str__(self) -> str:
            raise RuntimeError("cannot print me")

    async def broken(tool_call: ToolCall, call_next: Any) -> Any:
        raise Unprintable

    rig = SpanRig()
    harness = Harness()
    ScriptedTool("grep").register(harness.tools)
    harness.plugin(Tracing(rig.provider))
    harness.tools.dispatch.use(broken, name="broken")
    outcome = await harness.tools.execute(call("grep"))
    assert outcome.result.content == (
        'Error: dispatch layer "broken" failed: <unprintable Unprintable>'
    )
    [layer_span] = by_name(rig.spans, "broken")
    assert dict(layer_span.attributes or {})["error.type"] == "Unprintable"


async def test_layer_spans_carry_no_genai_attributes_so_one_call_is_one_tool() -> None:
    rig = SpanRig()
    harness = Harness()
    ScriptedTool("grep").register(harness.tools)
    harness.plugin(Tracing(rig.provider))
    harness.plugin(Retry())
    harness.plugin(Timeout(ms=1000))
    await harness.tools.execute(call("grep"))
    tools = [s for s in rig.spans if "gen_ai.tool.name" in (s.attributes or {})]
    assert [s.name for s in tools] == ["execute_tool grep"]
    layers = [s for s in rig.spans if "guardstack.layer" in (s.attributes or {})]
    assert {(s.attributes or {}).get("guardstack.stage") for s in layers} == {"dispatch"}
    assert all(not key.startswith("gen_ai.") for s in layers for key in (s.attributes or {}))


async def test_a_tool_that_raised_leaves_an_exception_event() -> None:
    rig = SpanRig()
    harness = Harness()
    ScriptedTool("boom", [Raise(KeyError("missing"))]).register(harness.tools)
    harness.plugin(Tracing(rig.provider))
    outcome = await harness.tools.execute(call("boom"))
    assert outcome.result.code == "TOOL_FAILED"
    [span] = by_name(rig.spans, "execute_tool boom")
    [event] = [e for e in span.events if e.name == "exception"]
    attributes = dict(event.attributes or {})
    assert attributes["exception.type"] == "KeyError"
    assert "missing" in str(attributes["exception.message"])
    assert "KeyError" in str(attributes["exception.stacktrace"])


async def test_a_turn_is_one_trace_invoke_agent_over_chat_and_execute_tool() -> None:
    from guardstack.pipeline import ModelReply, ScriptedModel, ToolCallRequest, Usage

    rig = SpanRig()
    model = ScriptedModel(
        [
            ModelReply(tool_calls=(ToolCallRequest("grep", {}, "c1"),), usage=Usage(10, 2)),
            ModelReply("done", usage=Usage(20, 3), model="m-1", finish_reason="stop"),
        ]
    )
    harness = Harness(model)
    ScriptedTool("grep").register(harness.tools)
    harness.plugin(Tracing(rig.provider))
    await harness.loop.create("session-9").prompt("go")
    spans = rig.spans
    assert len({span.context.trace_id for span in spans}) == 1
    [turn] = [s for s in spans if s.parent is None]
    assert turn.name == "invoke_agent session-9"
    assert dict(turn.attributes or {}) == {
        "gen_ai.operation.name": "invoke_agent",
        "gen_ai.provider.name": "_OTHER",  # required on every GenAI span (#66)
        "gen_ai.agent.name": "session-9",
        "gen_ai.conversation.id": "session-9",
        "guardstack.turn.reason": "completed",
        "gen_ai.usage.input_tokens": 30,
        "gen_ai.usage.output_tokens": 5,
    }
    children = sorted(
        (s for s in spans if s.parent is not None and s.parent.span_id == turn.context.span_id),
        key=lambda s: s.start_time or 0,
    )
    assert [s.name for s in children] == ["chat", "execute_tool grep", "chat"]
    last = dict(children[2].attributes or {})
    assert last["gen_ai.response.model"] == "m-1"
    assert last["gen_ai.response.finish_reasons"] == ("stop",)
    assert children[0].kind == SpanKind.CLIENT


async def test_a_failed_model_call_leaves_a_chat_span_with_its_code_and_layer_spans() -> None:
    from guardstack.pipeline import MODEL_REJECTED, ModelError, ScriptedModel

    rig = SpanRig()
    harness = Harness(ScriptedModel([ModelError("context too long", MODEL_REJECTED)]))
    harness.plugin(Tracing(rig.provider))
    harness.plugin(Retry(stage="model"))
    result = await harness.loop.create("s").prompt("go")
    assert result.reason == "error"
    [chat] = by_name(rig.spans, "chat")
    assert (chat.attributes or {})["error.type"] == MODEL_REJECTED
    assert chat.status.status_code == StatusCode.ERROR
    assert [e.name for e in chat.events] == ["exception"]
    [retry] = by_name(rig.spans, "retry")
    assert retry.parent is not None
    assert retry.parent.span_id == chat.context.span_id
    assert (retry.attributes or {})["guardstack.stage"] == "model"
    [turn] = by_name(rig.spans, "invoke_agent s")
    assert turn.status.status_code == StatusCode.ERROR


async def test_content_is_captured_only_when_asked_and_cut_to_size(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from guardstack.pipeline import ModelReply, ScriptedModel, ToolCallRequest

    def run_with(tracing: Tracing) -> Any:
        model = ScriptedModel(
            [
                ModelReply(tool_calls=(ToolCallRequest("grep", {"q": "x" * 50}, "c1"),)),
                ModelReply("ok"),
            ]
        )
        harness = Harness(model)
        ScriptedTool("grep", ["found " * 20]).register(harness.tools)
        harness.plugin(tracing)
        return harness.loop.create("s").prompt("look")

    off = SpanRig()
    await run_with(Tracing(off.provider))
    assert not any(
        key.startswith(("gen_ai.tool.call.arguments", "gen_ai.input", "gen_ai.output"))
        for span in off.spans
        for key in (span.attributes or {})
    )
    on = SpanRig()
    monkeypatch.setenv("OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT", "true")
    await run_with(Tracing(on.provider, max_content_chars=40))
    [tool] = by_name(on.spans, "execute_tool grep")
    attributes = dict(tool.attributes or {})
    assert attributes["gen_ai.tool.call.arguments"] == '{"q": "' + "x" * 33 + "… (+19 chars)"
    assert str(attributes["gen_ai.tool.call.result"]).startswith("found found")
    assert attributes["input.value"] == attributes["gen_ai.tool.call.arguments"]
    first_chat, last_chat = by_name(on.spans, "chat")
    assert json.loads(str((first_chat.attributes or {})["gen_ai.input.messages"])) == [
        {"role": "user", "parts": [{"type": "text", "content": "look"}]}
    ]
    [asked] = json.loads(str((first_chat.attributes or {})["gen_ai.output.messages"]))
    assert asked["finish_reason"] == "tool_call"
    assert asked["parts"] == [
        {"type": "tool_call", "id": "c1", "name": "grep", "arguments": {"q": "x" * 50}}
    ]
    sent = json.loads(str((last_chat.attributes or {})["gen_ai.input.messages"]))
    assert [message["role"] for message in sent] == ["user", "assistant", "tool"]
    [response] = sent[2]["parts"]
    assert response["type"] == "tool_call_response"
    assert response["response"] == ("found " * 20)[:40] + "… (+80 chars)"  # the JSON stays whole
    assert json.loads(str((last_chat.attributes or {})["gen_ai.output.messages"])) == [
        {"role": "assistant", "parts": [{"type": "text", "content": "ok"}], "finish_reason": "stop"}
    ]


async def test_cap_decisions_are_span_events() -> None:
    from guardstack.guards import ModelCallLimit, ToolCallLimit
    from guardstack.pipeline import ModelReply, ScriptedModel, ToolCallRequest
    from guardstack.wrappers import BLOCKED_EVENT, DENIED_EVENT

    rig = SpanRig()
    replies = [ModelReply(tool_calls=(ToolCallRequest("grep", {"n": n}),)) for n in range(5)]
    harness = Harness(ScriptedModel(replies))
    ScriptedTool("grep").register(harness.tools)
    harness.plugin(Tracing(rig.provider))
    harness.plugin(ToolCallLimit(per_turn=1))
    harness.plugin(ModelCallLimit(per_turn=3))
    result = await harness.loop.create("s").prompt("go")
    assert result.reason == "blocked"
    denied = [e for s in rig.spans for e in s.events if e.name == DENIED_EVENT]
    assert len(denied) == 2  # the second and third calls
    assert str((denied[0].attributes or {})["guardstack.reason"]).startswith("tool call limit")
    [turn] = by_name(rig.spans, "invoke_agent s")
    [blocked] = [e for e in turn.events if e.name == BLOCKED_EVENT]
    assert "model-call-limit" in str((blocked.attributes or {})["guardstack.reason"])


async def test_the_invoke_agent_span_names_the_agents_provider() -> None:
    """Reported: ``gen_ai.provider.name`` was missing on ``invoke_agent`` (DESIGN: on
    every GenAI span and metric)."""
    from guardstack.pipeline import ModelReply, ScriptedModel

    class Provided(ScriptedModel):
        provider = "anthropic"

    rig = SpanRig()
    harness = Harness(Provided([ModelReply("hi")]))
    harness.plugin(Tracing(rig.provider))
    await harness.loop.create("s").prompt("go")
    [turn] = [s for s in rig.spans if s.parent is None]
    assert dict(turn.attributes or {})["gen_ai.provider.name"] == "anthropic"
