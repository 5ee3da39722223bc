"""Retry: run the inner chain again when its result says the failure is worth retrying.

Where it belongs: a dispatch layer. Layers registered *after* it (inside) run once
per attempt — a ``Timeout`` there bounds each attempt, ``Metrics`` there counts
attempts, tracing shows their spans once per attempt. Layers registered *before*
it (outside) see one operation — a ``Timeout`` there bounds the whole retried
operation, backoff waits included. Each attempt passes the inner layers a call
carrying its number (``call.attempt``, 1-based).

The *policy* (what to retry, how long to wait) is kept apart from the *mechanism*
(the loop), as in tower and stamina:

* what: ``retry_on`` — error codes (default: ``TOOL_TIMEOUT`` only) or a predicate
  on the result; you say what is safe to retry;
* how long: exponential backoff, ``backoff_ms * 2**(n-1)`` capped at
  ``max_backoff_ms``, with full jitter (a uniform draw below it; ``seed`` makes the
  draws repeatable);
* how many: at most ``attempts``, and, with a shared ``RetryBudget``, only while the
  budget has tokens, so a fleet of agents cannot start a retry storm;
* which tools: never one declared ``ToolDefinition(idempotent=False)`` — a tool that
  sends, pays or deletes runs once and its first result is returned — and, when
  given, only tools matching ``tools`` and not ``exclude`` (``*``-wildcard name
  patterns, as the reminder's ``include``/``exclude``).

Defaults per stage: on the dispatch stage ``retry_on`` is ``("TOOL_TIMEOUT",)`` —
only a timeout, the one failure that says nothing about the arguments; name the
other codes you know are safe (``TOOL_FAILED``, ``TOOL_UNAVAILABLE``…). On the model
stage (``stage="model"``) a failure is an exception: it retries a ``ModelError``
whose code is in ``retry_on`` (default ``MODEL_RATE_LIMITED``, ``MODEL_UNAVAILABLE``,
``MODEL_OVERLOADED``, ``MODEL_TIMEOUT``; any other exception counts as
``MODEL_FAILED``), sets ``request.attempt`` for the layers inside, and re-raises the
last attempt's error. On both, it waits at least the ``retry_after_s`` a failure
carries (a provider's Retry-After, a rate limit's wait), still capped by
``max_backoff_ms``.

guardstack's own control flow is never retried: a cap's ``TurnBlocked`` and other
guardstack errors, a denial, another layer's refusal — except a refusal that says
when to come back (a rate limit's ``retry_after_s``), retried like any failure its
codes name.

Cancellation: the backoff wait is interrupted by it, and no attempt starts once the
call is cancelled; cancellation always propagates. The last attempt's result is
returned. ``no_backoff()`` turns the waits off in a scope (a context variable, not
a global), for tests.
"""

from __future__ import annotations

import contextlib
import math
import random
import re
from collections.abc import Awaitable, Callable, Collection, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any, ClassVar, Final, Generic

import anyio
import anyio.lowlevel
import attrs

from guardstack.pipeline.contract import (
    DISPATCH,
    CallContext,
    FailureKind,
    ItemT,
    Next,
    Outcome,
    OutcomeT,
    Scope,
    StageAdapter,
    StageAnswerT,
    StageCallT,
    StateStore,
    ValueT,
    adapter_for,
    stage_of,
    store_key,
)
from guardstack.pipeline.signals import RETRY_ATTEMPTS, Signals
from guardstack.pipeline.validate import (
    boolean,
    compile_patterns,
    cut,
    integer,
    invalid,
    number,
    patterns,
)
from guardstack.wrappers._keyed import (
    check_codes,
    codes_of,
    refuse_names_without_names,
    register,
    stage_repr,
)

__all__ = ["Retry", "RetryBudget", "no_backoff", "seeded_draws"]

PLUGIN = "retry"
_BACKOFF_ENABLED: ContextVar[bool] = ContextVar("guardstack_backoff_enabled", default=True)
_DEFAULT_SEED: ContextVar[int | None] = ContextVar("guardstack_default_seed", default=None)


