"""What a backend sees of the resilience layers: log-based events correlated with their
spans, and metrics for breaker, limiter, retry, reminder, loop, usage and store state —
read back through the SDK's in-memory reader and exporter."""

from __future__ import annotations

from typing import Any

import anyio
import pytest

from guardstack.guards import LoopDetector, RepeatToolReminder, UsageLimit
from guardstack.pipeline import (
    MODEL_UNAVAILABLE,
    GuardstackWarning,
    Harness,
    ModelError,
    ModelReply,
    Usage,
)
from guardstack.pipeline.signals import EVENTS, METRICS
from guardstack.pipeline.testing import Hang, Raise, Reply, ScriptedModel, ScriptedTool
from guardstack.wrappers import (
    AdaptiveConcurrencyLimit,
    CircuitBreaker,
    ConcurrencyLimit,
    Metrics,
    RateLimit,
    Retry,
    Tracing,
)
from tests.helpers import call, calls
from tests.wrappers.otel import LogRig, MetricRig, SpanRig


async def run(harness: Harness, request: Any) -> None:
    await harness.tools.execute(request)


class Rig:
    """A harness with Tracing (spans and log records) and Metrics, all in memory."""

    def __init__(self, model: Any = None, *, span_events: bool = True) -> None:
        self.spans, self.logs, self.meters = SpanRig(), LogRig(), MetricRig()
        self.harness = Harness(model)
        self.harness.plugin(
            Tracing(
                self.spans.provider,
                logger_provider=self.logs.provider,
                span_events=span_events,
            )
        )
        self.harness.plugin(Metrics(self.meters.provider))

    def gauge(self, name: str, **attributes: Any) -> list[float]:
        return [
            point.value
            for point in self.meters.points(name)
            if all(point.attributes.get(k) == v for k, v in attributes.items())
        ]


async def test_a_breaker_that_opens_shows_its_state_its_transitions_and_an_event() -> None:
    rig = Rig()
    tool = ScriptedTool("search", [Raise(RuntimeError("down"))] * 4 + [Reply("back")])
    tool.register(rig.harness.tools)
    rig.harness.plugin(CircuitBreaker(minimum_calls=4, failure_ratio=0.5, break_s=10))
    for _ in range(5):
        await rig.harness.tools.execute(call("search"))
    assert rig.gauge("guardstack.breaker.state", key="search") == [2.0]  # open
    assert rig.meters.total("guardstack.breaker.transitions", to="open") == 1
    [opened] = rig.logs.events("guardstack.breaker.state_change")
    assert dict(opened.attributes or {}) == {
        "guardstack.breaker.key": "search",
        "guardstack.breaker.from": "closed",
        "guardstack.breaker.to": "open",
        "guardstack.plugin": "circuit-breaker",
    }
    assert opened.severity_text == "WARN"
    # correlated: the record carries the span of the breaker layer, in the 4th call's trace
    fourth = [s for s in rig.spans.spans if s.name == "execute_tool search"][3]
    [layer] = [s for s in rig.spans.spans if s.context.span_id == opened.span_id]
    assert layer.name == "circuit-breaker"
    assert opened.trace_id == fourth.context.trace_id
    await anyio.sleep(10)  # the break passes: the next call probes, succeeds, closes it
    assert (await rig.harness.tools.execute(call("search"))).result.content == "back"
    assert rig.gauge("guardstack.breaker.state", key="search") == [0.0]
    moves = [dict(r.attributes or {})["guardstack.breaker.to"]
             for r in rig.logs.events("guardstack.breaker.state_change")]  # fmt: skip
    assert moves == ["open", "half_open", "closed"]


async def test_a_retry_storm_shows_as_attempts_per_operation() -> None:
    rig = Rig()
    tool = ScriptedTool("flaky", [Raise(RuntimeError("x"))] * 5 + [Reply("ok")] * 3)
    tool.register(rig.harness.tools)
    rig.harness.plugin(Retry(attempts=3, backoff_ms=10, retry_on=["TOOL_FAILED"]))
    for _ in range(3):
        await rig.harness.tools.execute(call("flaky"))
    [point] = rig.meters.points("guardstack.retry.attempts")
    assert (point.count, point.sum) == (2, 3 + 3)  # two storms of 3; the third worked at once
    assert point.attributes == {"key": "flaky", "guardstack.stage": "dispatch"}


