"""Agent limit: hard caps on how many agents a harness starts, and on a tree of them.

A runaway workflow that spawns subagents in a loop is stopped here:

* ``max_agents`` — agents created through this harness's loop, and child agents
  started (``AgentTool``) anywhere below an agent of this harness, counted together:
  past it, the next ``loop.create`` raises ``AgentLimitExceeded`` and the next child is
  refused;
* ``max_depth`` — how deep a tree below this harness's agents may grow (the root
  agent is depth 1, its children 2);
* ``max_children`` — how many child agents one agent may start in one turn.

A refused child never raises into the parent: its tool call answers ``AGENT_STOPPED``
naming the limit, which the parent's model reads. The tree's counts belong to the
agents that own it (the tree seam), so a child harness needs no ``AgentLimit`` of
its own; if it has one, both apply. Disposing the plugin lifts the caps.

Where it belongs: a ``loop.on_create`` hook and the tree seam's child policy, not an
onion layer; it has no order.
"""

from __future__ import annotations

import weakref
from typing import TYPE_CHECKING, Any, ClassVar, Final

import attrs

from guardstack.pipeline.contract import Scope
from guardstack.pipeline.errors import AgentLimitExceeded
from guardstack.pipeline.signals import Shadow
from guardstack.pipeline.validate import flag, invalid, optional_integer

if TYPE_CHECKING:
    from guardstack.pipeline.contract import Agent

__all__ = ["AgentLimit"]

PLUGIN: Final = "agent-limit"


@attrs.frozen
class AgentLimit:
    """At most ``max_agents`` agents in all, trees ``max_depth`` deep, ``max_children``
    children per agent per turn."""

    name: ClassVar[str] = PLUGIN

    max_agents: int | None = attrs.field(
        default=None, validator=optional_integer(PLUGIN, "max_agents")
    )
    max_depth: int | None = attrs.field(
        default=None, validator=optional_integer(PLUGIN, "max_depth")
    )
    max_children: int | None = attrs.field(
        default=None, validator=optional_integer(PLUGIN, "max_children")
    )
    #: Count as usual, record what it would have refused, refuse nothing.
    shadow: bool = attrs.field(default=False, validator=flag(PLUGIN, "shadow"), kw_only=True)

    def __attrs_post_init__(self) -> None:
        if self.max_agents is None and self.max_depth is None and self.max_children is None:
            raise invalid(
                PLUGIN,
                "max_agents",
                None,
                "set (or `max_depth`, `max_children`); with none it caps nothing",
            )

    def apply(self, scope: Scope) -> None:
        """Count the agents and children from now on, from zero."""
        policy = _Policy(self, scope.loop)
        policy.shadow = Shadow(scope.namespace, scope.signals) if self.shadow else None

        def on_create(agent: Agent) -> None:
            policy.take_agent(repr(agent.session_id))

        scope.adopt(scope.loop.on_create(on_create))
        scope.adopt(scope.loop.tree.govern_children(policy))


class _Policy:
    """One application's counts: agents in all, and each parent's children this turn."""

    def __init__(self, config: AgentLimit, loop: object) -> None:
        self.config = config
        self.loop = loop  # agents it creates are counted when created
        self.created = 0
        #: parent -> (its turn, children it started in that turn)
        self.parents: weakref.WeakKeyDictionary[Any, tuple[int, int]] = weakref.WeakKeyDictionary()
        self.shadow: Shadow | None = None

    def take_agent(self, refused: str) -> None:
        limit = self.config.max_agents
        if limit is not None and self.created >= limit:
            if self.shadow is None:
                raise AgentLimitExceeded(self._total(refused))
            self.shadow.would("refuse", f"agent {refused}", self._total(refused))
        self.created += 1

    def _total(self, refused: str) -> str:
        return (
            f"{PLUGIN}: this harness reached its total agent cap ({self.config.max_agents}) — "
            "a runaway-loop backstop; raise max_agents if the scale is intentional "
            f"(refused {refused})"
        )

    def refusal(self, parent: Agent, depth: int) -> str | None:
        why = self._refusal(parent, depth)
        if why is None or self.shadow is None:
            return why
        self.shadow.would("refuse", f"a child of agent {parent.session_id}", why)
        return None

    def _refusal(self, parent: Agent, depth: int) -> str | None:
        config = self.config
        if config.max_depth is not None and depth > config.max_depth:
            return (
                f"{PLUGIN}: a child here would be at depth {depth} and the limit is "
                f"max_depth={config.max_depth} (the root agent is depth 1); do the task "
                "yourself"
            )
        turn, started = self.parents.get(parent, (parent.turn, 0))
        if turn != parent.turn:
            started = 0
        if config.max_children is not None and started >= config.max_children:
            return (
                f"{PLUGIN}: this agent already started {started} child agents this turn "
                f"and the limit is max_children={config.max_children}; use their answers"
            )
        if config.max_agents is not None and self.created >= config.max_agents:
            return self._total("a child agent")
        return None

    def admitted(self, parent: Agent, child: Agent) -> None:
        turn, started = self.parents.get(parent, (parent.turn, 0))
        self.parents[parent] = (parent.turn, started + 1 if turn == parent.turn else 1)
        if child.loop is not self.loop:  # one of its own was counted by on_create
            self.created += 1
