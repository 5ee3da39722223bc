"""Where an agent stands: whose it is (tenant, priority), its place in a tree of agents
and the deadline its running turn must end by — read through properties, set when the
agent is made (``loop.create``) and changed only through ``join_tree`` (``AgentTool``
adopting a child) and ``limit_turn`` (``TurnDeadline``, a framework's turn)."""

from __future__ import annotations

import warnings
from collections.abc import Callable, Mapping
from types import MappingProxyType
from typing import TYPE_CHECKING

import anyio

if TYPE_CHECKING:
    from guardstack.pipeline.loop.agent import Agent

__all__ = ["Place"]


class Place:
    """An ``Agent``'s tenant, priority, parent, depth and turn deadline (``Agent`` is one)."""

    def __init__(
        self, tenant: str | None = None, priority: int = 0, labels: Mapping[str, str] | None = None
    ) -> None:
        self._tenant = tenant
        self._priority = priority
        self._labels: Mapping[str, str] = MappingProxyType(dict(labels or {}))
        #: Its place in a tree of agents: ``join_tree`` sets it, ``parent``/``depth`` read it.
        self._parent: Agent | None = None
        self._depth = 1
        #: When the running turn must end (anyio time) and the budget behind it (ms):
        #: ``limit_turn`` sets it, ``turn_deadline`` reads it.
        self._deadline: tuple[float, int] | None = None

    @property
    def tenant(self) -> str | None:
        """Whose calendar windows and fair share this agent's calls count in when a layer
        names no tenant of its own (the model proxy creates each client key's agents with
        its tenant). Fixed at ``loop.create(tenant=…)``: every turn sees the same one."""
        return self._tenant

    @tenant.setter
    def tenant(self, tenant: str | None) -> None:
        _deprecated_write("tenant", tenant)
        self._tenant = tenant

    @property
    def labels(self) -> Mapping[str, str]:
        """Whose it is beyond its tenant (a gateway's ``team`` and ``key_name``), for the
        decision log's lines about it. Fixed at ``loop.create(labels=…)``; read-only."""
        return self._labels

    @property
    def priority(self) -> int:
        """Its calls' place in the admission layers' queues (higher first), unless a call
        names its own: a person's interactive agent above a batch. Fixed at
        ``loop.create(priority=…)``."""
        return self._priority

    @priority.setter
    def priority(self, priority: int) -> None:
        _deprecated_write("priority", priority)
        self._priority = priority

    @property
    def parent(self) -> Agent | None:
        """The agent whose tool started this one (``AgentTool``), or ``None`` for a root."""
        return self._parent

    @property
    def depth(self) -> int:
        """Its depth in the tree of agents (the root is 1)."""
        return self._depth

    def join_tree(self, parent: Agent) -> None:
        """Become a child of ``parent`` (``AgentTool`` adopts it): one level below it and
        inside its turn's deadline. The ancestors' caps then count its calls as theirs."""
        self._parent, self._depth = parent, parent._depth + 1
        self._deadline = parent._deadline

    @property
    def turn_deadline(self) -> float | None:
        """When the running turn must end (anyio time), or ``None``: a turn cancelled at or
        past it ends with reason ``deadline`` instead of ``aborted``."""
        deadline = self._deadline
        return None if deadline is None else deadline[0]

    @property
    def turn_deadline_ms(self) -> int | None:
        """The budget behind ``turn_deadline``, in milliseconds (for the log's text)."""
        deadline = self._deadline
        return None if deadline is None else deadline[1]

    def limit_turn(self, ms: int | None) -> Callable[[], None]:
        """Bound the running turn to ``ms`` from now, unless a deadline bounds it sooner
        already (a parent's, which a child inherits): that one holds. ``None`` lifts the
        bound. Returns what puts the bound before back (for a ``finally``)."""
        outer = self._deadline
        if ms is None:
            self._deadline = None
        else:
            at = anyio.current_time() + ms / 1000
            if outer is None or at < outer[0]:
                self._deadline = (at, ms)

        def restore() -> None:
            self._deadline = outer

        return restore

    @property
    def ancestors(self) -> list[Agent]:
        """The parent, its parent, … up to the root (empty for a root agent)."""
        chain: list[Agent] = []
        agent = self.parent
        while agent is not None:
            chain.append(agent)
            agent = agent.parent
        return chain


def _deprecated_write(name: str, value: object) -> None:
    warnings.warn(
        f"setting agent.{name} after the agent is made is deprecated in 0.2 and removed in "
        f"0.3 (a turn's layers must all see one {name}); write "
        f"loop.create(..., {name}={value!r})",
        DeprecationWarning,
        stacklevel=3,
    )
