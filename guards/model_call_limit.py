"""Model-call limit: a hard cap on model calls per turn and per session. A cap stops loss.

Agents spend most of their money on model calls. ``per_turn`` caps the model calls
an agent makes in one turn, ``per_session`` those over its whole session (a resumed
session counts the replies already in its log). Each call is reserved in the ledger
before it is sent: the call that would go over is not sent, and the turn ends with
reason ``blocked`` and ``TurnResult.error`` naming the limit. Calls running at once —
parallel child agents, several processes on one session — are reserved one by one,
so together they never pass the limit. The replies before the refusal (and their tool
calls) are all logged, so the log stays whole. With ``on_limit="wrap_up"`` the last call
of the limit is kept aside: the call that would pass the rest goes once more with its
tools withheld and a note asking the model what it did and what is left, and the turn
ends ``blocked`` with that answer as its text (``guards.wrap_up``).

Where it belongs: a ``model_call`` layer, and its position decides what it counts.
Outside a model-stage ``Retry`` it counts operations (a call retried three times is
one); inside it, attempts (each provider request). Calls refused before they reached
the provider — by it, by another layer, or by the provider's own 429 or 400 — are
given back; calls that may have reached it (a timeout, a cancelled caller, a 5xx)
count.

The counts are kept in the harness's store (or ``store=``), through its ``Ledger``: a
session's count under its session id, for the session's lifetime and never less than
its log holds (so a store that lost it goes on from the log), a turn's until the turn
ends. A store that fails ends the turn (a cap fails closed, unless the store's
``on_error`` says ``"open"``).
"""

from __future__ import annotations

import weakref
from typing import TYPE_CHECKING, ClassVar, Final

import attrs

from guardstack.guards._accounts import Accounts, StoreDown, check_ledger_store
from guardstack.guards.wrap_up import OnLimit, check_on_limit, wrap_up
from guardstack.pipeline.contract import (
    ModelNext,
    ModelReply,
    ModelRequest,
    Scope,
    StateStore,
    never_reached,
)
from guardstack.pipeline.errors import TurnBlocked
from guardstack.pipeline.signals import Shadow
from guardstack.pipeline.validate import flag, invalid, optional_integer

if TYPE_CHECKING:
    from guardstack.pipeline.contract import Agent, Window

__all__ = ["ModelCallLimit"]

PLUGIN: Final = "model-call-limit"


def logged_replies(agent: Agent) -> int:
    """How many model replies the agent's log holds (a resumed session's earlier calls)."""
    return sum(1 for event in agent.session.events if event.type == "assistant/message")


