"""``MemoryStore``'s soft state, operation by operation (a clock of the test's own):
buckets that take and give back, breaker windows pruned at their edge, the bound on
keys and what it never drops."""

from __future__ import annotations

from typing import Any

import pytest

from guardstack.pipeline import ConfigError, MemoryStore
from guardstack.pipeline.contract import store_key


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


async def test_a_negative_take_deposits_up_to_the_burst() -> None:
    clock = Clock()
    store = MemoryStore(clock=clock)
    assert await store.take("b", 1.0, 3.0, amount=3.0) == 0.0  # emptied
    assert await store.take("b", 1.0, 3.0, amount=-2.0) == 0.0  # two back
    assert await store.take("b", 1.0, 3.0, amount=2.0) == 0.0
    assert await store.take("b", 1.0, 3.0, amount=1.0) == 1.0  # empty again: a second's wait
    assert await store.take("b", 1.0, 3.0, amount=-10.0) == 0.0  # never past the burst
    assert await store.take("b", 1.0, 3.0, amount=3.0) == 0.0
    assert await store.take("b", 1.0, 3.0, amount=0.5) == 0.5


async def test_a_breakers_outcome_leaves_its_window_exactly_at_the_edge() -> None:
    clock = Clock()
    store = MemoryStore(clock=clock)
    window: dict[str, Any] = {"window_s": 10.0, "minimum_calls": 2, "failure_ratio": 1.0}
    assert await store.record("k", True, False, **window) is None
    clock.now += 10.0  # the first failure is now exactly window_s old: out of the window
    assert await store.record("k", True, False, **window) is None
    clock.now += 9.0
    assert await store.record("k", True, False, **window) == "open"  # two inside it


async def test_below_its_bound_the_store_forgets_nothing() -> None:
    store = MemoryStore(max_keys=10)
    for index in range(5):
        await store.add(store_key("soft", str(index)), 1)
    assert len(store) == 5
    assert all(store_key("soft", str(index)) in store for index in range(5))


async def test_past_its_bound_it_forgets_the_least_recently_used_idle_entries() -> None:
    store = MemoryStore(max_keys=4)
    for index in range(10):
        await store.add(store_key("soft", str(index)), 1)
    assert len(store) == 4
    assert [store_key("soft", str(index)) in store for index in range(10)] == [False] * 6 + [
        True
    ] * 4
    lease = await store.acquire("held", 1)  # busy: never forgotten
    assert lease is not None
    for index in range(10, 20):
        await store.add(store_key("soft", str(index)), 1)
    assert "held" in store


async def test_a_counter_starts_at_zero_unless_told() -> None:
    store = MemoryStore()
    assert await store.add("c", 1) == (True, 1.0)
    assert await store.add("d", 1, initial=5.0) == (True, 6.0)
    assert await store.add("c", 2, limit=2) == (False, 1.0)  # would pass: not added
    assert await store.read("c") == 1.0


def test_the_memory_stores_lifetimes_are_in_ms_as_redis_store_spells_them() -> None:
    """One unit per constructor, and the same keywords on both stores: ``session_ttl_ms``
    and ``reservation_ttl_ms``; the old seconds keep working a minor version, warning."""
    store = MemoryStore(session_ttl_ms=7_200_000, reservation_ttl_ms=5_000)
    assert (store.session_ttl_s, store.lease_s) == (7_200, 5)
    assert MemoryStore().lease_s == 3_600  # by default a reservation is held an hour
    with pytest.warns(DeprecationWarning, match="lease_s is deprecated .* reservation_ttl_ms=5000"):
        assert MemoryStore(lease_s=5).lease_s == 5
    with pytest.warns(DeprecationWarning, match="write session_ttl_ms=7200000"):
        assert MemoryStore(session_ttl_s=7_200).session_ttl_s == 7_200
    with pytest.raises(ConfigError, match="reservation_ttl_ms"):
        MemoryStore(reservation_ttl_ms=0)
