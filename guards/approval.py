"""Approval: a person decides before a call runs — where it stands in the stack says when.

``Approval(require=("deploy", "delete_*"))`` is a pre-execute decision: a call whose
tool matches ``require``, or is annotated destructive (``ToolDefinition(destructive=
True)``, an MCP tool's explicit ``destructiveHint``) while ``destructive`` is on, and
does not match ``allow``, needs a person's decision before it runs. It is also the
harness's approval service: an ``Ask`` from any other pre-execute layer is resolved by
it too (one decision covers a call, however many layers asked).

Where it belongs: after the caps and loop guards that should refuse a call outright.
Pre-execute layers decide in registration order, so a ``ToolCallLimit`` or
``LoopDetector`` registered **before** ``Approval`` denies first and no person is
asked about a call that would be refused anyway; one registered after it is asked
only once the person approved — a person can approve a call a guard then refuses
(``guardstack check`` warns about that order).

How a person decides:

* with an ``approver`` — ``async (PendingApproval) -> Approve() | Reject(reason) |
  Edit(arguments)`` — the turn waits for it (``timeout_ms``, then ``on_timeout``:
  ``"reject"`` answers ``TOOL_REJECTED``, ``"pause"`` pauses durably); the calls of a
  parallel step are asked together and run as each is decided;
* without one, the turn ends with reason ``approval``; ``TurnResult.pending`` lists the
  calls, the log holds an ``approval/request`` for each, the process may exit, and
  ``agent.resume(decisions={call_id: …})`` — after ``Session.load``, in another
  process if need be — continues inside ``Approval``: the layers before it decided
  before the pause and are not asked again (a cap does not count a call twice).

A ``Reject`` is a ``TOOL_REJECTED`` result the model reads, in the original's error
shape; an ``Edit`` runs the call with the person's arguments (the model's stay in
the ``tool/call`` event, the person's are in ``approval/decision``). Each decision is
logged with who made it (``by``) and how long the wait was, reported as a span event
``guardstack.approval`` and counted in the ``guardstack.approvals`` metric.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, ClassVar, Final, Literal

import anyio
import attrs
from opentelemetry import metrics
from opentelemetry.metrics import MeterProvider

from guardstack.pipeline.contract import (
    Approve,
    Decision,
    Edit,
    Pending,
    PendingApproval,
    PreNext,
    Reject,
    Scope,
    as_pre_decision,
    call_digest,
    decision_kind,
    outside_call_order,
)
from guardstack.pipeline.signals import Shadow, Signals
from guardstack.pipeline.validate import compile_patterns, flag, integer, invalid
from guardstack.pipeline.values import ToolCall
from guardstack.pipeline.verdicts import Allow, Ask, PreDecision

if TYPE_CHECKING:
    import re

__all__ = ["Approval"]

PLUGIN: Final = "approval"

Approver = Callable[[PendingApproval], Awaitable[Decision]]


def _patterns(key: str, value: Any) -> tuple[str, ...]:
    if isinstance(value, str):
        value = (value,)
    if not isinstance(value, list | tuple) or not all(
        isinstance(item, str) and item for item in value
    ):
        raise invalid(PLUGIN, key, value, "a list of tool name patterns (`*` wildcards)")
    return tuple(value)


def _require(value: object) -> tuple[str, ...]:
    return _patterns("require", value)


def _allow(value: object) -> tuple[str, ...]:
    return _patterns("allow", value)


def _check_timeout(_: Any, __: Any, value: Any) -> None:
    if value is not None:
        integer(PLUGIN, "timeout_ms", value, minimum=1)


def _check_on_timeout(_: Any, __: Any, value: Any) -> None:
    if value not in ("reject", "pause"):
        raise invalid(PLUGIN, "on_timeout", value, "'reject' or 'pause'")


def _check_approver(_: Any, __: Any, value: Any) -> None:
    if value is not None and not callable(value):
        raise invalid(PLUGIN, "approver", value, "an async function of a PendingApproval")


def _counter(provider: Any) -> Any:
    meter = (provider or metrics.get_meter_provider()).get_meter("guardstack")
    return meter.create_counter(
        "guardstack.approvals",
        unit="{decision}",
        description="Approval decisions, by decision (approve, reject, edit) and tool",
    )


@attrs.frozen
class Approval:
    """Calls that need a person's decision before they run (see the module docstring)."""

    name: ClassVar[str] = PLUGIN

    require: tuple[str, ...] = attrs.field(default=(), converter=_require)
    allow: tuple[str, ...] = attrs.field(default=(), converter=_allow)
    destructive: bool = attrs.field(default=True, validator=attrs.validators.instance_of(bool))
    approver: Approver | None = attrs.field(
        default=None, validator=_check_approver, kw_only=True, repr=False
    )
    timeout_ms: int | None = attrs.field(default=None, validator=_check_timeout, kw_only=True)
    on_timeout: Literal["reject", "pause"] = attrs.field(
        default="reject", validator=_check_on_timeout, kw_only=True
    )
    #: Where the ``guardstack.approvals`` metric goes (``None``: the global provider).
    meter_provider: MeterProvider | None = attrs.field(
        default=None, kw_only=True, repr=False, eq=False
    )
    #: Record the calls its policy would ask a person about, ask about none.
    shadow: bool = attrs.field(default=False, validator=flag(PLUGIN, "shadow"), kw_only=True)
    _required: re.Pattern[str] | None = attrs.field(init=False, repr=False, eq=False)
    _allowed: re.Pattern[str] | None = attrs.field(init=False, repr=False, eq=False)

    def __attrs_post_init__(self) -> None:
        object.__setattr__(self, "_required", compile_patterns(self.require))
        object.__setattr__(self, "_allowed", compile_patterns(self.allow))

    def needs(self, call: ToolCall) -> bool:
        """Whether its policy asks a person about ``call``."""
        name = call.name
        if self._allowed is not None and self._allowed.fullmatch(name):
            return False
        if self._required is not None and self._required.fullmatch(name):
            return True
        tool = call.tool
        return self.destructive and tool is not None and tool.destructive is True

    def apply(self, scope: Scope) -> None:
        if self.shadow:  # a policy only: no service resolves asks, no person is asked
            shadow = Shadow(PLUGIN, scope.signals)

            async def watching(call: ToolCall, call_next: PreNext) -> PreDecision:
                if self.needs(call):
                    shadow.would("ask a person about", f'tool "{call.name}"', "its policy")
                return await call_next(call)

            scope.use(scope.tools.pre_execute, watching, name=PLUGIN)
            return
        service = _Service(self, scope.signals)
        scope.use(scope.tools.pre_execute, service.layer, name=PLUGIN)
        before = scope.tools.approvals
        scope.tools.approvals = service

        def restore() -> None:
            if scope.tools.approvals is service:
                scope.tools.approvals = before

        scope.on_dispose(restore)


