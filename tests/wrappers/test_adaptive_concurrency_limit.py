"""AdaptiveConcurrencyLimit (virtual time, both backends): concurrency-limits' own
assertions ported, and properties over random load, overload and cancellation."""

from __future__ import annotations

import warnings
from typing import Any

import anyio
import attrs
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from guardstack.pipeline import (
    MODEL_RATE_LIMITED,
    TOOL_OVERLOADED,
    TOOL_RATE_LIMITED,
    ConfigError,
    Harness,
    MemoryStore,
    ModelError,
    ModelReply,
    ToolCall,
    ToolDefinition,
    ToolError,
    ToolResult,
)
from guardstack.wrappers import AdaptiveConcurrencyLimit, Retry
from guardstack.wrappers.adaptive_concurrency_limit import AIMD, ExpAvg, Gradient2

# -- the algorithms, as concurrency-limits tests them ------------------------------------


def test_exp_avg_warms_up_as_a_plain_mean_then_decays() -> None:
    # ExpAvgMeasurementTest.testWarmup
    average = ExpAvg(100, 10)
    expected = [10.0, 10.5, 11, 11.5, 12, 12.5, 13, 13.5, 14, 14.5]
    for index in range(10):
        assert average.add(index + 10) == pytest.approx(expected[index], abs=0.01)
    assert average.add(100) == pytest.approx(16.2, abs=0.1)


def test_aimd_starts_at_its_initial_limit_grows_on_success_and_falls_on_a_drop() -> None:
    # AIMDLimitTest.testDefault / increaseOnSuccess / decreaseOnDrops, with this
    # library's window (as many successes as the limit) and its halving
    limit = AIMD(10, 1, 64)
    assert limit.limit == 10
    for _ in range(10):
        limit.sample(0.001, 10, False)
    assert limit.limit == 11
    limit.sample(0.001, 10, True)
    assert limit.limit == 5


def test_aimd_does_not_grow_while_it_is_not_in_use() -> None:
    limit = AIMD(10, 1, 64)
    for _ in range(100):
        limit.sample(0.001, 4, False)  # 4 running of 10: application-limited
    assert limit.limit == 10


def test_gradient2_follows_latency_and_stays_within_its_bounds() -> None:
    limit = Gradient2(20, 5, 40)
    for _ in range(50):  # steady latency at full use: it probes upward by its queue size
        limit.sample(0.1, 20, False)
    grown = limit.limit
    assert 20 < grown <= 40
    for _ in range(30):  # latency triples: the gradient (long / short) falls to 0.5
        limit.sample(0.3, 40, False)
    assert limit.limit < grown
    for _ in range(200):
        limit.sample(10.0, 40, False)
    assert limit.limit >= 5
    held = limit.limit
    limit.sample(0.1, 1, False)  # application-limited: nothing learned
    assert limit.limit == held
    limit.sample(0.1, 40, True)  # an overload (not in the original): × 0.9, or under the refusal
    assert limit.limit == pytest.approx(max(5, min(held * 0.9, held - 1)))


def test_gradient2_takes_an_overload_as_a_drop_and_probes_past_it_slowly() -> None:
    """A hard-capped provider (429 at 5 in flight, latency flat): the limit falls to just
    under the refused concurrency and then grows one slot per window of successes, as
    AIMD probes — not by its queue size at once, which made every probe a 429."""
    limit = Gradient2(8, 1, 64)
    limit.sample(0.1, 5, True)  # refused with 5 in flight
    assert limit.limit == 4
    for _ in range(3):  # flat latency at full use: the original would be back at 6.4
        limit.sample(0.1, 4, False)
    assert limit.limit == 4
    limit.sample(0.1, 4, False)  # the fourth success at the ceiling: one slot more
    limit.sample(0.1, 4, False)
    assert limit.limit == 5
    limit.sample(0.1, 5, True)
    assert limit.limit == 4


# -- the layer ----------------------------------------------------------------------------


class Provider:
    """A tool with a capacity: past ``capacity`` running calls, a 429 with Retry-After."""

    def __init__(
        self,
        capacity: int,
        latency_s: float = 1.0,
        retry_after_s: float = 0.0,
        reject_s: float = 0.0,
    ) -> None:
        self.capacity, self.latency_s, self.retry_after_s = capacity, latency_s, retry_after_s
        self.reject_s = reject_s  # how long a 429 takes to come back
        self.running = 0
        self.most = 0
        self.limited = 0

    async def __call__(self, arguments: Any, call: ToolCall) -> Any:
        if self.running >= self.capacity:
            self.limited += 1
            await anyio.sleep(self.reject_s)
            error = ToolError(
                "slow down", "RateLimited", TOOL_RATE_LIMITED, retry_after_s=self.retry_after_s
            )
            return ToolResult("Error: slow down", True, error)
        self.running += 1
        self.most = max(self.most, self.running)
        try:
            await anyio.sleep(self.latency_s)
        finally:
            self.running -= 1
        return "ok"