@contextmanager
def seeded_draws(seed: int) -> Iterator[None]:
    """Within this block, layers applied without a ``seed`` (``Retry``'s jitter, ``Chaos``'s
    faults) draw from ``seed`` instead of the system's entropy: what ``guardstack compare``
    uses so the same seed gives the same output, byte for byte."""
    token = _DEFAULT_SEED.set(seed)
    try:
        yield
    finally:
        _DEFAULT_SEED.reset(token)


def random_for(seed: int | None) -> random.Random:
    """A generator for a layer's draws: its own ``seed``, else ``seeded_draws``' if set."""
    return random.Random(seed if seed is not None else _DEFAULT_SEED.get())


@contextmanager
def no_backoff() -> Iterator[None]:
    """Within this block (and tasks started in it), retries do not wait between attempts."""
    token = _BACKOFF_ENABLED.set(False)
    try:
        yield
    finally:
        _BACKOFF_ENABLED.reset(token)


class RetryBudget:
    """A token bucket shared by ``Retry`` layers, in the style of Finagle's and tower's.

    Each first attempt deposits ``ratio`` tokens; each retry withdraws one. Tokens
    also refill at ``min_retries_per_second``, and the balance never exceeds
    ``capacity`` (it starts full). Under a storm, retries are therefore limited to
    about ``ratio`` of the traffic plus a trickle, instead of multiplying it.

    With ``store=`` (a ``RedisStore``) the bucket lives there under ``key``, shared by
    every process: eight workers retrying against one API then share one budget. A
    store that fails refuses the retry (a budget fails closed: no retry storm while
    the store is down); the call's own attempt is never held up.
    """

    def __init__(
        self,
        ratio: float = 0.2,
        min_retries_per_second: float = 1.0,
        capacity: float = 10.0,
        *,
        store: StateStore | None = None,
        key: str = "retry-budget",
    ) -> None:
        owner = "retry budget"
        self.ratio = number(owner, "ratio", ratio)
        self.min_retries_per_second = number(
            owner, "min_retries_per_second", min_retries_per_second
        )
        self.capacity = number(owner, "capacity", capacity, minimum=1)
        self._tokens = self.capacity
        self._updated: float | None = None
        self.store = store
        self.key = key
        self._store_key = store_key("retry-budget", "bucket", key)

    def _refill(self) -> None:
        now = anyio.current_time()
        if self._updated is not None:
            elapsed = max(0.0, now - self._updated)
            self._tokens = min(self.capacity, self._tokens + elapsed * self.min_retries_per_second)
        self._updated = now

    @property
    def tokens(self) -> float:
        """Tokens left (without refilling)."""
        return self._tokens

    def deposit(self) -> None:
        """Record one operation (a first attempt)."""
        self._refill()
        self._tokens = min(self.capacity, self._tokens + self.ratio)

    def try_withdraw(self) -> bool:
        """Take one token for a retry, or say no."""
        self._refill()
        if self._tokens >= 1.0:
            self._tokens -= 1.0
            return True
        return False

    async def deposit_shared(self) -> None:
        """``deposit``, in the store when the budget has one."""
        if self.store is None:
            self.deposit()
            return
        with contextlib.suppress(Exception):  # a lost deposit only makes retries scarcer
            await self.store.take(
                self._store_key, self.min_retries_per_second, self.capacity, -self.ratio
            )

    async def withdraw_shared(self) -> bool:
        """``try_withdraw``, in the store when the budget has one (refused if it fails)."""
        if self.store is None:
            return self.try_withdraw()
        try:
            wait = await self.store.take(
                self._store_key, self.min_retries_per_second, self.capacity
            )
        except Exception:
            return False
        return wait == 0.0

    def __repr__(self) -> str:
        shared = f", store={self.store.name}" if self.store is not None else ""
        return (
            f"RetryBudget(ratio={self.ratio}, min_retries_per_second="
            f"{self.min_retries_per_second}, capacity={self.capacity}{shared})"
        )


def _at_least(key: str, minimum: int) -> Callable[[object, object, object], None]:
    def check(_: object, __: object, value: object) -> None:
        integer(PLUGIN, key, value, minimum=minimum)

    return check


