"""TurnDeadline: one time budget for a whole turn, seen by every call inside it.

Where it belongs: around the whole turn (``AgentLoop.instrument_turn``), so every
model call and tool call of the turn runs inside its deadline: ``anyio``'s
effective deadline there is the turn's end, so ``Retry(respect_deadline=True)``
never starts an attempt that cannot finish, and each call's own budget
(``ToolCallTimeoutPolicy``, a ``Timeout``) still applies when it is shorter. When
the deadline passes, the running calls are cancelled and answered ``ABORTED`` (a
call never started: ``ABORTED_BEFORE_DISPATCH``), the turn ends with reason
``deadline`` — the log whole, so the next turn starts from a valid request — and
``prompt`` returns that result instead of raising.

It is per turn: the next prompt gets the whole budget again. A cancel from outside
(``agent.cancel()``, a task group) still ends the turn ``aborted``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, ClassVar, Final

import anyio
import attrs

from guardstack.pipeline.contract import Scope, TurnRun
from guardstack.pipeline.signals import Shadow
from guardstack.pipeline.validate import flag, integer

if TYPE_CHECKING:
    from guardstack.pipeline.contract import Agent

__all__ = ["TurnDeadline"]

PLUGIN: Final = "turn-deadline"


def _check_ms(_: Any, __: Any, value: Any) -> None:
    integer(PLUGIN, "ms", value, minimum=1)


@attrs.frozen
class TurnDeadline:
    """The whole turn's time budget, in milliseconds."""

    name: ClassVar[str] = PLUGIN

    ms: int = attrs.field(validator=_check_ms)
    #: Watch the clock as usual, record the turns it would have ended, end none.
    shadow: bool = attrs.field(default=False, validator=flag(PLUGIN, "shadow"), kw_only=True)

    def apply(self, scope: Scope) -> None:
        if self.shadow:
            scope.adopt(scope.loop.instrument_turn(self._watching(Shadow(PLUGIN, scope.signals))))
            return

        def hook(run: TurnRun) -> TurnRun:
            async def within(agent: Agent, text: str) -> Any:
                restore = agent.limit_turn(self.ms)  # an enclosing, sooner one wins
                deadline = agent.turn_deadline
                assert deadline is not None  # just set, or inherited
                try:
                    with anyio.CancelScope(deadline=deadline):
                        return await run(agent, text)
                finally:
                    restore()
                return agent.last_turn_result()  # the deadline cut it: its log says so

            return within

        scope.adopt(scope.loop.instrument_turn(hook))

    def _watching(self, shadow: Shadow) -> Callable[[TurnRun], TurnRun]:
        """In shadow mode: the turn runs whole; one that outlives the budget is recorded
        (a watcher beside it, cancelled when the turn ends). Calls inside see no deadline."""
        budget_s = self.ms / 1000

        def hook(run: TurnRun) -> TurnRun:
            async def watched(agent: Agent, text: str) -> Any:
                async def watch() -> None:
                    await anyio.sleep(budget_s)
                    shadow.would("end the turn", f"agent {agent.session_id}",
                                 f"it ran past its {self.ms} ms")  # fmt: skip

                async with anyio.create_task_group() as group:
                    group.start_soon(watch)
                    try:
                        return await run(agent, text)
                    finally:
                        group.cancel_scope.cancel()

            return watched

        return hook
