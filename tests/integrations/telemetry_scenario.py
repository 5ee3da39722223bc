"""One run that makes every resilience metric and event guardstack emits move: a tool
whose breaker opens, a retry storm, a queue at a concurrency limit, an adaptive limit,
a rate limit, a looping agent that is reminded, spend per tenant, a store that fails;
and a team's model proxy (a loopback upstream) whose budgets spend, run low and refuse.

Used by the dashboard test (every metric the dashboard reads is one this run exposes),
the Prometheus test (a real Prometheus scrapes it) and the telemetry guide's
screenshots (``python -m tests.integrations.telemetry_scenario PORT``).
"""

from __future__ import annotations

import sys
from collections.abc import Awaitable, Callable
from typing import Any

import anyio

from guardstack.guards import LoopDetector, RepeatToolReminder, ToolCallLimit, UsageLimit
from guardstack.pipeline import Harness, MemoryStore, ModelReply, ToolCall, ToolCallRequest, Usage
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


class _DownStore(MemoryStore):
    """A store that is down (as a Redis that went away)."""

    name = "redis"

    async def take(self, *args: Any, **kwargs: Any) -> float:
        raise ConnectionError("store unreachable")


def _call(name: str, n: int) -> ToolCall:
    return ToolCall(name, {"n": n}, f"{name}-{n}")


async def everything(
    meter_provider: Any,
    *,
    tracer_provider: Any = None,
    logger_provider: Any = None,
    hold_s: float = 0.0,
    rounds: int = 1,
    while_held: Callable[[], Awaitable[None]] | None = None,
) -> None:
    """Run the scenario ``rounds`` times; with ``hold_s``, keep calls queued at the
    concurrency limit that long at the end (a scrape then sees the queue), running
    ``while_held()`` meanwhile."""
    model = ScriptedModel(
        ([ModelReply(tool_calls=(ToolCallRequest("grep", {"q": "TODO"}),), usage=Usage(900, 100))]
         * 6 + [ModelReply("Done.", usage=Usage(1200, 40))]) * rounds
    )  # fmt: skip
    model.model = "gpt-test"
    # three harnesses on the same providers: a service's calls (breaker, retry, rate
    # limits), its limiters, and an agent (loop guards, spend)
    harness, limited, agentic = Harness(), Harness(), Harness(model, max_steps=20)
    for tool in (
        ScriptedTool("search", [Raise(ConnectionError("backend down"))] * 1000),
        ScriptedTool("flaky", [Raise(RuntimeError("x")), Reply("ok")] * 100),
        ScriptedTool("lookup", [Reply("found")] * 1000),
    ):
        tool.register(harness.tools)
    ScriptedTool("grep", [Reply("src/a.py:1: TODO")] * 1000).register(agentic.tools)
    for tool in (
        ScriptedTool("slow", [Reply("done", after_ms=500)] * 6 * rounds + [Hang()] * 10),
        ScriptedTool("api", [Reply("ok", after_ms=50)] * 1000),
    ):
        tool.register(limited.tools)
    for each in (harness, limited, agentic):
        if tracer_provider is not None:
            each.plugin(Tracing(tracer_provider, logger_provider=logger_provider))
        each.plugin(Metrics(meter_provider))
    agentic.plugin(Metrics(meter_provider, stage="model"))  # the GenAI client metrics
    harness.plugin(Retry(attempts=3, backoff_ms=20, retry_on=["TOOL_FAILED"], tools=["flaky"]))
    harness.plugin(CircuitBreaker(minimum_calls=4, failure_ratio=0.75, break_s=60))
    harness.plugin(RateLimit(per_second=50, burst=5))
    harness.plugin(
        RateLimit(per_second=10, store=_DownStore(on_error="open")), id="rate-limit-redis"
    )
    agentic.plugin(RepeatToolReminder())
    agentic.plugin(LoopDetector(identical=4, remind=1))
    agentic.plugin(UsageLimit(prices={"gpt-test": (2.5, 10.0)}, usd_per_session=100))
    # a new rule tried in shadow on real traffic: it would deny the agent's 5th call
    agentic.plugin(ToolCallLimit(per_turn=4, shadow=True))
    limited.plugin(ConcurrencyLimit(max_concurrent=1, queue=50))
    limited.plugin(AdaptiveConcurrencyLimit(initial=4, min=1, max=16))
    execute = harness.tools.execute

    async def run(request: ToolCall) -> None:
        await limited.tools.execute(request)

    # an operator pauses a tool for maintenance (an override in force while it runs)
    await harness.control.pause("lookup", reason="the index is being rebuilt")
    await harness.control.resume("lookup")
    await harness.control.set_limit("rate-limit", per_second=100)
    for round_ in range(rounds):
        for n in range(8):  # the breaker opens on the 4th failure, then refuses
            await execute(_call("search", n))
        for n in range(5):  # each call fails once before it works: a retry storm
            await execute(_call("flaky", n))
        async with anyio.create_task_group() as group:  # 6 calls, one slot: a queue
            for n in range(6):
                group.start_soon(run, _call("slow", n))
        async with anyio.create_task_group() as group:
            for n in range(20):
                group.start_soon(run, _call("api", n))
        tenant = "acme" if round_ % 2 == 0 else "globex"
        agent = agentic.loop.create(f"agent-{round_}", tenant=tenant)
        await agent.prompt("Find the TODOs")
        await execute(_call("lookup", round_))
    await _gateway(meter_provider)
    if hold_s:
        async with anyio.create_task_group() as group:
            for n in range(4):
                group.start_soon(run, ToolCall("slow", {"hold": n}, f"hold-{n}"))
            await anyio.sleep(0.1)  # one runs, three wait
            with anyio.move_on_after(hold_s):
                await (while_held() if while_held is not None else anyio.sleep(hold_s))
            group.cancel_scope.cancel()