def _check_stage(_: object, __: object, value: object) -> None:
    stage_of(PLUGIN, value)


_DEFAULT_RETRY_ON: Final[dict[str, tuple[FailureKind, ...]]] = {
    "dispatch": ("TIMEOUT",),
    "model": ("RATE_LIMITED", "UNAVAILABLE", "OVERLOADED", "TIMEOUT"),
}


def _default_retry_on(self: Retry) -> frozenset[str]:
    return codes_of(self.stage, _DEFAULT_RETRY_ON)


def _to_retry_on(value: object) -> Collection[str] | Callable[[Any], bool]:
    if callable(value):
        return value
    if isinstance(value, str):
        return frozenset({value})
    if isinstance(value, Collection) and value and all(isinstance(code, str) for code in value):
        return frozenset(value)
    raise invalid(
        PLUGIN, "retry_on", value, "a non-empty list of error codes or a predicate on the result"
    )


def _tools(value: object) -> tuple[str, ...]:
    return patterns(PLUGIN, "tools", value)


def _exclude(value: object) -> tuple[str, ...]:
    return patterns(PLUGIN, "exclude", value)


def _check_jitter(_: object, __: object, value: Any) -> None:
    boolean(PLUGIN, "jitter", value)


def _check_respect_deadline(_: object, __: object, value: Any) -> None:
    boolean(PLUGIN, "respect_deadline", value)


def _check_budget(_: object, __: object, value: Any) -> None:
    if value is not None and not isinstance(value, RetryBudget):
        raise invalid(PLUGIN, "budget", value, "a RetryBudget")


