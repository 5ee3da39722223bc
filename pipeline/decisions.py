"""The decision log: every stop, denial, refusal, shadow decision, reload, operator's
action and budget alert as one line an operator can read — with no OpenTelemetry set
up at all.

Each decision is one record on the ``logging`` logger ``guardstack.decisions`` (level
INFO; a stop or a refusal WARNING), its message one JSON object with the fields
``ts``, ``event``, ``layer``, ``decision``, ``reason``, ``tenant``, ``team``,
``key_name``, ``conversation``, ``model`` and ``tool`` (``null`` where they do not
apply) — never a client key, never what a message or a tool said (a reason is
guardstack's own text, cut to 300 characters). In process, attach any handler to that
logger; the gateways write the lines to standard error, or ``--decision-log FILE``,
and keep the last 1,000 for ``GET /admin/decisions?since=TS``.

Who asked — tenant, team, key, conversation, model — is what the gateway knows of the
request in hand (``about``), added to every decision made while serving it.
"""

from __future__ import annotations

import contextlib
import contextvars
import json
import logging
import time
from collections.abc import Iterator
from typing import Any, Final

__all__ = ["FIELDS", "about", "decided", "layer_of", "logger"]

logger = logging.getLogger("guardstack.decisions")
#: A library's logger says nothing until the application listens (no last-resort
#: printing of stops to standard error in process).
logger.addHandler(logging.NullHandler())

FIELDS: Final = (
    "ts", "event", "layer", "decision", "reason", "tenant", "team", "key_name",
    "conversation", "model", "tool",
)  # fmt: skip
#: Events whose decision stops or refuses something (logged as warnings).
_WARNINGS: Final = frozenset({"stop", "deny", "refuse", "budget_refused", "stream_cut"})
#: Who asked, for the decisions made serving the request in hand (a gateway sets it).
_ABOUT: contextvars.ContextVar[dict[str, str | None] | None] = contextvars.ContextVar(
    "guardstack_decision_about", default=None
)


def decided(
    event: str,
    *,
    layer: str,
    decision: str,
    reason: str = "",
    tool: str | None = None,
    **who: str | None,
) -> None:
    """Log one decision (see the module docstring); costs nothing when nobody listens."""
    level = logging.WARNING if event in _WARNINGS else logging.INFO
    if not logger.isEnabledFor(level):
        return
    record: dict[str, Any] = dict.fromkeys(FIELDS)
    record.update(_ABOUT.get() or {})
    record.update({key: value for key, value in who.items() if key in FIELDS and value})
    record.update(
        ts=round(time.time(), 3),
        event=event,
        layer=layer,
        decision=decision,
        reason=reason[:300],
        tool=tool,
    )
    logger.log(level, json.dumps(record, ensure_ascii=False), extra={"decision": record})


def layer_of(reason: str) -> str:
    """The layer a stop's or denial's text names (``tool-call-limit: …``), else
    ``guardstack``."""
    head = reason.split(":", 1)[0].strip()
    if head and " " not in head and head != "rejected":
        return head
    if reason.startswith("tool call limit"):
        return "tool-call-limit"
    if reason.startswith("rejected"):
        return "approval"
    if " is paused" in reason:
        return "control"
    return "guardstack"


@contextlib.contextmanager
def about(**who: str | None) -> Iterator[None]:
    """Decisions made inside are about this request: its tenant, team, key, conversation
    and model (a gateway's, around one request)."""
    token = _ABOUT.set({key: value for key, value in who.items() if key in FIELDS})
    try:
        yield
    finally:
        _ABOUT.reset(token)
