"""The hot path's clock, cancel check and cancel scopes answer as anyio's public calls do.

``guardstack.pipeline.runtime`` reads the running loop's clock and anyio's asyncio cancel
scopes directly (anyio's own calls look the backend up on every call); these tests
hold its answers to the public ``anyio.current_time()`` and
``anyio.current_effective_deadline()`` over random nestings of scopes — cancelled,
shielded, with deadlines past and future — on asyncio and trio.
"""

from __future__ import annotations

import asyncio
import math
from contextlib import ExitStack

import anyio
import anyio.lowlevel
import anyio.to_thread
import pytest
from hypothesis import given
from hypothesis import strategies as st

from guardstack.pipeline.runtime import (
    cancel_pending,
    cancel_scope,
    deliver_pending,
    now,
    scope_after,
)
from tests.virtual_time import jump_clock

pytestmark = pytest.mark.anyio

scope_specs = st.lists(
    st.tuples(
        st.booleans(),  # shield
        st.none() | st.floats(-5, 5),  # deadline, relative to now
        st.booleans(),  # cancel it
    ),
    max_size=5,
)


def _public_pending() -> bool:
    deadline = anyio.current_effective_deadline()
    return deadline != math.inf and deadline <= anyio.current_time()


@given(specs=scope_specs, sleep=st.floats(0, 3))
async def test_cancel_pending_is_anyios_answer_in_any_nesting_of_scopes(
    specs: list[tuple[bool, float | None, bool]], sleep: float
) -> None:
    with anyio.CancelScope(shield=True):  # what hypothesis cancels here stays here
        await anyio.sleep(sleep)  # the clock is not at zero
        assert now() == anyio.current_time()
        assert cancel_pending() is False
        with ExitStack() as stack:
            for shield, deadline, cancel in specs:
                at = math.inf if deadline is None else anyio.current_time() + deadline
                scope = stack.enter_context(anyio.CancelScope(shield=shield, deadline=at))
                if cancel:
                    scope.cancel()
                assert cancel_pending() is _public_pending()
        assert cancel_pending() is False


async def test_a_pending_cancel_is_delivered_by_the_next_checkpoint() -> None:
    with anyio.CancelScope() as scope:
        scope.cancel()
        assert cancel_pending()
        await anyio.lowlevel.checkpoint()
        pytest.fail("the checkpoint delivers the cancel")  # pragma: no cover
    assert scope.cancelled_caught


async def test_inside_a_task_group_child_the_parents_cancel_is_seen() -> None:
    seen: list[bool] = []

    async def child(scope: anyio.CancelScope) -> None:
        scope.cancel()
        seen.append(cancel_pending())

    with anyio.CancelScope() as outer:
        async with anyio.create_task_group() as group:
            group.start_soon(child, outer)
    assert seen == [True]


def test_outside_an_event_loop_the_public_calls_answer() -> None:
    with pytest.raises(Exception, match="event loop"):
        now()


@given(deadline=st.none() | st.floats(-5, 5), cancel=st.booleans())
async def test_a_scope_from_cancel_scope_is_the_scope_anyio_makes(
    deadline: float | None, cancel: bool
) -> None:
    """The same class as ``anyio.CancelScope()`` gives on this backend, the same deadline,
    and it cancels (and is caught) the same way."""

    def at() -> float:
        return math.inf if deadline is None else anyio.current_time() + deadline

    assert type(cancel_scope(at())) is type(anyio.CancelScope())
    outcomes = []
    for make in (cancel_scope, lambda when: anyio.CancelScope(deadline=when)):
        when = at()
        with make(when) as scope:
            assert scope.deadline == when
            if cancel:
                scope.cancel()
            await anyio.sleep(1)
        outcomes.append((scope.cancel_called, scope.cancelled_caught))
    assert outcomes[0] == outcomes[1]


class _FixedClockLoop(asyncio.SelectorEventLoop):
    def time(self) -> float:
        return 12_345.0


def _in_another_loop() -> tuple[float, float, bool]:
    async def inside() -> tuple[float, float, bool]:
        seen: list[tuple[float, float, bool]] = []
        with cancel_scope() as scope:
            scope.cancel()
            seen.append((now(), asyncio.get_running_loop().time(), cancel_pending()))
        return seen[0]

    loop = _FixedClockLoop()
    try:
        return loop.run_until_complete(inside())
    finally:
        loop.close()


async def test_a_loop_running_in_another_thread_is_that_threads_own() -> None:
    """The loop found last is remembered per thread it runs in: another thread running
    its own loop reads its own clock, and this one still reads its own after."""
    before = now()
    ours, theirs, pending = await anyio.to_thread.run_sync(_in_another_loop)
    assert (ours, theirs, pending) == (12_345.0, 12_345.0, True)
    assert now() == anyio.current_time() == before


async def test_scope_after_starts_its_deadline_now() -> None:
    await anyio.sleep(2)
    scope, started = scope_after(1.5)
    assert started == anyio.current_time()
    assert scope.deadline == started + 1.5
    assert type(scope) is type(anyio.CancelScope())
    with scope:
        await anyio.sleep(5)
    assert scope.cancelled_caught
    assert anyio.current_time() == started + 1.5


async def test_a_deadline_that_passed_while_the_task_ran_is_pending() -> None:
    """Before the event loop has run the deadline's timer, anyio's asyncio scopes do not
    say they are cancelled: only the deadline, against the clock, tells (the corner a
    busy tool leaves)."""
    with anyio.CancelScope(deadline=anyio.current_time() + 1) as scope:
        assert cancel_pending() is False
        jump_clock(2)
        assert cancel_pending() is True
        assert cancel_pending() is _public_pending()
        with anyio.CancelScope(shield=True):  # noqa: ASYNC100 - no checkpoint wanted
            assert cancel_pending() is False  # a shield hides it
        await deliver_pending()  # the timer runs; the cancel arrives
        pytest.fail("deliver_pending delivers the deadline's cancel")  # pragma: no cover
    assert scope.cancelled_caught


async def test_deliver_pending_returns_at_once_with_nothing_pending() -> None:
    with anyio.CancelScope(deadline=anyio.current_time() + 1):
        before = anyio.current_time()
        await deliver_pending()
        assert anyio.current_time() == before