def main() -> None:
    """Serve the scenario's metrics for Prometheus on ``PORT`` until stopped."""
    import time

    from opentelemetry.exporter.prometheus import PrometheusMetricReader
    from opentelemetry.sdk.metrics import MeterProvider
    from prometheus_client import start_http_server

    port = int(sys.argv[1])
    provider = MeterProvider(metric_readers=[PrometheusMetricReader()])
    start_http_server(port, addr="127.0.0.1")
    anyio.run(lambda: everything(provider, rounds=3))
    while True:
        time.sleep(1)


async def _gateway(meter_provider: Any) -> None:
    """A team's model proxy in front of a loopback upstream: requests spend in nested
    budgets (spend, what is left, the proxy's own time) until one is refused (a stop)."""
    import httpx

    from guardstack.gateway.model_proxy import ModelProxy
    from guardstack.gateway.tenants import tenants_of
    from tests.integrations.runaway import Runaway

    tenants = tenants_of({
        "keys": {"sk-acme-ci-0123456789abc": {"tenant": "acme", "team": "ci", "name": "ci"},
                 "sk-acme-al-0123456789abc": {"tenant": "acme", "team": "research"}},
        "tenants": {"acme": {"budget": {"usd_per_day": 1.0},
                             "teams": {"ci": {"budget": {"usd_per_day": 0.004}},
                                       "research": {}}}},
        "prices": {"gpt-test": [10, 30]},
    })  # fmt: skip
    harness = Harness()
    harness.plugin(Metrics(meter_provider, stage="model"))
    with Runaway(bound=0, usage=(5, 50)) as upstream:
        proxy = ModelProxy(harness, upstream.url, tenants=tenants, upstream_key="k")
        transport = httpx.ASGITransport(app=proxy.app)
        try:
            async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1") as c:
                for n in range(4):  # $0.00155 each: the third passes the team's day
                    await c.post(
                        "/v1/chat/completions",
                        json={"model": "gpt-test", "max_tokens": 50,
                              "messages": [{"role": "user", "content": f"build {n}"}]},
                        headers={"authorization": "Bearer sk-acme-ci-0123456789abc"},
                    )  # fmt: skip
                upstream.cut_after = 1  # a stream the upstream breaks off mid-answer
                await c.post(
                    "/v1/chat/completions",
                    json={"model": "gpt-test", "max_tokens": 50, "stream": True,
                          "messages": [{"role": "user", "content": "cut"}]},
                    headers={"authorization": "Bearer sk-acme-al-0123456789abc"},
                )  # fmt: skip
        finally:
            await proxy.aclose()


if __name__ == "__main__":
    main()