@attrs.frozen
class Retry(Generic[StageCallT, StageAnswerT]):
    """Up to ``attempts`` attempts while the result matches ``retry_on``.

    The instance is configuration only. Applied as a plugin, each application gets
    its own random generator (seeded with ``seed``); used directly as a layer
    (``stage.use(Retry())``), the instance keeps one of its own. Built for the model
    stage with ``stage=MODEL`` (``guardstack.pipeline.contract``), it is typed for that
    stage: put on the other, it is a type error as well as a ``ConfigError``.
    """

    name: ClassVar[str] = PLUGIN

    # Declared first (keyword-only) so the default of ``retry_on`` can depend on it.
    #: ``"dispatch"`` or ``"model"`` (kept as that name), or the stage itself (``MODEL``).
    stage: StageAdapter[StageCallT, StageAnswerT, Any] | str = attrs.field(
        default="dispatch", validator=_check_stage, kw_only=True
    )
    attempts: int = attrs.field(default=3, validator=_at_least("attempts", 1))
    #: Error codes, or a predicate on the result (dispatch) or the exception (model).
    retry_on: Collection[str] | Callable[[Any], bool] = attrs.field(
        default=attrs.Factory(_default_retry_on, takes_self=True), converter=_to_retry_on
    )
    backoff_ms: int = attrs.field(default=100, validator=_at_least("backoff_ms", 0))
    max_backoff_ms: int = attrs.field(default=10_000, validator=_at_least("max_backoff_ms", 0))
    jitter: bool = attrs.field(default=True, validator=_check_jitter)
    budget: RetryBudget | None = attrs.field(default=None, validator=_check_budget)
    seed: int | None = None
    #: Name patterns: retry only these tools (empty: every tool) ...
    tools: tuple[str, ...] = attrs.field(default=(), converter=_tools)
    #: ... and never these.
    exclude: tuple[str, ...] = attrs.field(default=(), converter=_exclude)
    #: Never start an attempt that cannot finish inside an enclosing deadline.
    respect_deadline: bool = attrs.field(default=False, validator=_check_respect_deadline)
    _direct: _RetryRun[StageCallT, StageAnswerT, Any] = attrs.field(
        init=False, repr=False, eq=False
    )
    _tools: re.Pattern[str] | None = attrs.field(init=False, repr=False, eq=False)
    _exclude: re.Pattern[str] | None = attrs.field(init=False, repr=False, eq=False)

    def __attrs_post_init__(self) -> None:
        object.__setattr__(self, "stage", stage_of(PLUGIN, self.stage))
        if self.max_backoff_ms < self.backoff_ms:
            raise invalid(
                PLUGIN,
                "max_backoff_ms",
                self.max_backoff_ms,
                f">= `backoff_ms` ({self.backoff_ms})",
            )
        refuse_names_without_names(PLUGIN, self.stage, tools=self.tools, exclude=self.exclude)
        check_codes(PLUGIN, "retry_on", self.stage, self.retry_on)
        object.__setattr__(self, "_tools", compile_patterns(self.tools))
        object.__setattr__(self, "_exclude", compile_patterns(self.exclude))
        object.__setattr__(self, "_direct", _RetryRun(self))

    def may_retry(self, call: CallContext, stage: StageAdapter[Any, Any, Any] = DISPATCH) -> bool:
        """Whether ``call`` may run again at all (its idempotency, ``tools``, ``exclude``)."""
        if not call.may_repeat:
            return False
        name = call.tool_name
        if name is None:
            return True
        if self._tools is not None and not self._tools.fullmatch(name):
            return False
        return self._exclude is None or not self._exclude.fullmatch(name)

    def should_retry(
        self, outcome: Outcome[Any], stage: StageAdapter[Any, Any, Any] = DISPATCH
    ) -> bool:
        """Whether ``outcome`` (a result, or a model call's exception) is one to retry."""
        failed = stage.failure_of(outcome)
        if failed is None:
            return False
        if failed.control and failed.retry_after_s is None:
            return False  # guardstack's own answer; only a refusal that says when may retry
        if callable(self.retry_on):
            return bool(self.retry_on(outcome))
        return failed.code in self.retry_on

    def ceiling_s(self, attempt: int) -> float:
        """The longest wait after failed attempt number ``attempt`` (1-based)."""
        return float(min(self.max_backoff_ms, self.backoff_ms * 2 ** (attempt - 1))) / 1000

    def delay_s(self, attempt: int) -> float:
        """The wait after failed attempt ``attempt``, drawn from this instance's generator."""
        return self._direct.delay_s(attempt)

    def __call__(
        self, call: StageCallT, call_next: Callable[[StageCallT], Awaitable[StageAnswerT]]
    ) -> Awaitable[StageAnswerT]:
        return self._direct(call, call_next)

    def apply(self, scope: Scope) -> None:
        """Register a fresh run of this policy (its own random draws) on its stage."""
        register(scope, self.stage, _RetryRun(self, scope.signals), PLUGIN)

    def __repr__(self) -> str:
        retry_on = self.retry_on if callable(self.retry_on) else sorted(self.retry_on)
        where = stage_repr(self.stage)
        names = "".join(
            f", {key}={list(value)!r}"
            for key, value in (("tools", self.tools), ("exclude", self.exclude))
            if value
        )
        deadline = ", respect_deadline=True" if self.respect_deadline else ""
        return (
            f"Retry(attempts={self.attempts}{where}, retry_on={cut(retry_on)}, "
            f"backoff_ms={self.backoff_ms}, max_backoff_ms={self.max_backoff_ms}, "
            f"jitter={self.jitter}, budget={self.budget!r}, seed={self.seed!r}{names}{deadline})"
        )


async def _before_attempt() -> None:
    """Never start an attempt once cancelled — nor once an enclosing deadline has passed.

    When the event loop runs late (a neighbour blocked it), the backoff sleep can
    return after the caller's deadline without its cancellation delivered yet: one
    checkpoint lets that overdue cancellation arrive before the attempt starts.
    """
    if anyio.current_time() >= anyio.current_effective_deadline():
        await anyio.lowlevel.checkpoint()
    await anyio.lowlevel.checkpoint_if_cancelled()


