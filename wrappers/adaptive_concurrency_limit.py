"""AdaptiveConcurrencyLimit: find the provider's limit instead of guessing it.

A fixed ``ConcurrencyLimit(8)`` is a guess about a provider's capacity, and the
provider changes it under you. This limit moves: ``algorithm="aimd"`` adds one slot
after a window of successes at full use (as many successes as the limit) and halves on
an overload signal; ``algorithm="gradient2"`` follows Netflix concurrency-limits'
Gradient2 — the limit tracks the ratio of a long-run latency baseline to the latest
latency, plus a little room to probe (``limit * gradient + 4``, smoothed by 0.2, the
gradient clamped to [0.5, 1]) — and, unlike the original, also falls on an overload
signal, by concurrency-limits' AIMD backoff (× 0.9). Overload signals:
``*_RATE_LIMITED``, ``*_OVERLOADED`` and timeouts, plus the codes in ``extra_on``. A storm
counts once, across every process sharing the store: the limit carries a version that
each decrease moves, and only a call admitted after the last decrease can decrease it
again (compare and set in the store, clamped to ``[min, max]`` there). A provider's
``retry_after_s`` pauses admissions for that long. The limit stays within
``[min, max]``; ``min == initial == max`` pins it.

Where it belongs: as a ``ConcurrencyLimit`` — a dispatch layer or a model-call layer;
outside a ``Retry`` it limits operations, inside it attempts. Callers beyond the
limit wait (``queue=None``: without bound, as a semaphore; an int bounds the waiting
queue, beyond it ``*_OVERLOADED``; ``ConcurrencyLimit(queue=0)``, by contrast, does
not wait at all), each for at most ``queue_timeout_ms``. The slots and the limit live
in the harness's ``StateStore`` (or ``store=``): with a shared one (Redis) every
process admits against one limit and moves it. ``current(key=None)`` reads the limit.
"""

from __future__ import annotations

import math
import warnings
from typing import Any, ClassVar, Final, Generic, Literal

import anyio
import attrs
from opentelemetry.util.types import AttributeValue

