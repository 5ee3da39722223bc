"""A full guarded stack against the same stack written by hand, with the same telemetry.

    python -m benchmarks.stack [--runs 3]

The stack: tracing (a span per call and per layer), metrics (a duration histogram
and a call counter), a retry (three attempts, on timeouts), and the tool's own
1-second budget — guardstack's ``Tracing``, ``Metrics``, ``Retry`` and
``ToolCallTimeoutPolicy`` on ``registry.execute``. The peers do the same work on
the success path, written the way a user would write them:

* **by hand** — a retry loop and an ``anyio.CancelScope``, four spans and two metric
  records made with the raw OpenTelemetry SDK, exactly the spans ours makes;
* **stamina** — the same, with ``stamina.retry_context`` as the retry loop;
* **tenacity** — the same, with ``tenacity.AsyncRetrying``.

Telemetry really processes its data: spans go through a ``BatchSpanProcessor`` to
an exporter (that drops them, so no I/O is timed) and metrics are aggregated and
collected by a ``PeriodicExportingMetricReader``. The garbage collector is on. Each
ratio is the median over ``--runs`` whole runs, with the range. "No telemetry"
drops tracing and metrics from both sides.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping, Sequence
from functools import partial
from typing import Any

import anyio
import stamina
import tenacity
from opentelemetry import context, trace
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import (
    MetricExporter,
    MetricExportResult,
    MetricsData,
    PeriodicExportingMetricReader,
)
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult
from opentelemetry.trace import Tracer

from benchmarks.timing import median, per_call_ns, ratio, run_and_report, table
from guardstack.guards import ToolCallTimeoutPolicy
from guardstack.pipeline import Harness, ToolCall, ToolDefinition
from guardstack.wrappers import Metrics, Retry, Tracing

stamina.instrumentation.set_on_retry_hooks([])  # no logging/prometheus hooks in the peer


class DiscardSpans(SpanExporter):
    """Receives every batch, keeps nothing: the processor's work is real, the I/O is not."""

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        return SpanExportResult.SUCCESS


class DiscardMetrics(MetricExporter):
    def export(
        self, metrics_data: MetricsData, timeout_millis: float = 10_000, **kwargs: Any
    ) -> MetricExportResult:
        return MetricExportResult.SUCCESS

    def force_flush(self, timeout_millis: float = 10_000) -> bool:
        return True

    def shutdown(self, timeout_millis: float = 30_000, **kwargs: Any) -> None:
        return None


class Telemetry:
    """An SDK tracer and meter provider that export (to nowhere) in the background."""

    def __init__(self) -> None:
        self.tracer_provider = TracerProvider()
        self.tracer_provider.add_span_processor(BatchSpanProcessor(DiscardSpans()))
        reader = PeriodicExportingMetricReader(DiscardMetrics(), export_interval_millis=1_000)
        self.meter_provider = MeterProvider(metric_readers=[reader])

    def shutdown(self) -> None:
        self.tracer_provider.shutdown()
        self.meter_provider.shutdown()


async def tool(arguments: Any = None, call: Any = None) -> str:
    return "ok"


TIMEOUT_RESULT = {"isError": True, "error": {"message": "tool call timed out after 1000ms"}}


