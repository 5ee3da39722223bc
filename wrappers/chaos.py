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
* ``"raise"`` — ``ChaosError``, reported as the stage reports a provider raising:
  on tools the ``TOOL_FAILED`` result of a tool that raised, on the model stage the
  exception itself (``MODEL_FAILED``). Either is a failure a ``Retry`` outside can
  retry (``retry_on=("TOOL_FAILED",)``, ``retry_on=("MODEL_FAILED",)`` or a predicate):
  testing a stack's retries is what this fault is for.

Off unless configured (``rate`` and ``fault`` are required); ``seed`` makes the
draws repeatable. For tests and game days, not for production traffic.
"""

from __future__ import annotations

import re
from typing import Any, ClassVar, Generic

import anyio
import attrs

from guardstack.pipeline.contract import (
    ItemT,
    Next,
    OutcomeT,
    Scope,
    StageAdapter,
    ValueT,
    adapter_for,
    stage_of,
)
from guardstack.pipeline.validate import StageName, invalid
from guardstack.wrappers._keyed import ratio, register
from guardstack.wrappers.retry import random_for

__all__ = ["Chaos", "ChaosError"]

PLUGIN = "chaos"
_FAULT = re.compile(r"latency:(?P<ms>[1-9][0-9]{0,8})|hang|fail:(?P<code>\S+)|raise")


class ChaosError(RuntimeError):
    """The fault ``Chaos(fault="raise")`` injects: a provider's failure, not guardstack's."""


def _stage(value: object) -> StageName:
    return stage_of(PLUGIN, value)  # its name, or the stage itself (``MODEL``)


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
        register(scope, self.stage, _ChaosRun(self), PLUGIN)


class _ChaosRun(Generic[ItemT, ValueT, OutcomeT]):
    __slots__ = ("code", "config", "latency_s", "random", "stage")

    def __init__(self, config: Chaos) -> None:
        self.config = config
        self.random = random_for(config.seed)
        self.stage: StageAdapter[ItemT, ValueT, OutcomeT] = adapter_for(config.stage)
        match = _FAULT.fullmatch(config.fault)
        assert match is not None  # validated
        self.latency_s = int(match["ms"]) / 1000 if match["ms"] else None
        self.code: str | None = match["code"]

    async def __call__(self, item: ItemT, call_next: Next[ItemT, ValueT]) -> ValueT:
        if self.random.random() >= self.config.rate:
            return await call_next(item)
        fault, stage = self.config.fault, self.stage
        if self.latency_s is not None:
            await anyio.sleep(self.latency_s)
            return await call_next(item)
        if fault == "hang":
            await anyio.sleep_forever()
        if fault == "raise":
            return stage.deliver(stage.fault(item, ChaosError("chaos: injected exception")))
        assert self.code is not None
        return stage.deliver(
            stage.failure(item, self.code, f"chaos: injected {self.code}", name="ChaosFault")
        )

    def __repr__(self) -> str:
        return repr(self.config)
