"""CircuitBreaker: stop calling a tool (or model) whose backend is down, and say so at once.

Where it belongs: a dispatch layer (``stage="dispatch"``) or a model-call layer
(``stage="model"``). **Its position is its meaning.** Outside a ``Retry`` it counts
*operations* (a call retried three times is one failure); inside it counts
*attempts* (the same call is three failures, so the breaker opens three times as
fast — resilience4j's documented trap, here a choice you make by order). Outside a
``Timeout`` it sees the timeout's ``TOOL_TIMEOUT``; inside one, a hung call is
cancelled before the breaker sees a result and counts as nothing.

How it decides, per tool (per model; one shared breaker with ``key=``):

* **closed**: calls pass; their outcomes are kept for ``window_s`` seconds. Once at
  least ``minimum_calls`` are in the window and the share of results with a code in
  ``on`` reaches ``failure_ratio``, it opens;
* **open**: for ``break_s`` seconds every call gets ``TOOL_UNAVAILABLE`` at once,
  with a text telling the model the tool is down and when to try again — no call
  waits out its budget against a dead backend;
* **half-open**: then one probe call goes through (others still get
  ``TOOL_UNAVAILABLE``); its success closes the breaker, its failure opens it
  again for another ``break_s``. A cancelled probe lets the next call probe.

On the model stage an open breaker raises ``ModelError(MODEL_UNAVAILABLE)`` with
``retry_after_s``, and a failure is a ``ModelError`` whose code is in ``on``
(default ``MODEL_TIMEOUT``, ``MODEL_UNAVAILABLE``, ``MODEL_FAILED``).
"""

from __future__ import annotations

import math
from collections import deque
from typing import Any, ClassVar, Literal

import anyio
import attrs

from guardstack.pipeline.contract import (
    MODEL_FAILED,
    MODEL_TIMEOUT,
    MODEL_UNAVAILABLE,
    DispatchNext,
    ModelError,
    ModelNext,
    ModelReply,
    ModelRequest,
    Scope,
    model_error_code,
)
from guardstack.pipeline.validate import StageName, codes, integer, stage
from guardstack.pipeline.values import (
    TOOL_FAILED,
    TOOL_TIMEOUT,
    TOOL_UNAVAILABLE,
    ToolCall,
    ToolResult,
)
from guardstack.wrappers._keyed import (
    PerKey,
    check_key,
    model_key,
    positive,
    ratio,
    tool_key,
    use_on_stage,
)

__all__ = ["CircuitBreaker"]

PLUGIN = "circuit-breaker"


def _default_on(self: CircuitBreaker) -> frozenset[str]:
    if self.stage == "model":
        return frozenset({MODEL_TIMEOUT, MODEL_UNAVAILABLE, MODEL_FAILED})
    return frozenset({TOOL_TIMEOUT, TOOL_FAILED})


def _minimum_calls(_: Any, __: Any, value: Any) -> None:
    integer(PLUGIN, "minimum_calls", value)


def _stage(value: object) -> StageName:
    return stage(PLUGIN, value)


def _on(value: object) -> frozenset[str]:
    return codes(PLUGIN, "on", value)


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
    on: frozenset[str] = attrs.field(
        default=attrs.Factory(_default_on, takes_self=True), converter=_on
    )
    #: One breaker shared by every call under this name, instead of one per tool.
    key: str | None = attrs.field(default=None, converter=_key, kw_only=True)

    def __repr__(self) -> str:
        where = ", stage='model'" if self.stage == "model" else ""
        shared = f", key={self.key!r}" if self.key is not None else ""
        return (
            f"CircuitBreaker(failure_ratio={self.failure_ratio}, minimum_calls="
            f"{self.minimum_calls}, window_s={self.window_s}, break_s={self.break_s}, "
            f"on={sorted(self.on)}{where}{shared})"
        )

    def apply(self, scope: Scope) -> None:
        """Register a fresh set of breakers (closed) on the stage it names."""
        use_on_stage(scope, self.stage, _Breakers(self, _Circuit), PLUGIN)


class _Circuit:
    """One breaker's state; every method runs without awaiting, so no update is lost."""

    __slots__ = ("failures", "opened_at", "outcomes", "probing", "state")

    def __init__(self) -> None:
        self.state: Literal["closed", "open", "half_open"] = "closed"
        self.outcomes: deque[tuple[float, bool]] = deque()
        self.failures = 0
        self.opened_at = -math.inf
        self.probing = False

    def idle(self) -> bool:
        return self.state == "closed" and not self.outcomes

    def admit(self, config: CircuitBreaker, now: float) -> tuple[bool, float]:
        """``(True, 0)`` to let the call through (maybe as the probe), else ``(False, wait_s)``."""
        if self.state == "open":
            remaining = self.opened_at + config.break_s - now
            if remaining > 0:
                return False, remaining
            self.state, self.probing = "half_open", False
        if self.state == "half_open":
            if self.probing:
                return False, 0.0
            self.probing = True
        return True, 0.0

    def record(self, config: CircuitBreaker, now: float, failed: bool, probe: bool) -> None:
        """A call's outcome, kept by ``now``: when it started (one clock read per call)."""
        if probe:
            self.probing = False
            if failed:
                self._open(anyio.current_time())
            else:
                self.state = "closed"
                self.outcomes.clear()
                self.failures = 0
            return
        if self.state != "closed":
            return  # admitted before it opened: the window starts afresh on closing
        self.outcomes.append((now, failed))
        self.failures += failed
        while self.outcomes and self.outcomes[0][0] <= now - config.window_s:
            self.failures -= self.outcomes.popleft()[1]
        calls = len(self.outcomes)
        if calls >= config.minimum_calls and self.failures >= config.failure_ratio * calls:
            self._open(anyio.current_time())  # the break runs from now, not the call's start

    def release_probe(self) -> None:
        """The probe was cancelled: the next call probes instead."""
        self.probing = False

    def _open(self, now: float) -> None:
        self.state, self.opened_at = "open", now
        self.outcomes.clear()
        self.failures = 0


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


class _Breakers(PerKey[CircuitBreaker, _Circuit]):
    """One application: a breaker per key, and the layers that consult them."""

    __slots__ = ()

    async def __call__(self, call: ToolCall, call_next: DispatchNext) -> ToolResult:
        config = self.config
        circuit = self.state(tool_key(call))
        now = anyio.current_time()  # outcomes are kept by when the call started
        admitted, wait_s = circuit.admit(config, now)
        if not admitted:
            return ToolResult.failure(
                _why(f'tool "{call.name}"', wait_s), name="CircuitOpenError", code=TOOL_UNAVAILABLE
            )
        probe = circuit.state == "half_open"
        try:
            result = await call_next(call)
        except BaseException:
            if probe:
                circuit.release_probe()
            raise
        failed = result.is_error and result.code in config.on
        circuit.record(config, now, failed, probe)
        return result

    async def model_layer(self, request: ModelRequest, call_next: ModelNext) -> ModelReply:
        config = self.config
        key = model_key(request)
        circuit = self.state(key)
        now = anyio.current_time()
        admitted, wait_s = circuit.admit(config, now)
        if not admitted:
            raise ModelError(
                _why(f"model {key}", wait_s), MODEL_UNAVAILABLE, retry_after_s=wait_s or None
            )
        probe = circuit.state == "half_open"
        try:
            reply = await call_next(request)
        except Exception as error:
            failed = model_error_code(error) in config.on
            circuit.record(config, now, failed, probe)
            raise
        except BaseException:
            if probe:
                circuit.release_probe()
            raise
        circuit.record(config, now, False, probe)
        return reply
