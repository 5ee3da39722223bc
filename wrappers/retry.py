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
  budget has tokens, so a fleet of agents cannot start a retry storm.

Cancellation: the backoff wait is interrupted by it, and no attempt starts once the
call is cancelled; cancellation always propagates. The last attempt's result is
returned. ``no_backoff()`` turns the waits off in a scope (a context variable, not
a global), for tests.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Collection, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import TYPE_CHECKING, ClassVar

import anyio
import anyio.lowlevel
import attrs

from pipeline.errors import ConfigError
from pipeline.values import TOOL_TIMEOUT, ToolCall, ToolResult

if TYPE_CHECKING:
    from pipeline.harness import Scope
    from pipeline.registry import DispatchNext

__all__ = ["Retry", "RetryBudget", "no_backoff"]

_BACKOFF_ENABLED: ContextVar[bool] = ContextVar("guardstack_backoff_enabled", default=True)


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
    """

    def __init__(
        self, ratio: float = 0.2, min_retries_per_second: float = 1.0, capacity: float = 10.0
    ) -> None:
        for key, value in (
            ("ratio", ratio),
            ("min_retries_per_second", min_retries_per_second),
            ("capacity", capacity),
        ):
            if isinstance(value, bool) or not isinstance(value, int | float) or value < 0:
                raise ConfigError(
                    f"retry budget: `{key}` must be a number >= 0, got {value!r}",
                    key=key,
                    value=value,
                )
        if capacity < 1:
            raise ConfigError(
                f"retry budget: `capacity` must be >= 1, got {capacity!r}",
                key="capacity",
                value=capacity,
            )
        self.ratio = float(ratio)
        self.min_retries_per_second = float(min_retries_per_second)
        self.capacity = float(capacity)
        self._tokens = self.capacity
        self._updated: float | None = None

    def _refill(self) -> None:
        now = anyio.current_time()
        if self._updated is not None:
            elapsed = max(0.0, now - self._updated)
            self._tokens = min(self.capacity, self._tokens + elapsed * self.min_retries_per_second)
        self._updated = now

    @property
    def tokens(self) -> float:
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

    def __repr__(self) -> str:
        return (
            f"RetryBudget(ratio={self.ratio}, min_retries_per_second="
            f"{self.min_retries_per_second}, capacity={self.capacity})"
        )


def _check_positive_int(key: str, minimum: int) -> Callable[[object, object, object], None]:
    def check(_: object, __: object, value: object) -> None:
        if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
            raise ConfigError(
                f"retry: `{key}` must be an integer >= {minimum}, got {value!r}",
                key=key,
                value=value,
            )

    return check


def _to_retry_on(value: object) -> Collection[str] | Callable[[ToolResult], bool]:
    if callable(value):
        return value
    if isinstance(value, str):
        return frozenset({value})
    if isinstance(value, Collection) and value and all(isinstance(code, str) for code in value):
        return frozenset(value)
    raise ConfigError(
        "retry: `retry_on` must be a non-empty list of error codes or a predicate on the "
        f"result, got {value!r}",
        key="retry_on",
        value=value,
    )


@attrs.frozen
class Retry:
    """Up to ``attempts`` attempts while the result matches ``retry_on``."""

    name: ClassVar[str] = "retry"

    attempts: int = attrs.field(default=3, validator=_check_positive_int("attempts", 1))
    retry_on: Collection[str] | Callable[[ToolResult], bool] = attrs.field(
        default=(TOOL_TIMEOUT,), converter=_to_retry_on
    )
    backoff_ms: int = attrs.field(default=100, validator=_check_positive_int("backoff_ms", 0))
    max_backoff_ms: int = attrs.field(
        default=10_000, validator=_check_positive_int("max_backoff_ms", 0)
    )
    jitter: bool = True
    budget: RetryBudget | None = None
    seed: int | None = None
    _random: random.Random = attrs.field(init=False, repr=False, eq=False)

    def __attrs_post_init__(self) -> None:
        if not isinstance(self.jitter, bool):
            raise ConfigError(
                f"retry: `jitter` must be true or false, got {self.jitter!r}",
                key="jitter",
                value=self.jitter,
            )
        if self.max_backoff_ms < self.backoff_ms:
            raise ConfigError(
                f"retry: `max_backoff_ms` ({self.max_backoff_ms}) must be >= `backoff_ms` "
                f"({self.backoff_ms})",
                key="max_backoff_ms",
                value=self.max_backoff_ms,
            )
        if self.budget is not None and not isinstance(self.budget, RetryBudget):
            raise ConfigError(
                f"retry: `budget` must be a RetryBudget, got {self.budget!r}",
                key="budget",
                value=self.budget,
            )
        object.__setattr__(self, "_random", random.Random(self.seed))

    def should_retry(self, result: ToolResult) -> bool:
        """Whether ``result`` is a failure this policy retries."""
        if not result.is_error:
            return False
        if callable(self.retry_on):
            return bool(self.retry_on(result))
        return result.code in self.retry_on

    def delay_s(self, attempt: int) -> float:
        """How long to wait after failed attempt number ``attempt`` (1-based)."""
        ceiling = min(self.max_backoff_ms, self.backoff_ms * 2 ** (attempt - 1)) / 1000
        return self._random.uniform(0, ceiling) if self.jitter else ceiling

    async def __call__(self, call: ToolCall, call_next: DispatchNext) -> ToolResult:
        budget = self.budget
        if budget is not None:
            budget.deposit()
        attempt = 1
        while True:
            attempt_call = call if call.attempt == attempt else attrs.evolve(call, attempt=attempt)
            result = await call_next(attempt_call)
            if attempt >= self.attempts or not self.should_retry(result):
                return result
            if budget is not None and not budget.try_withdraw():
                return result
            if _BACKOFF_ENABLED.get():
                await anyio.sleep(self.delay_s(attempt))
            else:
                await anyio.lowlevel.checkpoint()  # never start an attempt once cancelled
            attempt += 1

    def apply(self, scope: Scope) -> None:
        scope.use(scope.tools.dispatch, self)
