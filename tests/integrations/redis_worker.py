"""One worker process of the cross-process Redis tests: a harness whose layers keep
their state in one ``RedisStore``, driving calls and printing what happened as JSON
lines (``time.time()`` stamps: every worker shares the machine's clock).

    python -m tests.integrations.redis_worker MODE URL PREFIX SECONDS
"""

from __future__ import annotations

import json
import sys
import time
from typing import Any

import anyio

from guardstack.guards import UsageLimit
from guardstack.integrations.redis import RedisStore
from guardstack.pipeline import Harness, ModelReply, ToolCall, ToolDefinition, Usage
from guardstack.wrappers import CircuitBreaker, ConcurrencyLimit, RateLimit


def say(**event: Any) -> None:
    print(json.dumps({"t": time.time(), **event}), flush=True)


class Spender:
    """A model whose every call costs $0.0001 (100 output tokens at $1 a million) and
    states max_tokens=120, so it reserves a little more than it spends."""

    model = "m"
    max_tokens = 120

    async def complete(self, messages: Any, tools: Any) -> ModelReply:
        await anyio.sleep(0.02)
        say(event="spent", usd=0.0001)
        return ModelReply("ok", usage=Usage(0, 100), model="m")


async def spend(store: RedisStore, seconds: float) -> None:
    harness = Harness(Spender(), store=store)
    harness.plugin(UsageLimit(usd_per_day=0.005, prices={"m": (1.0, 1.0)}, tenant="shared"))
    deadline = time.monotonic() + seconds

    async def agent(n: int) -> None:
        while time.monotonic() < deadline:
            result = await harness.loop.create(f"{id(harness)}-{n}-{time.monotonic()}").prompt("go")
            say(event="turn", reason=result.reason)
            if result.reason == "blocked":
                return

    async with anyio.create_task_group() as group:
        for n in range(5):
            group.start_soon(agent, n)


async def session(store: RedisStore, seconds: float) -> None:
    """Four processes on one session, each with parallel agents of its own on it: the
    session's $0.005 is reserved call by call, so together they never pass it."""
    harness = Harness(Spender(), store=store)
    harness.plugin(UsageLimit(usd_per_session=0.005, prices={"m": (1.0, 1.0)}))
    deadline = time.monotonic() + seconds

    async def agent(n: int) -> None:
        one = harness.loop.create("the-session")
        while time.monotonic() < deadline:
            result = await one.prompt("go")
            say(event="turn", reason=result.reason)
            if result.reason == "blocked":
                return

    async with anyio.create_task_group() as group:
        for n in range(3):
            group.start_soon(agent, n)


async def barrier(url: str, name: str, count: int) -> None:
    """Wait until ``count`` processes have arrived (a counter on the same server), so
    every process starts its calls within a few milliseconds of the others, however
    long each took to start."""
    import redis.asyncio

    client = redis.asyncio.Redis.from_url(url)
    try:
        await client.incr(name)
        while int(await client.get(name) or 0) < count:  # noqa: ASYNC110 (another process)
            await anyio.sleep(0.005)
    finally:
        await client.aclose()


async def storm(store: RedisStore, url: str, prefix: str, processes: int) -> None:
    """One 429 storm seen by every process at once: four calls each, so the four
    processes' sixteen fill the shared limit of 16 and are all admitted before any
    answers (every process past the barrier first), all overloaded. (More calls would
    wait for slots, be admitted after the decrease, and fail again: a second storm.)"""
    from guardstack.pipeline import TOOL_RATE_LIMITED, ToolError, ToolResult
    from guardstack.wrappers import AdaptiveConcurrencyLimit

    async def provider(arguments: Any, call: ToolCall) -> Any:
        await anyio.sleep(1.0)  # every process's calls are in flight before any answers
        return ToolResult("Error: slow down", True, ToolError("slow", "R", TOOL_RATE_LIMITED))

    harness = Harness(store=store)
    harness.tools.register(ToolDefinition("llm", provider))
    limit = AdaptiveConcurrencyLimit(initial=16, min=2, max=32, key="llm")
    harness.plugin(limit)

    async def one(call: ToolCall) -> None:
        await harness.tools.execute(call)

    await barrier(url, f"{prefix}barrier", processes)
    async with anyio.create_task_group() as group:
        for n in range(4):
            group.start_soon(one, ToolCall("llm", {}, f"c{n}", conversation="x"))
    say(event="limit", value=limit.current())


async def main(mode: str, url: str, prefix: str, seconds: float) -> None:
    store = RedisStore(url, prefix=prefix, timeout_ms=1000, lease_ms=600)
    if mode in ("spend", "session", "storm"):
        say(event="ready")
        if mode == "storm":
            await storm(store, url, prefix, int(seconds))
        else:
            await {"spend": spend, "session": session}[mode](store, seconds)
        await store.aclose()
        return
    harness = Harness(store=store)

    async def work(arguments: Any, call: ToolCall) -> str:
        say(event="start")
        if mode == "breaker":
            raise RuntimeError("the backend is down")
        await anyio.sleep(float(arguments.get("hold", 0.0)))
        say(event="end")
        return "ok"

    harness.tools.register(ToolDefinition("work", work))
    harness.control.refresh_s = 0.05  # an override made elsewhere holds here within this
    if mode == "rate":
        harness.plugin(RateLimit(per_second=20, burst=5))
    elif mode in ("slots", "hold"):
        harness.plugin(ConcurrencyLimit(3, queue=100, queue_timeout_ms=10_000))
    elif mode == "breaker":
        harness.plugin(CircuitBreaker(minimum_calls=3, failure_ratio=1.0, break_s=1.0))
    hold = {"slots": 0.03, "hold": 3600.0}.get(mode, 0.0)
    pause = {"control": 0.05}.get(mode, 0.0)
    deadline = time.monotonic() + seconds
    say(event="ready")

    async def caller(n: int) -> None:
        while time.monotonic() < deadline:
            call = ToolCall("work", {"hold": hold}, f"c{n}", conversation="shared")
            outcome = await harness.tools.execute(call)
            say(event="result", code=outcome.result.code)
            if mode == "breaker" or pause:
                await anyio.sleep(0.05)

    async with anyio.create_task_group() as group:
        for n in range(3 if mode in ("slots", "hold") else 1):
            group.start_soon(caller, n)
    await store.aclose()


if __name__ == "__main__":
    mode, url, prefix, seconds = sys.argv[1:5]
    anyio.run(main, mode, url, prefix, float(seconds))
