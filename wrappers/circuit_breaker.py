"""CircuitBreaker: stop calling a tool (or model) whose backend is down, and say so at once.

Where it belongs: a dispatch layer (``stage="dispatch"``) or a model-call layer
(``stage="model"``). **Its position is its meaning.** Outside a ``Retry`` it counts
*operations* (a call retried three times is one failure); inside it counts
*attempts* (the same call is three failures, so the breaker opens three times as
fast — resilience4j's documented trap, here a choice you make by order). Outside a
``Timeout`` it sees the timeout's ``TOOL_TIMEOUT``; inside one, a hung call is
cancelled before the breaker sees a result and counts as nothing.

How it decides, per tool (per model; one shared breaker with ``key=``):

* **closed**: calls pass; their outcomes are kept for ``window_s`` seconds (by when
  they finished; the window is pruned by the current time). Once at least
  ``minimum_calls`` are in the window and the share of outcomes with a code in
  ``on`` reaches ``failure_ratio``, it opens;
* **open**: for ``break_s`` seconds every call gets ``TOOL_UNAVAILABLE`` at once
  (on the model stage ``ModelError(MODEL_UNAVAILABLE)``), with a text telling the
  model the tool is down and when to try again, and ``retry_after_s`` — no call
  waits out its budget against a dead backend;
* **half-open**: then one probe call goes through (others are still refused; with a
  shared store, one probe across every process); its success closes the breaker,
  its failure opens it again for another ``break_s``. A cancelled probe lets the
  next call probe.

guardstack's own control flow is never counted: a cap's ``TurnBlocked``, a denial,
another layer's refusal (a rate limit inside it that said no) pass through as they
are. State is kept in the harness's ``StateStore`` (or ``store=``); a store that
fails lets calls through (``on_error`` of the store says otherwise).
"""

from __future__ import annotations

import math
from typing import Any, ClassVar, Final, Generic

import anyio
import attrs
from opentelemetry.util.types import AttributeValue

