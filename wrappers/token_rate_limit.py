"""TokenRateLimit: what providers really limit — tokens (and requests) per minute.

A limit that counts calls lets a burst of long prompts through; a limit that checks
before and counts after lets concurrent requests walk through together. This one
*reserves* each request's estimated tokens — its input (a token per four characters)
plus its output limit (the model's ``max_tokens``, else ``estimate_output_tokens``) —
in a sliding minute kept in the store's ledger, before the request is sent, and
settles what the reply reports after it. So in any sixty seconds the tokens admitted
never pass ``tokens_per_minute`` by more than one call's estimation error, however
many calls run at once and in however many processes share the store (``RedisStore``).
``requests_per_minute`` counts requests in the same minute, all or none with the
tokens.

A request that would pass a limit waits in line (``wait=True``: cancellably, the
highest priority first, first come first served within a priority, or tenants in
weighted turns with ``fair=``) until enough of the minute has slid by; with
``wait=False`` it is refused at once — ``MODEL_RATE_LIMITED`` with ``retry_after_s``,
which a ``Retry`` outside honours. A request larger than the limit itself can never
pass and is refused without a wait. What the reply used replaces the estimate; a call
that never reached the provider (another layer's refusal, the provider's own 429 or
400) gives its reservation back; one that may have reached it (a timeout, a cancelled
caller) stays charged its estimate.

Where it belongs: a model-stage layer (``stage="model"``, the default; on the dispatch
stage it counts a tool's calls per minute and tokens as zero). Outside a ``Retry`` one
reservation covers the whole retried operation; inside it every attempt reserves (and
a 429 gives its reservation back), which is what the provider counts. Outside a
``Timeout`` the wait in line does not count against the budget; inside one it does.
Per model (one shared minute with ``key=``). A store that fails lets calls through
(its ``on_error`` may say otherwise).
"""

from __future__ import annotations

import math
from typing import Any, ClassVar, Generic

import anyio
import attrs

from guardstack.pipeline.contract import (
    ItemT,
    Ledger,
    ModelReply,
    ModelRequest,
    Next,
    OutcomeT,
    Scope,
    StageAdapter,
    StateStore,
    ValueT,
    Window,
    adapter_for,
    answering_model,
    input_estimate,
    never_reached,
    new_token,
    stage_of,
    stated_output_limit,
    store_key,
)
from guardstack.pipeline.outcome import refusal
from guardstack.pipeline.signals import Shadow
from guardstack.pipeline.validate import (
    StageName,
    boolean,
    flag,
    invalid,
    optional_integer,
)
from guardstack.wrappers._keyed import StateKeys, StoreFailures, check_key, check_store, register
from guardstack.wrappers._line import Fairness, WaitLine, fairness

__all__ = ["TokenRateLimit"]

PLUGIN = "token-rate-limit"
#: The window the limits slide over.
MINUTE_S = 60.0
#: How long a reservation may be settled: past two minutes its minute has slid by.
LEASE_S = 2 * MINUTE_S
_SHORTEST_WAIT_S = 1e-6


def _stage(value: object) -> StageName:
    return stage_of(PLUGIN, value)  # its name, or the stage itself (``MODEL``)


def _key(value: object) -> str | None:
    return check_key(PLUGIN, value)


def _fair(value: object) -> Fairness:
    return fairness(PLUGIN, value)


def _wait(_: Any, __: Any, value: Any) -> None:
    boolean(PLUGIN, "wait", value)


def _limit(_: Any, attribute: Any, value: Any) -> None:
    optional_integer(PLUGIN, attribute.name)(_, attribute, value)


@attrs.frozen
class TokenRateLimit:
    """At most ``tokens_per_minute`` tokens and ``requests_per_minute`` requests in any
    sliding minute, reserved before each request and settled after it."""

    name: ClassVar[str] = PLUGIN
    #: What an operator may change at run time (``harness.control.set_limit``).
    controllable: ClassVar[frozenset[str]] = frozenset({"tokens_per_minute", "requests_per_minute"})

    stage: StageName = attrs.field(default="model", converter=_stage, kw_only=True)
    tokens_per_minute: int | None = attrs.field(default=None, validator=_limit)
    requests_per_minute: int | None = attrs.field(default=None, validator=_limit)
    #: One minute shared by every call under this name, instead of one per model.
    key: str | None = attrs.field(default=None, converter=_key)
    wait: bool = attrs.field(default=True, validator=_wait)
    #: What a request that states no output limit reserves for its output.
    estimate_output_tokens: int = attrs.field(
        default=1_000, kw_only=True, validator=optional_integer(PLUGIN, "estimate_output_tokens")
    )
    #: Tenants take weighted turns in the line within a priority (``True``: equal weights).
    fair: Fairness = attrs.field(default=None, converter=_fair, kw_only=True)
    #: Where the minute is kept (``None``: the harness's store); it must keep a ledger.
    store: StateStore | None = attrs.field(
        default=None, validator=check_store(PLUGIN), kw_only=True, repr=False
    )
    #: Decide as usual, record what it would have done, let every call through.
    shadow: bool = attrs.field(default=False, validator=flag(PLUGIN, "shadow"), kw_only=True)

    def __attrs_post_init__(self) -> None:
        if self.tokens_per_minute is None and self.requests_per_minute is None:
            raise invalid(
                PLUGIN,
                "tokens_per_minute",
                None,
                "set, or requests_per_minute (a limit of nothing limits nothing)",
            )
        if self.store is not None and not isinstance(self.store, Ledger):
            raise invalid(PLUGIN, "store", self.store, "a store that keeps a ledger")

    def apply(self, scope: Scope) -> None:
        """Register a fresh minute (empty) on the stage it names."""
        limiter: _Minutes[Any, Any, Any] = _Minutes(self, scope)
        register(scope, self.stage, limiter, PLUGIN)


