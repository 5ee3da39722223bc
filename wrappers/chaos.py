"""Chaos: inject faults on purpose, to see what a stack does when things go wrong.

Where it belongs: wherever the fault should appear to come from. **Its position is
its meaning.** Innermost (registered last) it plays the tool or the model
misbehaving, so every other layer reacts as in production; outside a ``Retry`` a
fault hits the whole operation, inside it each attempt; outside a ``Timeout`` an
injected hang is never cut short.

With probability ``rate`` a call gets ``fault`` instead of (or before) going on:

* ``"latency:MS"`` — waits MS milliseconds, then the call goes on;
* ``"hang"`` — never answers (until cancelled: a timeout outside ends it);
* ``"fail:CODE"`` — an error result with that code (on the model stage a
  ``ModelError`` with it), without calling on;
* ``"raise"`` — raises ``ChaosError`` (a layer that raises: the call gets a final
  ``TOOL_FAILED`` naming this layer; on the model stage a ``MODEL_FAILED``).

Off unless configured (``rate`` and ``fault`` are required); ``seed`` makes the
draws repeatable. For tests and game days, not for production traffic.
"""

from __future__ import annotations

import random
import re
from typing import Any, ClassVar

import anyio
import attrs

from guardstack.pipeline.contract import (
    DispatchNext,
    ModelError,
    ModelNext,
    ModelReply,
    ModelRequest,
    Scope,
)
from guardstack.pipeline.errors import GuardstackError
from guardstack.pipeline.validate import StageName, invalid, stage
from guardstack.pipeline.values import ToolCall, ToolResult
from guardstack.wrappers._keyed import ratio, use_on_stage

__all__ = ["Chaos", "ChaosError"]

PLUGIN = "chaos"
_FAULT = re.compile(r"latency:(?P<ms>[1-9][0-9]{0,8})|hang|fail:(?P<code>\S+)|raise")


class ChaosError(GuardstackError, RuntimeError):
    """The fault ``Chaos(fault="raise")`` injects."""


def _stage(value: object) -> StageName:
    return stage(PLUGIN, value)


def _fault(_: Any, __: Any, value: Any) -> None:
    if not isinstance(value, str) or _FAULT.fullmatch(value) is None:
        raise invalid(PLUGIN, "fault", value, '"latency:MS", "hang", "fail:CODE" or "raise"')


@attrs.frozen
class Chaos:
    """With probability ``rate``, ``fault`` instead of the call going on as usual."""

    name: ClassVar[str] = PLUGIN

    stage: StageName = attrs.field(default="dispatch", converter=_stage, kw_only=True)
    rate: float = attrs.field(validator=ratio(PLUGIN, "rate", zero=True))
    fault: str = attrs.field(validator=_fault)
    seed: int | None = None

    def apply(self, scope: Scope) -> None:
        """Register with its own random draws (seeded with ``seed``) on its stage."""
        use_on_stage(scope, self.stage, _ChaosRun(self), PLUGIN)


class _ChaosRun:
    __slots__ = ("code", "config", "latency_s", "random")

    def __init__(self, config: Chaos) -> None:
        self.config = config
        self.random = random.Random(config.seed)
        match = _FAULT.fullmatch(config.fault)
        assert match is not None  # validated
        self.latency_s = int(match["ms"]) / 1000 if match["ms"] else None
        self.code: str | None = match["code"]

    async def _strike(self) -> bool:
        """Whether this call gets the fault (after its latency or hang, if that is the fault)."""
        if self.random.random() >= self.config.rate:
            return False
        fault = self.config.fault
        if self.latency_s is not None:
            await anyio.sleep(self.latency_s)
            return False
        if fault == "hang":
            await anyio.sleep_forever()
        if fault == "raise":
            raise ChaosError("chaos: injected exception")
        return True

    async def __call__(self, call: ToolCall, call_next: DispatchNext) -> ToolResult:
        if await self._strike():
            return ToolResult.failure(
                f"chaos: injected {self.code}", name="ChaosFault", code=self.code
            )
        return await call_next(call)

    async def model_layer(self, request: ModelRequest, call_next: ModelNext) -> ModelReply:
        if await self._strike():
            assert self.code is not None
            raise ModelError(f"chaos: injected {self.code}", self.code)
        return await call_next(request)

    def __repr__(self) -> str:
        return repr(self.config)
