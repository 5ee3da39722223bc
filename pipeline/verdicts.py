"""What a pre- or post-execute layer decides about a tool call, and what the registry
hands back for it: ``Allow``/``Deny``/``Ask`` before the tool runs, ``Accept``/``Block``
after, and the ``ToolOutcome`` the loop reads."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any, TypeAlias

import attrs

from guardstack.pipeline.frozen import passes, quick_init
from guardstack.pipeline.values import TOOL_DENIED, ContextMessage, ToolResult

if TYPE_CHECKING:
    from guardstack.pipeline.approval import PendingApproval

__all__ = [
    "Accept",
    "Allow",
    "Ask",
    "Block",
    "Deny",
    "PostDecision",
    "PreDecision",
    "ToolOutcome",
]


def _contexts(contexts: Iterable[ContextMessage]) -> tuple[ContextMessage, ...]:
    return tuple(contexts)


passes(tuple, _contexts)


@quick_init
@attrs.frozen
class Allow:
    """Pre-execute decision: run the call (with ``arguments`` instead of the model's,
    when a person edited them: ``Approval``'s ``Edit``)."""

    arguments: Mapping[str, Any] | None = None


@quick_init
@attrs.frozen
class Deny:
    """Pre-execute decision: do not run the call; the model reads ``Error: <reason>``.

    ``end_turn=True`` also ends the agent's turn after this step (reason ``blocked``);
    ``code`` is the result's code (``TOOL_DENIED``; ``TOOL_REJECTED`` for a person's no).
    """

    reason: str
    end_turn: bool = False
    code: str = attrs.field(default=TOOL_DENIED, kw_only=True)


@quick_init
@attrs.frozen
class Ask:
    """Pre-execute decision: run the call only if a person approves it (the original
    system's ``{kind: 'ask'}``). The harness's approval service (``guards.Approval``)
    resolves it; with none, the call is denied with ``reason`` or the original's text.
    A layer that asks should ask after ``call_next`` allowed the call, so the layers
    inside it have had their say."""

    reason: str | None = None


@quick_init
@attrs.frozen
class Accept:
    """Post-execute decision: keep the result, or replace its value (``value`` not None)."""

    value: object = None
    additional_contexts: tuple[ContextMessage, ...] = attrs.field(default=(), converter=_contexts)


@quick_init
@attrs.frozen
class Block:
    """Post-execute decision: replace the result by an error whose content is ``feedback``."""

    feedback: str
    additional_contexts: tuple[ContextMessage, ...] = attrs.field(default=(), converter=_contexts)
    end_turn: bool = False


PreDecision: TypeAlias = Allow | Deny | Ask
PostDecision: TypeAlias = Accept | Block


@quick_init
@attrs.frozen
class ToolOutcome:
    """What ``registry.execute`` returns: the final result and the contexts to inject."""

    result: ToolResult
    contexts: tuple[ContextMessage, ...] = ()
    ends_turn: bool = False
    #: Set when the call waits for a person's decision (a durable pause): ``result``
    #: is then only a placeholder, and the loop ends the turn with reason ``approval``.
    pending: PendingApproval | None = None
