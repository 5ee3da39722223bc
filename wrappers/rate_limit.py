"""RateLimit: a token bucket — at most ``per_second`` calls of a tool (or model), ``burst`` at once.

Where it belongs: a dispatch layer (``stage="dispatch"``) or a model-call layer
(``stage="model"``). **Its position is its meaning.** Outside a ``Retry`` one token
pays for the whole retried operation; inside it every attempt pays (retries then
cannot exceed the provider's rate, which is usually what you want). Outside a
``Timeout`` the wait for a token does not count against the budget; inside one it
does, and a call may time out still waiting.

Per tool (per model; one shared bucket with ``key=``) the bucket holds up to
``burst`` tokens and refills at ``per_second``. A call takes one; with none left it
waits its turn in a queue (cancellably; the highest priority first, first come first
served within a priority, or tenants in weighted turns with ``fair=``) or, with
``wait=False``, gets ``TOOL_RATE_LIMITED`` at once with the time to wait (and
``retry_after_s``). On the model stage that is ``ModelError(MODEL_RATE_LIMITED,
retry_after_s=…)``, which a model-stage ``Retry`` outside honours.

The queue is served by the bucket, as aiolimiter's is: only the waiter at its head
asks the bucket, and takes a token only when one is there — nothing is reserved
ahead, so a waiter that is cancelled simply leaves and the next moves up; never two
starts where one is allowed. The bucket lives in the harness's ``StateStore`` (or
``store=``; with a shared store the rate holds across processes, the queue is per
process). A store that fails lets calls through (its ``on_error`` may say otherwise).
"""

from __future__ import annotations

import math
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
from guardstack.pipeline.validate import StageName, boolean, flag, integer
from guardstack.wrappers._keyed import (
    QueueMetrics,
    StateKeys,
    StoreFailures,
    check_key,
    check_store,
    positive,
    register,
)
from guardstack.wrappers._line import Fairness, WaitLine, fairness

__all__ = ["RateLimit"]

PLUGIN = "rate-limit"
_SHORTEST_WAIT_S = 1e-6


def _stage(value: object) -> StageName:
    return stage_of(PLUGIN, value)  # its name, or the stage itself (``MODEL``)


def _key(value: object) -> str | None:
    return check_key(PLUGIN, value)


def _burst(_: Any, __: Any, value: Any) -> None:
    integer(PLUGIN, "burst", value)


def _wait(_: Any, __: Any, value: Any) -> None:
    boolean(PLUGIN, "wait", value)


def _fair(value: object) -> Fairness:
    return fairness(PLUGIN, value)


@attrs.frozen
class RateLimit:
    """``per_second`` calls on average, ``burst`` at once; wait for a token or refuse."""

    name: ClassVar[str] = PLUGIN
    #: What an operator may change at run time (``harness.control.set_limit``).
    controllable: ClassVar[frozenset[str]] = frozenset({"per_second", "burst"})

    stage: StageName = attrs.field(default="dispatch", converter=_stage, kw_only=True)
    per_second: float = attrs.field(validator=positive(PLUGIN, "per_second"))
    burst: int = attrs.field(default=1, validator=_burst)
    wait: bool = attrs.field(default=True, validator=_wait)
    #: One bucket shared by every call under this name, instead of one per tool.
    key: str | None = attrs.field(default=None, converter=_key, kw_only=True)
    #: Where the buckets live (``None``: the harness's store).
    store: StateStore | None = attrs.field(
        default=None, validator=check_store(PLUGIN), kw_only=True, repr=False
    )
    #: Tenants take weighted turns in the queue within a priority (``True``: equal weights).
    fair: Fairness = attrs.field(default=None, converter=_fair, kw_only=True)
    #: Decide as usual, record what it would have done, let every call through.
    shadow: bool = attrs.field(default=False, validator=flag(PLUGIN, "shadow"), kw_only=True)

    def apply(self, scope: Scope) -> None:
        """Register a fresh set of buckets (full) on the stage it names."""
        limiter: _Buckets[Any, Any, Any] = _Buckets(
            self, scope.store_for(self.store), scope.namespace, scope.signals
        )
        limiter.control, limiter.plugin_id = scope.control, scope.plugin_id
        scope.adopt(scope.signals.gauge(LIMITER_QUEUE, limiter.observed))
        register(scope, self.stage, limiter, PLUGIN)


