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

Who asked — tenant, team, key, conversation, model — is said by whoever decides: a
decision about an agent's call names the agent (``who_of``: its tenant, its labels
and its session), and a gateway names the request it serves. No context variable
carries it, so a decision made while a stream is relayed, after the request's handler
returned, names its caller all the same.
"""

from __future__ import annotations

import json
import logging
import time
from typing import Any, Final

from opentelemetry import trace

__all__ = [
    "FIELDS",
    "GUARDRAIL_EVENT",
    "GUARDRAIL_SOURCES",
    "decided",
    "guardrail_result",
    "layer_of",
    "logger",
    "who_of",
]

logger = logging.getLogger("guardstack.decisions")
#: A library's logger says nothing until the application listens (no last-resort
#: printing of stops to standard error in process).
logger.addHandler(logging.NullHandler())

FIELDS: Final = (
    "ts", "event", "layer", "decision", "reason", "tenant", "team", "key_name",
    "conversation", "model", "tool",
)  # fmt: skip
#: Events whose decision stops or refuses something (logged as warnings).
_WARNINGS: Final = frozenset(
    {"stop", "deny", "refuse", "budget_refused", "stream_cut", "upstream_failed"}
)


#: The OpenTelemetry GenAI conventions' guardrail result event (semantic-conventions-genai,
#: docs/gen-ai/gen-ai-guardrails.md): each guard decision is one, on the call's span.
GUARDRAIL_EVENT: Final = "gen_ai.guardrail.result"
#: Where a decision's evaluated content comes from (``gen_ai.guardrail.source``): a
#: tool call the model asked for, a tool's result, a request to the model, its answer.
GUARDRAIL_SOURCES: Final = ("tool_input", "tool_output", "model_request", "model_response")
#: The decision-log events that are a guard's decision (a guardrail result), and the
#: source each is about unless the caller says.
_GUARD_EVENTS: Final = {
    "deny": "tool_input",
    "stop": "model_request",
    "refuse": "model_request",
    "budget_refused": "model_request",
    "shadow": "tool_input",
    "remind": "tool_output",
}


def guardrail_result(
    layer: str,
    value: str,
    reason: str = "",
    *,
    source: str,
    shadow: bool = False,
    signals: Any = None,
) -> None:
    """One guard decision as a ``gen_ai.guardrail.result`` event on the current span
    (the call's, when tracing is on): the layer is the component, the decision the
    result's native value — never translated to a verdict — its reason guardstack's own
    text (never a tool's arguments or a key). A shadow decision is marked as one (it
    was not enforced). Given the stack's ``signals``, it is one of their events (a
    ``Tracing`` layer writes it as a log record and, unless told not to, a span event);
    else a span event, when a span is recording; else nothing."""
    if signals is not None and not getattr(signals, "listened", False):
        return
    span = trace.get_current_span()
    if signals is None and not span.is_recording():
        return
    attributes: dict[str, Any] = {
        "gen_ai.guardrail.component.name": layer,
        "gen_ai.guardrail.result.type": "guardstack.decision",
        "gen_ai.guardrail.result.value": value,
        "gen_ai.guardrail.source": source,
        "guardstack.enforced": not shadow,
    }
    if reason:
        attributes["gen_ai.guardrail.result.reason"] = reason[:300]
    try:
        if signals is not None:
            signals.event(GUARDRAIL_EVENT, attributes)
        else:
            span.add_event(GUARDRAIL_EVENT, attributes)
    except Exception:  # telemetry never changes a decision
        logging.getLogger("guardstack").debug("could not record a guardrail event", exc_info=True)


def decided(
    event: str,
    *,
    layer: str,
    decision: str,
    reason: str = "",
    tool: str | None = None,
    source: str | None = None,
    signals: Any = None,
    **who: str | None,
) -> None:
    """Log one decision (see the module docstring); costs nothing when nobody listens.
    A guard's decision is also a ``gen_ai.guardrail.result`` event (``source``: what it
    is about, else the event's usual one)."""
    guarded = _GUARD_EVENTS.get(event)
    if guarded is not None and not (event == "refuse" and layer == "gate"):
        guardrail_result(
            layer,
            decision,
            reason,
            source=source or guarded,
            shadow=event == "shadow",
            signals=signals,
        )
    level = logging.WARNING if event in _WARNINGS else logging.INFO
    if not logger.isEnabledFor(level):
        return
    record: dict[str, Any] = dict.fromkeys(FIELDS)
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


def who_of(agent: object) -> dict[str, str | None]:
    """What a decision about ``agent``'s call names it by: its tenant, its labels (a
    gateway's team and key) and its session (``conversation``); nothing for no agent."""
    if agent is None:
        return {}
    found: dict[str, str | None] = {
        "tenant": getattr(agent, "tenant", None),
        "conversation": getattr(agent, "session_id", None),
    }
    labels = getattr(agent, "labels", None) or {}
    found.update({key: value for key, value in labels.items() if key in FIELDS})
    return found
