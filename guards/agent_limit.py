"""Agent limit: a hard cap on how many agents one harness creates. A cap stops loss.

A runaway workflow that spawns subagents in a loop is stopped here: once
``max_agents`` agents were created through the harness's loop, the next
``loop.create`` raises ``AgentLimitExceeded`` naming the limit. It counts every
agent created while the plugin is applied (disposing the plugin lifts the cap).

Where it belongs: a ``loop.on_create`` hook, not an onion layer; it has no order.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar, Final

from pipeline.errors import AgentLimitExceeded, ConfigError

if TYPE_CHECKING:
    from pipeline.harness import Scope
    from pipeline.loop import Agent

__all__ = ["AgentLimit"]

PLUGIN: Final = "agent-limit"


class AgentLimit:
    """At most ``max_agents`` agents created by the harness it is applied to."""

    name: ClassVar[str] = PLUGIN

    def __init__(self, max_agents: int) -> None:
        if isinstance(max_agents, bool) or not isinstance(max_agents, int) or max_agents < 1:
            raise ConfigError(
                f"{PLUGIN}: `max_agents` must be an integer >= 1, got {max_agents!r}",
                key="max_agents",
                value=max_agents,
            )
        self.max_agents = max_agents
        self.created = 0

    def _on_create(self, agent: Agent) -> None:
        if self.created >= self.max_agents:
            raise AgentLimitExceeded(
                f"{PLUGIN}: this harness reached its total agent cap ({self.max_agents}) — a "
                "runaway-loop backstop; raise max_agents if the scale is intentional "
                f"(refused {agent.session_id!r})"
            )
        self.created += 1

    def apply(self, scope: Scope) -> None:
        scope.adopt(scope.loop.on_create(self._on_create))

    def __repr__(self) -> str:
        return f"AgentLimit(max_agents={self.max_agents})"
