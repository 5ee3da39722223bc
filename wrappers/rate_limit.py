"""RateLimit: a token bucket — at most ``per_second`` calls of a tool (or model), ``burst`` at once.

Where it belongs: a dispatch layer (``stage="dispatch"``) or a model-call layer
(``stage="model"``). **Its position is its meaning.** Outside a ``Retry`` one token
pays for the whole retried operation; inside it every attempt pays (retries then
cannot exceed the provider's rate, which is usually what you want). Outside a
``Timeout`` the wait for a token does not count against the budget; inside one it
does, and a call may time out still waiting.

Per tool (per model; one shared bucket with ``key=``) the bucket holds up to
``burst`` tokens and refills at ``per_second``. A call takes one; with none left it
waits its turn (cancellably; waiters are served in arrival order, each holding a
reservation, so none starves and none is lost) or, with ``wait=False``, gets
``TOOL_RATE_LIMITED`` at once with the time to wait. On the model stage that is
``ModelError(MODEL_RATE_LIMITED, retry_after_s=…)``, which a model-stage ``Retry``
outside honours.
"""

from __future__ import annotations

import math
from collections.abc import Hashable
from typing import Any, ClassVar

import anyio
import attrs

from guardstack.pipeline.contract import (
    MODEL_RATE_LIMITED,
    DispatchNext,
    ModelError,
    ModelNext,
    ModelReply,
    ModelRequest,
    Scope,
)
from guardstack.pipeline.validate import StageName, boolean, integer, stage
from guardstack.pipeline.values import TOOL_RATE_LIMITED, ToolCall, ToolResult
from guardstack.wrappers._keyed import (
    PerKey,
    check_key,
    model_key,
    positive,
    tool_key,
    use_on_stage,
)

__all__ = ["RateLimit"]

PLUGIN = "rate-limit"


def _stage(value: object) -> StageName:
    return stage(PLUGIN, value)


def _key(value: object) -> str | None:
    return check_key(PLUGIN, value)


def _burst(_: Any, __: Any, value: Any) -> None:
    integer(PLUGIN, "burst", value)


def _wait(_: Any, __: Any, value: Any) -> None:
    boolean(PLUGIN, "wait", value)


@attrs.frozen
class RateLimit:
    """``per_second`` calls on average, ``burst`` at once; wait for a token or refuse."""

    name: ClassVar[str] = PLUGIN

    stage: StageName = attrs.field(default="dispatch", converter=_stage, kw_only=True)
    per_second: float = attrs.field(validator=positive(PLUGIN, "per_second"))
    burst: int = attrs.field(default=1, validator=_burst)
    wait: bool = attrs.field(default=True, validator=_wait)
    #: One bucket shared by every call under this name, instead of one per tool.
    key: str | None = attrs.field(default=None, converter=_key, kw_only=True)

    def apply(self, scope: Scope) -> None:
        """Register a fresh set of buckets (full) on the stage it names."""
        buckets = _Buckets(self, lambda: _Bucket(self.per_second, self.burst))
        use_on_stage(scope, self.stage, buckets, PLUGIN)


class _Bucket:
    """Tokens (negative: reserved by waiters), refilled lazily from the clock."""

    __slots__ = ("burst", "per_second", "tokens", "updated")

    def __init__(self, per_second: float, burst: int) -> None:
        self.per_second = per_second
        self.burst = burst
        self.tokens = float(burst)
        self.updated: float | None = None

    def _refill(self, now: float) -> None:
        if self.updated is not None:
            self.tokens = min(self.burst, self.tokens + (now - self.updated) * self.per_second)
        self.updated = now

    def idle(self) -> bool:
        if self.updated is None:
            return True
        self._refill(anyio.current_time())
        return self.tokens >= self.burst

    def reserve(self, now: float) -> float:
        """Take a token, borrowing against the future: how long to wait for it."""
        self._refill(now)
        self.tokens -= 1
        return 0.0 if self.tokens >= 0 else -self.tokens / self.per_second

    def try_take(self, now: float) -> float:
        """Take a token if one is here (``0.0``), else how long until one is."""
        self._refill(now)
        if self.tokens >= 1:
            self.tokens -= 1
            return 0.0
        return (1 - self.tokens) / self.per_second

    def give_back(self) -> None:
        self.tokens += 1


class _Buckets(PerKey[RateLimit, _Bucket]):
    """One application: a bucket per key, and the layers that draw from them."""

    __slots__ = ()

    async def _token(self, key: Hashable) -> float:
        """Wait for a token (``0.0``), or with ``wait=False`` say how long one would take."""
        bucket = self.state(key)
        now = anyio.current_time()
        if not self.config.wait:
            return bucket.try_take(now)
        delay = bucket.reserve(now)
        if delay > 0:
            try:
                await anyio.sleep(delay)
            except BaseException:
                bucket.give_back()  # cancelled while waiting: the reservation returns
                raise
        return 0.0

    def _why(self, what: str, wait_s: float) -> str:
        rate = f"{self.config.per_second:g} calls per second"
        return f"{what} is rate limited ({rate}). Try again in {math.ceil(wait_s * 10) / 10:g}s."

    async def __call__(self, call: ToolCall, call_next: DispatchNext) -> ToolResult:
        wait_s = await self._token(tool_key(call))
        if wait_s > 0:
            return ToolResult.failure(
                self._why(f'tool "{call.name}"', wait_s),
                name="RateLimitedError",
                code=TOOL_RATE_LIMITED,
            )
        return await call_next(call)

    async def model_layer(self, request: ModelRequest, call_next: ModelNext) -> ModelReply:
        key = model_key(request)
        wait_s = await self._token(key)
        if wait_s > 0:
            raise ModelError(
                self._why(f"model {key}", wait_s), MODEL_RATE_LIMITED, retry_after_s=wait_s
            )
        return await call_next(request)