async def test_a_limiter_queue_and_its_waits_are_visible() -> None:
    rig = Rig()
    ScriptedTool("slow", [Reply("done", after_ms=1000)] * 3).register(rig.harness.tools)
    rig.harness.plugin(ConcurrencyLimit(max_concurrent=1, queue=5))
    queued: list[float] = []
    async with anyio.create_task_group() as group:
        for _ in range(3):
            group.start_soon(run, rig.harness, call("slow"))
        await anyio.sleep(0.5)
        queued = rig.gauge("guardstack.limiter.queue", key="slow")
    assert queued == [2.0]  # one runs, two wait
    [waits] = rig.meters.points("guardstack.limiter.wait")
    assert waits.count == 2
    assert waits.sum == pytest.approx(1.0 + 2.0)
    assert rig.gauge("guardstack.limiter.queue", key="slow") == []  # no queue left


async def test_a_rate_limits_waiters_and_an_adaptive_limit_are_visible() -> None:
    rig = Rig()
    ScriptedTool("api", [Reply("ok")] * 4).register(rig.harness.tools)
    rig.harness.plugin(RateLimit(per_second=2, burst=1))
    rig.harness.plugin(AdaptiveConcurrencyLimit(initial=4, min=1, max=8))
    async with anyio.create_task_group() as group:
        for _ in range(4):
            group.start_soon(run, rig.harness, call("api"))
    [waits] = rig.meters.points("guardstack.limiter.wait")
    assert waits.count == 3
    assert waits.sum == pytest.approx(0.5 + 1.0 + 1.5)
    assert rig.gauge("guardstack.concurrency.limit", key="api") == [4.0]


async def test_reminders_and_loop_detections_are_counted_by_pattern() -> None:
    model = ScriptedModel([calls(("grep", {"q": "x"}))] * 6 + [ModelReply("ok")])
    rig = Rig(model)
    ScriptedTool("grep", [Reply("same")] * 6).register(rig.harness.tools)
    rig.harness.plugin(RepeatToolReminder())
    rig.harness.plugin(LoopDetector(identical=4, remind=1))
    await rig.harness.loop.create("a").prompt("go")
    assert rig.meters.total("guardstack.reminders", pattern="repeat") >= 1
    [first, *later] = rig.logs.events("guardstack.loop_detected")
    pattern = dict(first.attributes or {})["guardstack.loop.pattern"]
    assert pattern in ("identical", "no_progress")  # the same call, the same answer
    assert rig.meters.total("guardstack.loop.detections", pattern=pattern) == 1 + len(later)
    assert rig.meters.total("guardstack.reminders", pattern=pattern) == 1  # remind=1
    reminded = rig.logs.events("guardstack.context")
    assert reminded
    assert dict(reminded[0].attributes or {})["gen_ai.tool.name"] == "grep"


async def test_usage_and_spend_are_counted_per_tenant() -> None:
    model = ScriptedModel([ModelReply("hi", usage=Usage(1000, 500))] * 2)
    model.model = "m"
    rig = Rig(model)
    rig.harness.plugin(UsageLimit(prices={"m": (2.0, 8.0)}, usd_per_session=100))
    agent = rig.harness.loop.create("a", tenant="acme")
    await agent.prompt("one")
    await rig.harness.loop.create("b").prompt("two")
    tokens = rig.meters.total
    assert (
        tokens("guardstack.usage.tokens", tenant="acme", **{"gen_ai.token.type": "input"}) == 1000
    )
    assert tokens("guardstack.usage.tokens", tenant="default") == 1500
    # $2 per million input tokens, $8 per million output: $0.006 a call
    assert rig.meters.total("guardstack.usage.usd", tenant="acme") == pytest.approx(0.006)


async def test_a_failing_store_is_counted_and_logged() -> None:
    from tests.wrappers.test_corners import FailingStore

    rig = Rig()
    ScriptedTool("search", [Reply("ok")] * 2).register(rig.harness.tools)
    store = FailingStore(on_error="open")
    store.down = True
    rig.harness.plugin(CircuitBreaker(store=store))
    answers = []
    with pytest.warns(GuardstackWarning, match="store failed"):
        answers = [await rig.harness.tools.execute(call("search")) for _ in range(2)]
    assert [outcome.result.content for outcome in answers] == ["ok", "ok"]
    assert rig.meters.total("guardstack.store.errors", policy="open") == 2
    [first, _] = rig.logs.events("guardstack.store.error")
    assert dict(first.attributes or {})["guardstack.layer"] == "circuit-breaker"


async def test_a_failed_model_call_emits_the_genai_exception_event() -> None:
    rig = Rig(ScriptedModel([ModelError("busy", MODEL_UNAVAILABLE)]))
    await rig.harness.loop.create("a").prompt("hi")
    [failed] = rig.logs.events("gen_ai.client.operation.exception")
    assert failed.severity_text == "WARN"
    assert dict(failed.attributes or {})["error.type"] == MODEL_UNAVAILABLE
    [chat] = [s for s in rig.spans.spans if s.name.startswith("chat")]
    assert failed.span_id == chat.context.span_id