from guardstack.pipeline.contract import (
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
from guardstack.pipeline.signals import CONCURRENCY_LIMIT, LIMITER_QUEUE, Shadow, Signals
from guardstack.pipeline.validate import (
    StageName,
    flag,
    integer,
    invalid,
    optional_integer,
)
from guardstack.wrappers._keyed import (
    QueueMetrics,
    StateKeys,
    StoreFailures,
    check_codes,
    check_key,
    check_store,
    extra_codes,
    register,
)
from guardstack.wrappers._line import Fairness, fairness
from guardstack.wrappers.concurrency_limit import QueueFull, SlotQueue, overloaded

__all__ = ["AIMD", "AdaptiveConcurrencyLimit", "ExpAvg", "Gradient2"]

PLUGIN: Final = "adaptive-concurrency-limit"
#: The outcome codes (without their TOOL_/MODEL_ prefix) that say "too much load".
OVERLOAD: Final = frozenset({"RATE_LIMITED", "OVERLOADED", "TIMEOUT"})
UNBOUNDED: Final = 2**31
#: Gradient2's fall on an overload signal: concurrency-limits' AIMD default backoff.
BACKOFF: Final = 0.9


def _stage(value: object) -> StageName:
    return stage_of(PLUGIN, value)  # its name, or the stage itself (``MODEL``)


def _fair(value: object) -> Fairness:
    return fairness(PLUGIN, value)


def _key(value: object) -> str | None:
    return check_key(PLUGIN, value)


def _bound(name: str) -> Any:
    def check(_: Any, __: Any, value: Any) -> None:
        integer(PLUGIN, name, value)

    return check


def _algorithm(_: Any, __: Any, value: Any) -> None:
    if value not in ("aimd", "gradient2"):
        raise invalid(PLUGIN, "algorithm", value, "'aimd' or 'gradient2'")


def _codes(value: Any) -> tuple[str, ...]:
    if value is None:
        return ()
    if isinstance(value, str) or not all(isinstance(code, str) and code for code in value):
        raise invalid(PLUGIN, "on", value, "a list of result codes")
    return tuple(value)


def _optional_codes(value: object) -> tuple[str, ...] | None:
    return None if value is None else _codes(value)


def _extra_on(value: object) -> frozenset[str]:
    return extra_codes(PLUGIN, value)


def _queue(_: Any, __: Any, value: Any) -> None:
    if value is not None:
        integer(PLUGIN, "queue", value, minimum=0)


class ExpAvg:
    """concurrency-limits' ``ExpAvgMeasurement``: the plain mean of the first ``warmup``
    samples, then an exponential average over ``window`` samples."""

    __slots__ = ("count", "value", "warmup", "window")

    def __init__(self, window: int, warmup: int) -> None:
        self.window, self.warmup = window, warmup
        self.value, self.count = 0.0, 0

    def add(self, sample: float) -> float:
        if self.count < self.warmup:
            self.count += 1
            self.value += (sample - self.value) / self.count
        else:
            factor = 2 / (self.window + 1)
            self.value = self.value * (1 - factor) + sample * factor
        return self.value


class AIMD:
    """Additive increase (one slot per window of successes at full use), multiplicative
    decrease (halve) on overload."""

    __slots__ = ("high", "limit", "low", "successes")

    def __init__(self, initial: int, low: int, high: int) -> None:
        self.limit, self.low, self.high = float(initial), low, high
        self.successes = 0

    def sample(self, rtt_s: float, inflight: int, overloaded: bool) -> float:
        if overloaded:
            self.limit = max(self.low, math.floor(self.limit / 2))
            self.successes = 0
        elif inflight * 2 >= self.limit:  # in use: an idle limit proves nothing
            self.successes += 1
            if self.successes >= self.limit:
                self.limit = min(self.high, self.limit + 1)
                self.successes = 0
        return self.limit


class Gradient2:
    """Netflix concurrency-limits' Gradient2, and an overload answer taken as a drop.

    The original reads only latency: against a provider that answers 429 at a hard cap
    while its latency stays flat, its limit keeps growing past the cap (``limit ×
    gradient + queue_size`` with a gradient of 1) and every probe is a 429. Here an
    overload answer is a drop: the limit falls to just under the concurrency the
    provider refused (and at least by ``BACKOFF``), that level becomes a ceiling, and
    above the ceiling the limit grows as AIMD probes — one slot after as many successes
    as the limit — instead of by ``queue_size`` at once. Latency still moves it below
    the ceiling as in the original."""

    __slots__ = ("ceiling", "high", "limit", "long", "low", "probes", "queue_size", "smoothing")

    def __init__(
        self,
        initial: int,
        low: int,
        high: int,
        *,
        smoothing: float = 0.2,
        queue_size: int = 4,
        long_window: int = 600,
    ) -> None:
        self.limit, self.low, self.high = float(initial), low, high
        self.smoothing, self.queue_size = smoothing, queue_size
        self.long = ExpAvg(long_window, 10)
        #: Just under the concurrency the provider last refused (``None``: never refused).
        self.ceiling: float | None = None
        self.probes = 0

    def sample(self, rtt_s: float, inflight: int, overloaded: bool) -> float:
        if overloaded:  # a drop: the provider said no at ``inflight`` calls
            refused_at = max(float(self.low), min(self.limit, float(inflight)) - 1)
            self.ceiling = refused_at
            self.limit = max(float(self.low), min(self.limit * BACKOFF, refused_at))
            self.probes = 0
            return self.limit
        short = max(rtt_s, 1e-9)
        long = self.long.add(short)
        if long / short > 2:  # back from overload: the baseline follows quickly
            self.long.value *= 0.9
        if inflight < self.limit / 2:  # application-limited: nothing learned
            return self.limit
        gradient = max(0.5, min(1.0, long / short))
        estimate = self.limit * gradient + self.queue_size
        estimate = self.limit * (1 - self.smoothing) + estimate * self.smoothing
        ceiling = self.ceiling
        if ceiling is not None and estimate > ceiling:
            self.probes += 1  # above the last refusal: probe one slot at a time
            if self.probes >= ceiling:
                self.ceiling = ceiling = ceiling + 1
                self.probes = 0
            estimate = min(estimate, ceiling)
        self.limit = max(float(self.low), min(float(self.high), estimate))
        return self.limit


@attrs.frozen
class AdaptiveConcurrencyLimit:
    """A concurrency limit that finds the provider's capacity (see the module docstring)."""

    name: ClassVar[str] = PLUGIN

    stage: StageName = attrs.field(default="dispatch", converter=_stage, kw_only=True)
    initial: int = attrs.field(default=4, validator=_bound("initial"))
    min: int = attrs.field(default=1, validator=_bound("min"))
    max: int = attrs.field(default=64, validator=_bound("max"))
    algorithm: Literal["aimd", "gradient2"] = attrs.field(default="aimd", validator=_algorithm)
    #: Deprecated: more codes that count as overload, besides rate limits, overloads and
    #: timeouts. ``on=`` replaces the defaults in every other layer; write ``extra_on=``.
    on: tuple[str, ...] | None = attrs.field(default=None, converter=_optional_codes)
    queue: int | None = attrs.field(default=None, validator=_queue)
    #: More codes that count as overload, besides rate limits, overloads and timeouts.
    extra_on: frozenset[str] = attrs.field(default=frozenset(), converter=_extra_on, kw_only=True)
    queue_timeout_ms: int | None = attrs.field(
        default=None, validator=optional_integer(PLUGIN, "queue_timeout_ms")
    )
    key: str | None = attrs.field(default=None, converter=_key, kw_only=True)
    store: StateStore | None = attrs.field(
        default=None, validator=check_store(PLUGIN), kw_only=True, repr=False
    )
    #: Tenants take weighted turns in the queue within a priority (``True``: equal weights).
    fair: Fairness = attrs.field(default=None, converter=_fair, kw_only=True)
    #: Decide as usual, record what it would have done, let every call through.
    shadow: bool = attrs.field(default=False, validator=flag(PLUGIN, "shadow"), kw_only=True)
    _applied: list[_Limits[Any, Any, Any]] = attrs.field(
        init=False, factory=list, repr=False, eq=False
    )

    def __attrs_post_init__(self) -> None:
        if self.on is not None:
            warnings.warn(
                "AdaptiveConcurrencyLimit: on= adds to the overload codes here, while in "
                "CircuitBreaker and Fallback it replaces the defaults; write extra_on= "
                "(deprecated in 0.2; in 0.3 on= replaces them here too)",
                DeprecationWarning,
                stacklevel=3,
            )
            # folded once: a copy (``attrs.evolve``) neither warns nor adds again
            object.__setattr__(self, "extra_on", self.extra_on | frozenset(self.on))
            object.__setattr__(self, "on", None)
        check_codes(PLUGIN, "extra_on", self.stage, self.extra_on)
        if not self.min <= self.initial <= self.max:
            raise invalid(
                PLUGIN,
                "initial",
                self.initial,
                f"between min ({self.min}) and max ({self.max})",
            )

    def current(self, key: str | None = None) -> int:
        """The limit now (of the tool or model ``key``; ``None``: the only one, or the
        shared ``key=``), as the most recent application of this plugin has it."""
        if not self._applied:
            return self.initial
        return self._applied[-1].current(key)

    def apply(self, scope: Scope) -> None:
        """Register a fresh limit (``initial``, all slots free) on the stage it names."""
        limits: _Limits[Any, Any, Any] = _Limits(
            self, scope.store_for(self.store), scope.namespace, scope.signals
        )
        scope.adopt(scope.signals.gauge(CONCURRENCY_LIMIT, limits.observed))
        scope.adopt(scope.signals.gauge(LIMITER_QUEUE, limits.slots.observed))
        self._applied.append(limits)
        scope.on_dispose(lambda: self._applied.remove(limits))
        register(scope, self.stage, limits, PLUGIN)


#: Keys whose limit this process remembers (and reports as a gauge series), at most:
#: the least recently used idle ones go first (they start again from the shared limit).
_MAX_KEYS: Final = 10_000


class _State:
    """One key's algorithm and bookkeeping in this process."""

    __slots__ = ("algorithm", "inflight", "limit", "paused_until", "version")

    def __init__(self, config: AdaptiveConcurrencyLimit) -> None:
        make = AIMD if config.algorithm == "aimd" else Gradient2
        self.algorithm: AIMD | Gradient2 = make(config.initial, config.min, config.max)
        self.limit = float(config.initial)
        self.version = 0  # the shared limit's version: each decrease moves it
        self.inflight = 0
        self.paused_until = -math.inf


class _Limits(Generic[ItemT, ValueT, OutcomeT]):
    """One application: the layer, the slots and each key's adaptive limit."""

    def __init__(
        self,
        config: AdaptiveConcurrencyLimit,
        store: StateStore,
        namespace: str,
        signals: Signals,
    ) -> None:
        self.config = config
        self.stage: StageAdapter[ItemT, ValueT, OutcomeT] = adapter_for(config.stage)
        self.store = store
        self.namespace = namespace
        self.keys = StateKeys(namespace, config.key, self.stage, "slots")
        self.limit_keys = StateKeys(namespace, config.key, self.stage, "limit")
        self.slots = SlotQueue(store, QueueMetrics(signals, self.keys, PLUGIN), config.fair)
        self.failures = StoreFailures(PLUGIN, store, "open", signals)
        #: Each name's (tool's, model's, or the shared key's) state, least recently used first.
        self.states: dict[str, _State] = {}
        self.signals = OVERLOAD | config.extra_on
        self.shadow = Shadow(namespace, signals) if config.shadow else None

    def __repr__(self) -> str:
        return repr(self.config)

    def observed(self) -> list[tuple[float, dict[str, AttributeValue]]]:
        """``guardstack.concurrency.limit``: each key's limit now."""
        return [
            (self._clamped(state.limit), {"key": name, "guardstack.layer": PLUGIN})
            for name, state in list(self.states.items())
        ]

    def current(self, name: str | None) -> int:
        if name is None:
            if not self.states:
                return self.config.initial
            state = next(reversed(self.states.values()))
        else:
            found = self.states.get(self.config.key if self.config.key is not None else name)
            if found is None:
                return self.config.initial
            state = found
        return self._clamped(state.limit)

    def _clamped(self, limit: float) -> int:
        return max(self.config.min, min(self.config.max, math.floor(limit)))

    def _state(self, name: str) -> _State:
        states = self.states
        state = states.pop(name, None)
        if state is None:
            state = _State(self.config)
            if len(states) >= _MAX_KEYS:
                idle = next((key for key, known in states.items() if not known.inflight), None)
                if idle is not None:
                    del states[idle]
        states[name] = state  # the most recently used last
        return state

    async def _shared_limit(self, name: str, state: _State) -> float:
        """The limit every process sharing the store admits against, and its version."""
        try:
            value, version = await self.store.read_limit(
                self.limit_keys.of(name), self.config.initial
            )
        except Exception as error:
            self.failures.fails_open(error)
            return state.limit
        state.limit, state.version = value, version
        return value

    async def _move(
        self, name: str, state: _State, version: int, after: float, decrease: bool
    ) -> None:
        """Move the shared limit to ``after`` if no decrease happened since this call was
        admitted (``version``); a decrease starts a new version."""
        config = self.config
        try:
            value, state.version = await self.store.swap_limit(
                self.limit_keys.of(name),
                version,
                after,
                config.min,
                config.max,
                bump=decrease,
            )
        except Exception as error:
            self.failures.fails_open(error)
            if state.version == version:
                state.limit = max(float(config.min), min(float(config.max), after))
                state.version += decrease
            return
        state.limit = value

    async def __call__(self, item: ItemT, call_next: Next[ItemT, ValueT]) -> ValueT:
        config, stage = self.config, self.stage
        key = self.keys(item)
        name = config.key if config.key is not None else item.key
        state = self._state(name)
        wait = state.paused_until - anyio.current_time()
        if wait > 0:
            await anyio.sleep(wait)  # the provider said when to come back
        limit = self._clamped(await self._shared_limit(name, state))
        timeout_ms = config.queue_timeout_ms
        if self.shadow is not None:  # it learns as usual; the call never waits
            return await self._shadowed(item, call_next, key, name, state, limit)
        try:
            lease = await self.slots.acquire(
                key,
                limit,
                UNBOUNDED if config.queue is None else config.queue,
                None if timeout_ms is None else timeout_ms / 1000,
                lambda: self._clamped(state.limit),  # a waiter sees the limit as it is now
                item,
                stage,
            )
        except QueueFull as full:
            return stage.deliver(self._refusal(item, full.reason))
        except Exception as error:
            if not self.failures.fails_open(error):
                return stage.deliver(self._refusal(item, self.failures.reason()))
            return await call_next(item)
        version = state.version
        state.inflight += 1
        inflight = state.inflight
        started = anyio.current_time()
        try:
            outcome = await stage.attempt(call_next, item)
            rtt_s = anyio.current_time() - started
            await self._learn(name, state, outcome, rtt_s, inflight, version)
        finally:
            state.inflight -= 1
            try:
                await self.slots.release(key, lease)
            except Exception as error:
                self.failures.fails_open(error)
        return stage.deliver(outcome)

    async def _shadowed(
        self,
        item: ItemT,
        call_next: Next[ItemT, ValueT],
        key: str,
        name: str,
        state: _State,
        limit: int,
    ) -> ValueT:
        """In shadow mode: a free slot is taken as usual, the limit learns from every
        outcome; a call that would have waited runs at once, and that is recorded."""
        stage = self.stage
        assert self.shadow is not None
        try:
            lease = await self.slots.store.acquire(key, limit)
        except Exception as error:
            self.failures.fails_open(error)
            lease = None
        if lease is None:
            self.shadow.would("wait", item.label, f"{limit} calls are running, its limit now")
        version = state.version
        state.inflight += 1
        inflight = state.inflight
        started = anyio.current_time()
        try:
            outcome = await stage.attempt(call_next, item)
            await self._learn(name, state, outcome, anyio.current_time() - started, inflight,
                              version)  # fmt: skip
        finally:
            state.inflight -= 1
            if lease is not None:
                try:
                    await self.slots.release(key, lease)
                except Exception as error:
                    self.failures.fails_open(error)
        return stage.deliver(outcome)

    async def _learn(
        self,
        name: str,
        state: _State,
        outcome: OutcomeT,
        rtt_s: float,
        inflight: int,
        version: int,
    ) -> None:
        failed = self.stage.failure_of(outcome)
        if failed is not None and failed.control:
            return  # guardstack's own answer says nothing about the provider
        code = failed.code if failed is not None else None
        bare = code.split("_", 1)[1] if code and "_" in code else code
        overloaded = code is not None and (bare in self.signals or code in self.signals)
        wait = failed.retry_after_s if failed is not None else None
        if wait is not None and wait > 0:
            state.paused_until = max(state.paused_until, anyio.current_time() + wait)
        if version < state.version:
            return  # admitted before the last decrease: that storm was counted
        before = state.limit
        state.algorithm.limit = before
        after = state.algorithm.sample(rtt_s, inflight, overloaded)
        if after != before or overloaded:
            await self._move(name, state, version, after, overloaded)

    def _refusal(self, item: ItemT, reason: str) -> OutcomeT:
        return overloaded(self.stage, item, reason, PLUGIN)
