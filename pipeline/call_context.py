"""What a tool call and a model request share: the call context every layer reads.

A ``ToolCall`` and a ``ModelRequest`` differ in what they carry (a tool's name and
arguments; a conversation's messages), but the resilience layers ask both the same
questions — which attempt and which hedge this is, where it stands in an admission
queue, whose it is. ``CallContext`` is that common part, so a ``StageAdapter``
answers those questions once for both stages and keeps only what really differs.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from guardstack.pipeline.contract import Agent

__all__ = ["CallContext"]


class CallContext(Protocol):
    """The part of a call every layer may read (frozen values; changed copies go inward)."""

    @property
    def attempt(self) -> int:
        """1 for the first attempt; a ``Retry`` counts up for the layers inside it."""
        ...

    @property
    def hedge(self) -> int:
        """0 for the first try; a ``Hedge`` numbers the ones it starts."""
        ...

    @property
    def priority(self) -> int | None:
        """Its own place in admission queues (``None``: its agent's)."""
        ...

    @property
    def tenant(self) -> str | None:
        """Whose call it is, for fair shares (``None``: its agent's)."""
        ...

    @property
    def agent(self) -> Agent | None:
        """The agent that made it, if any."""
        ...
