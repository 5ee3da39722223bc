"""The admission line (``wrappers/_line.py``): priority first, then first come first served
or fair shares — on the line alone, and through every admission layer in virtual time.

Properties, over random arrivals, priorities, tenants and hold times:

* no call of a higher priority waits while one of a lower priority is admitted (same
  key) — ``ConcurrencyLimit``, ``AdaptiveConcurrencyLimit`` (pinned) and ``RateLimit``;
* with ``fair=`` no waiting tenant sees another admitted more than its share between
  two of its own admissions (one round per other tenant at equal weights);
* FIFO within a priority when not fair.
"""

from __future__ import annotations

import itertools
import math
from typing import Any

import anyio
import attrs
import pytest
from hypothesis import given
from hypothesis import strategies as st

from guardstack.pipeline import ConfigError, Harness, ToolCall, ToolDefinition
from guardstack.wrappers import (
    AdaptiveConcurrencyLimit,
    ConcurrencyLimit,
    RateLimit,
    TokenRateLimit,
)
from guardstack.wrappers._line import WaitLine


def test_the_head_is_the_highest_priority_first_come() -> None:
    line = WaitLine()
    low = line.join(0, "a")
    high = line.join(5, "b")
    later_high = line.join(5, "a")
    assert line.head() is high
    assert line.leave(high)
    assert line.head() is later_high
    assert not line.leave(low)
    assert line.head() is later_high
    assert line.leave(later_high)
    assert line.head() is None
    assert len(line) == 0


def test_a_fair_line_takes_tenants_in_turns() -> None:
    line = WaitLine({})
    batch = [line.join(0, "batch") for _ in range(5)]
    person = line.join(0, "person")
    order = []
    while len(line):
        head = line.head()
        assert head is not None
        order.append(head.tenant)
        line.admitted(head)
        line.leave(head)
    assert order[:3] == ["batch", "person", "batch"]  # the person waits one turn at most
    assert batch[0].tenant == "batch"
    assert person.tenant == "person"


def test_weights_give_shares() -> None:
    line = WaitLine({"gold": 3.0})
    for _ in range(8):
        line.join(0, "gold")
        line.join(0, "free")
    order = []
    for _ in range(8):
        head = line.head()
        assert head is not None
        order.append(head.tenant)
        line.admitted(head)
        line.leave(head)
    assert order.count("gold") == 6  # three turns to one
    assert order.count("free") == 2


def test_a_tenant_joining_at_another_priority_wakes_the_head_it_makes() -> None:
    """A tenant that starts waiting is put level with the least served — its count is
    one per tenant, across priorities, so its waiter at the top priority can fall behind
    another tenant's there. That other waiter is the head now and is woken: before, it
    slept on while the old head waited for it, and a fair rate limit served nobody
    (found by the random-arrivals property below on trio, 41 runs in 200)."""
    line = WaitLine({"a": 2.0})
    b1, b2 = line.join(3, "b"), line.join(3, "b")
    a1, a2 = line.join(3, "a"), line.join(3, "a")
    for served in (b1, a1):  # b served 1, then a 0.5 (and more recently)
        assert line.head() is served
        line.admitted(served)
        line.leave(served)
    assert line.head() is a2
    b2.event = anyio.Event()  # b2 waits to be told it is the head
    line.join(0, "a")  # a starts waiting at priority 0: level with b, so b2 is the head
    assert line.head() is b2
    assert b2.event.is_set()


def test_a_tenant_that_was_idle_gets_no_burst() -> None:
    line = WaitLine({})
    for _ in range(10):  # "a" alone for a while: served 10
        waiter = line.join(0, "a")
        line.admitted(waiter)
        line.leave(waiter)
    for _ in range(3):
        line.join(0, "a")
    for _ in range(3):
        line.join(0, "b")
    order = []
    while len(line):
        head = line.head()
        assert head is not None
        order.append(head.tenant)
        line.admitted(head)
        line.leave(head)
    # b starts level with a, not ten turns ahead: they alternate
    assert order in (["a", "b"] * 3, ["b", "a"] * 3)


@pytest.mark.parametrize(
    "fair", [{"a": 0}, {"a": -1.0}, {"": 1}, {"a": math.inf}, "yes", 3, {"a": True}]
)
def test_bad_fairness_fails_loud(fair: Any) -> None:
    with pytest.raises(ConfigError) as raised:
        ConcurrencyLimit(1, fair=fair)
    assert str(raised.value.key).startswith("fair")


# -- through the layers, in virtual time ---------------------------------------------


@attrs.frozen
class Arrival:
    at_ms: int  # a multiple of 10, plus 3: never the instant a slot or token frees
    priority: int
    tenant: str
    hold_ms: int  # a multiple of 10


arrivals = st.lists(
    st.builds(
        Arrival,
        st.integers(0, 40).map(lambda n: n * 10 + 3),
        st.integers(0, 3),
        st.sampled_from(["a", "b", "c"]),
        st.integers(1, 8).map(lambda n: n * 10),
    ),
    min_size=1,
    max_size=25,
)


async def admissions(layer: Any, calls: list[Arrival]) -> list[tuple[float, int, Arrival]]:
    """Run every call through ``layer``; each admission as (when, index, arrival), with
    what was waiting then read off the log by the caller."""
    admitted: list[tuple[float, int, Arrival]] = []

    async def work(arguments: Any, call: ToolCall) -> str:
        index = int(arguments["i"])
        admitted.append((anyio.current_time(), index, calls[index]))
        await anyio.sleep(calls[index].hold_ms / 1000)
        return "ok"

    harness = Harness()
    harness.tools.register(ToolDefinition("work", work))
    harness.plugin(layer)
    start = anyio.current_time()

    async def one(index: int, arrival: Arrival) -> None:
        await anyio.sleep(arrival.at_ms / 1000)
        call = ToolCall(
            "work", {"i": index}, f"c{index}", priority=arrival.priority, tenant=arrival.tenant
        )
        outcome = await harness.tools.execute(call)
        assert outcome.result.content == "ok"

    async with anyio.create_task_group() as group:
        for index, arrival in enumerate(calls):
            group.start_soon(one, index, arrival)
    return [(when - start, index, arrival) for when, index, arrival in admitted]


