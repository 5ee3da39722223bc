"""Telemetry you can trust: what operators watch never leaks content, never changes an
outcome, stays bounded, and names one tenant per call. Each reported defect has a test
that failed before its fix; then a property over random stacks: with content capture
off, nothing exported — spans, span events, log records, metric points — holds a tool's
arguments, its results or the model's messages."""

from __future__ import annotations

import json
from typing import Any

import anyio
import pytest
from hypothesis import given
from hypothesis import strategies as st

from guardstack.guards import (
    LoopDetector,
    ModelCallLimit,
    RepeatToolReminder,
    ToolCallLimit,
    UsageLimit,
)
from guardstack.pipeline import Harness, ModelReply, ScriptedModel, ToolCallRequest, Usage
from guardstack.wrappers import Metrics, Retry, Timeout, Tracing
from tests.wrappers.otel import LogRig, MetricRig, SpanRig

SECRET = "hunter2-0xC0FFEE"


def looping_agent(calls: int, secret: str = SECRET) -> tuple[Harness, ScriptedModel]:
    """An agent that makes the same call ``calls`` times, then answers; its arguments,
    its tool's result and its prompt all hold ``secret``."""
    replies = [
        ModelReply(tool_calls=(ToolCallRequest("lookup", {"q": secret}, f"c{n}"),))
        for n in range(calls)
    ]
    model = ScriptedModel([*replies, ModelReply(f"done {secret}", usage=Usage(5, 5))], model="m")
    harness = Harness(model)

    async def lookup(arguments: Any, call: Any) -> str:
        return f"found {arguments['q']}"

    from guardstack.pipeline import ToolDefinition

    harness.tools.register(ToolDefinition("lookup", lookup))
    return harness, model


def exported(spans: SpanRig, logs: LogRig, metrics: MetricRig) -> str:
    """Everything the rigs received, as one text."""
    parts: list[str] = []
    for span in spans.spans:
        parts.append(span.name)
        parts.append(json.dumps(dict(span.attributes or {}), default=str))
        parts.append(str(span.status.description))
        for event in span.events:
            parts.append(event.name)
            parts.append(json.dumps(dict(event.attributes or {}), default=str))
    for record in logs.events():
        parts.append(str(record.body))
        parts.append(json.dumps(dict(record.attributes or {}), default=str))
    data = metrics.reader.get_metrics_data()
    if data is not None:
        parts.append(data.to_json())
    return "\n".join(parts)


async def test_a_detailed_reminder_does_not_quote_arguments_when_capture_is_off() -> None:
    """Reported: the reminder's ``- arguments: {"q": "hunter2-0xC0FFEE"}`` was exported in a
    log record and a span event."""
    spans, logs = SpanRig(), LogRig()
    harness, _ = looping_agent(5)
    harness.plugin(Tracing(spans.provider, logger_provider=logs.provider))
    harness.plugin(RepeatToolReminder())
    agent = harness.loop.create("s")
    await agent.prompt(f"find {SECRET}")
    from guardstack.pipeline import UserMessage

    told = [e for e in agent.session.events if isinstance(e, UserMessage) and e.source.plugin]
    assert any(SECRET in e.text for e in told)  # the model is told
    contexts = logs.events("guardstack.context")
    assert contexts  # the event is still there, without its text
    assert all("guardstack.context.text" not in dict(r.attributes) for r in contexts)
    assert all(dict(r.attributes)["guardstack.context.chars"] > 0 for r in contexts)
    assert SECRET not in exported(spans, logs, MetricRig())


async def test_with_capture_on_the_reminder_text_is_exported() -> None:
    spans, logs = SpanRig(), LogRig()
    harness, _ = looping_agent(5)
    harness.plugin(Tracing(spans.provider, logger_provider=logs.provider, capture_content=True))
    harness.plugin(RepeatToolReminder())
    await harness.loop.create("s").prompt("go")
    texts = [dict(r.attributes).get("guardstack.context.text", "") for r in logs.events()]
    assert any(SECRET in str(text) for text in texts)


class Raising:
    """A span and log-record processor that raises on everything."""

    def on_start(self, span: Any, parent_context: Any = None) -> None:
        raise RuntimeError("a broken span processor")

    def on_end(self, span: Any) -> None:
        raise RuntimeError("a broken span processor")

    def on_emit(self, record: Any) -> None:
        raise RuntimeError("a broken log processor")

    emit = on_emit

    def shutdown(self) -> None:
        pass

    def force_flush(self, timeout_millis: int = 30_000) -> bool:
        return True


