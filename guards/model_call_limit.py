"""Model-call limit: a hard cap on model calls per turn and per session. A cap stops loss.

Agents spend most of their money on model calls. ``per_turn`` caps the model calls
an agent makes in one turn, ``per_session`` those over its whole session (a resumed
session counts the replies already in its log). The check runs before each model
request: the call that would go over is not sent, and the turn ends with reason
``blocked`` and ``TurnResult.error`` naming the limit. The replies before it (and
their tool calls) are all logged, so the log stays whole.

Where it belongs: a ``model_call`` layer, and its position decides what it counts.
Outside a model-stage ``Retry`` it counts operations (a call retried three times is
one); inside it, attempts (each provider request). Calls it refused are not counted.
"""

from __future__ import annotations

import weakref
from typing import TYPE_CHECKING, ClassVar, Final

import attrs

from guardstack.guards.agent_state import ConversationState
from guardstack.pipeline.contract import ModelNext, ModelReply, ModelRequest, Scope
from guardstack.pipeline.errors import TurnBlocked
from guardstack.pipeline.validate import invalid, optional_integer

if TYPE_CHECKING:
    from guardstack.pipeline.contract import Agent

__all__ = ["ModelCallLimit"]

PLUGIN: Final = "model-call-limit"


def logged_replies(agent: Agent) -> int:
    """How many model replies the agent's log holds (a resumed session's earlier calls)."""
    return sum(1 for event in agent.session.events if event.type == "assistant/message")


@attrs.frozen
class ModelCallLimit:
    """At most ``per_turn`` model calls per turn and ``per_session`` per session."""

    name: ClassVar[str] = PLUGIN

    per_turn: int | None = attrs.field(default=None, validator=optional_integer(PLUGIN, "per_turn"))
    per_session: int | None = attrs.field(
        default=None, validator=optional_integer(PLUGIN, "per_session")
    )

    def __attrs_post_init__(self) -> None:
        if self.per_turn is None and self.per_session is None:
            raise invalid(
                PLUGIN,
                "per_turn",
                None,
                "set (or `per_session`, or both); with neither it caps nothing",
            )

    def apply(self, scope: Scope) -> None:
        """Register the counting model-call layer and the per-turn reset, with fresh counts."""
        turn: ConversationState[list[int]] = ConversationState(PLUGIN)
        session: weakref.WeakKeyDictionary[Agent, list[int]] = weakref.WeakKeyDictionary()

        async def model_layer(request: ModelRequest, call_next: ModelNext) -> ModelReply:
            agent = request.agent
            in_turn = turn.of_agent(agent)
            if in_turn is None:
                in_turn = [0]
                turn.set_agent(agent, in_turn)
            in_session = session.get(agent)
            if in_session is None:
                in_session = session[agent] = [logged_replies(agent)]
            if self.per_turn is not None and in_turn[0] >= self.per_turn:
                raise TurnBlocked(
                    f"{PLUGIN}: this turn made {in_turn[0]} model calls and the limit is "
                    f"{self.per_turn} per turn"
                )
            if self.per_session is not None and in_session[0] >= self.per_session:
                raise TurnBlocked(
                    f"{PLUGIN}: this session made {in_session[0]} model calls and the limit is "
                    f"{self.per_session} per session"
                )
            in_turn[0] += 1
            in_session[0] += 1
            return await call_next(request)

        scope.use(scope.loop.model_call, model_layer, name=PLUGIN)
        scope.use(scope.loop.prompt_submit, turn.reset_on_prompt, name=PLUGIN)
