"""BudgetNotice: tell the model what is left, before each model call, so it can plan.

A model that does not know its caps finds them by hitting them: the step that would
have summed up is the one refused. ``BudgetNotice()`` logs one short context message
before each of the agent's model calls, sourced ``budget-notice``, listing what remains
of each cap that applies — the loop's steps, a ``ToolCallLimit``'s tool calls this
turn, a ``UsageLimit``'s tokens and dollars, a ``TurnDeadline``'s time — the stricter
of the agent's own and, for a child agent (``AgentTool``), its ancestors' (it spends
from theirs too). A cap that is not there is not mentioned. It is logged like a
reminder, so the request rebuilt from the log is the one the model got.

Where it belongs: around the whole model call (``instrument_model_call``), so it reads
the caps before any of them counts this call and a retry resends the same request;
it has no order among the model-stage layers.
"""

from __future__ import annotations

import math
import weakref
from collections.abc import Mapping
from typing import TYPE_CHECKING, ClassVar, Final

import attrs

from guardstack.pipeline.contract import ModelNext, ModelReply, ModelRequest, Scope
from guardstack.pipeline.validate import invalid

if TYPE_CHECKING:
    from guardstack.pipeline.contract import Agent

__all__ = ["BudgetNotice"]

PLUGIN: Final = "budget-notice"
KINDS: Final = ("steps", "tool_calls", "model_calls", "tokens", "usd", "time")


def _show(value: object) -> tuple[str, ...]:
    if isinstance(value, str) or not isinstance(value, tuple | list) or not value:
        raise invalid(PLUGIN, "show", value, f"a non-empty list of {', '.join(KINDS)}")
    for kind in value:
        if kind not in KINDS:
            raise invalid(PLUGIN, "show", kind, f"one of {', '.join(KINDS)}")
    return tuple(value)


def _plural(count: float, one: str, many: str) -> str:
    whole = int(count)
    return f"{whole:,} {one if whole == 1 else many}"


@attrs.frozen
class BudgetNotice:
    """Before each model call, one context message saying what is left of each cap."""

    name: ClassVar[str] = PLUGIN

    show: tuple[str, ...] = attrs.field(
        default=("steps", "tool_calls", "tokens", "usd", "time"), converter=_show
    )

    def text(self, left: Mapping[str, float]) -> str | None:
        """The notice for what is ``left`` (``agent.remaining()``), or ``None`` if nothing
        it shows applies."""
        left = dict(left)
        if "model_calls" in left and "model_calls" not in self.show:
            # each step is one model call: the stricter of the two is the steps left
            more_calls = left.pop("model_calls") - 1
            left["steps"] = min(left.get("steps", math.inf), max(0.0, more_calls))
        parts = []
        for kind in self.show:
            amount = left.get(kind)
            if amount is None:
                continue
            if kind == "steps":
                parts.append(f"{_plural(amount, 'more step', 'more steps')} after this one")
            elif kind == "tool_calls":
                parts.append(f"{_plural(amount, 'tool call', 'tool calls')}")
            elif kind == "model_calls":
                parts.append(f"{_plural(amount, 'model call', 'model calls')}")
            elif kind == "tokens":
                parts.append(f"{_plural(amount, 'token', 'tokens')}")
            elif kind == "usd":
                parts.append(f"${amount:.2f}")
            else:
                parts.append(f"{round(amount):,} s")
        if not parts:
            return None
        text = f"Budget left: {', '.join(parts)}. Plan to finish within it."
        if left.get("downgraded"):
            text += " The budget is nearly spent: a cheaper model answers from now on."
        return text

    def apply(self, scope: Scope) -> None:
        noted: weakref.WeakKeyDictionary[Agent, tuple[int, int]] = weakref.WeakKeyDictionary()

        def hook(call_next: ModelNext) -> ModelNext:
            async def noticed(request: ModelRequest) -> ModelReply:
                agent = request.agent
                here = (agent.turn, agent.step)
                if noted.get(agent) != here:
                    noted[agent] = here
                    text = self.text(await agent.remaining())
                    if text is not None:
                        agent.note(text, PLUGIN)
                        # the request with the note after it: what the log now rebuilds, and
                        # what a host that forwards its own history (the model proxy) sends
                        notice = {"role": "user", "content": text}
                        request = attrs.evolve(request, messages=[*request.messages, notice])
                return await call_next(request)

            return noticed

        scope.adopt(scope.loop.instrument_model_call(hook))
