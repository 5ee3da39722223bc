"""A turn paused for approval, read back from the log, and the decisions that resume it."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

import attrs

from guardstack.pipeline.approval import (
    Approve,
    Decision,
    Edit,
    PendingApproval,
    Reject,
    call_digest,
    canonical_arguments,
    decision_kind,
)
from guardstack.pipeline.errors import (
    ApprovalMismatch,
)
from guardstack.pipeline.model import (
    ToolCallRequest,
    Usage,
)
from guardstack.pipeline.session import (
    ApprovalDecision,
    ApprovalRequest,
    AssistantMessage,
    ContextDeferred,
    Session,
    StepEnd,
    ToolResultEvent,
    TurnEnd,
    TurnStart,
    UserMessage,
)
from guardstack.pipeline.values import (
    TOOL_REJECTED,
    ContextMessage,
    ToolResult,
    denied_result,
)

if TYPE_CHECKING:
    pass
from guardstack.pipeline.loop.step_order import StepCalls

#: A placeholder result for calls of a paused step that are not run again on resume.
ANSWERED = ToolResult("")


@attrs.define(eq=False)
class Paused:
    """A turn that ended waiting for decisions, read from the log (in any process)."""

    turn: int
    step: int
    requests: tuple[ToolCallRequest, ...]
    waiting: dict[str, ApprovalRequest]
    deferred: dict[str, list[ContextMessage]]
    calls: StepCalls
    last_text: str
    usage: Usage
    model_calls: int
    #: Decisions made so far: logged ones (read back) and the resume's new ones.
    decisions: dict[str, Decision] = attrs.Factory(dict)
    #: The call ids whose decision is already in the log.
    logged: set[str] = attrs.Factory(set)
    #: Decisions for a child agent's calls, by the parent's call that started it.
    routed: dict[str, dict[str, Decision]] = attrs.Factory(dict)

    def pending_of(self, asked: ApprovalRequest) -> PendingApproval:
        return PendingApproval(
            asked.call_id,
            asked.tool,
            json.loads(asked.arguments_json),
            asked.digest,
            asked.reason,
            asked.asked_by,
        )

    def pending(self) -> tuple[PendingApproval, ...]:
        """The calls still waiting for a decision, in model order."""
        return tuple(
            self.pending_of(self.waiting[r.call_id])
            for r in self.requests
            if r.call_id in self.waiting and r.call_id not in self.decisions
        )


def paused_of(session: Session) -> Paused | None:
    """The turn of ``session`` that ended waiting for decisions, read from its log."""
    events = session.events
    last = next(reversed(events), None)
    if not isinstance(last, TurnEnd) or last.reason != "approval":  # the usual: nothing paused
        return None
    start = max(i for i, e in enumerate(events) if isinstance(e, TurnStart))
    turn = events[start:]
    replies = [e for e in turn if isinstance(e, AssistantMessage)]
    step = replies[-1].step
    requests = replies[-1].tool_calls
    answered = {e.call_id for e in turn if isinstance(e, ToolResultEvent)}
    waiting = {
        e.call_id: e
        for e in turn
        if isinstance(e, ApprovalRequest) and e.step == step and e.call_id not in answered
    }
    deferred: dict[str, list[ContextMessage]] = {}
    index = len(turn) - 2
    while index >= 0 and isinstance(turn[index], ContextDeferred):
        index -= 1
    for event in turn[index + 1 : -1]:
        assert isinstance(event, ContextDeferred)
        deferred.setdefault(event.call_id, []).append(ContextMessage(event.text, event.source))
    calls = StepCalls(requests)
    calls.called.update(range(len(requests)))
    calls.answered.update(i for i, r in enumerate(requests) if r.call_id in answered)
    usage = sum((r.usage for r in replies if r.usage is not None), Usage())
    decided = {
        e.call_id: decision_of(e)
        for e in turn
        if isinstance(e, ApprovalDecision) and e.call_id in waiting
    }
    return Paused(
        turn[0].turn,  # type: ignore[union-attr]
        step,
        requests,
        waiting,
        deferred,
        calls,
        replies[-1].text,
        usage,
        len(replies),
        decided,
        set(decided),
    )


def check_runs_as_asked(
    paused: Paused, call_id: str, asked: ApprovalRequest | PendingApproval
) -> None:
    """The call that would run is the one the person was asked about: its digest,
    computed from the log's call (not taken from the logged request), is the pending
    one's. A log whose call was edited after the request raises, and nothing runs."""
    request = next((r for r in paused.requests if r.call_id == call_id), None)
    if request is None or asked.asked_by.startswith("agent:"):
        return  # a descendant's call: its own agent checks it when it resumes
    arguments = request.arguments if isinstance(request.arguments, Mapping) else {}
    running = call_digest(request.name, arguments)
    if running != asked.digest:
        raise ApprovalMismatch(
            f"call {call_id!r} in the log is not the call the person was asked about "
            f"(digest {running[:12]}…, asked {asked.digest[:12]}…): the log was changed "
            "after the request; nothing runs"
        )


