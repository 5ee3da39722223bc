"""UsageLimit's calendar windows: a tenant's day and month shared by every agent, spend
reserved before a call and settled after, one warning at ``warn_at``."""

from __future__ import annotations

import datetime
from typing import Any

import anyio
import pytest
from hypothesis import given
from hypothesis import strategies as st

from guardstack.guards import UsageLimit
from guardstack.pipeline import (
    GuardstackWarning,
    Harness,
    MemoryStore,
    ModelReply,
    ScriptedModel,
    Usage,
)
from guardstack.pipeline.contract import Window, store_key
from guardstack.pipeline.session import AssistantMessage

PRICES = {"m": (1.0, 2.0)}  # $ per million: input, output


class Clock:
    def __init__(self, when: str) -> None:
        self.now = datetime.datetime.fromisoformat(when).timestamp()

    def __call__(self) -> float:
        return self.now


class Priced:
    """A model that answers with the given usage, after ``delay_s``."""

    model = "m"
    max_tokens = 100

    def __init__(self, usage: Usage, delay_s: float = 0.0) -> None:
        self.usage = usage
        self.delay_s = delay_s
        self.calls = 0

    async def complete(self, messages: Any, tools: Any) -> ModelReply:
        self.calls += 1
        await anyio.sleep(self.delay_s)
        return ModelReply("ok", usage=self.usage, model="m")


def memory(harness: Harness) -> MemoryStore:
    assert isinstance(harness.store, MemoryStore)
    return harness.store


def harness(limit: UsageLimit, model: Any, clock: Clock) -> Harness:
    built = Harness(model, store=MemoryStore(wall_clock=clock))
    built.plugin(limit)
    return built


async def test_a_tenants_day_is_shared_by_every_agent_and_a_new_day_starts_afresh() -> None:
    clock = Clock("2026-12-01T23:00:00+00:00")
    model = Priced(Usage(100_000, 10_000))  # $0.10 + $0.02 = $0.12 a call
    built = harness(UsageLimit(usd_per_day=0.30, prices=PRICES, tenant="acme"), model, clock)
    reasons = [(await built.loop.create(f"s{n}").prompt("hi")).reason for n in range(4)]
    # the third call's reservation (its stated max_tokens) fit under $0.30; what it really
    # cost took the day to $0.36 — an estimate below the real cost is the overshoot
    assert reasons == ["completed", "completed", "completed", "blocked"]
    blocked = await built.loop.create("s9").prompt("hi")
    assert blocked.error is not None
    assert "tenant 'acme' has used $0.3600 this day and the limit is $0.3000 per day" in (
        blocked.error
    )
    clock.now += 3600  # past midnight UTC: a new day
    assert (await built.loop.create("s10").prompt("hi")).reason == "completed"


async def test_tenants_are_kept_apart_by_a_function_of_the_request() -> None:
    clock = Clock("2026-12-01T10:00:00+00:00")
    model = Priced(Usage(0, 50))
    limit = UsageLimit(
        tokens_per_day=250, tenant=lambda request: request.agent.session_id.split("/")[0]
    )
    built = harness(limit, model, clock)
    results = [
        (await built.loop.create(f"{tenant}/{n}").prompt("hi")).reason
        for n in range(3)
        for tenant in ("a", "b")
    ]
    # each call reserves 101 + ~1 input tokens; a tenant's second call settles at 50 each
    assert results.count("completed") == 6


async def test_concurrent_calls_overshoot_by_at_most_what_is_in_flight() -> None:
    clock = Clock("2026-12-01T10:00:00+00:00")
    model = Priced(Usage(1, 50), delay_s=1.0)  # each call costs less than it reserves
    limit = UsageLimit(usd_per_day=0.002, prices=PRICES)
    built = harness(limit, model, clock)
    results: list[str] = []

    async def one(n: int) -> None:
        results.append((await built.loop.create(f"s{n}").prompt("hi")).reason)

    async with anyio.create_task_group() as group:
        for n in range(20):
            group.start_soon(one, n)
    day = store_key("usage-limit", "tenant", "all", "usd", "day:2026-12-01")  # tenant "all"
    spent = await memory(built).balance(Window(day, "usd"))
    assert spent <= 0.002  # reservations are atomic: the day never passes its limit
    assert results.count("completed") == model.calls
    assert 1 <= model.calls < 20
    assert spent == pytest.approx(model.calls * (1 * 1 + 50 * 2) / 1e6)  # settled


async def test_one_warning_at_warn_at() -> None:
    clock = Clock("2026-12-01T10:00:00+00:00")
    model = Priced(Usage(100_000, 0))  # $0.10 a call
    built = harness(UsageLimit(usd_per_month=1.0, prices=PRICES, warn_at=0.25), model, clock)

    async def six_calls() -> None:
        for n in range(6):
            await built.loop.create(f"s{n}").prompt("hi")

    with pytest.warns(GuardstackWarning, match=r"used 0\.3 of its 1 usd this month") as caught:
        await six_calls()
    assert len([w for w in caught if "warning)" in str(w.message)]) == 1


def test_bad_window_config_names_the_key() -> None:
    from guardstack.pipeline import ConfigError

    with pytest.raises(ConfigError, match="warn_at"):
        UsageLimit(usd_per_day=1, prices=PRICES, warn_at=1.5)
    with pytest.raises(ConfigError, match="prices"):
        UsageLimit(usd_per_day=1)
    with pytest.raises(ConfigError, match="tenant"):
        UsageLimit(tokens_per_day=5, tenant="")


