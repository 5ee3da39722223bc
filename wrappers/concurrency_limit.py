"""ConcurrencyLimit: a bulkhead — at most so many calls of a tool (or model) at once.

Where it belongs: a dispatch layer (``stage="dispatch"``) or a model-call layer
(``stage="model"``). **Its position is its meaning.** Outside a ``Timeout``, time
spent queueing for a slot does not count against the call's budget (the budget
starts when the call gets its slot); inside one, it does (a long queue eats the
budget, and a call can time out before it ever ran). Outside a ``Retry`` one slot
is held for the whole retried operation, backoff included; inside it, each
attempt queues for a slot of its own.

Per tool (per model; one shared limit with ``key=``), at most ``max_concurrent``
calls run; up to ``queue`` more wait, each for at most ``queue_timeout_ms`` (``None``:
as long as it takes, or until cancelled) — the highest priority first
(``ToolCall.priority``, ``ModelRequest.priority``, else the agent's), first come first
served within a priority, or with ``fair=True`` (or ``{tenant: weight}``) tenants in
weighted turns, so one tenant's batch cannot starve another's interactive calls
(``wrappers/_line.py``). Beyond that a call gets ``TOOL_OVERLOADED`` at once, a text
the model can act on. On the model stage the same refusal is
``ModelError(MODEL_OVERLOADED)``.

A thousand agents sharing one harness share its limit: the slots are kept in the
harness's ``StateStore`` (or ``store=``; with a shared store the count holds across
processes, as leases, and the queue is per process), and waiters are served in
line, so none starves: a newcomer never takes a slot while others wait. A
waiter that is cancelled leaves the queue; a slot is always given back, even when
the call is cancelled. A store that fails lets calls through (its ``on_error`` may
say otherwise).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, ClassVar, Generic

import anyio
import attrs
from opentelemetry.util.types import AttributeValue

from guardstack.pipeline.contract import (
    Control,
    ItemT,
    Next,
    OutcomeT,
    Scope,
    StageAdapter,
    StateStore,
    ValueT,
    adapter_for,
    stage_of,
)
from guardstack.pipeline.outcome import refusal
from guardstack.pipeline.signals import LIMITER_QUEUE, Shadow, Signals
from guardstack.pipeline.validate import StageName, flag, integer, optional_integer
from guardstack.wrappers._keyed import (
    QueueMetrics,
    StateKeys,
    StoreFailures,
    check_key,
    check_store,
    register,
    suspends,
)
from guardstack.wrappers._line import Fairness, Waiter, WaitLine, fairness

__all__ = ["ConcurrencyLimit"]

PLUGIN = "concurrency-limit"


def _stage(value: object) -> StageName:
    return stage_of(PLUGIN, value)  # its name, or the stage itself (``MODEL``)


def _key(value: object) -> str | None:
    return check_key(PLUGIN, value)


def _max_concurrent(_: Any, __: Any, value: Any) -> None:
    integer(PLUGIN, "max_concurrent", value)


def _queue(_: Any, __: Any, value: Any) -> None:
    integer(PLUGIN, "queue", value, minimum=0)


def _fair(value: object) -> Fairness:
    return fairness(PLUGIN, value)


@attrs.frozen
class ConcurrencyLimit:
    """At most ``max_concurrent`` calls at once, ``queue`` more waiting, the rest overloaded."""

    name: ClassVar[str] = PLUGIN
    #: What an operator may change at run time (``harness.control.set_limit``).
    controllable: ClassVar[frozenset[str]] = frozenset({"max_concurrent"})

    stage: StageName = attrs.field(default="dispatch", converter=_stage, kw_only=True)
    max_concurrent: int = attrs.field(validator=_max_concurrent)
    queue: int = attrs.field(default=0, validator=_queue)
    queue_timeout_ms: int | None = attrs.field(
        default=None, validator=optional_integer(PLUGIN, "queue_timeout_ms")
    )
    #: One limit shared by every call under this name, instead of one per tool.
    key: str | None = attrs.field(default=None, converter=_key, kw_only=True)
    #: Where the slots live (``None``: the harness's store).
    store: StateStore | None = attrs.field(
        default=None, validator=check_store(PLUGIN), kw_only=True, repr=False
    )
    #: Tenants take weighted turns within a priority (``True``: equal weights).
    fair: Fairness = attrs.field(default=None, converter=_fair, kw_only=True)
    #: Decide as usual, record what it would have done, let every call through.
    shadow: bool = attrs.field(default=False, validator=flag(PLUGIN, "shadow"), kw_only=True)

    def apply(self, scope: Scope) -> None:
        """Register a fresh set of limits (all slots free) on the stage it names."""
        limits: _Limits[Any, Any, Any] = _Limits(
            self, scope.store_for(self.store), scope.namespace, scope.signals
        )
        limits.control, limits.plugin_id = scope.control, scope.plugin_id
        scope.adopt(scope.signals.gauge(LIMITER_QUEUE, limits.slots.observed))
        register(scope, self.stage, limits, PLUGIN)


class QueueFull(Exception):
    """No slot came (the queue was full, or the wait ran out): the caller answers
    ``*_OVERLOADED`` with ``reason``."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class SlotQueue:
    """Slots in a store and a line of this process's waiters (``WaitLine``: priority,
    then first come first served or fair shares).

    Shared with ``AdaptiveConcurrencyLimit``: ``acquire(key, limit, queue, timeout_s)``
    gives a lease or raises ``QueueFull``; ``release`` gives it back and wakes the
    waiter at the head. With a store that other processes share, the head also asks
    again every ``store.poll_s`` seconds (slots freed elsewhere wake no one here).
    """

    __slots__ = ("fair", "metrics", "queues", "shield", "store")

    def __init__(self, store: StateStore, metrics: QueueMetrics, fair: Fairness = None) -> None:
        self.store = store
        self.shield = suspends(store)
        self.queues: dict[str, WaitLine] = {}
        self.metrics = metrics
        self.fair = fair

    def observed(self) -> list[tuple[float, dict[str, AttributeValue]]]:
        """``guardstack.limiter.queue``: the calls waiting, per key that has a queue."""
        return self.metrics.lengths(self.queues)

    async def acquire(
        self,
        key: str,
        limit: int,
        queue: int,
        timeout_s: float | None,
        current: Callable[[], int] | None = None,
        item: Any = None,
        stage: StageAdapter[Any, Any, Any] | None = None,
    ) -> str:
        """A lease on one of ``limit`` slots; ``current()``, if given, is the limit as it
        is now, asked again each time a waiter tries (an adaptive limit moves). A call
        that waits takes its place in line by ``stage``'s priority and tenant of
        ``item`` (read only then)."""
        waiting = self.queues.get(key)
        if waiting is None:
            lease = await self.store.acquire(key, limit)
            if lease is not None:
                return lease
            # another caller may have started a line while the store answered: join it
            waiting = self.queues.get(key)
            if waiting is None:
                waiting = self.queues[key] = WaitLine(self.fair)
        if len(waiting) >= queue:
            if not waiting and self.queues.get(key) is waiting:
                del self.queues[key]
            raise QueueFull(
                f"{limit} calls are running and {len(waiting)} waiting, the most "
                "allowed. Try again shortly, or do something else first."
            )
        if stage is None:
            waiter = waiting.join(0, "default")
        else:
            waiter = waiting.join(item.queue_priority, item.owner)
        started = anyio.current_time()
        admitted = False
        try:
            with anyio.move_on_after(timeout_s if timeout_s is not None else float("inf")):
                lease = await self._wait(key, limit, waiting, waiter, current)
                admitted = True
                return lease
        finally:
            self.metrics.waited(key, started, admitted)
            waiting.leave(waiter)  # wakes the line's head, whoever it is now
            if not waiting and self.queues.get(key) is waiting:
                del self.queues[key]
        raise QueueFull(
            f"it waited {round((timeout_s or 0) * 1000)}ms for one of its "
            f"{limit} slots. Try again shortly, or do something else first."
        )

    async def _wait(
        self,
        key: str,
        limit: int,
        waiting: WaitLine,
        waiter: Waiter,
        current: Callable[[], int] | None,
    ) -> str:
        poll_s: float | None = getattr(self.store, "poll_s", None)
        while True:
            if waiting.head() is waiter:
                lease = await self.store.acquire(key, limit if current is None else current())
                if lease is not None:
                    waiting.admitted(waiter)
                    return lease
            waiter.event = anyio.Event()
            with anyio.move_on_after(poll_s if poll_s is not None else float("inf")):
                await waiter.event.wait()

    async def release(self, key: str, lease: str) -> None:
        if self.shield:
            with anyio.CancelScope(shield=True):  # a slot always goes back, cancelled or not
                await self.store.release_slot(key, lease)
        else:  # answers without suspending: nothing can cancel it
            await self.store.release_slot(key, lease)
        waiting = self.queues.get(key)
        if waiting:
            waiting.wake_head()


