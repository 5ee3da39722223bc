"""What a tool call and a model request share: the call context every layer reads.

A ``ToolCall`` and a ``ModelRequest`` differ in what they carry (a tool's name and
arguments; a conversation's messages), but the resilience layers ask both the same
questions — which attempt and which hedge this is, where it stands in an admission
queue, whose it is, what its state key is, how a message names it, what budget it
declares, whether it may run twice, who hears of its progress. ``CallContext`` is
that common part: each call answers it about itself, so a ``StageAdapter`` keeps only
what really differs between the stages — how an outcome fails.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, Final, Protocol, TypeVar

import attrs

if TYPE_CHECKING:
    from guardstack.pipeline.approval import Decision
    from guardstack.pipeline.contract import Agent
    from guardstack.pipeline.registry import PhaseOrder

__all__ = ["DEFAULT_TENANT", "UNKNOWN_KEY", "CallContext", "CallScope", "ProgressListener"]

#: The one key every call to a tool no registry holds shares: names a model makes up
#: cannot fill a layer's state.
UNKNOWN_KEY: Final = "<unknown>"
#: The tenant of a call that names none, and whose agent names none.
DEFAULT_TENANT: Final = "default"

#: Told of a call's progress: a tool's reports (``""``), a stream's pieces (their text).
ProgressListener = Callable[[str], None]

_Self = TypeVar("_Self", bound="CallContext")


@attrs.frozen
class CallScope:
    """What a tool call's caller knows beside the call, handed inward with it (each
    layer passes the call on, so whatever runs inside finds it on the call it is given):

    * ``order`` — its place in a parallel step (the loop's ``PhaseOrder``), which a
      pre-execute layer that waits for a person steps out of (``outside_call_order``),
      so the step's other calls are asked meanwhile;
    * ``decisions`` — a person's decisions for the calls of the child agent this call
      resumes (``AgentTool``, by the child's call ids);
    * ``progress`` — where the caller wants the tool's progress sent (the MCP proxy's
      client: its session, its progress token, its request id).
    """

    order: PhaseOrder | None = None
    decisions: Mapping[str, Decision] | None = None
    progress: tuple[Any, str | int, Any] | None = None


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

    @property
    def key(self) -> str:
        """The state key: the tool's name (``<unknown>`` for none), the model's name."""
        ...

    @property
    def label(self) -> str:
        """How a message names what was called: ``tool "grep"``, ``model gpt-x``."""
        ...

    @property
    def budget_ms(self) -> int | None:
        """The budget the called thing declares (a tool's ``timeout_ms``; a model none)."""
        ...

    @property
    def may_repeat(self) -> bool:
        """Whether running it twice is allowed (not declared ``idempotent=False``)."""
        ...

    @property
    def tool_name(self) -> str | None:
        """The tool's name, for name patterns (``None`` for a model request)."""
        ...

    @property
    def queue_priority(self) -> int:
        """Its place in an admission queue: its own priority, else its agent's, else 0."""
        ...

    @property
    def owner(self) -> str:
        """Whose call it is, for fair shares: its own tenant, its agent's, or ``default``."""
        ...

    @property
    def listener(self) -> ProgressListener | None:
        """What is told of its progress (a tool's reports, a stream's pieces) already."""
        ...

    def with_listener(self: _Self, listener: ProgressListener) -> _Self:
        """The call with ``listener`` told of its progress instead (the caller chains)."""
        ...

    def with_attempt(self: _Self, attempt: int) -> _Self:
        """The call as attempt ``attempt`` (itself when it already is)."""
        ...

    def with_hedge(self: _Self, hedge: int) -> _Self:
        """The call as hedge ``hedge`` (itself when it already is)."""
        ...