async def test_a_reply_naming_an_unpriced_model_is_charged_at_the_highest_price_and_said_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Reported: a model missing from ``prices`` raised after the upstream had answered
    (behind the proxy: a 500 or a cut stream for an answer already paid for). Now the
    answer is delivered, charged at the highest price (what it was reserved at), and
    the missing price is named once."""
    clock = Clock("2026-12-01T10:00:00+00:00")
    replies = [ModelReply("x", usage=Usage(1_000, 1_000), model="mystery")] * 2
    built = harness(
        UsageLimit(usd_per_day=1.0, prices={"cheap": (1, 1), "dear": (10, 100)}, tenant="t"),
        ScriptedModel(replies),
        clock,
    )
    with caplog.at_level("WARNING", logger="guardstack"):
        results = [await built.loop.create(f"s{n}").prompt("hi") for n in range(2)]
    assert [result.reason for result in results] == ["completed", "completed"]
    said = [
        r.getMessage() for r in caplog.records if "no price for model 'mystery'" in r.getMessage()
    ]
    assert len(said) == 1
    day = Window(store_key("usage-limit", "tenant", "t", "usd", "day:2026-12-01"), "usd")
    spent = await built.store.balance(day)  # type: ignore[attr-defined]
    assert spent == pytest.approx(2 * (1_000 * 10 + 1_000 * 100) / 1_000_000)


async def test_a_model_that_names_none_reserves_at_the_highest_price_and_settles_at_the_reply() -> (
    None
):
    clock = Clock("2026-12-01T10:00:00+00:00")
    prices = {"cheap": (1.0, 1.0), "dear": (10.0, 100.0)}
    cheap_reply = ModelReply("x", usage=Usage(1_000, 1_000), model="cheap")
    # 1,000 output tokens reserved at the dearest price: $0.10, over a $0.05 day
    tight = UsageLimit(usd_per_day=0.05, prices=prices, estimate_output_tokens=1_000)
    refused = await harness(tight, ScriptedModel([cheap_reply]), clock).loop.create("s").prompt(".")
    assert refused.reason == "blocked"
    assert "reservation of $0.1000 would pass it" in (refused.error or "")
    # room for the dearest estimate: the call runs and is settled at the reply's model
    roomy = UsageLimit(usd_per_day=1.0, prices=prices, estimate_output_tokens=1_000)
    built = harness(roomy, ScriptedModel([cheap_reply]), clock)
    assert (await built.loop.create("s").prompt("hi")).reason == "completed"
    day = store_key("usage-limit", "tenant", "all", "usd", "day:2026-12-01")
    assert await memory(built).balance(Window(day, "usd")) == pytest.approx(2_000 / 1e6)


async def test_a_scripted_model_names_the_model_its_replies_report() -> None:
    clock = Clock("2026-12-01T10:00:00+00:00")
    scripted = ScriptedModel([ModelReply("x", usage=Usage(1_000, 0))], model="cheap")
    built = harness(UsageLimit(usd_per_day=1.0, prices={"cheap": (1, 1)}), scripted, clock)
    agent = built.loop.create("s")
    assert (await agent.prompt("hi")).reason == "completed"
    [reply] = [e for e in agent.session.events if isinstance(e, AssistantMessage)]
    assert reply.model == "cheap"


# -- estimate: observed --------------------------------------------------------------------


class Varying:
    """A model stating a large ``max_tokens`` whose answers use the sizes given."""

    model = "m"
    max_tokens = 32_000

    def __init__(self, sizes: list[int], delay_s: float = 1.0) -> None:
        self.sizes = list(sizes)
        self.delay_s = delay_s

    async def complete(self, messages: Any, tools: Any) -> ModelReply:
        size = self.sizes.pop(0) if self.sizes else 10
        await anyio.sleep(self.delay_s)
        return ModelReply("ok", usage=Usage(0, size), model="m")


@given(
    warm=st.lists(st.integers(1, 500), min_size=3, max_size=25),
    burst=st.lists(st.integers(1, 32_000), min_size=1, max_size=12),
)
async def test_calls_at_once_pass_a_limit_by_at_most_the_stated_bound(
    warm: list[int], burst: list[int]
) -> None:
    """``estimate: observed``: answers that used ``warm`` tokens, then ``burst`` calls
    at once whose answers use up to ``max_tokens``. What the tenant's day holds never
    passes its limit by more than the sum of (``max_tokens`` - each call's estimate)
    tokens at the output price — the bound ``ObservedOutputs`` states."""
    clock = Clock("2026-12-01T10:00:00+00:00")
    limit_usd = 0.05
    model = Varying(warm + burst)
    built = harness(
        UsageLimit(usd_per_day=limit_usd, prices=PRICES, tenant="t", estimate="observed"),
        model,
        clock,
    )
    for number in range(len(warm)):
        await built.loop.create(f"warm{number}").prompt("hi")
    day = Window(store_key("usage-limit", "tenant", "t", "usd", "day:2026-12-01"), "usd")
    from guardstack.guards.usage_costs import ObservedOutputs

    estimator = ObservedOutputs()
    for size in warm:
        estimator.seen(("m", "t"), size)
    estimate = min(32_000, estimator.estimate(("m", "t")) or 32_000)
    async with anyio.create_task_group() as group:
        for number in range(len(burst)):
            group.start_soon(built.loop.create(f"burst{number}").prompt, "hi")
    spent = await memory(built).balance(day)
    bound = len(burst) * (32_000 - estimate) * PRICES["m"][1] / 1_000_000
    assert spent <= limit_usd + bound + 1e-9
