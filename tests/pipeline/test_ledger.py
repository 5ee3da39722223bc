"""The in-process ledger (``MemoryStore``) against the reference model of the contract:
reserve, settle and release by operation id, all or none, idempotent; lifetimes by the
wall clock; never evicted to make room."""

from __future__ import annotations

import math
from collections.abc import Coroutine
from typing import Any

import anyio
import pytest
from hypothesis import settings

from guardstack.pipeline import MemoryStore
from guardstack.pipeline.contract import Ledger, Window, store_key
from tests.ledger_model import LedgerMachine


def run_now(coroutine: Coroutine[Any, Any, Any]) -> Any:
    """A memory store's operations never suspend: run one to its end without a loop."""
    try:
        coroutine.send(None)
    except StopIteration as done:
        return done.value
    raise AssertionError("a MemoryStore operation suspended")


class MemoryLedgerMachine(LedgerMachine):
    run = staticmethod(run_now)
    make_store = staticmethod(lambda: (MemoryStore(), None, None))


TestMemoryLedger = MemoryLedgerMachine.TestCase
TestMemoryLedger.settings = settings(max_examples=150, stateful_step_count=40, deadline=None)


class Clock:
    def __init__(self) -> None:
        self.now = 1_000_000.0

    def __call__(self) -> float:
        return self.now


def window(name: str, limit: float | None = 10.0, ttl_s: float = 60.0) -> Window:
    return Window(store_key("cap", "window", name), "calls", limit, ttl_s)


async def test_a_window_lives_until_its_lifetime_ends_and_each_use_extends_it() -> None:
    clock = Clock()
    store = MemoryStore(wall_clock=clock)
    assert (await store.reserve("cap:op:1", {"calls": 3}, [window("w")])).granted
    clock.now += 59
    assert await store.balance(window("w")) == 3
    assert (await store.reserve("cap:op:2", {"calls": 1}, [window("w")])).granted
    clock.now += 59  # 118 s after the first use, 59 after the last: still there
    await store.release("cap:op:other")  # an operation: what has expired goes now
    assert await store.balance(window("w")) == 4
    clock.now += 2
    assert await store.balance(window("w")) == 0  # its meaning ended: gone
    assert store.ledger_size() == 3  # two unsettled reservations, one early release
    clock.now += 3_600
    await store.release("cap:op:3")  # expired entries go as operations come
    assert store.ledger_size() == 1  # only the new release's own record


async def test_the_ledger_is_never_evicted_to_make_room_for_soft_state() -> None:
    store = MemoryStore(max_keys=10)
    month = Window(store_key("cap", "tenant", "acme", "usd", "month:2026-12"), "usd", 5.0)
    assert (await store.reserve("cap:op:a", {"usd": 4.0}, [month])).granted
    assert await store.settle("cap:op:a", {"usd": 4.5}) == "settled"
    for index in range(1_000):  # soft state far past the bound
        await store.add(store_key("soft", "counter", str(index)), 1.0)
    assert len(store) <= 11
    assert await store.balance(month) == 4.5
    refused = await store.reserve("cap:op:b", {"usd": 1.0}, [month])
    assert not refused.granted
    assert refused.used == 4.5


async def test_a_release_before_its_reservation_keeps_that_reservation_from_counting() -> None:
    store = MemoryStore()
    assert await store.release("cap:op:late") == "unknown"
    late = await store.reserve("cap:op:late", {"calls": 5}, [window("w")])
    assert late.duplicate
    assert not late.granted
    assert await store.balance(window("w")) == 0


async def test_settlements_are_idempotent_and_a_settle_after_a_release_is_refused() -> None:
    store = MemoryStore()
    await store.reserve("cap:op:1", {"calls": 2}, [window("w")])
    assert await store.settle("cap:op:1", {"calls": 1}) == "settled"
    assert await store.settle("cap:op:1", {"calls": 7}) == "duplicate"  # counted once
    again = await store.reserve("cap:op:1", {"calls": 2}, [window("w")])
    assert (again.granted, again.duplicate) == (True, True)  # re-sent: not counted again
    await store.reserve("cap:op:2", {"calls": 2}, [window("w")])
    assert await store.release("cap:op:2") == "released"
    assert await store.settle("cap:op:2", {"calls": 2}) == "released"
    assert await store.release("cap:op:2") == "duplicate"
    late = await store.reserve("cap:op:2", {"calls": 2}, [window("w")])
    assert (late.granted, late.duplicate) == (False, True)
    assert await store.release("cap:op:1") == "settled"
    assert await store.balance(window("w")) == 1