async def test_without_span_events_the_events_are_log_records_only() -> None:
    model = ScriptedModel([calls(("grep", {}))] * 3 + [ModelReply("ok")])
    rig = Rig(model, span_events=False)
    ScriptedTool("grep").register(rig.harness.tools)
    rig.harness.plugin(RepeatToolReminder())
    await rig.harness.loop.create("a").prompt("go")
    assert all(not span.events for span in rig.spans.spans)
    assert len(rig.logs.events("guardstack.context")) == 1


def test_every_metric_and_event_is_named_in_the_telemetry_guide() -> None:
    from pathlib import Path

    guide = (Path(__file__).parents[2] / "docs" / "telemetry.md").read_text("utf-8")
    missing = [name for name in [*METRICS, *EVENTS] if f"`{name}`" not in guide]
    assert not missing


async def test_a_hanging_tool_under_a_timeout_leaves_the_limiter_queue_empty() -> None:
    """Cancellation at the wrong instant must not leave a gauge reporting a ghost queue."""
    rig = Rig()
    ScriptedTool("hang", [Hang()] * 3, timeout_ms=100).register(rig.harness.tools)
    from guardstack.guards import ToolCallTimeoutPolicy

    rig.harness.plugin(ToolCallTimeoutPolicy())
    rig.harness.plugin(ConcurrencyLimit(max_concurrent=1, queue=5))
    async with anyio.create_task_group() as group:
        for _ in range(3):
            group.start_soon(run, rig.harness, call("hang"))
    assert rig.gauge("guardstack.limiter.queue", key="hang") == []


async def test_two_harnesses_on_one_meter_provider_both_report_their_gauges(
    caplog: pytest.LogCaptureFixture,
) -> None:
    meters = MetricRig()
    harnesses = []
    for name in ("one", "two"):
        harness = Harness()
        ScriptedTool(name, [Raise(RuntimeError("down"))] * 4).register(harness.tools)
        harness.plugin(Metrics(meters.provider))
        harness.plugin(CircuitBreaker(minimum_calls=2, failure_ratio=0.5))
        harnesses.append((name, harness))
    for name, harness in harnesses:
        for _ in range(3):
            await harness.tools.execute(call(name))
    states = {p.attributes["key"]: p.value for p in meters.points("guardstack.breaker.state")}
    assert states == {"one": 2.0, "two": 2.0}
    assert "created already" not in caplog.text  # each instrument made once per meter


async def test_a_hundred_thousand_failing_tools_keep_the_breaker_gauge_bounded(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import guardstack.wrappers.circuit_breaker as breaker_module
    from guardstack.pipeline import ToolDefinition

    monkeypatch.setattr(breaker_module, "_MAX_REPORTED", 1_000)  # the same rule, smaller
    meters = MetricRig()
    harness = Harness()

    async def down(arguments: Any, call: Any) -> str:
        raise RuntimeError("down")

    for n in range(100_000):
        harness.tools.register(ToolDefinition(f"t{n}", down))
    harness.loop.signals.bind(meters.provider)  # the state metrics alone, no per-call ones
    harness.plugin(CircuitBreaker(minimum_calls=1, failure_ratio=0.5))
    for n in range(100_000):
        await harness.tools.execute(call(f"t{n}"))
    points = meters.points("guardstack.breaker.state")
    assert len(points) == 1_000  # the latest thousand, not a series per tool
    assert {p.attributes["key"] for p in points} == {f"t{n}" for n in range(99_000, 100_000)}
    assert meters.total("guardstack.breaker.transitions", to="open") == 100_000


async def test_a_listener_or_a_gauge_that_raises_never_changes_the_call(
    caplog: pytest.LogCaptureFixture,
) -> None:
    meters = MetricRig()
    harness = Harness()
    ScriptedTool("search", [Raise(RuntimeError("down"))] * 3).register(harness.tools)
    harness.plugin(Metrics(meters.provider))
    harness.plugin(CircuitBreaker(minimum_calls=2, failure_ratio=0.5))

    def broken_sink(name: str, attributes: Any, severity: str) -> None:
        raise ValueError("a listener with a bug")

    def broken_gauge() -> Any:
        raise ValueError("a gauge with a bug")

    harness.loop.signals.listen(broken_sink)
    harness.loop.signals.gauge("guardstack.limiter.queue", broken_gauge)
    codes = [(await harness.tools.execute(call("search"))).result.code for _ in range(3)]
    assert codes == ["TOOL_FAILED", "TOOL_FAILED", "TOOL_UNAVAILABLE"]  # opened, as always
    states = [p.value for p in meters.points("guardstack.breaker.state")]
    assert states == [2.0]  # the other gauges still read
    assert "an event listener failed on guardstack.breaker.state_change" in caplog.text
    assert "could not read guardstack.limiter.queue" in caplog.text