@attrs.frozen
class ModelCallLimit:
    """At most ``per_turn`` model calls per turn and ``per_session`` per session."""

    name: ClassVar[str] = PLUGIN
    #: What an operator may change at run time (``harness.control.set_limit``).
    controllable: ClassVar[frozenset[str]] = frozenset({"per_turn", "per_session"})

    per_turn: int | None = attrs.field(default=None, validator=optional_integer(PLUGIN, "per_turn"))
    per_session: int | None = attrs.field(
        default=None, validator=optional_integer(PLUGIN, "per_session")
    )
    #: Where the counts live (``None``: the harness's store).
    store: StateStore | None = attrs.field(
        default=None, kw_only=True, repr=False, validator=check_ledger_store(PLUGIN)
    )
    #: Count as usual, record what it would have refused, refuse nothing.
    shadow: bool = attrs.field(default=False, validator=flag(PLUGIN, "shadow"), kw_only=True)
    #: At the limit: end the turn (``stop``), or keep its last call for an answer
    #: without tools first (``wrap_up``).
    on_limit: OnLimit = attrs.field(default="stop", validator=check_on_limit(PLUGIN), kw_only=True)

    def __attrs_post_init__(self) -> None:
        if self.per_turn is None and self.per_session is None:
            raise invalid(
                PLUGIN,
                "per_turn",
                None,
                "set (or `per_session`, or both); with neither it caps nothing",
            )

    def apply(self, scope: Scope) -> None:
        """Register the counting model-call layer; its turn windows close as turns end."""
        accounts = Accounts(scope, self.store)
        shadow = Shadow(scope.namespace, scope.signals) if self.shadow else None
        #: The least each agent's session has made: its log's replies when first seen,
        #: plus every call this process counted since.
        made: weakref.WeakKeyDictionary[Agent, int] = weakref.WeakKeyDictionary()

        control, plugin_id = scope.control, scope.plugin_id

        def limits() -> tuple[int | None, int | None]:
            per_turn, per_session = self.per_turn, self.per_session
            if control is not None and control.limits:  # an operator's numbers, if any
                turn = control.limit(plugin_id, None, "per_turn")
                session = control.limit(plugin_id, None, "per_session")
                per_turn = int(turn) if turn is not None else per_turn
                per_session = int(session) if session is not None else per_session
            return per_turn, per_session

        def windows(agent: Agent, aside: int = 0) -> list[Window]:
            """The agent's windows, ``aside`` calls of each limit kept for a wrap-up."""
            found = []
            per_turn, per_session = limits()
            if per_turn is not None:
                per_turn = max(0, per_turn - aside)
            if per_session is not None:
                per_session = max(0, per_session - aside)
            if per_turn is not None:
                token = accounts.turn_of(agent)
                floor = agent.turn_model_calls
                found.append(accounts.turn_window(token, "calls", "calls", per_turn, floor))
            if per_session is not None:
                logged = made.get(agent)
                if logged is None:
                    logged = made[agent] = logged_replies(agent)
                found.append(
                    accounts.session_window(agent.session_id, "calls", "calls", per_session, logged)
                )
            return found

        wraps_up = self.on_limit == "wrap_up"

        async def model_layer(request: ModelRequest, call_next: ModelNext) -> ModelReply:
            agent = request.agent
            wanted = windows(agent, 1 if wraps_up else 0)
            op_id = accounts.operation()
            try:
                reservation = await accounts.reserve(op_id, _ONE, wanted)
            except StoreDown as down:
                if not accounts.fails_open:
                    raise TurnBlocked(
                        f"{PLUGIN}: its {accounts.ledger.name} store is not answering "
                        f"({type(down.error).__name__}); no model call is made without it"
                    ) from down.error
                return await call_next(request)
            if not reservation.granted:
                refused = reservation.window
                per_turn, per_session = limits()
                turn = per_turn is not None and refused is not None
                what = "turn" if turn and refused and refused.key == wanted[0].key else "session"
                limit = per_turn if what == "turn" else per_session
                reason = (
                    f"{PLUGIN}: this {what} made {int(reservation.used)} model calls and the "
                    f"limit is {limit} per {what}"
                )
                if shadow is not None:
                    shadow.would("end the turn", f"agent {agent.session_id}", reason)
                    return await call_next(request)
                if not wraps_up:
                    raise TurnBlocked(reason)
                # the call kept aside, if this turn has not used it
                last_op = accounts.operation()
                try:
                    kept = await accounts.reserve(last_op, _ONE, windows(agent))
                except StoreDown as down:
                    raise TurnBlocked(reason) from down.error
                if not kept.granted:
                    raise TurnBlocked(reason)

                async def last(request: ModelRequest) -> ModelReply:
                    return await counted(last_op, agent, request, call_next)

                await wrap_up(request, last, reason)
            return await counted(op_id, agent, request, call_next)

        async def counted(
            op_id: str, agent: Agent, request: ModelRequest, call_next: ModelNext
        ) -> ModelReply:
            """The reserved call made, and counted unless it never reached the model."""
            try:
                reply = await call_next(request)
            except BaseException as error:
                if never_reached(error):
                    await accounts.release(op_id)
                else:
                    await accounts.charged(op_id, _ONE)
                    _counted(made, agent)
                raise
            await accounts.charged(op_id, _ONE)
            _counted(made, agent)
            return reply

        async def remaining(agent: Agent) -> dict[str, float]:
            left: list[float] = []
            try:
                for window in windows(agent):
                    assert window.limit is not None
                    left.append(window.limit - await accounts.balance(window))
            except Exception:
                return {}
            return {"model_calls": max(0.0, min(left))}

        scope.use(scope.loop.model_call, model_layer, name=PLUGIN)
        accounts.close_turns(
            scope, lambda token: [accounts.turn_window(token, "calls", "calls", None).key]
        )
        scope.adopt(scope.loop.tree.report_remaining(remaining))


#: One model call, in the ledger's units.
_ONE: Final = {"calls": 1.0}


def _counted(made: weakref.WeakKeyDictionary[Agent, int], agent: Agent) -> None:
    if agent in made:
        made[agent] += 1
