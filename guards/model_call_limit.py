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

The counts are kept in the harness's ``StateStore`` (or ``store=``): a session's
count under its session id, so agents in several processes sharing a store share a
session's limit. A store that fails ends the turn (a cap fails closed, unless the
store's ``on_error`` says ``"open"``).
"""

from __future__ import annotations

import weakref
from typing import TYPE_CHECKING, ClassVar, Final

import anyio
import attrs

from guardstack.guards.agent_state import ConversationState, new_turn_token
from guardstack.pipeline.contract import ModelNext, ModelReply, ModelRequest, Scope, StateStore
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
    #: Where the counts live (``None``: the harness's store).
    store: StateStore | None = attrs.field(default=None, kw_only=True, repr=False)

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
        store = scope.store_for(self.store)
        namespace = scope.namespace
        turns: ConversationState[str] = ConversationState(PLUGIN)
        seen: weakref.WeakSet[Agent] = weakref.WeakSet()

        async def count(key: str, limit: int | None, initial: int, what: str) -> str:
            added, used = await store.add(key, 1, limit=limit, initial=initial)
            if not added:
                raise TurnBlocked(
                    f"{PLUGIN}: this {what} made {int(used)} model calls and the limit is "
                    f"{limit} per {what}"
                )
            return key

        async def model_layer(request: ModelRequest, call_next: ModelNext) -> ModelReply:
            agent = request.agent
            turn = turns.of_agent(agent)
            if turn is None:
                turn = new_turn_token()
                turns.set_agent(agent, turn)
            # a session this process has not seen yet counts the replies its log holds
            initial = 0
            if agent not in seen:
                seen.add(agent)
                initial = logged_replies(agent)
            counted: list[str] = []
            try:
                counted.append(await count(f"{namespace}:{turn}:turn", self.per_turn, 0, "turn"))
                counted.append(
                    await count(
                        f"{namespace}:session:{agent.session_id}",
                        self.per_session,
                        initial,
                        "session",
                    )
                )
            except TurnBlocked:
                await give_back(counted)
                raise
            except Exception as error:
                await give_back(counted)
                if store.on_error != "open":
                    raise TurnBlocked(
                        f"{PLUGIN}: its {store.name} store is not answering "
                        f"({type(error).__name__}); no model call is made without it"
                    ) from error
            return await call_next(request)

        async def give_back(keys: list[str]) -> None:
            with anyio.CancelScope(shield=True):
                for key in keys:
                    try:
                        await store.add(key, -1)
                    except Exception:
                        continue

        async def remaining(agent: Agent) -> dict[str, float]:
            left: list[float] = []
            turn = turns.of_agent(agent)
            try:
                if self.per_turn is not None:
                    used = 0.0 if turn is None else await store.read(f"{namespace}:{turn}:turn")
                    left.append(self.per_turn - used)
                if self.per_session is not None:
                    used = await store.read(f"{namespace}:session:{agent.session_id}")
                    left.append(self.per_session - max(used, logged_replies(agent)))
            except Exception:
                return {}
            return {"model_calls": max(0.0, min(left))}

        scope.use(scope.loop.model_call, model_layer, name=PLUGIN)
        scope.use(scope.loop.prompt_submit, turns.reset_on_prompt, name=PLUGIN)
        scope.adopt(scope.loop.ledger.report_remaining(remaining))
