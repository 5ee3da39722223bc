"""Per-call cost of each resilience layer on the success path, against the nearest Python peer.

    python -m benchmarks.resilience

All on asyncio, in one run; the tool answers at once, which is where a layer's
overhead is paid on every call. "Added" is the cost on top of the bare call each
variant wraps: ours on top of an empty ``registry.execute``, a peer on top of
``await tool()``. GC on; each ratio is the median of ``--runs`` runs with the range.

* ``CircuitBreaker`` vs aiobreaker's ``CircuitBreaker.call_async`` (pybreaker's
  async path needs tornado, so aiobreaker is its asyncio port);
* ``RateLimit`` vs aiolimiter's ``AsyncLimiter`` and limits' asyncio moving-window
  limiter (rates high enough that nobody waits);
* ``ConcurrencyLimit`` vs ``asyncio.Semaphore``;
* ``Fallback``, ``Hedge`` and ``Chaos(rate=0)``: no peer does the same job, so
  against an empty pass-through layer (what the layer costs beyond being one).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

import aiobreaker
import aiolimiter
from limits import RateLimitItemPerSecond
from limits.aio.storage import MemoryStorage
from limits.aio.strategies import MovingWindowRateLimiter

from benchmarks.timing import median, per_call_ns, ratio, run_and_report, table
from guardstack.pipeline import Harness, ToolCall, ToolDefinition
from guardstack.wrappers import Chaos, CircuitBreaker, ConcurrencyLimit, Fallback, Hedge, RateLimit

FAST = 10**9  # calls per second: a rate nobody reaches


async def tool(arguments: Any = None, call: Any = None) -> str:
    return "ok"


async def passthrough(call: ToolCall, call_next: Callable[[ToolCall], Awaitable[Any]]) -> Any:
    return await call_next(call)


def harness(*plugins: Any, layers: int = 0) -> Harness:
    built = Harness()
    built.tools.register(ToolDefinition("t", tool))
    for plugin in plugins:
        built.plugin(plugin)
    for _ in range(layers):
        built.tools.dispatch.use(passthrough)
    return built


async def measure() -> dict[str, float]:
    call = ToolCall("t", {"q": "x"}, "c1")

    def execute(stack: Harness) -> Callable[[], Awaitable[Any]]:
        return lambda: stack.tools.execute(call)

    breaker = aiobreaker.CircuitBreaker(fail_max=5)
    limiter = aiolimiter.AsyncLimiter(FAST, 1)
    window = MovingWindowRateLimiter(MemoryStorage())
    item = RateLimitItemPerSecond(FAST)
    semaphore = asyncio.Semaphore(10)

    async def aiobreaker_call() -> Any:
        return await breaker.call_async(tool)

    async def aiolimiter_call() -> Any:
        async with limiter:
            return await tool()

    async def limits_call() -> Any:
        await window.hit(item, "t")
        return await tool()

    async def semaphore_call() -> Any:
        async with semaphore:
            return await tool()

    operations: dict[str, Callable[[], Awaitable[Any]]] = {
        "bare await": tool,
        "aiobreaker": aiobreaker_call,
        "aiolimiter": aiolimiter_call,
        "limits moving window": limits_call,
        "asyncio.Semaphore": semaphore_call,
        "execute, empty": execute(harness()),
        "execute + pass-through layer": execute(harness(layers=1)),
        "execute + CircuitBreaker": execute(harness(CircuitBreaker())),
        "execute + RateLimit": execute(harness(RateLimit(FAST, burst=FAST))),
        "execute + ConcurrencyLimit": execute(harness(ConcurrencyLimit(10))),
        "execute + Fallback": execute(harness(Fallback("t"))),
        "execute + Hedge": execute(harness(Hedge(delay_ms=1_000))),
        "execute + Chaos(rate=0)": execute(harness(Chaos(rate=0.0, fault="hang"))),
    }
    return await per_call_ns(operations, calls=3_000, rounds=5)


def report(runs: list[dict[str, float]]) -> str:
    def added(name: str, base: str) -> Callable[[Mapping[str, float]], float]:
        return lambda run: max(run[name] - run[base], 1.0)

    comparisons = [
        ("CircuitBreaker", "aiobreaker", "bare await"),
        ("RateLimit", "aiolimiter", "bare await"),
        ("RateLimit", "limits moving window", "bare await"),
        ("ConcurrencyLimit", "asyncio.Semaphore", "bare await"),
        ("Fallback", "execute + pass-through layer", "execute, empty"),
        ("Hedge", "execute + pass-through layer", "execute, empty"),
        ("Chaos(rate=0)", "execute + pass-through layer", "execute, empty"),
    ]
    rows = []
    for ours, peer, peer_base in comparisons:
        ours_added = added(f"execute + {ours}", "execute, empty")
        peer_added = added(peer, peer_base)
        shown = "a pass-through layer" if peer.startswith("execute") else peer
        rows.append(
            [
                ours,
                shown,
                f"{median(runs, ours_added):,.0f}",
                f"{median(runs, peer_added):,.0f}",
                ratio(runs, ours_added, peer_added),
            ]
        )
    bare = median(runs, lambda run: run["bare await"])
    empty = median(runs, lambda run: run["execute, empty"])
    return "\n".join(
        [
            table(["ours", "peer", "ours ns", "peer ns", "ours / peer"], rows),
            "",
            f"ns are added per-call costs (medians of {len(runs)} runs; ratio ranges in brackets).",
            f"Bare await {bare:,.0f} ns; empty registry.execute {empty:,.0f} ns.",
        ]
    )


def main() -> None:
    run_and_report(__doc__, measure, report)


if __name__ == "__main__":
    main()
