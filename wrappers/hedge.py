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
Inner layers see each attempt's number as ``call.attempt`` (1 is the original).

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
from collections.abc import Awaitable, Callable
from typing import Any, ClassVar, TypeVar

import anyio
import attrs
from anyio.abc import TaskGroup

from guardstack.pipeline.contract import (
    DispatchNext,
    ModelNext,
    ModelReply,
    ModelRequest,
    Scope,
)
from guardstack.pipeline.validate import (
    StageName,
    compile_patterns,
    integer,
    invalid,
    patterns,
    stage,
)
from guardstack.pipeline.values import ToolCall, ToolResult, validate_timeout_ms

__all__ = ["Hedge"]

PLUGIN = "hedge"
T = TypeVar("T")


def _stage(value: object) -> StageName:
    return stage(PLUGIN, value)


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

    def __attrs_post_init__(self) -> None:
        if self.stage == "model" and self.tools:
            raise invalid(PLUGIN, "tools", self.tools, "empty on the model stage (no tools)")
        object.__setattr__(self, "_tools", compile_patterns(self.tools))

    def hedges(self, call: ToolCall) -> bool:
        """Whether ``call`` may be hedged: not declared non-idempotent, and named if limited."""
        tool = call.tool
        if tool is not None and tool.idempotent is False:
            return False
        return self._tools is None or bool(self._tools.fullmatch(call.name))

    def apply(self, scope: Scope) -> None:
        """Register on the stage it names; refuse a named tool that must not run twice."""
        if self.stage == "model":
            scope.use(scope.loop.model_call, self.model_layer, name=PLUGIN)
            return
        for pattern in self.tools:
            tool = scope.tools.get(pattern) if "*" not in pattern else None
            if tool is not None and tool.idempotent is False:
                raise invalid(
                    PLUGIN,
                    "tools",
                    list(self.tools),
                    f'tools that may run twice; "{pattern}" is declared idempotent=False',
                )
        scope.use(scope.tools.dispatch, self, name=PLUGIN)

    async def __call__(self, call: ToolCall, call_next: DispatchNext) -> ToolResult:
        if not self.hedges(call):
            return await call_next(call)

        async def attempt(number: int) -> tuple[bool, Any]:
            hedged = call if number == call.attempt else attrs.evolve(call, attempt=number)
            result = await call_next(hedged)
            return not result.is_error, result

        _, result = await self._race(attempt, call.attempt)
        return result  # type: ignore[no-any-return]

    async def model_layer(self, request: ModelRequest, call_next: ModelNext) -> ModelReply:
        async def attempt(number: int) -> tuple[bool, Any]:
            hedged = request if number == request.attempt else attrs.evolve(request, attempt=number)
            try:
                return True, await call_next(hedged)
            except Exception as error:
                return False, error

        won, outcome = await self._race(attempt, request.attempt)
        if not won:
            raise outcome
        return outcome  # type: ignore[no-any-return]

    async def _race(
        self, attempt: Callable[[int], Awaitable[tuple[bool, T]]], first: int
    ) -> tuple[bool, T]:
        """Start ``attempt(first)``, hedge it; the first ``(True, …)`` wins, else the last."""
        last: list[tuple[bool, T]] = []
        running = 0
        changed = anyio.Event()

        async def run(number: int, group: TaskGroup) -> None:
            nonlocal running, changed
            try:
                outcome = await attempt(number)
            finally:
                running -= 1
            last.append(outcome)
            if outcome[0] and running:
                group.cancel_scope.cancel()  # the others stop before the race returns
            changed.set()

        async with anyio.create_task_group() as group:
            started = 0
            while True:
                if started <= self.max_hedges:
                    running += 1
                    group.start_soon(run, first + started, group)
                    started += 1
                elif running == 0:
                    break
                changed = anyio.Event()
                if started <= self.max_hedges:
                    with anyio.move_on_after(self.delay_ms / 1000):
                        await changed.wait()
                else:
                    await changed.wait()
                if last and last[-1][0]:
                    break
                if running == 0 and started > self.max_hedges:
                    break
        winners = [outcome for outcome in last if outcome[0]]
        return winners[0] if winners else last[-1]

    def __repr__(self) -> str:
        names = f", tools={list(self.tools)!r}" if self.tools else ""
        where = ", stage='model'" if self.stage == "model" else ""
        return f"Hedge(delay_ms={self.delay_ms}, max_hedges={self.max_hedges}{where}{names})"