class _RetryRun(Generic[ItemT, ValueT, OutcomeT]):
    """The mechanism: one application of a ``Retry`` policy, with its own random draws."""

    __slots__ = ("policy", "random", "signals", "stage")

    def __init__(self, policy: Retry[Any, Any], signals: Signals | None = None) -> None:
        self.policy = policy
        self.random = random_for(policy.seed)
        self.stage: StageAdapter[ItemT, ValueT, OutcomeT] = adapter_for(policy.stage)
        self.signals = signals

    def delay_s(self, attempt: int) -> float:
        ceiling = self.policy.ceiling_s(attempt)
        return float(self.random.uniform(0, ceiling)) if self.policy.jitter else ceiling

    async def __call__(self, item: ItemT, call_next: Next[ItemT, ValueT]) -> ValueT:
        policy, stage = self.policy, self.stage
        budget = policy.budget
        if budget is not None:
            if budget.store is None:
                budget.deposit()
            else:
                await budget.deposit_shared()
        attempt = 1
        while True:
            outcome = await stage.attempt(call_next, item.with_attempt(attempt))
            failed = stage.failure_of(outcome)
            if (
                attempt >= policy.attempts
                or failed is None  # the usual: it worked (``should_retry`` asks too)
                or not policy.should_retry(outcome, stage)
            ):
                if attempt == 1:
                    return stage.deliver(outcome)  # worked (or failed for good) at once
                return self._done(item, attempt, stage.deliver(outcome))
            if attempt == 1 and not policy.may_retry(item, stage):
                return self._done(item, attempt, stage.deliver(outcome))
            retry_after = failed.retry_after_s
            stop = self._deadline_stop(attempt, item.budget_ms, retry_after)
            if stop is not None:
                return self._done(item, attempt, stage.deliver(stage.explained(outcome, stop)))
            if not await self._pause(attempt, retry_after):
                return self._done(item, attempt, stage.deliver(outcome))
            attempt += 1

    def _done(self, item: ItemT, attempts: int, delivered: ValueT) -> ValueT:
        """``guardstack.retry.attempts``: one point per operation that was retried (one
        that worked first time costs nothing here: ``Metrics`` counts the calls), then its
        answer."""
        if attempts > 1 and self.signals is not None:
            attributes = {"key": item.key, "guardstack.stage": self.stage.name}
            self.signals.add(RETRY_ATTEMPTS, attempts, attributes)
        return delivered

    def _deadline_stop(
        self, attempt: int, budget_ms: int | None, retry_after_s: float | None = None
    ) -> str | None:
        """With ``respect_deadline``: why the next attempt must not start, or ``None``.

        The wait before it is its ceiling (the longest the backoff may draw, or the
        provider's ``retry_after_s``); the attempt then needs the tool's declared
        budget, when it has one. Either running past the enclosing deadline stops.
        """
        if not self.policy.respect_deadline:
            return None
        deadline = anyio.current_effective_deadline()
        if deadline == math.inf:
            return None
        left_ms = max(0.0, (deadline - anyio.current_time()) * 1000)
        wait_s = self.policy.ceiling_s(attempt) if _BACKOFF_ENABLED.get() else 0.0
        if retry_after_s is not None:
            wait_s = max(wait_s, min(retry_after_s, self.policy.max_backoff_ms / 1000))
        needed_ms = wait_s * 1000 + (budget_ms or 0)
        if needed_ms < left_ms:
            return None
        what = f"a {budget_ms}ms attempt" if budget_ms else "the next attempt"
        wait = f" after a {round(wait_s * 1000)}ms wait" if wait_s else ""
        return (
            f"not retried: {what}{wait} cannot finish in the {round(left_ms)}ms "
            "left of the deadline"
        )

    async def _pause(self, attempt: int, retry_after_s: float | None = None) -> bool:
        """Between attempts, on both stages: ``False`` if the budget refuses a retry;
        else wait the backoff (at least ``retry_after_s``, within our ceiling) and
        check that the next attempt may still start."""
        budget = self.policy.budget
        if budget is not None and not await budget.withdraw_shared():
            return False
        if _BACKOFF_ENABLED.get():
            delay = self.delay_s(attempt)
            if retry_after_s is not None and retry_after_s > delay:
                # The provider said when to come back; never sooner, never past our ceiling.
                delay = min(retry_after_s, self.policy.max_backoff_ms / 1000)
            await anyio.sleep(delay)
        await _before_attempt()
        return True

    def __repr__(self) -> str:
        return repr(self.policy)