class _Service:
    """One application: the pre-execute layer, and the service that resolves asks."""

    def __init__(self, config: Approval, signals: Signals) -> None:
        self.config = config
        self.signals = signals
        self.decisions = _counter(config.meter_provider)
        #: Decisions handed over by a resume, for the layer to apply where it asked.
        self._decided: dict[str, Decision] = {}

    def decide(self, call_id: str, decision: Decision) -> None:
        self._decided[call_id] = decision

    async def layer(self, call: ToolCall, call_next: PreNext) -> PreDecision | Pending:
        decided = self._decided.pop(call.call_id, None)
        settled: PreDecision | Pending | None = None
        if self.config.needs(call):
            settled = await self._settle(call, None, decided)
            if not isinstance(settled, Allow):
                return settled  # rejected, or waiting for a person
            if settled.arguments is not None:
                call = attrs.evolve(call, arguments=settled.arguments)
        decision = await call_next(call)
        if isinstance(decision, Ask):
            if settled is not None:
                return settled  # the person already decided on this call
            return await self._settle(call, decision.reason, decided)
        if isinstance(settled, Allow) and settled.arguments is not None:
            return settled if isinstance(decision, Allow) else decision
        return decision

    async def resolve(self, call: ToolCall, reason: str | None) -> PreDecision | Pending:
        return await self._settle(call, reason, self._decided.pop(call.call_id, None), "registry")

    async def _settle(
        self,
        call: ToolCall,
        reason: str | None,
        decided: Decision | None,
        asked_by: str = PLUGIN,
    ) -> PreDecision | Pending:
        """The call's decision as a pre-execute answer: ``Allow`` (maybe with edited
        arguments), a ``TOOL_REJECTED`` denial, or ``Pending`` (a durable pause)."""
        arguments = call.arguments if not isinstance(call.arguments, str) else {}
        pending = PendingApproval(
            call.call_id, call.name, arguments, call_digest(call.name, arguments), reason, asked_by
        )
        if decided is not None:  # a resume: the loop logged it already
            self._report(call, decided, None)
            return as_pre_decision(decided)
        approver = self.config.approver
        if approver is None:
            return Pending(pending)
        started = anyio.current_time()
        decision = await outside_call_order(self._ask(approver, pending), call)
        waited = anyio.current_time() - started
        if decision is None:
            return Pending(pending)
        self._report(call, decision, waited)
        agent = call.agent
        if agent is not None:
            agent.approval_decided(call.call_id, decision, round(waited, 6))
        return as_pre_decision(decision)

    async def _ask(self, approver: Approver, pending: PendingApproval) -> Decision | None:
        """The approver's decision; at the timeout, a rejection or ``None`` (pause)."""
        config = self.config
        if config.timeout_ms is None:
            decision = await approver(pending)
        else:
            with anyio.move_on_after(config.timeout_ms / 1000) as waited:
                decision = await approver(pending)
            if waited.cancelled_caught:
                if config.on_timeout == "pause":
                    return None
                return Reject(f"no decision within {config.timeout_ms} ms", by="timeout")
        if not isinstance(decision, Approve | Reject | Edit):
            return Reject(
                f"the approver answered {type(decision).__name__}, not a decision", by="approval"
            )
        if decision.digest is not None and decision.digest != pending.digest:
            return Reject("the decision was made on other arguments than these", by="approval")
        return decision

    def _report(self, call: ToolCall, decision: Decision, waited_s: float | None) -> None:
        _report(call, decision, waited_s, self.decisions, self.signals)


def _report(
    call: ToolCall, decision: Decision, waited_s: float | None, counter: Any, signals: Signals
) -> None:
    """The decision as an event (``Tracing`` writes it as a log record and a span event)
    and a counted metric point (a durable pause's wait is not known to the process that
    resumes: it is left out)."""
    kind = decision_kind(decision)
    attributes: dict[str, Any] = {
        "gen_ai.tool.name": call.name,
        "gen_ai.tool.call.id": call.call_id,
        "guardstack.approval.decision": kind,
    }
    if waited_s is not None:
        attributes["guardstack.approval.wait_s"] = waited_s
    if decision.by is not None:
        attributes["guardstack.approval.by"] = decision.by
    if isinstance(decision, Reject):
        attributes["guardstack.approval.reason"] = decision.reason
    signals.event("guardstack.approval", attributes)
    counter.add(1, {"guardstack.approval.decision": kind, "gen_ai.tool.name": call.name})