class _Buckets(Generic[ItemT, ValueT, OutcomeT]):
    """One application: the layer, on either stage, and its queues of waiters per key."""

    __slots__ = ("config", "control", "failures", "keys", "metrics", "plugin_id", "queues",
                 "shadow", "stage", "store")  # fmt: skip

    def __init__(
        self, config: RateLimit, store: StateStore, namespace: str, signals: Signals
    ) -> None:
        self.config = config
        self.stage: StageAdapter[ItemT, ValueT, OutcomeT] = adapter_for(config.stage)
        self.store = store
        self.keys = StateKeys(namespace, config.key, self.stage, "bucket")
        self.metrics = QueueMetrics(signals, self.keys, PLUGIN)
        self.failures = StoreFailures(PLUGIN, store, "open", signals)
        #: Waiters per key; a key is here only while someone waits.
        self.queues: dict[str, WaitLine] = {}
        self.shadow = Shadow(namespace, signals) if config.shadow else None
        self.control: Control | None = None
        self.plugin_id = namespace

    def observed(self) -> list[tuple[float, dict[str, AttributeValue]]]:
        """``guardstack.limiter.queue``: the calls waiting, per key that has a queue."""
        return self.metrics.lengths(self.queues)

    def __repr__(self) -> str:
        return repr(self.config)

    async def _take(self, key: str) -> float:
        config = self.config
        control = self.control
        if control is not None and control.limits:  # an operator's numbers, if any
            name = self.keys.name_of(key)
            rate = control.limit(self.plugin_id, name, "per_second") or config.per_second
            burst = control.limit(self.plugin_id, name, "burst")
            return await self.store.take(
                key, rate, max(1, int(burst)) if burst is not None else config.burst
            )
        return await self.store.take(key, config.per_second, config.burst)

    async def _wait_in_line(self, key: str, queue: WaitLine, priority: int, tenant: str) -> None:
        """Wait for this caller's turn at the head of the line, then for a token."""
        waiter = queue.join(priority, tenant)
        started = anyio.current_time()
        admitted = False
        try:
            while True:
                while queue.head() is not waiter:
                    waiter.event = anyio.Event()
                    await waiter.event.wait()  # set when this caller becomes the head
                wait_s = await self._take(key)
                if wait_s <= 0:
                    queue.admitted(waiter)
                    admitted = True
                    return
                # Never a wait shorter than the clock can add: at a large (virtual) time a
                # wait of 1e-10 s does not move it, and the waiter would spin. A caller of a
                # higher priority may have come first meanwhile: then this one waits again.
                await anyio.sleep(max(wait_s, _SHORTEST_WAIT_S))
        finally:
            self.metrics.waited(key, started, admitted)
            queue.leave(waiter)  # wakes the line's head, whoever it is now
            # the line this waiter stood in, not a newer one
            if not queue and self.queues.get(key) is queue:
                del self.queues[key]

    async def __call__(self, item: ItemT, call_next: Next[ItemT, ValueT]) -> ValueT:
        stage = self.stage
        key = self.keys(item)
        refusal = None
        if self.shadow is not None:
            try:
                wait_s = await self._take(key)
            except Exception as error:
                self.failures.fails_open(error)
                wait_s = 0.0
            if wait_s > 0:  # no token: the call would have waited (or been refused)
                decision = "wait" if self.config.wait else "refuse"
                self.shadow.would(decision, item.label, f"no token for {wait_s:.3g}s")
            return await call_next(item)
        try:
            queue = self.queues.get(key)
            if queue is not None:  # others are waiting: join the line
                await self._wait_in_line(key, queue, item.queue_priority, item.owner)
            else:
                wait_s = await self._take(key)
                if wait_s > 0:
                    if not self.config.wait:
                        refusal = self._refusal(item, wait_s)
                    else:
                        # Another caller may have started a line while the store answered
                        # (a shared store suspends): join it rather than start a second.
                        queue = self.queues.get(key)
                        if queue is None:
                            queue = self.queues[key] = WaitLine(self.config.fair)
                        await self._wait_in_line(key, queue, item.queue_priority, item.owner)
        except Exception as error:
            if not self.failures.fails_open(error):
                refusal = self._refusal(item, 0.0, self.failures.reason())
        if refusal is not None:
            return stage.deliver(refusal)
        return await call_next(item)

    def _refusal(self, item: ItemT, wait_s: float, why: str | None = None) -> OutcomeT:
        what = item.label
        if why is None:
            rate = f"{self.config.per_second:g} calls per second"
            message = (
                f"{what} is rate limited ({rate}). Try again in {math.ceil(wait_s * 10) / 10:g}s."
            )
        else:
            message = f"{what} is rate limited: {why}"
        return refusal(
            self.stage,
            item,
            "RATE_LIMITED",
            message,
            layer=PLUGIN,
            name="RateLimitedError",
            retry_after_s=wait_s or None,
        )