async def test_a_floor_counts_what_a_session_log_holds_when_the_store_lost_it() -> None:
    store = MemoryStore()  # a fresh store: what a restarted Redis has
    session = attrs_evolve(window("s", limit=4.0), floor=3.0)  # the log holds three calls
    assert (await store.reserve("cap:op:1", {"calls": 1}, [session])).granted
    refused = await store.reserve("cap:op:2", {"calls": 1}, [session])
    assert not refused.granted
    assert refused.used == 4.0


def attrs_evolve(value: Window, **changes: Any) -> Window:
    import attrs

    return attrs.evolve(value, **changes)


@pytest.mark.parametrize("bad", [-1.0, float("nan"), float("inf")])
def test_a_window_refuses_a_bad_limit_or_lifetime(bad: float) -> None:
    with pytest.raises(ValueError, match=r"Window\.limit"):
        Window("k", "calls", bad)
    with pytest.raises(ValueError, match=r"Window\.ttl_s"):
        Window("k", "calls", 1.0, bad)


def test_both_stores_are_ledgers() -> None:
    assert isinstance(MemoryStore(), Ledger)


async def test_a_sliding_window_in_memory_refuses_with_when_and_slides() -> None:
    """The same contract as on Redis (tests/integrations/test_redis_ledger.py), in
    anyio's clock: buckets of a second for a minute."""
    from guardstack.pipeline.contract import Window

    ledger = MemoryStore()
    now = anyio.current_time()
    await anyio.sleep(math.ceil(now) - now + 1)  # the start of a bucket
    window = Window("t:minute:m:tokens", "tokens", 100, 120.0, slide_s=60.0)
    assert (await ledger.reserve("a", {"tokens": 60}, [window])).granted
    assert await ledger.settle("a", {"tokens": 50}) == "settled"
    await anyio.sleep(30)
    assert (await ledger.reserve("b", {"tokens": 40}, [window])).granted
    refused = await ledger.reserve("c", {"tokens": 20}, [window])
    assert (refused.granted, refused.used) == (False, 90)
    assert refused.retry_after_s == pytest.approx(31.0)  # "a"'s second, 61 s after it began
    assert await ledger.release("b") == "released"
    assert await ledger.balance(window) == 50
    assert (await ledger.reserve("c", {"tokens": 20}, [window])).granted
    too_big = await ledger.reserve("d", {"tokens": 101}, [window])
    assert (too_big.granted, too_big.retry_after_s) == (False, None)
    await anyio.sleep(31)
    assert await ledger.balance(window) == 20  # "a" slid out; "c" has not
    await anyio.sleep(30)
    assert await ledger.balance(window) == 0


async def test_asking_a_sliding_windows_whole_limit_says_when_there_will_be_room() -> None:
    """Asking exactly the limit while the window holds something is refused with when
    it will have slid out (not ``None``: that means never, for more than the limit)."""
    from guardstack.pipeline.contract import Window

    ledger = MemoryStore()
    now = anyio.current_time()
    await anyio.sleep(math.ceil(now) - now + 1)
    window = Window("t:minute:m:tokens", "tokens", 100, 120.0, slide_s=60.0)
    assert (await ledger.reserve("a", {"tokens": 30}, [window])).granted
    whole = await ledger.reserve("b", {"tokens": 100}, [window])
    assert not whole.granted
    assert whole.retry_after_s == pytest.approx(61.0)


async def test_sliding_windows_no_longer_used_are_dropped() -> None:
    """A sliding window idle for two of its lengths is forgotten once more than 1,024 are
    held: 2,000 windows of one-off keys do not stay in memory."""
    from guardstack.pipeline.contract import Window

    ledger = MemoryStore(wall_clock=anyio.current_time)  # operations expire in it too
    await anyio.sleep(1_000)  # a clock well past its start
    for n in range(2_000):
        window = Window(f"t:minute:k{n}:tokens", "tokens", 100, 1.0, slide_s=60.0)
        assert (await ledger.reserve(f"op{n}", {"tokens": 1}, [window], lease_s=1.0)).granted
    assert ledger.ledger_size() >= 2_000
    await anyio.sleep(121)
    last = Window("t:minute:last:tokens", "tokens", 100, 1.0, slide_s=60.0)
    assert (await ledger.reserve("last", {"tokens": 1}, [last], lease_s=1.0)).granted
    assert ledger.ledger_size() <= 3


def test_a_sliding_window_must_slide() -> None:
    from guardstack.pipeline.contract import Window

    for bad in (0, -1.0, math.inf):
        with pytest.raises(ValueError, match="slide_s"):
            Window("k", "tokens", slide_s=bad)
