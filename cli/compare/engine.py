"""The ``compare`` engine: every stack on the same seeded calls against the simulated
providers, each run in virtual time (trio's ``MockClock``)."""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import anyio
import attrs

from guardstack.cli.compare.scenario import (
    EXTRA,
    MAX_ATTEMPTS,
    REJECT_S,
    Attempt,
    Scenario,
    Tenant,
    ToolProfile,
    check_calls,
)
from guardstack.integrations._extras import require
from guardstack.pipeline.harness import Harness
from guardstack.pipeline.values import (
    TOOL_RATE_LIMITED,
    ToolCall,
    ToolDefinition,
    ToolError,
    ToolResult,
)
from guardstack.wrappers.retry import seeded_draws


@attrs.frozen
class StackStats:
    config: str
    success_rate: float
    p50_ms: float
    p95_ms: float
    p99_ms: float
    mean_attempts: float
    wasted_tool_s: float
    timeouts_by_code: Mapping[str, int]
    #: Every call's latency, sorted (for ``plot``; not part of ``to_dict``).
    latencies_ms: tuple[float, ...] = attrs.field(default=(), eq=False, repr=False)
    #: Successful calls per virtual second, over the whole run.
    goodput_per_s: float = 0.0
    #: How many ``TOOL_RATE_LIMITED`` answers the provider gave per successful call.
    rate_limited_per_success: float = 0.0
    #: ``(virtual second, value)`` of what ``compare(watch=…)`` read, every second.
    watched: tuple[tuple[float, float], ...] = attrs.field(default=(), eq=False, repr=False)
    #: When (virtual seconds into the run) each successful call was answered.
    success_times: tuple[float, ...] = attrs.field(default=(), eq=False, repr=False)
    #: Streams: the median time from a call's start to the first piece it saw (ms).
    first_byte_p50_ms: float | None = None
    #: Per tenant (``tenants:``): its calls, success rate, p50 and p99 latency.
    tenants: Mapping[str, Mapping[str, float]] = attrs.field(factory=dict)
    #: Per tenant, its calls' latencies, sorted (for ``plot``).
    tenant_latencies_ms: Mapping[str, tuple[float, ...]] = attrs.field(
        factory=dict, eq=False, repr=False
    )

    def to_dict(self) -> dict[str, Any]:
        data = attrs.asdict(self)
        for series in ("latencies_ms", "watched", "success_times", "tenant_latencies_ms"):
            del data[series]
        if self.first_byte_p50_ms is None:
            del data["first_byte_p50_ms"]  # only scenarios with streams
        if not self.tenants:
            del data["tenants"]  # only scenarios with tenants
        return data

    def goodput_between(self, start_s: float, end_s: float) -> float:
        """Successful calls per virtual second answered in ``[start_s, end_s)``."""
        done = sum(1 for at in self.success_times if start_s <= at < end_s)
        return done / (end_s - start_s)


@attrs.frozen
class _Plan:
    """Every call's tool and attempt draws, made on demand from the seed and the call's
    index, so each stack sees the same calls and nothing is held for calls not yet run."""

    scenario: Scenario
    seed: int
    calls: int

    def call(self, index: int) -> tuple[str, tuple[Attempt, ...], Tenant | None]:
        rng = random.Random(f"{self.seed}/{index}")
        scenario = self.scenario
        [tool] = rng.choices(scenario.tools, weights=scenario.weights)
        attempts = tuple(tool.draw(rng) for _ in range(MAX_ATTEMPTS))
        tenants = scenario.tenants
        if not tenants:
            return tool.name, attempts, None
        [tenant] = rng.choices(tenants, weights=[t.share for t in tenants])
        return tool.name, attempts, tenant


@attrs.define
class _Provider:
    """One simulated tool's provider: what is running now, and its token bucket."""

    profile: ToolProfile
    started: float
    running: int = 0
    tokens: float = 0.0
    refilled: float = 0.0

    def admit(self, now: float) -> float | None:
        """``None`` to run the call, else the Retry-After of a 429."""
        profile = self.profile
        factor = profile.capacity_factor(now - self.started)
        if profile.capacity_concurrent is not None:
            limit = max(1, math.floor(profile.capacity_concurrent * factor))
            if self.running >= limit:
                return 1.0
        if profile.capacity_per_second is not None:
            rate = profile.capacity_per_second * factor
            self.tokens = min(rate, self.tokens + (now - self.refilled) * rate)
            self.refilled = now
            if self.tokens < 1:
                return (1 - self.tokens) / rate
            self.tokens -= 1
        return None

    def stretch(self, now: float) -> float:
        """How much the load a call finds stretches its latency: ``1 + ρ²`` (≤ 2×)."""
        profile = self.profile
        if profile.capacity_concurrent is None or not profile.latency_grows:
            return 1.0
        limit = max(1, profile.capacity_concurrent * profile.capacity_factor(now - self.started))
        load = min(1.0, self.running / limit)
        return 1 + load * load


