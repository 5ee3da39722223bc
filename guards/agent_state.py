"""Per-agent guard state: held weakly, so it dies with the agent, and reset by each prompt.

Both ``RepeatToolReminder`` (its chain) and ``ToolCallLimit`` (its per-turn counts)
keep state per agent that must never outlive the agent and must start fresh with
each new person's prompt. This is that one mechanism; each application of a
guard creates its own, so one guard applied to two harnesses keeps two states.
"""

from __future__ import annotations

import weakref
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Generic, TypeVar

if TYPE_CHECKING:
    from guardstack.pipeline.contract import Agent

__all__ = ["AgentState"]

T = TypeVar("T")


class AgentState(Generic[T]):
    """A weak map from agent to state, with a ``prompt_submit`` layer that clears it."""

    def __init__(self) -> None:
        self._states: weakref.WeakKeyDictionary[Agent, T] = weakref.WeakKeyDictionary()

    def get(self, agent: Agent) -> T | None:
        """The agent's state, or ``None`` before its first call this turn."""
        return self._states.get(agent)

    def set(self, agent: Agent, state: T) -> None:
        """Replace the agent's state."""
        self._states[agent] = state

    async def reset_on_prompt(
        self, agent: Agent, text: str, call_next: Callable[[Agent, str], Awaitable[str]]
    ) -> str:
        """A ``prompt_submit`` layer: each new person's prompt starts the agent afresh."""
        self._states.pop(agent, None)
        return await call_next(agent, text)