def check_priority(calls: list[Arrival], log: list[tuple[float, int, Arrival]]) -> None:
    admitted_at = {index: when for when, index, _ in log}
    assert len(admitted_at) == len(calls)
    for when, _, arrival in log:
        waiting = [
            other
            for other_index, other in enumerate(calls)
            # arrived before (not at the same instant: then either may go first)
            if other.at_ms / 1000 < when - 1e-6 and admitted_at[other_index] > when + 1e-6
        ]
        assert all(other.priority <= arrival.priority for other in waiting), (when, arrival)


def check_fifo_within_priority(calls: list[Arrival], log: list[tuple[float, int, Arrival]]) -> None:
    order = [index for _, index, _ in log]
    for priority in {arrival.priority for arrival in calls}:
        same = [i for i in order if calls[i].priority == priority]
        waited = [i for i in same if log[order.index(i)][0] > calls[i].at_ms / 1000 + 1e-6]
        assert [calls[i].at_ms for i in waited] == sorted(calls[i].at_ms for i in waited)


@given(calls=arrivals)
async def test_a_bulkhead_never_admits_below_a_waiting_priority(calls: list[Arrival]) -> None:
    log = await admissions(ConcurrencyLimit(2, queue=100), calls)
    check_priority(calls, log)
    check_fifo_within_priority(calls, log)


@given(calls=arrivals)
async def test_a_pinned_adaptive_limit_never_admits_below_a_waiting_priority(
    calls: list[Arrival],
) -> None:
    log = await admissions(AdaptiveConcurrencyLimit(initial=2, min=2, max=2), calls)
    check_priority(calls, log)


@given(calls=arrivals)
async def test_a_rate_limit_never_admits_below_a_waiting_priority(calls: list[Arrival]) -> None:
    log = await admissions(RateLimit(per_second=20), calls)
    check_priority(calls, log)
    check_fifo_within_priority(calls, log)


batches = st.lists(
    st.tuples(st.sampled_from(["a", "b", "c"]), st.integers(1, 8)), min_size=1, max_size=4
)


@given(batches=batches, weights=st.fixed_dictionaries({}, optional={"a": st.integers(1, 3)}))
async def test_a_fair_bulkhead_gives_each_waiting_tenant_its_turn(
    batches: list[tuple[str, int]], weights: dict[str, int]
) -> None:
    """Batches of calls from tenants, all waiting from the start: between two
    admissions of a tenant that still waits, another tenant is admitted at most
    ceil(its weight / the waiting tenant's weight) times."""
    calls = [
        Arrival(3 + 10 * batch, 0, tenant, 10)
        for batch, (tenant, count) in enumerate(batches)
        for _ in range(count)
    ]
    log = await admissions(ConcurrencyLimit(1, queue=100, fair=weights or True), calls)
    assert len(log) == len(calls)
    weight = {tenant: float(weights.get(tenant, 1)) for tenant in "abc"}
    last_arrival = max(arrival.at_ms for arrival in calls) / 1000
    order = [(when, arrival.tenant) for when, _, arrival in log if when > last_arrival]
    for tenant in {t for _, t in order}:
        mine = [n for n, (_, t) in enumerate(order) if t == tenant]
        for before, after in itertools.pairwise(mine):
            between = [t for _, t in order[before + 1 : after]]
            for other in set(between):
                assert between.count(other) <= math.ceil(weight[other] / weight[tenant])


# -- fair lines at a rate limit: every waiter is served (no deadlock) -------------------


def rate_limited(kind: str, fair: Any) -> Any:
    if kind == "rate":
        return RateLimit(per_second=20, fair=fair)
    return TokenRateLimit(stage="dispatch", requests_per_minute=1200, fair=fair)


@pytest.mark.parametrize("kind", ["rate", "tokens"])
async def test_a_small_tenant_between_a_big_batch_is_served_at_a_fair_rate_limit(
    kind: str,
) -> None:
    """Admitting a call changes which tenant's waiter is the head: the line must wake
    that new head, or the small tenant waits until its own timeout (a deadlock)."""
    calls = [Arrival(3, 0, "big", 10) for _ in range(6)] + [Arrival(5, 0, "small", 10)]
    with anyio.fail_after(60):  # a deadlock waits forever; the calls need well under 1 s
        log = await admissions(rate_limited(kind, True), calls)
    assert len(log) == len(calls)
    small_at = next(when for when, _, arrival in log if arrival.tenant == "small")
    assert small_at < 0.2  # served within a couple of turns, not after the whole batch


@pytest.mark.parametrize("kind", ["rate", "tokens"])
@given(calls=arrivals, weights=st.fixed_dictionaries({}, optional={"a": st.integers(1, 3)}))
async def test_every_waiter_at_a_fair_rate_limit_is_served(
    kind: str, calls: list[Arrival], weights: dict[str, int]
) -> None:
    """Random arrivals, priorities and tenants at a fair rate limit (tool stage): every
    call is admitted, in bounded virtual time, and no call of a higher priority waits
    while a lower one is admitted."""
    with anyio.fail_after(600):
        log = await admissions(rate_limited(kind, weights or True), calls)
    assert len(log) == len(calls)
    check_priority(calls, log)
