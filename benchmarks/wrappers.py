"""Per-call overhead of each wrapper against the peers a user would otherwise reach for.

    python -m benchmarks.wrappers

All on asyncio, in one run, success path (the tool answers at once), which is where
overhead is paid on every call:

* ``Timeout`` vs a bare ``anyio.CancelScope`` / ``anyio.fail_after`` and
  ``asyncio.timeout`` around the same call;
* ``Retry`` vs tenacity's ``AsyncRetrying`` and stamina's ``retry_context``;
* ``Tracing``, per layer, vs one raw OpenTelemetry SDK span with the same attributes,
  both through the same ``BatchSpanProcessor``.

The whole stack against hand-written, stamina and tenacity peers with the same
telemetry is ``benchmarks/stack.py``. "Added" is the cost on top of the bare call
each variant wraps: ours on top of an empty ``registry.execute``, a peer on top of
``await tool()``. GC on; each ratio is the median of ``--runs`` runs with the range.
Goals: Retry <= 0.1x tenacity; Timeout <= 1.2x a bare cancel scope; tracing <=
1.2x a raw SDK span per layer.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

import anyio
import stamina
import tenacity
from opentelemetry.util.types import AttributeValue

from benchmarks.stack import Telemetry
from benchmarks.timing import median, per_call_ns, ratio, run_and_report, table
from guardstack.pipeline import Harness, ToolCall, ToolDefinition
from guardstack.wrappers import Retry, Timeout, Tracing

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
    telemetry = Telemetry()
    tracer_provider = telemetry.tracer_provider
    tracer = tracer_provider.get_tracer("peer")

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

    operations: dict[str, Callable[[], Awaitable[Any]]] = {
        "bare await": tool,
        "anyio.CancelScope": cancel_scope,
        "anyio.fail_after": fail_after,
        "asyncio.timeout": asyncio_timeout,
        "tenacity AsyncRetrying": tenacity_retry,
        "stamina retry_context": stamina_retry,
        "raw SDK span": raw_span,
        "execute, empty": execute(harness()),
        "execute + Timeout": execute(harness(Timeout(ms=1000))),
        "execute + Retry": execute(harness(Retry())),
        "execute + Tracing, 0 layers": execute(harness(Tracing(tracer_provider))),
        "execute + Tracing, 4 layers": execute(harness(Tracing(tracer_provider), layers=4)),
    }
    try:
        return await per_call_ns(operations, calls=5_000, rounds=5)
    finally:
        telemetry.shutdown()


def report(runs: list[dict[str, float]]) -> str:
    def added(name: str, base: str) -> Callable[[Mapping[str, float]], float]:
        return lambda run: max(run[name] - run[base], 1.0)

    def per_layer_span(run: Mapping[str, float]) -> float:
        return (run["execute + Tracing, 4 layers"] - run["execute + Tracing, 0 layers"]) / 4

    comparisons = [
        ("Timeout", added("execute + Timeout", "execute, empty"), "anyio.CancelScope", "<= 1.2x"),
        ("Timeout", added("execute + Timeout", "execute, empty"), "anyio.fail_after", "—"),
        ("Timeout", added("execute + Timeout", "execute, empty"), "asyncio.timeout", "—"),
        ("Retry", added("execute + Retry", "execute, empty"), "tenacity AsyncRetrying", "<= 0.1x"),
        ("Retry", added("execute + Retry", "execute, empty"), "stamina retry_context", "—"),
        ("Tracing, per layer", per_layer_span, "raw SDK span", "<= 1.2x"),
    ]
    rows = []
    for ours, ours_added, peer, goal in comparisons:
        peer_added = added(peer, "bare await")
        rows.append(
            [
                ours,
                peer,
                f"{median(runs, ours_added):,.0f}",
                f"{median(runs, peer_added):,.0f}",
                ratio(runs, ours_added, peer_added),
                goal,
            ]
        )
    bare = median(runs, lambda run: run["bare await"])
    empty = median(runs, lambda run: run["execute, empty"])
    return "\n".join(
        [
            table(["ours", "peer", "ours ns", "peer ns", "ours / peer", "goal"], rows),
            "",
            f"ns are added per-call costs (medians of {len(runs)} runs; ratio ranges in brackets).",
            f"Bare await {bare:,.0f} ns; empty registry.execute {empty:,.0f} ns.",
        ]
    )


def main() -> None:
    run_and_report(__doc__, measure, report)


if __name__ == "__main__":
    main()
