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
    TurnEndReason,
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