def route(paused: Paused, call_id: str) -> tuple[str, str]:
    """Which paused ``AgentTool`` call a descendant's call ``{session id}#{call id}``
    belongs to, and its id as that child knows it (a grandchild's stays whole)."""
    session_id, _, own = call_id.rpartition("#")
    for parent_call, asked in paused.waiting.items():
        child = asked.asked_by.removeprefix("agent:")
        if asked.asked_by.startswith("agent:") and (
            session_id == child or session_id.startswith(f"{child}/")
        ):
            return parent_call, own if session_id == child else call_id
    raise ApprovalMismatch(f"call {call_id!r} is not waiting for a decision")


def pending_of(session: Session) -> tuple[PendingApproval, ...]:
    """What waits in ``session``'s paused turn; a child agent's calls in its place."""
    paused = paused_of(session)
    if paused is None:
        return ()
    found: list[PendingApproval] = []
    for pending in paused.pending():
        child = session.children.get(pending.asked_by[6:])
        if not pending.asked_by.startswith("agent:") or child is None:
            found.append(pending)
            continue
        found.extend(
            attrs.evolve(inner, call_id=f"{child.session_id}#{inner.call_id}")
            if "#" not in inner.call_id
            else inner
            for inner in pending_of(child)
        )
    return tuple(found)


def decision_of(event: ApprovalDecision) -> Decision:
    """A logged decision, as it was made."""
    if event.decision == "reject":
        return Reject(event.reason or "rejected", by=event.by)
    if event.decision == "edit":
        return Edit(json.loads(event.arguments_json or "{}"), by=event.by)
    return Approve(by=event.by)


def decision_event(
    turn: int, step: int, call_id: str, decision: Decision, waited_s: float | None
) -> ApprovalDecision:
    edited = canonical_arguments(decision.arguments) if isinstance(decision, Edit) else None
    reason = decision.reason if isinstance(decision, Reject) else None
    return ApprovalDecision(
        turn, step, call_id, decision_kind(decision), decision.by, reason, edited, waited_s
    )


def reject_pending(session: Session, reason: str) -> None:
    """A new prompt while calls wait: each is rejected with ``reason`` and the paused
    turn is ended, so the next request is one a provider accepts."""
    paused = paused_of(session)
    if paused is None:
        return
    turn, step = paused.turn, paused.step
    reject_waiting(
        session, turn, step, [paused.pending_of(e) for e in paused.waiting.values()], reason
    )
    for request in paused.requests:
        for context in paused.deferred.get(request.call_id, ()):
            session.append(UserMessage(context.text, context.source))
    session.append(StepEnd(turn, step))
    session.append(TurnEnd(turn, "aborted", f"pending calls rejected: {reason}"))


def reject_waiting(
    session: Session, turn: int, step: int, waiting: Sequence[PendingApproval], reason: str
) -> None:
    """Log a rejection and its denied result for each of ``waiting``."""
    for pending in waiting:
        decision = Reject(reason, by="guardstack")
        session.append(decision_event(turn, step, pending.call_id, decision, None))
        result = denied_result(f"rejected: {reason}", TOOL_REJECTED)
        session.append(ToolResultEvent(turn, step, pending.call_id, result))