async def test_a_processor_that_raises_never_changes_an_outcome(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Reported: a span or log-record processor that raised made ``agent.prompt()`` raise."""
    monkeypatch.setattr("guardstack.wrappers._otel._REPORTED", set())  # warned once per run
    spans, logs = SpanRig(), LogRig()
    spans.provider.add_span_processor(Raising())  # type: ignore[arg-type]
    logs.provider.add_log_record_processor(Raising())  # type: ignore[arg-type]
    harness, _ = looping_agent(5)
    harness.plugin(Tracing(spans.provider, logger_provider=logs.provider))
    harness.plugin(RepeatToolReminder())
    harness.plugin(Retry(stage="model"))
    harness.plugin(Timeout(stage="model", ms=5_000))
    result = await harness.loop.create("s").prompt("go")
    assert result.reason == "completed"
    assert result.text == f"done {SECRET}"
    assert "telemetry: starting a span raised RuntimeError" in caplog.text
    assert "telemetry: emitting a log record raised RuntimeError" in caplog.text


async def test_the_adaptive_limits_state_and_gauge_stay_bounded() -> None:
    """Reported: a state and a gauge series per tool name, forever (15,000 for 15,000)."""
    from guardstack.pipeline import ToolCall, ToolDefinition
    from guardstack.wrappers import AdaptiveConcurrencyLimit

    async def answer(arguments: Any, call: Any) -> str:
        return "ok"

    metrics = MetricRig()
    harness = Harness()
    for n in range(15_000):
        harness.tools.register(ToolDefinition(f"t{n}", answer))
    harness.plugin(Metrics(metrics.provider))
    harness.plugin(AdaptiveConcurrencyLimit())
    for n in range(15_000):
        await harness.tools.execute(ToolCall(f"t{n}", {}, f"c{n}"))
    assert len(metrics.points("guardstack.concurrency.limit")) == 10_000


async def test_tokens_and_dollars_name_the_same_tenant() -> None:
    """Reported: with tenant="team-a", tokens were labelled ``default`` and dollars
    ``team-a``."""
    metrics = MetricRig()
    model = ScriptedModel([ModelReply("ok", usage=Usage(100, 50))], model="m")
    harness = Harness(model)
    harness.plugin(Metrics(metrics.provider))
    harness.plugin(UsageLimit(usd_per_day=10.0, prices={"m": (1.0, 1.0)}, tenant="team-a"))
    await harness.loop.create("s").prompt("hi")
    assert metrics.total("guardstack.usage.tokens", tenant="team-a") == 150
    assert metrics.total("guardstack.usage.tokens", tenant="default") == 0
    assert metrics.total("guardstack.usage.usd", tenant="team-a") == pytest.approx(0.00015)


guards = st.lists(
    st.sampled_from(
        [
            lambda: RepeatToolReminder(thresholds=(2, 3)),
            lambda: LoopDetector(identical=2, remind=1, deny=2),
            lambda: ToolCallLimit(per_turn=3),
            lambda: ModelCallLimit(per_turn=4),
            lambda: UsageLimit(tokens_per_turn=10_000),
            lambda: Retry(stage="model"),
            lambda: Timeout(ms=5_000),
        ]
    ),
    max_size=5,
)


@given(
    chosen=guards,
    calls=st.integers(1, 6),
    layer_spans=st.booleans(),
    span_events=st.booleans(),
    metrics_first=st.booleans(),
    secret=st.sampled_from([SECRET, "sk-live-0123456789", "pässwörd-✓"]),
)
async def test_with_capture_off_nothing_exported_holds_content(
    chosen: list[Any],
    calls: int,
    layer_spans: bool,
    span_events: bool,
    metrics_first: bool,
    secret: str,
) -> None:
    spans, logs, metrics = SpanRig(), LogRig(), MetricRig()
    harness, _ = looping_agent(calls, secret)
    telemetry: list[Any] = [
        Tracing(
            spans.provider,
            layer_spans,
            logger_provider=logs.provider,
            span_events=span_events,
            capture_content=False,
        ),
        Metrics(metrics.provider),
    ]
    for plugin in telemetry if metrics_first else telemetry[::-1]:
        harness.plugin(plugin)
    for make in chosen:
        harness.plugin(make())
    with anyio.fail_after(30):
        await harness.loop.create("s").prompt(f"look up {secret}")
    assert secret not in exported(spans, logs, metrics)
