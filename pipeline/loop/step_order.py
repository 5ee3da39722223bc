"""A step's calls: which were logged and answered, and the order a parallel step keeps."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import TYPE_CHECKING

import anyio
import anyio.lowlevel
import attrs

from guardstack.pipeline.frozen import quick_init
from guardstack.pipeline.model import (
    ToolCallRequest,
)
from guardstack.pipeline.registry import Phase
from guardstack.pipeline.runtime import cancel_pending, deliver_pending
from guardstack.pipeline.values import ToolCall
from guardstack.pipeline.verdicts import ToolOutcome

if TYPE_CHECKING:
    pass


@quick_init
@attrs.define(eq=False)
class StepCalls:
    """Which of a step's calls were logged (started) and answered: what a cancel must fill."""

    requests: tuple[ToolCallRequest, ...]
    called: set[int] = attrs.Factory(set)
    answered: set[int] = attrs.Factory(set)


class Gate:
    """A one-shot event that costs nothing unless someone has to wait for it.

    A parallel step has a gate per call and phase, and most are open by the time
    anyone looks: ``anyio.Event`` would be built for each, and its ``wait()`` yields
    to the scheduler even when set. The real event is made only for a waiter.
    """

    __slots__ = ("_event", "open")

    def __init__(self) -> None:
        self.open = False
        self._event: anyio.Event | None = None

    def set(self) -> None:
        self.open = True
        if self._event is not None:
            self._event.set()

    async def wait(self) -> None:
        if self.open:
            return
        if self._event is None:
            self._event = anyio.Event()
        await self._event.wait()


class StepOrder:
    """The turns a parallel step's calls take: pre- and post-execute in model order."""

    __slots__ = ("done", "slots")

    def __init__(self, count: int, parallelism: int) -> None:
        self.done = {
            "pre_execute": [Gate() for _ in range(count)],
            "post_execute": [Gate() for _ in range(count)],
        }
        #: ``None`` when every call may run at once: no semaphore to pass.
        self.slots = anyio.Semaphore(parallelism) if parallelism < count else None

    def release(self, index: int) -> None:
        for events in self.done.values():
            events[index].set()


class CallOrder:
    """One call's ``PhaseOrder`` within a ``StepOrder`` (see ``pipeline.registry``)."""

    __slots__ = ("index", "log_call", "step")

    def __init__(self, step: StepOrder, index: int, log_call: Callable[[int], None]) -> None:
        self.step = step
        self.index = index
        self.log_call = log_call

    async def enter(self, phase: Phase) -> None:
        if phase == "dispatch":
            slots = self.step.slots
            if slots is not None:
                try:
                    slots.acquire_nowait()
                except anyio.WouldBlock:
                    await slots.acquire()
            return
        if self.index:
            await self.step.done[phase][self.index - 1].wait()
        if phase == "pre_execute":
            self.log_call(self.index)  # in model order; from here on the call has started

    def leave(self, phase: Phase) -> None:
        if phase == "dispatch":
            if self.step.slots is not None:
                self.step.slots.release()
        else:
            self.step.done[phase][self.index].set()


async def run_overlapping(
    calls: Sequence[ToolCall],
    execute: Callable[..., Awaitable[ToolOutcome]],
    parallelism: int,
    log_call: Callable[[int], None],
    answer: Callable[[int, ToolOutcome], None],
) -> list[ToolOutcome]:
    """Run a step's ``calls`` overlapping, at most ``parallelism`` dispatching at once,
    while pre-execute, post-execute and ``answer`` keep the model's order."""
    count = len(calls)
    step_order = StepOrder(count, parallelism)
    committed = [Gate() for _ in range(count)]
    outcomes: list[ToolOutcome | None] = [None] * count

    async def run(index: int) -> None:
        order = CallOrder(step_order, index, log_call)
        outcome = await execute(calls[index], order=order)
        # A hook that answered without running the phases still frees the next call.
        step_order.release(index)
        if cancel_pending():
            await deliver_pending()
        if index:
            await committed[index - 1].wait()
        log_call(index)
        answer(index, outcome)
        outcomes[index] = outcome
        committed[index].set()

    try:
        async with anyio.create_task_group() as group:
            for index in range(count):
                group.start_soon(run, index)
    except BaseExceptionGroup as group_error:
        # One tool's KeyboardInterrupt (or the like) stopped the step: raise it as
        # itself, as the sequential path does (the log is repaired by the caller).
        if len(group_error.exceptions) == 1:
            raise group_error.exceptions[0] from None
        raise
    return [outcome for outcome in outcomes if outcome is not None]
