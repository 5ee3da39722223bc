"""Tool-call limit: a hard cap on tool calls per agent per turn. A cap stops loss.

Unlike the guards, which reduce waste and leave the decision to the model, a cap
ends spending. ``per_turn`` caps all tool calls an agent makes in one turn;
``per_tool`` caps calls of tools in one turn: an int caps each tool on its own, a
mapping gives budgets by name pattern (``*`` wildcards, as the reminder's
``include``): ``{"search_*": 3}`` is one budget of 3 shared by every tool whose name
matches, ``{"deploy": 1}`` one for ``deploy`` alone. A call counts against every
entry it matches. When a call would go over:

* ``on_exceeded="deny"`` — the call is not run; the model reads a ``TOOL_DENIED``
  result saying which limit it hit, and may answer with what it has;
* ``on_exceeded="end_turn"`` — the call is denied and the turn ends after this step
  with reason ``blocked``;
* ``on_limit="wrap_up"`` (whichever ``on_exceeded``) — the call is denied, and the
  turn's next model call goes with its tools withheld and a note asking the model
  what it did and what is left; the turn ends ``blocked`` with that answer as its
  text (``guards.wrap_up``).

Where it belongs: a pre-execute layer. Outside other pre-execute layers, it counts
calls before they can deny them; inside, only calls they allowed. Denied calls
(by it or others inside it) do not use up the budget. Counts are per agent and
reset by each new person's prompt. A call outside the agent loop counts in its
``call.conversation``, or, with neither, in one anonymous conversation (with a
``GuardstackWarning``); ``reset(conversation)`` starts such a conversation's next
turn. With parallel tool calls, pre-execute runs in the model's order, so the
count is exact.

The counts are kept in the harness's store (or ``store=``), through its ``Ledger``: each
call is reserved in every counter it counts against, all or none, before it runs,
and given back if a layer inside denies it; a turn's counters go when the turn ends
(a day after their last use for a conversation outside the agent loop). A store that
fails denies the call (a cap fails closed, unless the store's ``on_error`` says
``"open"``), and a reservation whose answer was lost is released, never kept.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Hashable, Mapping
from typing import TYPE_CHECKING, Any, ClassVar, Final, Literal

import attrs

from guardstack.guards._accounts import Accounts, StoreDown, check_ledger_store
from guardstack.guards.agent_state import ConversationState, Resettable, new_turn_token
from guardstack.guards.wrap_up import OnLimit, check_on_limit, wrap_up
from guardstack.pipeline.contract import (
    UNKNOWN_KEY,
    Control,
    ModelNext,
    ModelReply,
    ModelRequest,
    PreNext,
    Scope,
    StateStore,
    Window,
)
from guardstack.pipeline.signals import Shadow
from guardstack.pipeline.validate import compile_patterns, flag, integer, invalid
from guardstack.pipeline.values import TOOL_DENIED, ToolCall
from guardstack.pipeline.verdicts import Deny, PreDecision

if TYPE_CHECKING:
    from guardstack.pipeline.contract import Agent

__all__ = ["ToolCallLimit"]

PLUGIN: Final = "tool-call-limit"


def _check_per_turn(_: object, __: attrs.Attribute[int | None], value: int | None) -> None:
    if value is not None:
        integer(PLUGIN, "per_turn", value)


def _per_tool(value: object) -> int | Mapping[str, int] | None:
    if value is None:
        return None
    if isinstance(value, int):
        return integer(PLUGIN, "per_tool", value)
    if isinstance(value, Mapping) and value:
        for tool, limit in value.items():
            if not isinstance(tool, str) or not tool:
                raise invalid(PLUGIN, "per_tool", value, "keyed by tool names")
            integer(PLUGIN, f"per_tool.{tool}", limit)
        return dict(value)
    raise invalid(PLUGIN, "per_tool", value, "an integer or a mapping of tool name to integer")


def _check_on_exceeded(_: object, __: object, value: object) -> None:
    if value not in ("deny", "end_turn"):
        raise invalid(PLUGIN, "on_exceeded", value, "'deny' or 'end_turn'")


@attrs.frozen
class ToolCallLimit:
    """At most ``per_turn`` calls, and ``per_tool`` calls of one tool, per agent per turn."""

    name: ClassVar[str] = PLUGIN
    #: What an operator may change at run time (``harness.control.set_limit``).
    controllable: ClassVar[frozenset[str]] = frozenset({"per_turn"})

    per_turn: int | None = attrs.field(default=None, validator=_check_per_turn)
    per_tool: int | Mapping[str, int] | None = attrs.field(default=None, converter=_per_tool)
    on_exceeded: Literal["deny", "end_turn"] = attrs.field(
        default="deny", validator=_check_on_exceeded
    )
    #: Where the counts live (``None``: the harness's store).
    store: StateStore | None = attrs.field(
        default=None, validator=check_ledger_store(PLUGIN), kw_only=True, repr=False
    )
    #: Count as usual, record what it would have refused, refuse nothing.
    shadow: bool = attrs.field(default=False, validator=flag(PLUGIN, "shadow"), kw_only=True)
    #: ``wrap_up``: past the limit, one last model call without tools, then the end.
    on_limit: OnLimit = attrs.field(default="stop", validator=check_on_limit(PLUGIN), kw_only=True)
    _resets: Resettable = attrs.field(init=False, repr=False, eq=False, factory=Resettable)
    _patterns: tuple[tuple[str, re.Pattern[str], int], ...] = attrs.field(
        init=False, repr=False, eq=False
    )

    def __attrs_post_init__(self) -> None:
        if self.per_turn is None and self.per_tool is None:
            raise invalid(
                PLUGIN,
                "per_turn",
                None,
                "set (or `per_tool`, or both); with neither it caps nothing",
            )
        entries = self.per_tool.items() if isinstance(self.per_tool, Mapping) else ()
        compiled = tuple(
            (pattern, compiled, limit)
            for pattern, limit in entries
            if (compiled := compile_patterns((pattern,))) is not None
        )
        object.__setattr__(self, "_patterns", compiled)

    def budgets(self, call: ToolCall) -> list[tuple[str, int]]:
        """The per-tool budgets a call counts against: ``(counter name, limit)`` each."""
        if self.per_tool is None:
            return []
        if isinstance(self.per_tool, int):
            return [(f"tool:{call.name if call.tool is not None else UNKNOWN_KEY}", self.per_tool)]
        return [
            (f"pattern:{pattern}", limit)
            for pattern, compiled, limit in self._patterns
            if compiled.fullmatch(call.name)
        ]

    def reason(self, counter: str, used: float, limit: int) -> str:
        """The denial the model reads when ``counter`` has used up its ``limit``."""
        used = int(used)
        if counter == "total":
            return (
                f"tool call limit reached: this turn already made {used} tool "
                f"calls and the limit is {limit} per turn. Do not call more tools; "
                "answer with what you have."
            )
        kind, _, name = counter.partition(":")
        what = (
            f'"{name}" was'
            if kind == "tool" or "*" not in name
            else f'tools matching "{name}" were'
        )
        return (
            f"tool call limit reached: {what} already called {used} times this turn and the "
            f"limit is {limit}. Use what it returned, or try something else."
        )

    def reset(self, conversation: Hashable | None) -> None:
        """Start a new turn for ``conversation`` (a key, an agent, or ``None``: anonymous)."""
        self._resets.reset(conversation)

    def apply(self, scope: Scope) -> None:
        """Register the counting pre-execute layer and the per-turn reset, with fresh counts."""
        # which turn each conversation is in outlives a reload of this id: the new
        # application counts on in the same turn's windows
        turns: ConversationState[str] = self._resets.track(
            scope.kept("turns", lambda: ConversationState[str](PLUGIN))
        )
        cap = _Cap(self, turns, Accounts(scope, self.store))
        cap.shadow = Shadow(scope.namespace, scope.signals) if self.shadow else None
        cap.control, cap.plugin_id = scope.control, scope.plugin_id
        turns.on_forget = cap.forget
        scope.use(scope.tools.pre_execute, cap.pre_execute, name=self.name)
        # a child agent's calls (AgentTool) count here too, as this agent's
        scope.adopt(scope.loop.tree.count_tool_calls(cap.pre_execute))
        if self.per_turn is not None:
            scope.adopt(scope.loop.tree.report_remaining(cap.remaining))
        # a new turn starts with fresh counts (its token made now: its first call need not
        # read the log for calls a resumed turn made before)
        scope.use(scope.loop.prompt_submit, turns.start_on_prompt(new_turn_token), name=self.name)
        cap.close_on_turn_end(scope)
        if self.on_limit == "wrap_up":
            scope.use(scope.loop.model_call, cap.wrap_up, name=self.name)


class _Cap:
    """One application's counters in a ledger, and the pre-execute layer that enforces them."""

    __slots__ = (
        "accounts",
        "config",
        "control",
        "forgotten",
        "open_turns",
        "plugin_id",
        "shadow",
        "turns",
        "wrapping",
    )

    def __init__(
        self, config: ToolCallLimit, turns: ConversationState[str], accounts: Accounts
    ) -> None:
        self.config = config
        self.turns = turns  # each conversation's current turn: a fresh token per turn
        self.accounts = accounts
        #: A turn's token -> the windows it used, by the budgets a call counted against
        #: (closed at its end).
        self.open_turns: dict[str, dict[tuple[tuple[str, int | None], ...], list[Window]]] = {}
        #: Keys of turns whose conversation was forgotten: closed at the next call.
        self.forgotten: list[str] = []
        self.shadow: Shadow | None = None
        self.control: Control | None = None
        #: A turn's token -> the denial its next model call wraps the turn up with.
        self.wrapping: dict[str, str] = {}
        self.plugin_id = PLUGIN

    def forget(self, token: str) -> None:
        """A conversation outside the loop was forgotten (or reset): its turn is over."""
        self.forgotten.extend(_keys(self.open_turns.pop(token, {})))

    def close_on_turn_end(self, scope: Scope) -> None:
        """When an agent's turn ends (not a pause for approval), its windows go."""
        open_turns, turns, ledger = self.open_turns, self.turns, self.accounts.ledger

        async def ended(agent: Agent) -> None:
            token = turns.of_agent(agent)
            if token is not None:
                self.wrapping.pop(token, None)
            used = open_turns.pop(token, None) if token is not None else None
            if used:
                with contextlib.suppress(Exception):  # else they expire a day after last use
                    await ledger.close(_keys(used))

        scope.adopt(scope.loop.on_turn_end(ended))

    def _turn(self, call: ToolCall) -> tuple[str, bool]:
        """The token of the call's turn, and whether this process just met it."""
        token = self.turns.get(call)
        fresh = token is None
        if token is None:
            token = new_turn_token()
            self.turns.set(call, token)
        return token, fresh

    def _logged(self, call: ToolCall) -> dict[str, int]:
        """What the agent's current turn already spent, by counter, from its log: a turn
        resumed in another process (after an approval) goes on from there. A denied
        call never counted; a call waiting for a decision did."""
        agent = call.agent
        if agent is None:
            return {}
        made: list[Any] = []
        denied: set[str] = set()
        event: Any
        for event in reversed(agent.session.events):  # back to the turn's start
            kind = event.type
            if kind == "turn/start":
                break
            if kind == "tool/call":
                if event.call_id != call.call_id:
                    made.append(event)
            elif kind == "tool/result" and event.result.code == TOOL_DENIED:
                denied.add(event.call_id)
        counts: dict[str, int] = {}
        for event in reversed(made):
            if event.call_id in denied:
                continue
            made_call = ToolCall(
                event.name, {}, event.call_id, tool=agent.loop.tools.get(event.name)
            )
            for counter in ("total", *(name for name, _ in self.config.budgets(made_call))):
                counts[counter] = counts.get(counter, 0) + 1
        return counts

    def windows(
        self, token: str, wanted: list[tuple[str, int | None]], floors: dict[str, int]
    ) -> list[Window]:
        """The turn's windows a call counts in (made once per turn and budget; a turn met
        afresh is floored at what its log holds)."""
        turn = self.open_turns.get(token)
        if turn is None:
            turn = self.open_turns[token] = {}
        key = tuple(wanted)
        made = None if floors else turn.get(key)
        if made is None:
            made = [
                self.accounts.turn_window(token, counter, "calls", limit, floors.get(counter, 0))
                for counter, limit in wanted
            ]
            turn[key] = made
        return made

    async def pre_execute(self, call: ToolCall, call_next: PreNext) -> PreDecision:
        config = self.config
        token, fresh = self._turn(call)
        per_turn = config.per_turn
        control = self.control
        if control is not None and control.limits:  # an operator's number, if any
            changed = control.limit(self.plugin_id, call.name, "per_turn")
            if changed is not None:
                per_turn = int(changed)
        wanted: list[tuple[str, int | None]] = [("total", per_turn)] if per_turn is not None else []
        wanted.extend(config.budgets(call))
        if not wanted:  # nothing caps this call: no store round trip for it
            return await call_next(call)
        windows = self.windows(token, wanted, self._logged(call) if fresh else {})
        accounts = self.accounts
        if self.forgotten:
            keys, self.forgotten = self.forgotten, []
            with contextlib.suppress(Exception):  # else they expire a day after their last use
                await accounts.ledger.close(keys)
        op_id = accounts.operation()
        try:
            reservation = await accounts.reserve(op_id, _ONE_CALL, windows, lease_s=_LEASE_S)
        except StoreDown as down:
            if not accounts.fails_open:
                return self._deny(
                    f"tool call limit: its {accounts.ledger.name} store is not answering "
                    f"({type(down.error).__name__}), so no more tool calls are allowed for now."
                )
            return await call_next(call)
        if not reservation.granted:
            refused = reservation.window
            counter, limit = next(
                (counter, limit)
                for (counter, limit), window in zip(wanted, windows, strict=True)
                if refused is not None and window.key == refused.key
            )
            assert limit is not None
            reason = config.reason(counter, reservation.used, limit)
            if self.shadow is not None:  # the call goes on, uncounted, as a denied one is
                would = "end the turn" if config.on_exceeded == "end_turn" else "deny"
                self.shadow.would(would, f'tool "{call.name}"', reason)
                return await call_next(call)
            if config.on_limit == "wrap_up" and call.agent is not None:
                self.wrapping.setdefault(token, reason)
                return Deny(reason)
            return self._deny(reason)
        try:
            decision = await call_next(call)
        except BaseException:
            await accounts.release(op_id)  # the call never ran
            raise
        if isinstance(decision, Deny):
            await accounts.release(op_id)  # denied calls do not use up the budget
        else:
            await accounts.charged(op_id, _ONE_CALL)
        return decision

    async def wrap_up(self, request: ModelRequest, call_next: ModelNext) -> ModelReply:
        """The model stage's side of ``on_limit="wrap_up"``: the call after a denial
        goes without tools, and its answer ends the turn."""
        token = self.turns.of_agent(request.agent)
        reason = self.wrapping.pop(token, None) if token is not None else None
        if reason is not None:
            await wrap_up(request, call_next, reason)
        return await call_next(request)

    async def remaining(self, agent: Agent) -> dict[str, float]:
        """How many more tool calls the agent's turn may make (for ``BudgetNotice``)."""
        limit = self.config.per_turn
        token = self.turns.of_agent(agent)
        if limit is None:
            return {}
        try:
            used = (
                0.0
                if token is None
                else await self.accounts.balance(
                    self.accounts.turn_window(token, "total", "calls", limit)
                )
            )
        except Exception:
            return {}
        return {"tool_calls": max(0.0, limit - used)}

    def _deny(self, reason: str) -> Deny:
        return Deny(reason, end_turn=self.config.on_exceeded == "end_turn")


def _keys(used: dict[tuple[tuple[str, int | None], ...], list[Window]]) -> list[str]:
    return sorted({window.key for windows in used.values() for window in windows})


#: How long a call's reservation may still be given back (a layer inside that denies
#: it, an approver who rejects it): past that it stays counted.
_LEASE_S: Final = 900.0

#: One tool call, in the ledger's units.
_ONE_CALL: Final = {"calls": 1.0}