def built(plugin: AdaptiveConcurrencyLimit, provider: Provider, *more: Any) -> Harness:
    harness = Harness()
    harness.tools.register(ToolDefinition("llm", provider))
    for extra in more:
        harness.plugin(extra)
    harness.plugin(plugin)
    return harness


async def burst(harness: Harness, count: int, start: int = 0) -> list[ToolResult]:
    return await burst_of(harness, "llm", count, start)


async def burst_of(harness: Harness, tool: str, count: int, start: int = 0) -> list[ToolResult]:
    results: list[ToolResult] = []

    async def one(index: int) -> None:
        outcome = await harness.tools.execute(ToolCall(tool, {}, str(index), conversation="x"))
        results.append(outcome.result)

    async with anyio.create_task_group() as group:
        for index in range(start, start + count):
            group.start_soon(one, index)
    return results


async def test_the_limit_climbs_without_overload_and_never_more_run_than_it() -> None:
    provider = Provider(capacity=1_000)
    plugin = AdaptiveConcurrencyLimit(initial=2, min=1, max=16)
    harness = built(plugin, provider)
    over: list[tuple[int, int]] = []

    async def watched(arguments: Any, call: ToolCall) -> Any:
        if provider.running + 1 > plugin.current():  # this call would be one too many
            over.append((provider.running + 1, plugin.current()))
        return await provider(arguments, call)

    harness.tools.register(ToolDefinition("watched", watched))
    seen: list[int] = []
    for round_number in range(30):
        await burst(harness, 32, round_number * 32)
        seen.append(plugin.current())
    assert seen == sorted(seen)  # only climbs
    assert seen[-1] == 16  # up to its max
    assert provider.most <= 16
    for index in range(64):  # the same limit in front of another tool: never exceeded
        await burst_of(harness, "watched", 32, index * 32)
    assert over == []


async def test_the_limit_falls_on_overload_and_a_storm_counts_once() -> None:
    provider = Provider(capacity=4, reject_s=0.02)
    plugin = AdaptiveConcurrencyLimit(initial=16, min=1, max=64)
    harness = built(plugin, provider)
    await burst(harness, 16)  # 12 of 16 admitted together, answered 429 together: one storm
    assert provider.limited == 12
    assert plugin.current() == 8  # halved once, not twelve times


async def test_a_retry_after_pauses_admissions() -> None:
    provider = Provider(capacity=1, latency_s=1.0, retry_after_s=5.0)
    plugin = AdaptiveConcurrencyLimit(initial=2, min=1, max=8)
    harness = built(plugin, provider)
    started = anyio.current_time()
    await burst(harness, 2)  # the second is a 429 saying "come back in 5 s"
    before = anyio.current_time()
    await harness.tools.execute(ToolCall("llm", {}, "later", conversation="x"))
    assert before - started == 1.0
    assert anyio.current_time() - started == 6.0  # waited out the Retry-After, then ran 1 s


async def test_a_bounded_queue_overflows_into_overloaded() -> None:
    provider = Provider(capacity=100, latency_s=10.0)
    plugin = AdaptiveConcurrencyLimit(initial=2, min=2, max=2, queue=1)  # pinned at 2
    results = await burst(built(plugin, provider), 5)
    codes = sorted(str(result.code) for result in results)
    assert codes.count(TOOL_OVERLOADED) == 2  # 2 running, 1 waiting, 2 refused
    assert "overloaded" in next(r for r in results if r.code == TOOL_OVERLOADED).content


async def test_on_the_model_stage_a_rate_limited_model_lowers_the_limit() -> None:
    calls = 0

    class Limited:
        async def complete(self, messages: Any, tools: Any) -> ModelReply:
            nonlocal calls
            calls += 1
            if calls % 2:
                raise ModelError("slow down", MODEL_RATE_LIMITED)
            return ModelReply("ok")

    plugin = AdaptiveConcurrencyLimit(stage="model", initial=8, min=1, max=8)
    harness = Harness(Limited())
    harness.plugin(Retry(stage="model", attempts=3, backoff_ms=0))
    harness.plugin(plugin)
    result = await harness.loop.create("s").prompt("go")
    assert result.reason == "completed"
    assert plugin.current() == 4


async def test_processes_sharing_a_store_admit_against_one_limit() -> None:
    store = MemoryStore()
    provider = Provider(capacity=3)
    first = AdaptiveConcurrencyLimit(initial=8, min=1, max=16, key="llm", store=store)
    second = AdaptiveConcurrencyLimit(initial=8, min=1, max=16, key="llm", store=store)
    a, b = built(first, provider), built(second, provider)
    await burst(a, 8)  # a learns the provider is smaller: 8 -> 4
    await burst(b, 1, 100)  # b reads the shared limit before it admits
    assert first.current() == second.current() == 4


