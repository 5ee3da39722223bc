"""Hedge: when a call is slow, start another and take whichever answers first.

Where it belongs: a dispatch layer (``stage="dispatch"``) or a model-call layer
(``stage="model"``). **Its position is its meaning.** Outside a ``Timeout`` each
hedged attempt has its own budget; inside one, the budget covers the original and
its hedges together. Inside a ``Retry`` every retried attempt is hedged; outside
it, a failed hedge race is retried as one operation.

After ``delay_ms`` without an answer it starts another attempt (up to
``max_hedges`` more, each after a further ``delay_ms``; an attempt that fails
starts the next at once). The first good answer wins and every other attempt is
cancelled — all of them have stopped before the call returns (structured
concurrency: none is left running). If all fail, the last failure is the result.
Inner layers see each attempt's hedge number as ``call.hedge`` (``request.hedge`` on
the model stage): 0 is the original, 1… its hedges — ``attempt`` stays ``Retry``'s,
so a layer inside both can tell a retried attempt from a hedged one.

guardstack's own control flow ends the hedging: after a cap's ``TurnBlocked`` or
another layer's refusal no further hedge starts (the attempts already running may
still win). An exception an inner layer raises propagates as itself, with the blame
where it was raised — never wrapped in an exception group.

Cost: racing needs a task group and a task per call, about 0.1 ms even when the
first attempt answers at once (``benchmarks/resilience.py``): hedge calls slow
enough to be worth it, not every call.

Hedging runs a call more than once, so it is for idempotent tools and for model
calls: a tool declared ``ToolDefinition(idempotent=False)`` is never hedged (it
runs once), and ``tools`` (name patterns) limits hedging to the tools you name; a
pattern naming a non-idempotent registered tool outright is refused when applied.
"""

from __future__ import annotations

import re
from typing import Any, ClassVar, Literal, TypeAlias

import anyio
import attrs
from anyio.abc import TaskGroup

from guardstack.pipeline.contract import (
    CallContext,
    ItemT,
    Next,
    Scope,
    StageAdapter,
    ValueT,
    adapter_for,
    stage_of,
)
from guardstack.pipeline.validate import (
    StageName,
    compile_patterns,
    integer,
    invalid,
    patterns,
)
from guardstack.pipeline.values import validate_timeout_ms
from guardstack.wrappers._keyed import refuse_names_without_names, register, stage_repr

__all__ = ["Hedge"]

PLUGIN = "hedge"

_Kind: TypeAlias = Literal["won", "failed", "control", "raised"]


def _stage(value: object) -> StageName:
    return stage_of(PLUGIN, value)  # its name, or the stage itself (``MODEL``)


def _delay(_: Any, __: Any, value: Any) -> None:
    validate_timeout_ms(PLUGIN, "delay_ms", value)


def _max_hedges(_: Any, __: Any, value: Any) -> None:
    integer(PLUGIN, "max_hedges", value)


def _tools(value: object) -> tuple[str, ...]:
    return patterns(PLUGIN, "tools", value)


@attrs.frozen
class Hedge:
    """After ``delay_ms`` without an answer, up to ``max_hedges`` more attempts; first good wins."""

    name: ClassVar[str] = PLUGIN

    stage: StageName = attrs.field(default="dispatch", converter=_stage, kw_only=True)
    delay_ms: int = attrs.field(validator=_delay)
    max_hedges: int = attrs.field(default=1, validator=_max_hedges)
    #: Name patterns: hedge only these tools (empty: every tool not declared non-idempotent).
    tools: tuple[str, ...] = attrs.field(default=(), converter=_tools)
    _tools: re.Pattern[str] | None = attrs.field(init=False, repr=False, eq=False)
    _stage: StageAdapter[Any, Any, Any] = attrs.field(init=False, repr=False, eq=False)

    def __attrs_post_init__(self) -> None:
        refuse_names_without_names(PLUGIN, self.stage, tools=self.tools)
        object.__setattr__(self, "_tools", compile_patterns(self.tools))
        object.__setattr__(self, "_stage", adapter_for(self.stage))

    def hedges(self, item: CallContext) -> bool:
        """Whether a call may be hedged: not declared non-idempotent, and named if limited."""
        if not item.may_repeat:
            return False
        name = item.tool_name
        return self._tools is None or name is None or bool(self._tools.fullmatch(name))

    def apply(self, scope: Scope) -> None:
        """Register on the stage it names; refuse a named tool that must not run twice."""
        for pattern in self.tools:
            tool = scope.tools.get(pattern) if "*" not in pattern else None
            if tool is not None and tool.idempotent is False:
                raise invalid(
                    PLUGIN,
                    "tools",
                    list(self.tools),
                    f'tools that may run twice; "{pattern}" is declared idempotent=False',
                )
        register(scope, self.stage, self, PLUGIN)

    async def __call__(self, item: ItemT, call_next: Next[ItemT, ValueT]) -> ValueT:
        if not self.hedges(item):
            return await call_next(item)
        stage: StageAdapter[ItemT, ValueT, Any] = self._stage
        kind, outcome = await self._race(item, call_next, stage)
        if kind == "raised":
            raise outcome  # as itself: the layer that raised it keeps the blame
        return stage.deliver(outcome)

    async def _race(
        self, item: ItemT, call_next: Next[ItemT, ValueT], stage: StageAdapter[ItemT, ValueT, Any]
    ) -> tuple[_Kind, Any]:
        """Start the call, hedge it; the first win (or exception) ends the race."""
        first = item.hedge
        finished: list[tuple[_Kind, Any]] = []
        running = 0
        changed = anyio.Event()

        async def run(number: int, group: TaskGroup) -> None:
            nonlocal running
            kind: _Kind
            try:
                outcome = await stage.attempt(call_next, item.with_hedge(number))
            except Exception as error:
                kind, outcome = "raised", error
            else:
                failed = stage.failure_of(outcome)
                if failed is None:
                    kind = "won"
                elif failed.control:
                    kind = "control"
                else:
                    kind = "failed"
            finally:
                running -= 1
            finished.append((kind, outcome))
            if kind in ("won", "raised") and running:
                group.cancel_scope.cancel()  # the others stop before the race returns
            changed.set()

        async with anyio.create_task_group() as group:
            started, hedging = 0, True
            while True:
                if hedging and started <= self.max_hedges:
                    running += 1
                    group.start_soon(run, first + started, group)
                    started += 1
                elif running == 0:
                    break
                changed = anyio.Event()
                more = hedging and started <= self.max_hedges
                with anyio.move_on_after(self.delay_ms / 1000 if more else float("inf")):
                    await changed.wait()
                if any(kind in ("won", "raised") for kind, _ in finished):
                    break
                if any(kind == "control" for kind, _ in finished):
                    hedging = False  # guardstack said no: never hedge after it
        for wanted in ("won", "raised"):
            for kind, outcome in finished:
                if kind == wanted:
                    return kind, outcome
        return finished[-1]

    def __repr__(self) -> str:
        names = f", tools={list(self.tools)!r}" if self.tools else ""
        where = stage_repr(self.stage)
        return f"Hedge(delay_ms={self.delay_ms}, max_hedges={self.max_hedges}{where}{names})"
