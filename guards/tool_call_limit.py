"""Tool-call limit: a hard cap on tool calls per agent per turn. A cap stops loss.

Unlike the guards, which reduce waste and leave the decision to the model, a cap
ends spending. ``per_turn`` caps all tool calls an agent makes in one turn;
``per_tool`` caps calls of any single tool in one turn (an int for every tool, or a
mapping of tool name to limit). When a call would go over:

* ``on_exceeded="deny"`` — the call is not run; the model reads a ``TOOL_DENIED``
  result saying which limit it hit, and may answer with what it has;
* ``on_exceeded="end_turn"`` — the call is denied and the turn ends after this step
  with reason ``blocked``.

Where it belongs: a pre-execute layer. Outside other pre-execute layers, it counts
calls before they can deny them; inside, only calls they allowed. Denied calls
(by it or others inside it) do not use up the budget. Counts are per agent and
reset by each new person's prompt. A call outside the agent loop counts in its
``call.conversation``, or, with neither, in one anonymous conversation (with a
``GuardstackWarning``); ``reset(conversation)`` starts such a conversation's next
turn. With parallel tool calls, pre-execute runs in the model's order, so the
count is exact.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Hashable, Mapping
from typing import ClassVar, Final, Literal

import attrs

from guardstack.guards.agent_state import ConversationState, Resettable
from guardstack.pipeline.contract import PreNext, Scope
from guardstack.pipeline.validate import integer, invalid
from guardstack.pipeline.values import Deny, PreDecision, ToolCall

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


@attrs.define(eq=False)
class _TurnCounts:
    total: int = 0
    by_tool: Counter[str] = attrs.Factory(Counter)


@attrs.frozen
class ToolCallLimit:
    """At most ``per_turn`` calls, and ``per_tool`` calls of one tool, per agent per turn."""

    name: ClassVar[str] = PLUGIN

    per_turn: int | None = attrs.field(default=None, validator=_check_per_turn)
    per_tool: int | Mapping[str, int] | None = attrs.field(default=None, converter=_per_tool)
    on_exceeded: Literal["deny", "end_turn"] = attrs.field(
        default="deny", validator=_check_on_exceeded
    )
    _resets: Resettable = attrs.field(init=False, repr=False, eq=False, factory=Resettable)

    def __attrs_post_init__(self) -> None:
        if self.per_turn is None and self.per_tool is None:
            raise invalid(
                PLUGIN,
                "per_turn",
                None,
                "set (or `per_tool`, or both); with neither it caps nothing",
            )

    def _tool_limit(self, tool: str) -> int | None:
        if isinstance(self.per_tool, Mapping):
            return self.per_tool.get(tool)
        return self.per_tool

    def over_limit(self, total: int, tool: str, tool_calls: int) -> str | None:
        """The denial reason for one more call of ``tool`` after these counts, or ``None``."""
        if self.per_turn is not None and total >= self.per_turn:
            return (
                f"tool call limit reached: this turn already made {total} tool "
                f"calls and the limit is {self.per_turn} per turn. Do not call more tools; "
                "answer with what you have."
            )
        limit = self._tool_limit(tool)
        if limit is not None and tool_calls >= limit:
            return (
                f'tool call limit reached: "{tool}" was already called '
                f"{tool_calls} times this turn and the limit is {limit}. Use "
                "what it returned, or try something else."
            )
        return None

    def reset(self, conversation: Hashable | None) -> None:
        """Start a new turn for ``conversation`` (a key, an agent, or ``None``: anonymous)."""
        self._resets.reset(conversation)

    def apply(self, scope: Scope) -> None:
        """Register the counting pre-execute layer and the per-turn reset, with fresh counts."""
        counts: ConversationState[_TurnCounts] = self._resets.track(ConversationState(PLUGIN))
        cap = _Cap(self, counts)
        scope.use(scope.tools.pre_execute, cap.pre_execute, name=self.name)
        # a new turn starts with fresh counts
        scope.use(scope.loop.prompt_submit, counts.reset_on_prompt, name=self.name)


class _Cap:
    """One application's counts, and the pre-execute layer that enforces them."""

    __slots__ = ("config", "counts")

    def __init__(self, config: ToolCallLimit, counts: ConversationState[_TurnCounts]) -> None:
        self.config = config
        self.counts = counts

    async def pre_execute(self, call: ToolCall, call_next: PreNext) -> PreDecision:
        counts = self.counts.get(call)
        if counts is None:
            counts = _TurnCounts()
            self.counts.set(call, counts)
        reason = self.config.over_limit(counts.total, call.name, counts.by_tool[call.name])
        if reason is not None:
            return Deny(reason, end_turn=self.config.on_exceeded == "end_turn")
        decision = await call_next(call)
        if not isinstance(decision, Deny):
            counts.total += 1
            counts.by_tool[call.name] += 1
        return decision
