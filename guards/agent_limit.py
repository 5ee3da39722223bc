"""Agent limit: a hard cap on how many agents one harness creates. A cap stops loss.

A runaway workflow that spawns subagents in a loop is stopped here: once
``max_agents`` agents were created through the harness's loop, the next
``loop.create`` raises ``AgentLimitExceeded`` naming the limit. It counts every
agent created while the plugin is applied (disposing the plugin lifts the cap).

Where it belongs: a ``loop.on_create`` hook, not an onion layer; it has no order.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar, Final

import attrs

from guardstack.pipeline.contract import Scope
from guardstack.pipeline.errors import AgentLimitExceeded
from guardstack.pipeline.validate import integer

if TYPE_CHECKING:
    from guardstack.pipeline.contract import Agent

__all__ = ["AgentLimit"]

PLUGIN: Final = "agent-limit"


def _check_max_agents(_: object, __: object, value: Any) -> None:
    integer(PLUGIN, "max_agents", value)


@attrs.frozen
class AgentLimit:
    """At most ``max_agents`` agents created by each harness it is applied to."""

    name: ClassVar[str] = PLUGIN

    max_agents: int = attrs.field(validator=_check_max_agents)

    def apply(self, scope: Scope) -> None:
        """Count the agents this harness creates from now on, from zero."""
        created = 0

        def on_create(agent: Agent) -> None:
            nonlocal created
            if created >= self.max_agents:
                raise AgentLimitExceeded(
                    f"{PLUGIN}: this harness reached its total agent cap ({self.max_agents}) — "
                    "a runaway-loop backstop; raise max_agents if the scale is intentional "
                    f"(refused {agent.session_id!r})"
                )
            created += 1

        scope.adopt(scope.loop.on_create(on_create))