async def _run_stack(
    label: str,
    build: Callable[[], Harness],
    scenario: Scenario,
    plan: _Plan,
    advance: Callable[[], None],
    watch: Callable[[Harness], float] | None = None,
) -> StackStats:
    with seeded_draws(plan.seed):  # unseeded jitter and chaos: the same draws every run
        harness = build()
    runs: dict[int, list[tuple[float, float]]] = {}
    draws: dict[int, tuple[Attempt, ...]] = {}
    first_bytes: dict[int, float] = {}  # when each call saw its first piece (streams)
    began = anyio.current_time()
    providers = {tool.name: _Provider(tool, began, 0, 0.0, began) for tool in scenario.tools}
    for provider in providers.values():
        provider.tokens = provider.profile.capacity_per_second or 0.0
    limited = 0

    def simulated(profile: ToolProfile) -> Any:
        provider = providers[profile.name]

        async def execute(arguments: Mapping[str, Any], call: ToolCall) -> object:
            nonlocal limited
            index = int(call.call_id)
            attempt = draws[index][min(call.attempt, MAX_ATTEMPTS) - 1]
            kind, seconds = attempt.kind, attempt.seconds
            started = anyio.current_time()
            retry_after = provider.admit(started)
            if retry_after is not None:
                limited += 1
                await anyio.sleep(REJECT_S)
                error = ToolError(
                    "the provider is at capacity", "RateLimitedError", TOOL_RATE_LIMITED,
                    retry_after_s=retry_after,
                )  # fmt: skip
                return ToolResult(f"Error: {error.message}", True, error)
            stretch = provider.stretch(started)
            provider.running += 1
            try:
                if attempt.first_byte_s is None or profile.stream is None:
                    await anyio.sleep(seconds * stretch)
                else:
                    await streamed(index, attempt, stretch, profile.stream.chunk_ms / 1000, call)
            finally:
                provider.running -= 1
                runs.setdefault(index, []).append((started, anyio.current_time()))
            if kind == "fail":
                return ToolResult.failure("simulated failure", code=profile.failure_code)
            return "ok"

        return execute

    async def streamed(
        index: int, attempt: Attempt, stretch: float, chunk_s: float, call: ToolCall
    ) -> None:
        """A streamed answer: the first piece, then one every ``chunk_s``, reported as the
        tool's progress; a stall stops the pieces and hangs."""
        assert attempt.first_byte_s is not None
        seconds = attempt.seconds * stretch
        first = attempt.first_byte_s * stretch
        stall_at = math.inf if attempt.stall_at_s is None else attempt.stall_at_s * stretch
        if first >= stall_at or not math.isfinite(first):
            await anyio.sleep(math.inf)
        await anyio.sleep(first)
        call.progress()
        first_bytes.setdefault(index, anyio.current_time())
        elapsed = first
        while elapsed < seconds:
            step = min(chunk_s, seconds - elapsed)
            if elapsed + step > stall_at:
                await anyio.sleep(math.inf)
            await anyio.sleep(step)
            elapsed += step
            call.progress()

    for profile in scenario.tools:
        if harness.tools.get(profile.name) is None:
            harness.tools.register(
                ToolDefinition(
                    profile.name,
                    simulated(profile),
                    timeout_ms=profile.timeout_ms,
                    idempotent=profile.idempotent,
                )
            )
    latencies: list[float] = []
    totals = {"runs": 0, "successes": 0}
    wasted = 0.0
    timeouts: dict[str, int] = {}
    indices = iter(range(plan.calls))
    watched: list[tuple[float, float]] = []
    succeeded: list[float] = []

    by_tenant: dict[str, list[float]] = {}
    tenant_successes: dict[str, int] = {}
    until_first_byte: list[float] = []

    async def one(index: int) -> None:
        nonlocal wasted
        name, draws[index], tenant = plan.call(index)
        started = anyio.current_time()
        result = None
        with anyio.move_on_after(scenario.give_up_s):
            call = ToolCall(
                name,
                {},
                str(index),
                conversation=f"call-{index}",
                priority=tenant.priority if tenant is not None else None,
                tenant=tenant.name if tenant is not None else None,
            )
            result = (await harness.tools.execute(call)).result
        latencies.append(anyio.current_time() - started)
        first_byte = first_bytes.pop(index, None)
        if first_byte is not None:
            until_first_byte.append(first_byte - started)
        if tenant is not None:
            by_tenant.setdefault(tenant.name, []).append(anyio.current_time() - started)
            if result is not None and not result.is_error:
                tenant_successes[tenant.name] = tenant_successes.get(tenant.name, 0) + 1
        spent = [end - begin for begin, end in runs.get(index, [])]
        if result is not None and not result.is_error:
            totals["successes"] += 1
            succeeded.append(anyio.current_time() - began)
            spent = spent[:-1]  # the last run's answer was used
        wasted += sum(spent)
        totals["runs"] += len(runs.pop(index, ()))
        del draws[index]
        if (
            result is not None
            and result.error is not None
            and result.error.name == ("ToolTimeoutError")
        ):
            code = result.code or "?"
            timeouts[code] = timeouts.get(code, 0) + 1
        elif result is None:
            timeouts["caller gave up"] = timeouts.get("caller gave up", 0) + 1
        advance()

    async def caller() -> None:
        for index in indices:  # shared: each caller takes the next call when it is free
            await one(index)

    async def watcher(done: anyio.Event) -> None:
        assert watch is not None
        while not done.is_set():
            watched.append((anyio.current_time() - began, float(watch(harness))))
            with anyio.move_on_after(1.0):
                await done.wait()

    finished = anyio.Event()
    async with anyio.create_task_group() as group:
        if watch is not None:
            group.start_soon(watcher, finished)
        async with anyio.create_task_group() as callers:
            for _ in range(scenario.concurrency):
                callers.start_soon(caller)
        finished.set()
    duration = anyio.current_time() - began
    latencies.sort()
    count = len(latencies)

    def percentile(fraction: float) -> float:
        return latencies[min(count - 1, int(fraction * count))] * 1000

    successes = totals["successes"]
    until_first_byte.sort()
    tenants: dict[str, dict[str, float]] = {}
    tenant_latencies: dict[str, tuple[float, ...]] = {}
    for tenant in scenario.tenants:
        mine = sorted(by_tenant.get(tenant.name, []))
        if not mine:
            continue
        tenant_latencies[tenant.name] = tuple(latency * 1000 for latency in mine)
        tenants[tenant.name] = {
            "calls": len(mine),
            "success_rate": tenant_successes.get(tenant.name, 0) / len(mine),
            "p50_ms": mine[min(len(mine) - 1, len(mine) // 2)] * 1000,
            "p99_ms": mine[min(len(mine) - 1, int(0.99 * len(mine)))] * 1000,
        }
    return StackStats(
        label,
        successes / count,
        percentile(0.50),
        percentile(0.95),
        percentile(0.99),
        totals["runs"] / count,
        wasted,
        dict(sorted(timeouts.items())),
        tuple(latency * 1000 for latency in latencies),
        successes / duration if duration > 0 else 0.0,
        limited / successes if successes else float(limited),
        tuple(watched),
        tuple(succeeded),
        until_first_byte[len(until_first_byte) // 2] * 1000 if until_first_byte else None,
        tenants,
        tenant_latencies,
    )


def compare(
    stacks: Sequence[tuple[str, Callable[[], Harness]]],
    scenario: Scenario,
    *,
    seed: int = 0,
    calls: int | None = None,
    progress: bool = False,
    watch: Callable[[Harness], float] | None = None,
) -> list[StackStats]:
    """Run every stack on the same seeded calls, each in its own virtual-time trio run.

    ``watch(harness)``, if given, is read every virtual second of each run (an adaptive
    limit's ``current()``, say) into ``StackStats.watched``."""
    trio = require("trio", EXTRA)
    testing = require("trio.testing", EXTRA)
    total = scenario.calls if calls is None else check_calls(calls)
    plan = _Plan(scenario, seed, total)
    results = []
    bar: Any = None
    if progress:
        rich_progress = require("rich.progress", EXTRA)
        bar = rich_progress.Progress(transient=True)
        bar.start()
    try:
        for label, build in stacks:
            task = bar.add_task(label, total=total) if bar is not None else None

            def advance(task: Any = task) -> None:
                if bar is not None:
                    bar.advance(task)

            clock = testing.MockClock(autojump_threshold=0)
            results.append(
                trio.run(_run_stack, label, build, scenario, plan, advance, watch, clock=clock)
            )
    finally:
        if bar is not None:
            bar.stop()
    return results
