"""Human approval: the decisions a person makes, the calls that wait for one.

A pre-execute layer may answer ``Ask(reason)`` (the original system's third
decision); the harness's approval service — ``guards.Approval`` — resolves it, with
an in-process approver (an async callback) or durably: the turn ends with reason
``approval``, ``TurnResult.pending`` lists each ``PendingApproval``, the log records
an ``approval/request``, and ``agent.resume(decisions={call_id: …})`` continues the
same turn, in this process or another after ``Session.load``.

A decision is ``Approve()``, ``Reject(reason)`` (the model reads ``TOOL_REJECTED``
with the reason) or ``Edit(arguments)`` (the call runs with the person's arguments;
both versions are logged). Each takes ``by=`` (who or what decided) and ``digest=``
(the digest of the call the person saw: one that differs from the pending call's
raises ``ApprovalMismatch`` and leaves the call pending).
"""

from __future__ import annotations

import contextvars
import hashlib
import json
import warnings
from collections.abc import Awaitable, Callable, Mapping
from typing import TYPE_CHECKING, Any, Literal, Protocol, TypeAlias, TypeVar

import attrs

if TYPE_CHECKING:
    from guardstack.pipeline.registry import PhaseOrder
    from guardstack.pipeline.values import ToolCall
    from guardstack.pipeline.verdicts import Allow, Deny, PreDecision

__all__ = [
    "ApprovalService",
    "Approve",
    "Decision",
    "Edit",
    "Pending",
    "PendingApproval",
    "Reject",
    "as_pre_decision",
    "call_digest",
    "canonical_arguments",
    "decision_from_dict",
    "decision_kind",
    "decision_to_dict",
    "outside_call_order",
]

T = TypeVar("T")


def call_digest(tool: str, arguments: Mapping[str, Any] | str) -> str:
    """The hex SHA-256 of the canonical JSON of ``[tool, arguments]`` (key order and
    spacing do not change it): what binds a decision to the call a person saw."""
    text = json.dumps([tool, arguments], sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()


@attrs.frozen
class Approve:
    """Run the call as the model asked."""

    by: str | None = attrs.field(default=None, kw_only=True)
    digest: str | None = attrs.field(default=None, kw_only=True)


@attrs.frozen
class Reject:
    """Do not run the call; the model reads ``TOOL_REJECTED`` with ``reason``."""

    reason: str = "the person reviewing it said no"
    by: str | None = attrs.field(default=None, kw_only=True)
    digest: str | None = attrs.field(default=None, kw_only=True)


@attrs.frozen
class Edit:
    """Run the call with ``arguments`` instead of the model's (both are logged)."""

    arguments: Mapping[str, Any]
    by: str | None = attrs.field(default=None, kw_only=True)
    digest: str | None = attrs.field(default=None, kw_only=True)


Decision: TypeAlias = Approve | Reject | Edit


@attrs.frozen
class PendingApproval:
    """A call waiting for a person: what they are shown, and the digest a decision must
    carry (if it carries one)."""

    call_id: str
    tool: str
    arguments: Mapping[str, Any]
    digest: str
    #: Why it needs a decision (the asking layer's reason), if it gave one.
    reason: str | None = None
    #: The plugin that asked (``approval`` for its own policy): a resume continues there.
    asked_by: str = "approval"


@attrs.frozen
class Pending:
    """The pre-execute answer of a call that waits durably for a decision."""

    approval: PendingApproval


class ApprovalService(Protocol):
    """What resolves an ``Ask`` that no layer resolved (``guards.Approval``).

    ``layer`` is its pre-execute layer: a call it paused resumes there, with the
    decision handed over by ``decide``."""

    async def layer(
        self, call: ToolCall, call_next: Callable[[ToolCall], Awaitable[PreDecision]]
    ) -> PreDecision | Pending: ...

    async def resolve(self, call: ToolCall, reason: str | None) -> PreDecision | Pending: ...

    def decide(self, call_id: str, decision: Decision) -> None: ...


def as_pre_decision(decision: Decision) -> Allow | Deny:
    """What a decision means to the registry: run (perhaps with edited arguments), or a
    ``TOOL_REJECTED`` denial the model reads."""
    from guardstack.pipeline.values import TOOL_REJECTED
    from guardstack.pipeline.verdicts import Allow, Deny

    if isinstance(decision, Reject):
        return Deny(f"rejected: {decision.reason}", code=TOOL_REJECTED)
    if isinstance(decision, Edit):
        return Allow(dict(decision.arguments))
    return Allow()


def decision_from_dict(answer: Any, owner: str = "approval") -> Decision:
    """A decision from its wire form (``{"type": "approve" | "reject" | "edit",
    "reason": …, "arguments": …, "by": …, "digest": …}``), or a decision as it is."""
    from guardstack.pipeline.errors import ApprovalMismatch

    if isinstance(answer, Approve | Reject | Edit):
        return answer
    if isinstance(answer, Mapping):
        kind, by, digest = answer.get("type"), answer.get("by"), answer.get("digest")
        if kind == "approve":
            return Approve(by=by, digest=digest)
        if kind == "reject":
            return Reject(answer.get("reason") or "rejected", by=by, digest=digest)
        if kind == "edit" and isinstance(answer.get("arguments"), Mapping):
            return Edit(dict(answer["arguments"]), by=by, digest=digest)
    raise ApprovalMismatch(
        f"{owner}: a decision is Approve(), Reject(reason), Edit(arguments) or "
        f"{{'type': 'approve' | 'reject' | 'edit', …}}, got {answer!r}"
    )


def decision_to_dict(decision: Decision) -> dict[str, Any]:
    """A decision's wire form (what ``decision_from_dict`` reads)."""
    wire: dict[str, Any] = {"type": decision_kind(decision)}
    if isinstance(decision, Reject):
        wire["reason"] = decision.reason
    if isinstance(decision, Edit):
        wire["arguments"] = dict(decision.arguments)
    if decision.by is not None:
        wire["by"] = decision.by
    if decision.digest is not None:
        wire["digest"] = decision.digest
    return wire


def decision_kind(decision: Decision) -> Literal["approve", "reject", "edit"]:
    if isinstance(decision, Reject):
        return "reject"
    return "edit" if isinstance(decision, Edit) else "approve"


def canonical_arguments(arguments: Mapping[str, Any] | str) -> str:
    """The arguments as the digest covers them: sorted keys, no spaces."""
    return json.dumps(arguments, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


#: 0.2 only (goes in 0.3): the running call's place in a parallel step, for a layer
#: that calls ``outside_call_order(waiting)`` without the call. The call carries it
#: (``ToolCall.scope.order``).
CALL_ORDER: contextvars.ContextVar[PhaseOrder | None] = contextvars.ContextVar(
    "guardstack_call_order", default=None
)


async def outside_call_order(waiting: Awaitable[T], call: ToolCall | None = None) -> T:
    """Await ``waiting`` (a person's decision about ``call``, the call the layer was
    given) outside the step's pre-execute order, so the other calls of a parallel step
    are asked meanwhile and run as each is decided. Without ``call`` (deprecated, goes
    in 0.3) the order is looked up beside the call."""
    if call is None:
        warnings.warn(
            "outside_call_order(waiting) without the call is deprecated and goes in 0.3: "
            "pass the call the layer was given, outside_call_order(waiting, call)",
            DeprecationWarning,
            stacklevel=2,
        )
        order = CALL_ORDER.get()
    else:
        scope = call.scope
        order = scope.order if scope is not None else None
    if order is None:
        return await waiting
    order.leave("pre_execute")
    try:
        return await waiting
    finally:
        await order.enter("pre_execute")