from guardstack.pipeline.contract import (
    Control,
    FailureKind,
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
from guardstack.pipeline.signals import BREAKER_STATE, BREAKER_TRANSITIONS, Shadow, Signals
from guardstack.pipeline.store import BreakerState
from guardstack.pipeline.validate import StageName, codes, flag, integer
from guardstack.wrappers._keyed import (
    StateKeys,
    StoreFailures,
    check_key,
    check_store,
    codes_of,
    extra_codes,
    positive,
    ratio,
    register,
    stage_repr,
    suspends,
    with_extra_codes,
)

__all__ = ["CircuitBreaker"]

PLUGIN = "circuit-breaker"


_DEFAULT_ON: Final[dict[str, tuple[FailureKind, ...]]] = {
    "dispatch": ("TIMEOUT", "FAILED"),
    "model": ("TIMEOUT", "UNAVAILABLE", "FAILED"),
}


def _default_on(self: CircuitBreaker) -> frozenset[str]:
    return codes_of(self.stage, _DEFAULT_ON)


def _minimum_calls(_: Any, __: Any, value: Any) -> None:
    integer(PLUGIN, "minimum_calls", value)


def _stage(value: object) -> StageName:
    return stage_of(PLUGIN, value)  # its name, or the stage itself (``MODEL``)


def _on(value: object) -> frozenset[str]:
    return codes(PLUGIN, "on", value)


def _extra_on(value: object) -> frozenset[str]:
    return extra_codes(PLUGIN, value)


def _key(value: object) -> str | None:
    return check_key(PLUGIN, value)


@attrs.frozen
class CircuitBreaker:
    """Opens at ``failure_ratio`` of the calls in ``window_s``; probes after ``break_s``."""

    name: ClassVar[str] = PLUGIN

    stage: StageName = attrs.field(default="dispatch", converter=_stage, kw_only=True)
    failure_ratio: float = attrs.field(default=0.5, validator=ratio(PLUGIN, "failure_ratio"))
    minimum_calls: int = attrs.field(default=10, validator=_minimum_calls)
    window_s: float = attrs.field(default=30.0, validator=positive(PLUGIN, "window_s"))
    break_s: float = attrs.field(default=30.0, validator=positive(PLUGIN, "break_s"))
    #: The codes that count (``on=`` replaces the defaults; ``extra_on=`` adds to them).
    on: frozenset[str] = attrs.field(
        default=attrs.Factory(_default_on, takes_self=True), converter=_on
    )
    extra_on: frozenset[str] = attrs.field(
        default=frozenset(), converter=_extra_on, kw_only=True, repr=False
    )
    #: One breaker shared by every call under this name, instead of one per tool.
    key: str | None = attrs.field(default=None, converter=_key, kw_only=True)
    #: Where the breakers live (``None``: the harness's store).
    store: StateStore | None = attrs.field(
        default=None, validator=check_store(PLUGIN), kw_only=True, repr=False
    )
    #: Decide as usual, record what it would have done, let every call through.
    shadow: bool = attrs.field(default=False, validator=flag(PLUGIN, "shadow"), kw_only=True)

    def __attrs_post_init__(self) -> None:
        with_extra_codes(self, PLUGIN)

    def __repr__(self) -> str:
        where = stage_repr(self.stage)
        shared = f", key={self.key!r}" if self.key is not None else ""
        return (
            f"CircuitBreaker(failure_ratio={self.failure_ratio}, minimum_calls="
            f"{self.minimum_calls}, window_s={self.window_s}, break_s={self.break_s}, "
            f"on={sorted(self.on)}{where}{shared})"
        )

    def apply(self, scope: Scope) -> None:
        """Register a fresh set of breakers (closed) on the stage it names."""
        store = scope.store_for(self.store)
        breakers: _Breakers[Any, Any, Any] = _Breakers(self, store, scope.namespace, scope.signals)
        breakers.control, breakers.plugin_id = scope.control, scope.plugin_id
        scope.adopt(scope.signals.gauge(BREAKER_STATE, breakers.observed))
        if scope.control is not None:  # a health-aware Fallback asks it
            scope.adopt(scope.control.watch_breakers(breakers.open_for))
        register(scope, self.stage, breakers, PLUGIN)


_STATE_VALUE: dict[str, float] = {"closed": 0.0, "half_open": 1.0, "open": 2.0}
_TO: dict[str, dict[str, AttributeValue]] = {state: {"to": state} for state in _STATE_VALUE}
#: Breakers whose state the gauge reports, at most.
_MAX_REPORTED: Final = 10_000


def _back(wait_s: float) -> str:
    if wait_s <= 0:
        return "Do without it for now."
    return f"Try again in {math.ceil(wait_s)}s, or do without it."


def _why(what: str, wait_s: float) -> str:
    if wait_s <= 0:
        return (
            f"{what} is unavailable: it has been failing, and a test call to see whether it "
            "is back is in progress. Try again in a few seconds, or do without it."
        )
    return (
        f"{what} is unavailable: it has been failing, so calls to it are stopped for now. "
        f"Try again in {math.ceil(wait_s)}s, or do without it."
    )


class _Breakers(Generic[ItemT, ValueT, OutcomeT]):
    """One application: the layer, on either stage, over breakers kept in a store."""

    __slots__ = ("config", "control", "failures", "keys", "namespace", "open_until",
                 "plugin_id", "shadow", "shield", "signals", "stage", "states",
                 "store")  # fmt: skip

    def __init__(
        self, config: CircuitBreaker, store: StateStore, namespace: str, signals: Signals
    ) -> None:
        self.config = config
        self.stage: StageAdapter[ItemT, ValueT, OutcomeT] = adapter_for(config.stage)
        self.store = store
        self.namespace = namespace
        self.keys = StateKeys(namespace, config.key, self.stage, "breaker")
        self.shield = suspends(store)
        self.failures = StoreFailures(PLUGIN, store, "open", signals)
        self.signals = signals
        self.shadow = Shadow(namespace, signals) if config.shadow else None
        #: An operator's overrides (``Harness.control``), and the id they name it by.
        self.control: Control | None = None
        self.plugin_id = namespace
        #: When (anyio time) each breaker this process saw open lets a probe through.
        self.open_until: dict[str, float] = {}
        #: The state this process last saw of each breaker that ever left closed.
        self.states: dict[str, BreakerState] = {}

    def observed(self) -> list[tuple[float, dict[str, AttributeValue]]]:
        """``guardstack.breaker.state``: 0 closed, 1 half-open, 2 open, per breaker."""
        return [
            (_STATE_VALUE[state], {"key": key, "guardstack.plugin": self.namespace})
            for key, state in self.states.items()
        ]

    def _seen_open(self, key: str, wait_s: float = 0.0) -> None:
        """Refused: the breaker is open, whoever opened it (another process, through a
        shared store, counts its own transition)."""
        name = self.keys.name_of(key)
        self._opened(name, wait_s)
        if self.states.get(name) != "open":
            self._remember(name, "open")

    def _opened(self, name: str, wait_s: float) -> None:
        known = self.open_until
        known.pop(name, None)  # the most recently opened last
        known[name] = anyio.current_time() + max(wait_s, 0.0)
        while len(known) > _MAX_REPORTED:  # the longest-known go first: bounded, O(1)
            del known[next(iter(known))]

    def open_for(self, name: str) -> float | None:
        """How long until this breaker lets a call to ``name`` try (as this process last
        saw it), or ``None``: closed, or its break is over."""
        until = self.open_until.get(self.keys.shared or name)
        if until is None:
            return None
        left = until - anyio.current_time()
        return left if left > 0 else None

    def _remember(self, name: str, state: BreakerState) -> None:
        """Keep ``name``'s state for the gauge; past ``_MAX_REPORTED`` breakers, closed ones
        are forgotten first, then the longest-known (a gauge series per tool of 100,000
        would swamp any backend)."""
        states = self.states
        states.pop(name, None)
        states[name] = state
        if len(states) > _MAX_REPORTED:
            for closed in [key for key, known in states.items() if known == "closed"]:
                del states[closed]
            while len(states) > _MAX_REPORTED:
                del states[next(iter(states))]

    def _changed(self, key: str, state: BreakerState) -> None:
        name = self.keys.name_of(key)
        before = self.states.get(name, "closed")
        if before == state:
            return
        self._remember(name, state)
        if state == "open":
            self._opened(name, self.config.break_s)
        else:
            self.open_until.pop(name, None)
        signals = self.signals
        # by the state entered only: a series per tool would swamp a backend (the event
        # names the tool)
        signals.add(BREAKER_TRANSITIONS, 1, _TO[state])
        signals.event(
            "guardstack.breaker.state_change",
            {
                "guardstack.breaker.key": name,
                "guardstack.breaker.from": before,
                "guardstack.breaker.to": state,
                "guardstack.plugin": self.namespace,
            },
            "WARN" if state == "open" else "INFO",
        )

    def __repr__(self) -> str:
        return repr(self.config)

    async def __call__(self, item: ItemT, call_next: Next[ItemT, ValueT]) -> ValueT:
        config, stage, store = self.config, self.stage, self.store
        key = self.keys(item)
        control = self.control
        if control is not None and control.breakers:
            held = control.breaker(self.plugin_id, self.keys.name_of(key))
            if held == "closed":  # an operator holds it closed: it never refuses
                return await call_next(item)
            if held is not None:  # forced open, or isolated
                reason = "an operator holds it open"
                if self.shadow is not None:
                    self.shadow.would("refuse", item.label, reason)
                    return await call_next(item)
                wait_s = control.wait_s(self.plugin_id, self.keys.name_of(key))
                return stage.deliver(self._refusal(item, wait_s, f"{reason}. {_back(wait_s)}"))
        try:
            admission = await store.admit(key, config.break_s)
        except Exception as error:
            if not self.failures.fails_open(error):
                return stage.deliver(self._refusal(item, 0.0, self.failures.reason()))
            return await call_next(item)
        if not admission.admitted:
            self._seen_open(key, admission.wait_s)
            if self.shadow is not None:  # it would answer at once; the call goes on, uncounted
                self.shadow.would("refuse", item.label, "the breaker is open")
                return await call_next(item)
            return stage.deliver(self._refusal(item, admission.wait_s))
        if admission.probe:
            self._changed(key, "half_open")
        try:
            outcome = await stage.attempt(call_next, item)
        except BaseException:
            if admission.probe:
                await self._release_probe(key)
            raise
        failure = stage.failure_of(outcome)
        if failure is not None and failure.control:
            if admission.probe:  # guardstack's own answer says nothing about the backend
                await self._release_probe(key)
        else:
            failed = failure is not None and failure.code in config.on
            try:
                changed = await store.record(
                    key,
                    failed,
                    admission.probe,
                    window_s=config.window_s,
                    minimum_calls=config.minimum_calls,
                    failure_ratio=config.failure_ratio,
                )
            except Exception as error:
                self.failures.fails_open(error)  # the call already ran: its outcome stands
            else:
                if changed is not None:
                    self._changed(key, changed)
        return stage.deliver(outcome)

    async def _release_probe(self, key: str) -> None:
        try:
            with anyio.CancelScope(shield=self.shield):
                await self.store.release_probe(key)
        except Exception as error:
            self.failures.fails_open(error)

    def _refusal(self, item: ItemT, wait_s: float, why: str | None = None) -> OutcomeT:
        what = item.label
        message = f"{what} is unavailable: {why}" if why else _why(what, wait_s)
        return refusal(
            self.stage,
            item,
            "UNAVAILABLE",
            message,
            layer=PLUGIN,
            name="CircuitOpenError",
            retry_after_s=wait_s or None,
        )
