"""``TemporalAgent``: what a worker serves under a name, and the names of the activities
and the workflow."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from datetime import timedelta
from typing import Any, Final

import attrs

from guardstack.integrations._extras import require
from guardstack.pipeline import (
    ConfigError,
    ToolDefinition,
)
from guardstack.pipeline.model import Model
from guardstack.pipeline.store import StateStore
from guardstack.wrappers import Retry

require("temporalio", "temporal")

from temporalio.common import RetryPolicy  # noqa: E402
from temporalio.workflow import ActivityCancellationType  # noqa: E402

OWNER: Final = "temporal"
TOOL_ACTIVITY: Final = "guardstack.tool"
MODEL_ACTIVITY: Final = "guardstack.model"
STORE_ACTIVITY: Final = "guardstack.store"
WORKFLOW: Final = "guardstack.turn"
#: How long an activity for a tool without a declared budget may run.
NO_BUDGET_MS: Final = 24 * 3_600_000


def _tools(tools: Sequence[ToolDefinition]) -> tuple[ToolDefinition, ...]:
    return tuple(tools)


def _no_plugins() -> Sequence[Any]:
    return ()


@attrs.frozen
class TemporalAgent:
    """An agent the workers can run: its real tools and model, and its guard stack."""

    name: str
    tools: tuple[ToolDefinition, ...] = attrs.field(converter=_tools)
    model: Model
    #: Builds the guard stack, in the workflow, for each turn (layers in onion order).
    plugins: Callable[[], Sequence[Any]] = _no_plugins
    max_steps: int = 50
    system: str | None = None
    grace_ms: int = 5_000
    heartbeat_ms: int = 10_000
    #: An engine limit on any activity's start-to-close (e.g. a namespace's maximum).
    start_to_close_cap_ms: int | None = None
    #: Temporal's own attempts per activity; 1 leaves retrying to guardstack.
    activity_attempts: int = 1
    #: Where the stack's keyed layers and caps keep their state (a ``RedisStore``): each
    #: store operation is a local activity on the worker, so every workflow and worker
    #: shares the limits and the workflow stays deterministic. ``None``: each turn's
    #: own memory store (limits that live for one turn).
    store: StateStore | None = attrs.field(default=None, kw_only=True)

    def tool(self, name: str) -> ToolDefinition:
        for definition in self.tools:
            if definition.name == name:
                return definition
        raise KeyError(name)

    def check(self) -> None:
        """Refuse a stack the engine would cut or retry twice (``ConfigError``)."""
        cap = self.start_to_close_cap_ms
        for tool in self.tools:
            if cap is not None and tool.timeout_ms is not None:
                needed = tool.timeout_ms + self.grace_ms
                if cap < needed:
                    raise ConfigError(
                        f"{OWNER}: agent {self.name!r}: start_to_close_cap_ms={cap} would cut "
                        f"tool {tool.name!r}'s {tool.timeout_ms} ms budget (it needs {needed} ms "
                        "with the grace period): the model would never learn it timed out",
                        plugin=OWNER,
                        key="start_to_close_cap_ms",
                        value=cap,
                    )
        if self.activity_attempts != 1 and any(isinstance(p, Retry) for p in self.plugins()):
            raise ConfigError(
                f"{OWNER}: agent {self.name!r}: activity_attempts={self.activity_attempts} with "
                "a Retry in the stack would retry in two places; keep activity_attempts=1",
                plugin=OWNER,
                key="activity_attempts",
                value=self.activity_attempts,
            )

    def activity_options(self, tool: ToolDefinition) -> dict[str, Any]:
        """Temporal's options for one attempt of ``tool``."""
        budget = tool.timeout_ms
        limit = NO_BUDGET_MS if budget is None else budget + self.grace_ms
        if self.start_to_close_cap_ms is not None:
            limit = min(limit, self.start_to_close_cap_ms)
        return {
            "start_to_close_timeout": timedelta(milliseconds=limit),
            "heartbeat_timeout": timedelta(milliseconds=self.heartbeat_ms),
            "retry_policy": RetryPolicy(maximum_attempts=self.activity_attempts),
            "cancellation_type": ActivityCancellationType.TRY_CANCEL,
        }


#: The agents this process's workers run, by name.
#: The agents served in this process, by task queue and name: two workers on different
#: queues may serve different agents under one name; one queue may not.
AGENTS: dict[tuple[str, str], TemporalAgent] = {}


def served(task_queue: str, name: str) -> TemporalAgent:
    return AGENTS[(task_queue, name)]