class _Minutes(Generic[ItemT, ValueT, OutcomeT]):
    """One application: the layer, its windows per key, and its lines of waiters."""

    __slots__ = (
        "config",
        "control",
        "failures",
        "keys",
        "ledger",
        "lines",
        "operation",
        "plugin_id",
        "remote",
        "shadow",
        "stage",
        "windows_of",
    )

    def __init__(self, config: TokenRateLimit, scope: Scope) -> None:
        self.config = config
        self.stage: StageAdapter[ItemT, ValueT, OutcomeT] = adapter_for(config.stage)
        store = scope.store_for(config.store)
        self.ledger: Ledger = scope.ledger_for(config.store)
        self.keys = StateKeys(scope.namespace, config.key, self.stage, "minute")
        self.failures = StoreFailures(PLUGIN, store, "open", scope.signals)
        self.lines: dict[str, WaitLine] = {}
        self.operation = store_key(scope.namespace, "op") + ":"
        #: A store that suspends (a remote one): a call whose reservation is exactly its
        #: charge (a tool call: one request, no tokens) sends no settlement — the
        #: reservation stands and its record expires with its lease — so it costs one
        #: round trip.
        self.remote = bool(getattr(store, "suspends", True))
        #: Each key's windows, made once (a key per model: few).
        self.windows_of: dict[str, list[Window]] = {}
        self.shadow = Shadow(scope.namespace, scope.signals) if config.shadow else None
        self.control = scope.control
        self.plugin_id = scope.plugin_id

    def __repr__(self) -> str:
        config = self.config
        limits = [
            f"{name}={value}"
            for name, value in (
                ("tokens_per_minute", config.tokens_per_minute),
                ("requests_per_minute", config.requests_per_minute),
            )
            if value is not None
        ]
        return f"TokenRateLimit({', '.join(limits)})"

    def windows(self, key: str, name: str) -> list[Window]:
        control = self.control
        if control is not None and control.limits:  # an operator's numbers, if any
            tokens = control.limit(self.plugin_id, name, "tokens_per_minute")
            requests = control.limit(self.plugin_id, name, "requests_per_minute")
            if tokens is not None or requests is not None:
                return self._windows(key, tokens, requests)
        known = self.windows_of.get(key)
        if known is not None:
            return known
        if len(self.windows_of) >= 10_000:
            self.windows_of.clear()
        found = self.windows_of[key] = self._windows(key, None, None)
        return found

    def _windows(self, key: str, tokens: float | None, requests: float | None) -> list[Window]:
        """The key's windows, at the configured limits or an operator's."""
        config, found = self.config, []
        tokens = tokens if tokens is not None else config.tokens_per_minute
        requests = requests if requests is not None else config.requests_per_minute
        if tokens is not None:
            found.append(Window(f"{key}:tokens", "tokens", tokens, MINUTE_S * 2, slide_s=MINUTE_S))
        if requests is not None:
            found.append(
                Window(f"{key}:requests", "calls", requests, MINUTE_S * 2, slide_s=MINUTE_S)
            )
        return found

    def estimate(self, item: ItemT) -> dict[str, float]:
        if not isinstance(item, ModelRequest):  # a tool call: counted as a request only
            return {"tokens": 0.0, "calls": 1.0}
        output = stated_output_limit(answering_model(item)) or self.config.estimate_output_tokens
        return {"tokens": float(input_estimate(item.messages) + output), "calls": 1.0}

    async def __call__(self, item: ItemT, call_next: Next[ItemT, ValueT]) -> ValueT:
        stage = self.stage
        key = self.keys(item)
        windows = self.windows(key, item.key)
        amounts = self.estimate(item)
        op_id = self.operation + new_token()
        if self.shadow is not None:
            return await self._shadowed(item, call_next, op_id, amounts, windows)
        try:
            refusal = await self._admit(item, key, op_id, amounts, windows)
        except Exception as error:
            if not self.failures.fails_open(error):
                return stage.deliver(self._refusal(item, None, self.failures.reason()))
            return await call_next(item)
        if refusal is not None:
            return stage.deliver(refusal)
        outcome = await self._attempt(item, call_next, op_id)
        return stage.deliver(outcome)

    async def _shadowed(
        self,
        item: ItemT,
        call_next: Next[ItemT, ValueT],
        op_id: str,
        amounts: dict[str, float],
        windows: list[Window],
    ) -> ValueT:
        """In shadow mode: reserved as usual when there is room (so the minute counts what
        it would count); when there is none, recorded, and the call runs uncounted."""
        try:
            reservation = await self.ledger.reserve(op_id, amounts, windows, lease_s=LEASE_S)
        except Exception as error:
            self.failures.fails_open(error)
            return await call_next(item)
        if not reservation.granted:
            decision = "wait" if self.config.wait and reservation.retry_after_s else "refuse"
            shadow = self.shadow
            assert shadow is not None
            shadow.would(decision, item.label, self._why(reservation))
            return await call_next(item)
        return self.stage.deliver(await self._attempt(item, call_next, op_id))

    async def _attempt(self, item: ItemT, call_next: Next[ItemT, ValueT], op_id: str) -> OutcomeT:
        # cancelled: it may have reached the provider, and stays charged its estimate
        outcome = await self.stage.attempt(call_next, item)
        try:
            if self.remote:  # a cancelled caller's call is still settled
                with anyio.CancelScope(shield=True):
                    await self._settle(op_id, outcome)
            else:  # answers without suspending: nothing can cancel it
                await self._settle(op_id, outcome)
        except Exception as error:
            self.failures.fails_open(error)
        return outcome

    async def _settle(self, op_id: str, outcome: OutcomeT) -> None:
        failed = self.stage.failure_of(outcome)
        if failed is not None:
            error = outcome if isinstance(outcome, BaseException) else None
            if (error is not None and never_reached(error)) or failed.control:
                await self.ledger.release(op_id)
            else:
                await self.ledger.settle(op_id, {})  # it may have been billed: as reserved
            return
        if not isinstance(outcome, ModelReply):
            if not self.remote:  # a tool call: reserved what it cost (one request)
                await self.ledger.settle(op_id, {})
            return
        usage = getattr(outcome, "usage", None)
        if usage is None:
            await self.ledger.settle(op_id, {})  # unknown usage: charged its estimate
            return
        await self.ledger.settle(op_id, {"tokens": float(usage.total_tokens)})

    async def _admit(
        self,
        item: ItemT,
        key: str,
        op_id: str,
        amounts: dict[str, float],
        windows: list[Window],
    ) -> OutcomeT | None:
        """Reserve now, or wait in line for room (or refuse): ``None`` once reserved."""
        line = self.lines.get(key)
        if line is None:
            reservation = await self.ledger.reserve(op_id, amounts, windows, lease_s=LEASE_S)
            if reservation.granted:
                return None
            if reservation.retry_after_s is None or not self.config.wait:
                return self._refusal(item, reservation.retry_after_s, self._why(reservation))
            line = self.lines.get(key)
            if line is None:
                line = self.lines[key] = WaitLine(self.config.fair)
        elif not self.config.wait:
            reservation = await self.ledger.reserve(op_id, amounts, windows, lease_s=LEASE_S)
            if reservation.granted:
                return None
            return self._refusal(item, reservation.retry_after_s, self._why(reservation))
        return await self._wait_in_line(item, key, line, op_id, amounts, windows)

    async def _wait_in_line(
        self,
        item: ItemT,
        key: str,
        line: WaitLine,
        op_id: str,
        amounts: dict[str, float],
        windows: list[Window],
    ) -> OutcomeT | None:
        waiter = line.join(item.queue_priority, item.owner)
        try:
            while True:
                while line.head() is not waiter:
                    waiter.event = anyio.Event()
                    await waiter.event.wait()
                reservation = await self.ledger.reserve(op_id, amounts, windows, lease_s=LEASE_S)
                if reservation.granted:
                    line.admitted(waiter)
                    return None
                if reservation.retry_after_s is None:  # larger than the limit: never
                    return self._refusal(item, None, self._why(reservation))
                waiter.event = anyio.Event()
                # Woken early when one of a higher priority comes first (it is the head
                # then, and this caller waits its turn again).
                with anyio.move_on_after(max(reservation.retry_after_s, _SHORTEST_WAIT_S)):
                    await waiter.event.wait()
        finally:
            line.leave(waiter)  # wakes the line's head, whoever it is now
            if not line and self.lines.get(key) is line:
                del self.lines[key]

    def _why(self, reservation: Any) -> str:
        window = reservation.window
        unit = "requests" if window is not None and window.unit == "calls" else "tokens"
        limit = window.limit if window is not None else None
        if reservation.retry_after_s is None:
            return f"one request is larger than the limit of {limit:g} {unit} per minute"
        return f"{reservation.used:g} of its {limit:g} {unit} per minute are in use"

    def _refusal(self, item: ItemT, wait_s: float | None, why: str) -> OutcomeT:
        stage = self.stage
        message = f"{item.label} is rate limited: {why}"
        if wait_s is not None:
            message += f". Try again in {math.ceil(wait_s * 10) / 10:g}s."
        return refusal(
            stage,
            item,
            "RATE_LIMITED",
            message,
            layer=PLUGIN,
            name="RateLimitedError",
            retry_after_s=wait_s,
        )
