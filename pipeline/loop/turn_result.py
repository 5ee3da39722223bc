"""How a turn ended: ``TurnResult``."""

from __future__ import annotations

from typing import TYPE_CHECKING

import attrs

from guardstack.pipeline.approval import (
    PendingApproval,
)
from guardstack.pipeline.frozen import quick_init
from guardstack.pipeline.model import (
    NO_USAGE,
    Usage,
)
from guardstack.pipeline.session import (
    AssistantMessage,
    Session,
    StepStart,
    TurnEnd,
    TurnEndReason,
    TurnStart,
)

if TYPE_CHECKING:
    pass


@quick_init
@attrs.frozen
class TurnResult:
    """How a turn ended: its reason, the model's last text, the error if any, and its usage.

    ``error`` names what failed (``error``: the exception and, for a ``ModelError``,
    its code) or which limit stopped the turn (``blocked``).
    """

    reason: TurnEndReason
    text: str = ""
    error: str | None = None
    steps: int = 0
    usage: Usage = NO_USAGE
    #: The calls waiting for a person's decision (reason ``approval``), in model order.
    pending: tuple[PendingApproval, ...] = ()


def last_turn_of(session: Session, usage: Usage) -> TurnResult:
    """The last turn's result as ``session``'s log records it (its end reason and error,
    the model's last text, its steps), with the turn's ``usage``."""
    events = session.events
    starts = [i for i, event in enumerate(events) if isinstance(event, TurnStart)]
    turn = events[starts[-1] :] if starts else []
    end = next((e for e in reversed(turn) if isinstance(e, TurnEnd)), None)
    texts = [e.text for e in turn if isinstance(e, AssistantMessage)]
    return TurnResult(
        end.reason if end is not None else "aborted",
        texts[-1] if texts else "",
        end.error if end is not None else None,
        sum(isinstance(e, StepStart) for e in turn),
        usage,
    )
