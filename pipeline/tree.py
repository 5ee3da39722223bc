"""The tree seam: what a tree of agents counts at its ancestors.

(What caps count, and for how long, is the accounting ``Ledger``: ``pipeline/ledger.py``.)

A child agent started by ``AgentTool`` spends from every ancestor's caps, not from a
fresh allowance. Its model calls reach the ancestors through their model stages
(``UsageLimit`` and ``ModelCallLimit`` see them there); everything else a cap counts
goes through this seam, which each ``AgentLoop`` owns (``loop.tree``) and which
caps fill in ``apply``:

* ``tool_caps`` — pre-execute layers that also count a descendant's tool calls, seen
  as calls of the ancestor (``ToolCallLimit``): the stricter of the child's own cap
  and every ancestor's wins, and a call a layer inside denies is given back;
* ``children`` — who may start a child agent (``AgentLimit``'s depth, fan-out and
  total);
* ``remaining`` — what is left of each cap for an agent (``BudgetNotice`` says it
  to the model; ``agent.remaining()`` to a program).

The keys ``remaining`` reports: ``steps``, ``tool_calls``, ``model_calls``,
``tokens``, ``usd`` and ``time`` (seconds).
"""

from __future__ import annotations

import contextvars
from collections.abc import Awaitable, Callable, Hashable, Mapping
from typing import TYPE_CHECKING, Any, Protocol, TypeAlias

import attrs

from guardstack.pipeline.onion import Registration

if TYPE_CHECKING:
    from guardstack.pipeline.loop import Agent

__all__ = [
    "BUDGET_KEYS",
    "TREE_CAPS",
    "ChildPolicy",
    "Remaining",
    "RunKey",
    "TreeLedger",
    "ancestor_caps",
]

#: What ``remaining`` reports, in the order a notice lists it.
BUDGET_KEYS = ("steps", "tool_calls", "model_calls", "tokens", "usd", "time")

#: ``async (agent) -> {key: amount left}`` for the caps one plugin enforces.
Remaining: TypeAlias = Callable[["Agent"], Awaitable[Mapping[str, float]]]


@attrs.frozen
class RunKey:
    """An ancestor that is a framework run's conversation key, not an ``Agent``."""

    key: Hashable


#: Outside the agent loop (a framework's own runs): the ancestors' tool-call caps for
#: calls made inside a guarded tool call — a sub-agent run the framework starts there —
#: each with the ``RunKey`` it counts in. Set by the framework adapters while a
#: tool body runs; the registry reads it for calls with no ``agent``. The one seam
#: left in a context variable: the framework, not guardstack, starts the sub-agent's
#: run and makes its calls, so no argument of ours reaches them (inside the agent
#: loop the ancestors are read from the call's agent: ``ancestor_caps``).
TREE_CAPS: contextvars.ContextVar[tuple[tuple[Any, Callable[..., Awaitable[Any]]], ...]] = (
    contextvars.ContextVar("guardstack_tree_caps", default=())
)


class ChildPolicy(Protocol):
    """Who may start a child agent: asked before the child exists, told once it does."""

    def refusal(self, parent: Agent, depth: int) -> str | None:
        """Why ``parent`` may not start a child at ``depth`` (the root is 1), or ``None``."""
        ...

    def admitted(self, parent: Agent, child: Agent) -> None:
        """``parent`` started ``child`` (every policy said yes)."""
        ...


class TreeLedger:
    """One loop's share of the tree's counting (see the module docstring)."""

    __slots__ = ("children", "remaining", "tool_caps")

    def __init__(self) -> None:
        self.tool_caps: list[Callable[..., Awaitable[Any]]] = []
        self.children: list[ChildPolicy] = []
        self.remaining: list[Remaining] = []

    def count_tool_calls(self, layer: Callable[..., Awaitable[Any]]) -> Registration:
        """Count descendants' tool calls with the pre-execute ``layer`` too."""
        return _added(self.tool_caps, layer)

    def govern_children(self, policy: ChildPolicy) -> Registration:
        """Ask ``policy`` before any agent of this loop (or below it) starts a child."""
        return _added(self.children, policy)

    def report_remaining(self, report: Remaining) -> Registration:
        """Add what ``report`` says is left to ``agent.remaining()``."""
        return _added(self.remaining, report)


def _added(items: list[Any], item: Any) -> Registration:
    items.append(item)

    def remove() -> None:
        if item in items:
            items.remove(item)

    return Registration(remove)


def ancestor_caps(agent: Agent) -> tuple[tuple[Agent, Callable[..., Awaitable[Any]]], ...]:
    """Every ancestor's tool-call caps (its loop's ``tool_caps`` as they are now), each
    with the ancestor it counts for, nearest first: what the registry runs outside
    ``agent``'s own pre-execute."""
    return tuple(
        (ancestor, cap) for ancestor in agent.ancestors for cap in ancestor.loop.tree.tool_caps
    )


def merge_remaining(into: dict[str, float], found: Mapping[str, float]) -> None:
    """Keep the smaller amount per key: the stricter cap is the one that binds."""
    for key, amount in found.items():
        held = into.get(key)
        if held is None or amount < held:
            into[key] = amount
