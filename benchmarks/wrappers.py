"""Per-call overhead of each wrapper against the peers a user would otherwise reach for.

    python -m benchmarks.wrappers

All on asyncio, in one run, success path (the tool answers at once), which is where
overhead is paid on every call:

* ``Timeout`` vs a bare ``anyio.CancelScope`` / ``anyio.fail_after`` and
  ``asyncio.timeout`` around the same call;
* ``Retry`` vs tenacity's ``AsyncRetrying`` and stamina's ``retry_context``;
* ``Tracing``, per layer, vs one raw OpenTelemetry SDK span with the same attributes;
* a full stack (tracing + metrics + retry + the timeout policy) vs the same stack
  assembled by hand from stamina + ``asyncio.timeout`` + raw OpenTelemetry.

"Added" is the cost on top of the bare call each variant wraps: ours on top of an
empty ``registry.execute``, a peer on top of ``await tool()``. Goals: Retry <= 0.1x
tenacity; Timeout <= 1.2x a bare cancel scope; tracing <= 1.2x a raw SDK span per
layer; full stack <= 0.5x the hand-assembled peer.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import anyio
import stamina
import tenacity
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.util.types import AttributeValue

from benchmarks.timing import per_call_ns, table
from guardstack.guards import ToolCallTimeoutPolicy
from guardstack.pipeline import Harness, ToolCall, ToolDefinition
from guardstack.wrappers import Metrics, Retry, Timeout, Tracing

stamina.instrumentation.set_on_retry_hooks([])  # no logging/prometheus hooks in the peer


async def tool(arguments: Any = None, call: Any = None) -> str:
    return "ok"


async def passthrough(call: ToolCall, call_next: Callable[[ToolCall], Awaitable[Any]]) -> Any:
    return await call_next(call)


def harness(*plugins: Any, layers: int = 0, timeout_ms: int | None = None) -> Harness:
    built = Harness()
    built.tools.register(ToolDefinition("t", tool, timeout_ms=timeout_ms))
    for plugin in plugins:
        built.plugin(plugin)
    for _ in range(layers):
        built.tools.dispatch.use(passthrough)
    return built


async def measure() -> dict[str, float]:
    call = ToolCall("t", {"q": "x"}, "c1")
    tracer_provider = TracerProvider()  # recording spans, no exporter: the cost of spans
    tracer = tracer_provider.get_tracer("peer")
    meter = MeterProvider().get_meter("peer")
    histogram = meter.create_histogram("gen_ai.execute_tool.duration", unit="s")
    counter = meter.create_counter("tool.calls")

    def execute(stack: Harness) -> Callable[[], Awaitable[Any]]:
        return lambda: stack.tools.execute(call)

    async def cancel_scope() -> Any:
        with anyio.CancelScope(deadline=anyio.current_time() + 1):
            return await tool()

    async def fail_after() -> Any:
        with anyio.fail_after(1):
            return await tool()

    async def asyncio_timeout() -> Any:
        async with asyncio.timeout(1):
            return await tool()

    async def tenacity_retry() -> Any:
        async for attempt in tenacity.AsyncRetrying(
            stop=tenacity.stop_after_attempt(3),
            wait=tenacity.wait_exponential_jitter(max=10),
            retry=tenacity.retry_if_exception_type(TimeoutError),
        ):
            with attempt:
                return await tool()
        return None

    async def stamina_retry() -> Any:
        async for attempt in stamina.retry_context(on=TimeoutError, attempts=3):
            with attempt:
                return await tool()
        return None

    attributes: dict[str, AttributeValue] = {
        "guardstack.layer": "x",
        "guardstack.layer.index": 0,
        "guardstack.attempt": 1,
        "gen_ai.tool.name": "t",
    }

    async def raw_span() -> Any:
        with tracer.start_as_current_span("x", attributes=attributes):
            return await tool()

    call_attributes: dict[str, AttributeValue] = {
        "gen_ai.operation.name": "execute_tool",
        "gen_ai.tool.name": "t",
        "gen_ai.tool.call.id": "c1",
    }

    def record(started: float) -> None:
        metric_attributes = {"gen_ai.tool.name": "t"}
        histogram.record(anyio.current_time() - started, metric_attributes)
        counter.add(1, metric_attributes)

    async def by_hand() -> Any:
        with tracer.start_as_current_span("execute_tool t", attributes=call_attributes):
            started = anyio.current_time()
            try:
                async for attempt in stamina.retry_context(on=TimeoutError, attempts=3):
                    with attempt:
                        async with asyncio.timeout(1.0):
                            return await tool()
            finally:
                record(started)
        return None

    async def by_hand_span_per_layer() -> Any:
        """The same stack by hand, with the same telemetry: a span per layer too."""
        with (
            tracer.start_as_current_span("execute_tool t", attributes=call_attributes),
            tracer.start_as_current_span("metrics", attributes=attributes),
        ):
            started = anyio.current_time()
            try:
                with tracer.start_as_current_span("retry", attributes=attributes):
                    async for attempt in stamina.retry_context(on=TimeoutError, attempts=3):
                        with (
                            attempt,
                            tracer.start_as_current_span("timeout", attributes=attributes),
                        ):
                            async with asyncio.timeout(1.0):
                                return await tool()
            finally:
                record(started)
        return None

    operations: dict[str, Callable[[], Awaitable[Any]]] = {
        "bare await": tool,
        "anyio.CancelScope": cancel_scope,
        "anyio.fail_after": fail_after,
        "asyncio.timeout": asyncio_timeout,
        "tenacity AsyncRetrying": tenacity_retry,
        "stamina retry_context": stamina_retry,
        "raw SDK span": raw_span,
        "hand-assembled stack": by_hand,
        "hand-assembled, span per layer": by_hand_span_per_layer,
        "execute, empty": execute(harness()),
        "execute + Timeout": execute(harness(Timeout(ms=1000))),
        "execute + Retry": execute(harness(Retry())),
        "execute + Tracing, 0 layers": execute(harness(Tracing(tracer_provider))),
        "execute + Tracing, 4 layers": execute(harness(Tracing(tracer_provider), layers=4)),
        "execute + full stack, call spans only": execute(
            harness(
                Tracing(tracer_provider, layer_spans=False),
                Metrics(MeterProvider()),
                Retry(),
                ToolCallTimeoutPolicy(),
                timeout_ms=1000,
            )
        ),
        "execute + full stack": execute(
            harness(
                Tracing(tracer_provider),
                Metrics(MeterProvider()),
                Retry(),
                ToolCallTimeoutPolicy(),
                timeout_ms=1000,
            )
        ),
    }
    return await per_call_ns(operations)


def report(ns: dict[str, float]) -> str:
    bare, empty = ns["bare await"], ns["execute, empty"]

    def added(name: str, base: float) -> float:
        return max(ns[name] - base, 1.0)

    rows = []

    def compare(ours: str, peer: str, goal: str, ours_added: float, peer_added: float) -> None:
        rows.append(
            [
                ours,
                peer,
                f"{ours_added:,.0f}",
                f"{peer_added:,.0f}",
                f"{ours_added / peer_added:.2f}x",
                goal,
            ]
        )

    timeout_added = added("execute + Timeout", empty)
    for peer in ("anyio.CancelScope", "anyio.fail_after", "asyncio.timeout"):
        compare(
            "Timeout",
            peer,
            "<= 1.2x" if peer == "anyio.CancelScope" else "—",
            timeout_added,
            added(peer, bare),
        )
    retry_added = added("execute + Retry", empty)
    compare(
        "Retry",
        "tenacity AsyncRetrying",
        "<= 0.1x",
        retry_added,
        added("tenacity AsyncRetrying", bare),
    )
    compare(
        "Retry", "stamina retry_context", "—", retry_added, added("stamina retry_context", bare)
    )
    per_layer_span = (ns["execute + Tracing, 4 layers"] - ns["execute + Tracing, 0 layers"]) / 4
    compare(
        "Tracing, per layer", "raw SDK span", "<= 1.2x", per_layer_span, added("raw SDK span", bare)
    )
    full = ns["execute + full stack"]
    compare("full stack", "by hand, one span", "<= 0.5x", full, ns["hand-assembled stack"])
    compare(
        "full stack", "by hand, span per layer", "—", full, ns["hand-assembled, span per layer"]
    )
    compare(
        "full stack, layer_spans=False",
        "by hand, one span",
        "<= 0.5x",
        ns["execute + full stack, call spans only"],
        ns["hand-assembled stack"],
    )
    return "\n".join(
        [
            table(["ours", "peer", "ours ns", "peer ns", "ours / peer", "goal"], rows),
            "",
            "ns are added per-call costs; the full-stack rows compare whole calls, registry",
            f"included. Bare await {bare:,.0f} ns; empty registry.execute {empty:,.0f} ns.",
        ]
    )


def main() -> None:
    print(report(anyio.run(measure)))


if __name__ == "__main__":
    main()