class _Limits(Generic[ItemT, ValueT, OutcomeT]):
    """One application: the layer, on either stage, over slots kept in a store."""

    __slots__ = ("config", "control", "failures", "keys", "plugin_id", "shadow", "slots", "stage")

    def __init__(
        self, config: ConcurrencyLimit, store: StateStore, namespace: str, signals: Signals
    ) -> None:
        self.config = config
        self.stage: StageAdapter[ItemT, ValueT, OutcomeT] = adapter_for(config.stage)
        self.keys = StateKeys(namespace, config.key, self.stage, "slots")
        self.slots = SlotQueue(store, QueueMetrics(signals, self.keys, PLUGIN), config.fair)
        self.failures = StoreFailures(PLUGIN, store, "open", signals)
        self.shadow = Shadow(namespace, signals) if config.shadow else None
        self.control: Control | None = None
        self.plugin_id = namespace

    def __repr__(self) -> str:
        return repr(self.config)

    async def __call__(self, item: ItemT, call_next: Next[ItemT, ValueT]) -> ValueT:
        config, stage = self.config, self.stage
        key = self.keys(item)
        timeout_ms = config.queue_timeout_ms
        shadow = self.shadow
        limit = config.max_concurrent
        control = self.control
        if control is not None and control.limits:
            changed = control.limit(self.plugin_id, item.key, "max_concurrent")
            if changed is not None:
                limit = max(1, int(changed))
        try:
            lease = await self.slots.acquire(
                key,
                limit,
                config.queue if shadow is None else 0,  # a shadow never makes a call wait
                None if timeout_ms is None else timeout_ms / 1000,
                None,
                item,
                stage,
            )
        except QueueFull as overloaded:
            if shadow is not None:  # it would have waited (or refused): runs without a slot
                full = f"{config.max_concurrent} calls are running, the most allowed"
                shadow.would("wait" if config.queue else "refuse", item.label, full)
                return await call_next(item)
            return stage.deliver(self._refusal(item, overloaded.reason))
        except Exception as error:
            if not self.failures.fails_open(error):
                return stage.deliver(self._refusal(item, self.failures.reason()))
            return await call_next(item)
        try:
            return await call_next(item)
        finally:
            try:
                await self.slots.release(key, lease)
            except Exception as error:
                self.failures.fails_open(error)

    def _refusal(self, item: ItemT, reason: str) -> OutcomeT:
        return overloaded(self.stage, item, reason, PLUGIN)


def overloaded(
    stage: StageAdapter[ItemT, Any, OutcomeT], item: ItemT, reason: str, layer: str
) -> OutcomeT:
    """The ``*_OVERLOADED`` refusal a full limit answers (a concurrency limit's, adaptive
    or not)."""
    return refusal(
        stage,
        item,
        "OVERLOADED",
        f"{item.label} is overloaded: {reason}",
        layer=layer,
        name="OverloadedError",
    )