class HandWritten:
    """The same stack by hand: what ours does on the success path, span for span."""

    def __init__(self, telemetry: Telemetry | None) -> None:
        self.tracer: Tracer | None = None
        if telemetry is not None:
            self.tracer = telemetry.tracer_provider.get_tracer("peer")
            meter = telemetry.meter_provider.get_meter("peer")
            self.histogram = meter.create_histogram("gen_ai.execute_tool.duration", unit="s")
            self.counter = meter.create_counter("guardstack.tool.calls")

    def span(self, name: str, index: int | None, call: ToolCall) -> Any:
        assert self.tracer is not None
        if index is None:
            attributes: dict[str, Any] = {
                "gen_ai.operation.name": "execute_tool",
                "gen_ai.tool.name": call.name,
                "gen_ai.tool.call.id": call.call_id,
            }
        else:
            attributes = {
                "guardstack.layer": name,
                "guardstack.layer.index": index,
                "guardstack.attempt": call.attempt,
                "gen_ai.tool.name": call.name,
            }
        span = self.tracer.start_span(name, attributes=attributes)
        return span, context.attach(trace.set_span_in_context(span))

    @staticmethod
    def end(opened: Any) -> None:
        span, token = opened
        context.detach(token)
        span.end()

    async def attempt(self, call: ToolCall) -> Any:
        """The timeout layer: the tool's budget, and whose deadline fired."""
        opened = self.span("tool-call-timeout-policy", 2, call) if self.tracer else None
        try:
            with anyio.CancelScope(deadline=anyio.current_time() + 1.0) as scope:
                result = await tool(call.arguments, call)
            return TIMEOUT_RESULT if scope.cancel_called else result
        finally:
            if opened is not None:
                self.end(opened)

    async def retry(self, call: ToolCall, attempts: Callable[[ToolCall], Awaitable[Any]]) -> Any:
        opened = self.span("retry", 1, call) if self.tracer else None
        try:
            return await attempts(call)
        finally:
            if opened is not None:
                self.end(opened)

    async def loop(self, call: ToolCall) -> Any:
        for attempt in range(1, 4):
            result = await self.attempt(call)
            if result is not TIMEOUT_RESULT or attempt == 3:
                return result
            await anyio.sleep(0.1 * 2 ** (attempt - 1))
        return None

    async def stamina_loop(self, call: ToolCall) -> Any:
        async for attempt in stamina.retry_context(on=TimeoutError, attempts=3):
            with attempt:
                result = await self.attempt(call)
                if result is TIMEOUT_RESULT:
                    raise TimeoutError
                return result
        return None

    async def tenacity_loop(self, call: ToolCall) -> Any:
        async for attempt in tenacity.AsyncRetrying(
            stop=tenacity.stop_after_attempt(3),
            wait=tenacity.wait_exponential_jitter(max=10),
            retry=tenacity.retry_if_exception_type(TimeoutError),
        ):
            with attempt:
                result = await self.attempt(call)
                if result is TIMEOUT_RESULT:
                    raise TimeoutError
                return result
        return None

    async def execute(self, call: ToolCall, loop: Callable[[ToolCall], Awaitable[Any]]) -> Any:
        if self.tracer is None:
            return await self.retry(call, loop)
        outer = self.span(f"execute_tool {call.name}", None, call)
        try:
            metrics_span = self.span("metrics", 0, call)
            started = anyio.current_time()
            try:
                return await self.retry(call, loop)
            finally:
                attributes = {"gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": "t"}
                self.histogram.record(anyio.current_time() - started, attributes)
                self.counter.add(1, attributes)
                self.end(metrics_span)
        finally:
            self.end(outer)


def ours(telemetry: Telemetry | None) -> Harness:
    harness = Harness()
    harness.tools.register(ToolDefinition("t", tool, timeout_ms=1_000))
    if telemetry is not None:
        harness.plugin(Tracing(telemetry.tracer_provider))
        harness.plugin(Metrics(telemetry.meter_provider))
    harness.plugin(Retry())
    harness.plugin(ToolCallTimeoutPolicy())
    return harness


async def measure() -> dict[str, float]:
    call = ToolCall("t", {"q": "x"}, "c1")
    telemetry = Telemetry()
    operations: dict[str, Callable[[], Awaitable[Any]]] = {}
    for label, used in (("telemetry", telemetry), ("no telemetry", None)):
        stack, peer = ours(used), HandWritten(used)
        operations[f"guardstack, {label}"] = partial(stack.tools.execute, call)
        operations[f"by hand, {label}"] = partial(peer.execute, call, peer.loop)
        operations[f"stamina, {label}"] = partial(peer.execute, call, peer.stamina_loop)
        operations[f"tenacity, {label}"] = partial(peer.execute, call, peer.tenacity_loop)
    try:
        return await per_call_ns(operations, calls=2_000, rounds=3)
    finally:
        telemetry.shutdown()


def _key(name: str) -> Callable[[Mapping[str, float]], float]:
    return lambda run: run[name]


def report(runs: list[dict[str, float]]) -> str:
    rows = []
    for label, goal in (("telemetry", "<= 1.05x"), ("no telemetry", "<= 1.25x")):
        ours_of = _key(f"guardstack, {label}")
        for peer in ("by hand", "stamina", "tenacity"):
            peer_of = _key(f"{peer}, {label}")
            rows.append(
                [
                    label,
                    peer,
                    f"{median(runs, ours_of):,.0f}",
                    f"{median(runs, peer_of):,.0f}",
                    ratio(runs, ours_of, peer_of),
                    goal if peer == "by hand" else "—",
                ]
            )
    return "\n".join(
        [
            table(
                ["telemetry", "peer", "ours ns/call", "peer ns/call", "ours / peer", "goal"], rows
            ),
            "",
            f"Median of {len(runs)} runs (range in brackets); GC on; spans through a "
            "BatchSpanProcessor, metrics through a PeriodicExportingMetricReader.",
        ]
    )


def main() -> None:
    run_and_report(__doc__, measure, report)


if __name__ == "__main__":
    main()