def test_bad_configuration_names_the_key() -> None:
    with pytest.raises(ConfigError, match="initial"):
        AdaptiveConcurrencyLimit(initial=100, max=64)
    with pytest.raises(ConfigError, match=r"algorithm.*'aimd' or 'gradient2'"):
        AdaptiveConcurrencyLimit(algorithm="vegas")  # type: ignore[arg-type]
    harness = Harness()
    with pytest.raises(ConfigError, match="did you mean"):
        harness.load([{"name": "adaptive-concurrency-limit", "config": {"intial": 4}}])
    harness.load([{"name": "adaptive-concurrency-limit", "config": {"algorithm": "gradient2"}}])


# -- the properties -------------------------------------------------------------------------


@settings(max_examples=60)
@given(
    algorithm=st.sampled_from(["aimd", "gradient2"]),
    capacity=st.integers(1, 12),
    bounds=st.tuples(st.integers(1, 4), st.integers(4, 20)),
    latencies=st.lists(st.sampled_from([0.1, 0.5, 2.0]), min_size=1, max_size=8),
    cancel_at=st.lists(st.floats(0.05, 6.0), max_size=6),
    callers=st.integers(1, 24),
)
async def test_the_limit_stays_in_bounds_and_every_slot_comes_back(
    algorithm: str,
    capacity: int,
    bounds: tuple[int, int],
    latencies: list[float],
    cancel_at: list[float],
    callers: int,
) -> None:
    low, high = bounds
    provider = Provider(capacity=capacity, latency_s=latencies[0], retry_after_s=0.0)
    plugin = AdaptiveConcurrencyLimit(
        initial=low,
        min=low,
        max=high,
        algorithm=algorithm,  # type: ignore[arg-type]
    )
    harness = built(plugin, provider)
    seen: list[int] = []

    async def caller(index: int, scope: anyio.CancelScope) -> None:
        with scope:
            for n in range(6):
                provider.latency_s = latencies[(index + n) % len(latencies)]
                await harness.tools.execute(ToolCall("llm", {}, f"{index}-{n}", conversation="x"))
                seen.append(plugin.current())

    scopes = [anyio.CancelScope() for _ in range(callers)]
    async with anyio.create_task_group() as group:
        for index, scope in enumerate(scopes):
            group.start_soon(caller, index, scope)
        for at in sorted(cancel_at):  # cancel callers mid-call at random instants
            await anyio.sleep(at / len(cancel_at))
            scopes[int(at * 1000) % callers].cancel()
    assert all(low <= limit <= high for limit in seen)
    assert provider.most <= max(high, capacity)
    # every slot came back, cancelled or not: the whole limit runs at once again
    provider.capacity, provider.latency_s, provider.most = 1_000, 1.0, 0
    limit = plugin.current()
    await burst(harness, limit, 10_000)
    assert provider.most == limit


async def test_a_failure_that_is_no_overload_never_lowers_the_limit() -> None:
    """A tool that fails (TOOL_FAILED) says nothing about the provider's capacity."""

    async def broken(arguments: Any, call: ToolCall) -> Any:
        raise RuntimeError("a bug, not a busy provider")

    plugin = AdaptiveConcurrencyLimit(initial=8, min=1, max=16)
    harness = Harness()
    harness.tools.register(ToolDefinition("llm", broken))
    harness.plugin(plugin)
    results = await burst(harness, 8)
    assert {result.code for result in results} == {"TOOL_FAILED"}
    assert plugin.current() == 8


async def test_extra_on_adds_a_code_that_lowers_the_limit() -> None:
    """``extra_on=`` adds to the overload codes: a tool's own failure code now counts."""

    async def broken(arguments: Any, call: ToolCall) -> Any:
        raise RuntimeError("the provider's own way of saying busy")

    plugin = AdaptiveConcurrencyLimit(initial=8, min=1, max=16, extra_on=["TOOL_FAILED"])
    harness = Harness()
    harness.tools.register(ToolDefinition("llm", broken))
    harness.plugin(plugin)
    await burst(harness, 8)
    assert plugin.current() < 8


async def test_the_old_on_still_adds_with_a_deprecation_warning() -> None:
    """``on=`` added to the defaults here (it replaces them in every other layer): for one
    minor version it still adds, and says to write ``extra_on=``."""

    async def broken(arguments: Any, call: ToolCall) -> Any:
        raise RuntimeError("busy")

    with pytest.warns(DeprecationWarning, match="extra_on="):
        plugin = AdaptiveConcurrencyLimit(initial=8, min=1, max=16, on=["TOOL_FAILED"])
    assert plugin.extra_on == frozenset({"TOOL_FAILED"})
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a copy neither warns nor adds again
        assert attrs.evolve(plugin, initial=9).extra_on == frozenset({"TOOL_FAILED"})
    harness = Harness()
    harness.tools.register(ToolDefinition("llm", broken))
    harness.plugin(plugin)
    await burst(harness, 8)
    assert plugin.current() < 8


def test_extra_on_names_another_stages_code_as_a_mistake() -> None:
    with pytest.raises(ConfigError, match="extra_on"):
        AdaptiveConcurrencyLimit(extra_on=["MODEL_FAILED"])
    with pytest.raises(ConfigError, match="extra_on"):
        AdaptiveConcurrencyLimit(extra_on="")
