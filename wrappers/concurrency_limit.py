"""ConcurrencyLimit: a bulkhead — at most so many calls of a tool (or model) at once.

Where it belongs: a dispatch layer (``stage="dispatch"``) or a model-call layer
(``stage="model"``). **Its position is its meaning.** Outside a ``Timeout``, time
spent queueing for a slot does not count against the call's budget (the budget
starts when the call gets its slot); inside one, it does (a long queue eats the
budget, and a call can time out before it ever ran). Outside a ``Retry`` one slot
is held for the whole retried operation, backoff included; inside it, each
attempt queues for a slot of its own.

Per tool (per model; one shared limit with ``key=``), at most ``max_concurrent``
calls run; up to ``queue`` more wait, first come first served, each for at most
``queue_timeout_ms`` (``None``: as long as it takes, or until cancelled). Beyond
that a call gets ``TOOL_OVERLOADED`` at once, a text the model can act on. On the
model stage the same refusal is ``ModelError(MODEL_UNAVAILABLE)``.

A thousand agents sharing one harness share its limit: slots are handed over
without an await in between, so no update is lost, and waiters are served in
arrival order, so none starves. A waiter that is cancelled leaves the queue (and
hands on a slot it was just given).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Awaitable, Callable, Hashable
from typing import Any, ClassVar, TypeVar

import anyio
import attrs

from guardstack.pipeline.contract import (
    MODEL_UNAVAILABLE,
    DispatchNext,
    ModelError,
    ModelNext,
    ModelReply,
    ModelRequest,
    Scope,
)
from guardstack.pipeline.validate import StageName, integer, optional_integer, stage
from guardstack.pipeline.values import TOOL_OVERLOADED, ToolCall, ToolResult
from guardstack.wrappers._keyed import PerKey, check_key, model_key, tool_key, use_on_stage

__all__ = ["ConcurrencyLimit"]

PLUGIN = "concurrency-limit"
T = TypeVar("T")


def _stage(value: object) -> StageName:
    return stage(PLUGIN, value)


def _key(value: object) -> str | None:
    return check_key(PLUGIN, value)


def _max_concurrent(_: Any, __: Any, value: Any) -> None:
    integer(PLUGIN, "max_concurrent", value)


def _queue(_: Any, __: Any, value: Any) -> None:
    integer(PLUGIN, "queue", value, minimum=0)


@attrs.frozen
class ConcurrencyLimit:
    """At most ``max_concurrent`` calls at once, ``queue`` more waiting, the rest overloaded."""

    name: ClassVar[str] = PLUGIN

    stage: StageName = attrs.field(default="dispatch", converter=_stage, kw_only=True)
    max_concurrent: int = attrs.field(validator=_max_concurrent)
    queue: int = attrs.field(default=0, validator=_queue)
    queue_timeout_ms: int | None = attrs.field(
        default=None, validator=optional_integer(PLUGIN, "queue_timeout_ms")
    )
    #: One limit shared by every call under this name, instead of one per tool.
    key: str | None = attrs.field(default=None, converter=_key, kw_only=True)

    def apply(self, scope: Scope) -> None:
        """Register a fresh set of limits (all slots free) on the stage it names."""
        use_on_stage(scope, self.stage, _Limits(self, _Bulkhead), PLUGIN)


class _Overloaded(Exception):
    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class _Bulkhead:
    """Slots and a FIFO queue; every state change happens without an await in between."""

    __slots__ = ("running", "waiting")

    def __init__(self) -> None:
        self.running = 0
        self.waiting: deque[anyio.Event] = deque()

    def idle(self) -> bool:
        return self.running == 0 and not self.waiting

    async def acquire(self, config: ConcurrencyLimit) -> None:
        if self.running < config.max_concurrent and not self.waiting:
            self.running += 1
            return
        if len(self.waiting) >= config.queue:
            raise _Overloaded(
                f"{self.running} calls are running and {len(self.waiting)} waiting, the most "
                "allowed. Try again shortly, or do something else first."
            )
        turn = anyio.Event()
        self.waiting.append(turn)
        try:
            if config.queue_timeout_ms is None:
                await turn.wait()
            else:
                with anyio.move_on_after(config.queue_timeout_ms / 1000):
                    await turn.wait()
        except BaseException:
            self._leave(turn)
            raise
        if not turn.is_set():
            self._leave(turn)
            raise _Overloaded(
                f"it waited {config.queue_timeout_ms}ms for one of its "
                f"{config.max_concurrent} slots. Try again shortly, or do something else first."
            )
        # release() handed this waiter its slot: ``running`` already counts it.

    def _leave(self, turn: anyio.Event) -> None:
        if turn.is_set():
            self.release()  # the slot arrived as we were cancelled: pass it on
        else:
            self.waiting.remove(turn)

    def release(self) -> None:
        if self.waiting:
            self.waiting.popleft().set()  # the slot passes straight to the next in line
        else:
            self.running -= 1


class _Limits(PerKey[ConcurrencyLimit, _Bulkhead]):
    """One application: a bulkhead per key, and the layers that use them."""

    __slots__ = ()

    async def _run(self, key: Hashable, work: Callable[[], Awaitable[T]]) -> T:
        bulkhead = self.state(key)
        await bulkhead.acquire(self.config)
        try:
            return await work()
        finally:
            bulkhead.release()

    async def __call__(self, call: ToolCall, call_next: DispatchNext) -> ToolResult:
        try:
            return await self._run(tool_key(call), lambda: call_next(call))
        except _Overloaded as overloaded:
            return ToolResult.failure(
                f'tool "{call.name}" is overloaded: {overloaded.reason}',
                name="OverloadedError",
                code=TOOL_OVERLOADED,
            )

    async def model_layer(self, request: ModelRequest, call_next: ModelNext) -> ModelReply:
        key = model_key(request)
        try:
            return await self._run(key, lambda: call_next(request))
        except _Overloaded as overloaded:
            raise ModelError(
                f"model {key} is overloaded: {overloaded.reason}", MODEL_UNAVAILABLE
            ) from None
