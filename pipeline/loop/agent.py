"""``Agent``: one conversation's turns — the steps, the tool calls, the pause for
approval and the resume."""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import anyio
import anyio.lowlevel

from guardstack.pipeline.approval import (
    Approve,
    Decision,
    Edit,
    PendingApproval,
    Reject,
    canonical_arguments,
    decision_kind,
)
from guardstack.pipeline.contract import TurnRun
from guardstack.pipeline.decisions import decided, layer_of, who_of
from guardstack.pipeline.errors import (
    ApprovalMismatch,
    TurnBlocked,
    TurnInProgressError,
)
from guardstack.pipeline.loop.paused import (
    ANSWERED,
    Paused,
    check_runs_as_asked,
    decision_event,
    paused_of,
    pending_of,
    reject_pending,
    reject_waiting,
    route,
)
from guardstack.pipeline.loop.place import Place
from guardstack.pipeline.loop.reply import checked_reply, reply_message, with_unique_ids
from guardstack.pipeline.loop.step_order import StepCalls, run_overlapping
from guardstack.pipeline.loop.turn_result import TurnResult, last_turn_of
from guardstack.pipeline.model import (
    NO_USAGE,
    Model,
    ModelReply,
    ModelRequest,
    ToolCallRequest,
    Usage,
)
from guardstack.pipeline.runtime import cancel_pending, cancel_scope, deliver_pending
from guardstack.pipeline.session import (
    ApprovalRequest,
    AssistantMessage,
    ContextDeferred,
    Session,
    StepEnd,
    StepStart,
    SystemMessage,
    ToolCallEvent,
    ToolResultEvent,
    TurnEnd,
    TurnEndReason,
    TurnStart,
    UserMessage,
)
from guardstack.pipeline.signals import STOPS
from guardstack.pipeline.tree import merge_remaining
from guardstack.pipeline.values import (
    USER_SOURCE,
    WRAP_UP_SOURCE,
    MessageSource,
    ToolCall,
    ToolResult,
    aborted_result,
    message_of,
)
from guardstack.pipeline.verdicts import ToolOutcome

if TYPE_CHECKING:
    from guardstack.pipeline.loop.agent_loop import AgentLoop

logger = logging.getLogger("guardstack")


class Agent(Place):
    """One conversation: a session log, a model, and turns run one at a time.

    Agents compare and hash by identity; guards keep per-agent state in weak maps
    keyed on them, so that state dies with the agent.
    """

    def __init__(
        self,
        loop: AgentLoop,
        session: Session,
        model: Model,
        *,
        tenant: str | None = None,
        priority: int = 0,
        labels: Mapping[str, str] | None = None,
    ) -> None:
        self.loop = loop
        self.session = session
        self.model = model
        self._scope: anyio.CancelScope | None = None
        Place.__init__(self, tenant, priority, labels)
        events = session.events
        # A new session holds its system prompt at most: nothing to repair or count.
        new = not events or (len(events) == 1 and isinstance(events[0], SystemMessage))
        if not new:
            session.close_open_turn()  # a resumed mid-turn snapshot: answer what it left open
        self._turn = 0 if new else sum(isinstance(event, TurnStart) for event in events)
        #: Tokens every model reply of this session used (rebuilt from the log on resume).
        self.usage = NO_USAGE if new and not session.children else session.usage()
        #: Tokens the current (or last) turn's model replies used.
        self.turn_usage = NO_USAGE
        #: Model calls the current (or last) turn made.
        self.turn_model_calls = 0
        #: The current (or last) turn's step.
        self.step = 0
        #: Tool call id -> the id of the child session that call started.
        self._child_of_call: dict[str, str] = {}

    def add_usage(self, usage: Usage) -> None:
        """Count ``usage`` in this session's and this turn's totals (a reply's, or a
        child's charged to its parent as it happens)."""
        self.usage += usage
        self.turn_usage += usage

    def child_started(self, call_id: str, session_id: str) -> None:
        """Note that the call ``call_id`` started the child session ``session_id``: its
        result is logged with the child's id, and its decisions routed to it."""
        self._child_of_call[call_id] = session_id

    @property
    def session_id(self) -> str:
        return self.session.session_id

    def __repr__(self) -> str:
        return f"<Agent {self.session_id!r}>"

    @property
    def turn(self) -> int:
        """The current (or last) turn's number, from 1 (0 before the first)."""
        return self._turn

    async def remaining(self) -> dict[str, float]:
        """What is left of every cap that applies to this agent now, the stricter per key:
        its own loop's ``steps`` and the ``time`` to its turn deadline, what its caps
        report, and what its ancestors' caps report (a child spends from them too). Keys
        as ``tree.BUDGET_KEYS``; a cap that does not apply is absent."""
        left: dict[str, float] = {"steps": float(max(0, self.loop.max_steps - self.step))}
        if self.turn_deadline is not None:
            left["time"] = max(0.0, self.turn_deadline - anyio.current_time())
        for agent in (self, *self.ancestors):
            for report in tuple(agent.loop.tree.remaining):
                merge_remaining(left, await report(agent))
        return left

    def start_turn(self) -> None:
        """A turn run outside the loop begins (the model proxy's conversations: a new
        person's message): the turn's counts start at zero."""
        self._turn += 1
        self.turn_usage, self.turn_model_calls, self.step = NO_USAGE, 0, 0

    def start_step(self) -> None:
        """A step run outside the loop begins (each model request the model proxy
        forwards for a conversation is one): what notes once per step notes again."""
        self.step += 1

    def note(self, text: str, plugin: str) -> None:
        """Log a context message from ``plugin`` now (a ``user/message`` it sources); the
        next request rebuilt from the log carries it. For layers that speak to the model
        outside a tool call's outcome (``BudgetNotice``)."""
        self.session.append(UserMessage(text, MessageSource("plugin", plugin)))

    def cancel(self) -> None:
        """Cancel the running turn, if any; ``prompt`` then returns reason ``aborted``."""
        if self._scope is not None:
            self._scope.cancel()

    async def prompt(self, text: str) -> TurnResult:
        """Run one turn for a person's ``text``."""
        if self._scope is not None:
            raise TurnInProgressError(f"agent {self.session_id!r} is already running a turn")
        return await self._hooked(cancel_scope(), self._run_turn, text)

    async def _hooked(self, scope: anyio.CancelScope, run: TurnRun, text: str) -> TurnResult:
        """A whole turn (``run``) in ``scope``, inside the loop's turn hooks; the turn-end
        hooks are told unless it paused for approval. Cancelled: ``aborted``."""
        result: TurnResult | None = None
        with scope:
            self._scope = scope
            try:
                for hook in reversed(self.loop.turn_hooks):
                    run = hook(run)
                result = await run(self, text)
                return result
            finally:
                self._scope = None
                if self.loop.turn_end_hooks and (result is None or result.reason != "approval"):
                    await self.loop.turn_ended(self)
        return TurnResult("aborted", error="cancelled by agent.cancel()", usage=self.turn_usage)

    @staticmethod
    async def _run_turn(agent: Agent, text: str) -> TurnResult:
        submit = agent.loop.prompt_submit
        if submit.layered:  # an empty stage hands the text on: skipped
            text = await submit(agent, text)
        return await agent._turn_body(text)

    async def _turn_body(self, text: str) -> TurnResult:
        reject_pending(self.session, "a new prompt came before anyone decided on it")
        self._turn += 1
        self.turn_usage, self.turn_model_calls, self.step = NO_USAGE, 0, 0
        turn = self._turn
        self.session.append(TurnStart(turn))
        self.session.append(UserMessage(text, USER_SOURCE))
        return await self._steps(turn, 0, "", None)

    async def _steps(
        self, turn: int, step: int, last_text: str, paused: Paused | None
    ) -> TurnResult:
        """The turn's steps from ``step`` on (a resumed turn first finishes its paused
        step): the loop of model call, tool calls, results."""
        log = self.session.append
        step_calls = None if paused is None else paused.calls
        try:
            if paused is not None:
                outcomes = await self._resume_calls(turn, step, paused)
                ended = self._end_step(turn, step, paused.requests, outcomes)
                if ended is not None:
                    return ended
            loop = self.loop
            while step < loop.max_steps:
                step += 1
                self.step = step
                step_calls = None
                log(StepStart(turn, step))
                request = ModelRequest(self, self.session.messages(), loop.tools.schemas())
                try:
                    # the model stage itself when nothing instruments it: a frame fewer
                    call_model = loop.hooked_model_call or loop.model_call.entry
                    reply = checked_reply(await call_model(request))
                except TurnBlocked as blocked:
                    wrapped = isinstance(blocked.answer, ModelReply)
                    if wrapped:  # a cap's wrap-up answer
                        last_text = self._wrapped_up(turn, step, request, blocked)
                    self._stopped(message_of(blocked), wrapped)
                    log(StepEnd(turn, step))
                    log(TurnEnd(turn, "blocked", message_of(blocked)))
                    return self._result("blocked", last_text, message_of(blocked), step)
                except Exception as error:
                    partial = getattr(error, "partial", None)
                    if isinstance(partial, str) and partial:  # a stream cut mid-reply
                        log(AssistantMessage(turn, step, partial, ()))
                    log(StepEnd(turn, step))
                    message = f"{type(error).__name__}: {message_of(error)}"
                    log(TurnEnd(turn, "error", message))
                    return self._result("error", last_text, message, step)
                self.turn_model_calls += 1
                if reply.usage is not None:
                    self.loop.charge(self, reply.usage, request)
                requests = with_unique_ids(reply.tool_calls, turn, step)
                last_text = reply.text
                log(reply_message(turn, step, reply, requests))
                if not requests:
                    log(StepEnd(turn, step))
                    log(TurnEnd(turn, "completed"))
                    return self._result("completed", last_text, None, step)
                step_calls = StepCalls(requests)
                outcomes = await self._run_calls(turn, step, step_calls)
                ended = self._end_step(turn, step, requests, outcomes)
                if ended is not None:
                    return ended
            log(TurnEnd(turn, "max-steps"))
            return self._result("max-steps", last_text, None, step)
        except BaseException as error:
            # Cancellation, or a KeyboardInterrupt / SystemExit from a tool: the log is
            # repaired on the way out — every call answered, the turn ended — so a
            # session saved in a ``finally:`` still rebuilds a valid request.
            if step_calls is not None:
                self._answer_unanswered(turn, step, step_calls)
            if step:
                log(StepEnd(turn, step))
            cancelled = isinstance(error, anyio.get_cancelled_exc_class())
            deadline = self.turn_deadline
            if cancelled and deadline is not None and anyio.current_time() >= deadline:
                spent = self.turn_deadline_ms
                log(TurnEnd(turn, "deadline", f"turn-deadline: the turn's {spent} ms ran out"))
            else:
                log(TurnEnd(turn, "aborted", None if cancelled else type(error).__name__))
            raise

    def _stopped(self, why: str, wrapped: bool = False) -> None:
        """A guard or a cap ended the turn: a decision-log line, a stop counted."""
        layer = layer_of(why)
        decision = "wrap_up" if wrapped else "end_turn"
        decided("stop", layer=layer, decision=decision, reason=why, signals=self.loop.signals,
                **who_of(self))  # fmt: skip
        self.loop.signals.add(STOPS, 1, {"layer": layer, "tenant": self.tenant or "default"})

    def _wrapped_up(self, turn: int, step: int, request: ModelRequest, blocked: TurnBlocked) -> str:
        """Log a cap's wrap-up — the note that asked, the answer without tools — and
        charge it; the answer's text is the turn's."""
        reply = blocked.answer
        assert isinstance(reply, ModelReply)
        if blocked.note:
            self.session.append(UserMessage(blocked.note, WRAP_UP_SOURCE))
        self.turn_model_calls += 1
        if reply.usage is not None:
            self.loop.charge(self, reply.usage, request)
        # tools were withheld: a call it still asks for is not run
        self.session.append(reply_message(turn, step, reply, ()))
        return reply.text

    def _end_step(
        self,
        turn: int,
        step: int,
        requests: Sequence[ToolCallRequest],
        outcomes: Sequence[ToolOutcome],
    ) -> TurnResult | None:
        """After a step's calls: pause for approval, or log the contexts (after every
        result, in model order) and end the step; a result if the turn ends here."""
        log = self.session.append
        waiting: list[Any] = []
        ended = None
        for outcome in outcomes:  # a loop, not two generators: this runs every step
            if outcome.pending is not None:
                waiting.append(outcome.pending)
            if outcome.ends_turn and ended is None:
                ended = outcome
        if waiting and ended is None:
            # the step's contexts wait for its last result, so the request the model
            # gets after the decisions is the one it would have got without the pause
            for request, outcome in zip(requests, outcomes, strict=True):
                call_id = request.call_id
                for context in outcome.contexts:
                    log(ContextDeferred(turn, step, call_id, context.text, context.source))
            log(TurnEnd(turn, "approval", "waiting for a person's decision"))
            pending = self.pending  # the undecided ones, read back from the log
            count = len(pending)
            why = f"{count} tool call{'s' if count > 1 else ''} wait for a person's decision"
            return self._result("approval", self._last_text(), why, step, pending)
        if waiting:
            reject_waiting(
                self.session,
                turn,
                step,
                tuple(waiting),
                "the turn ended before anyone decided on it",
            )
        for outcome in outcomes:
            for context in outcome.contexts:
                log(UserMessage(context.text, context.source))
        log(StepEnd(turn, step))
        if ended is not None:
            why = ended.result.error.message if ended.result.error else ended.result.content
            self._stopped(why)
            log(TurnEnd(turn, "blocked", why))
            return self._result("blocked", self._last_text(), why, step)
        return None

    # -- approval ------------------------------------------------------------------------

    @property
    def pending(self) -> tuple[PendingApproval, ...]:
        """The calls of the last turn that wait for a person's decision, in model order;
        a child agent's (``AgentTool``) in its place, their ids ``{child id}#{call id}``."""
        return pending_of(self.session)

    async def resume(self, decisions: Mapping[str, Decision]) -> TurnResult:
        """Continue a turn that ended with reason ``approval``: run each decided call
        (``{call_id: Approve() | Reject(reason) | Edit(arguments)}``), then the turn goes
        on as if it had never paused. Calls left undecided stay pending (the turn ends
        ``approval`` again). A decision for a call that is not pending, or whose
        ``digest`` is not the pending call's, raises ``ApprovalMismatch`` and nothing
        runs. Works on an agent created from a loaded session, in another process."""
        if self._scope is not None:
            raise TurnInProgressError(f"agent {self.session_id!r} is already running a turn")
        paused = self._paused()
        if paused is None:
            raise ApprovalMismatch(f"agent {self.session_id!r} has no turn waiting for approval")
        pending = {p.call_id: p for p in self.pending}
        for call_id, decision in decisions.items():
            asked = paused.waiting.get(call_id) or pending.get(call_id)
            if asked is None:
                waiting = ", ".join(map(repr, pending)) or "none"
                raise ApprovalMismatch(
                    f"call {call_id!r} is not waiting for a decision (waiting: {waiting})"
                )
            if not isinstance(decision, Approve | Reject | Edit):
                raise TypeError(
                    f"a decision is Approve(), Reject(reason) or Edit(arguments), got {decision!r}"
                )
            if decision.digest is not None and decision.digest != asked.digest:
                raise ApprovalMismatch(
                    f"the decision on call {call_id!r} was made on other arguments than "
                    f"the pending call's (digest {decision.digest[:12]}…, pending "
                    f"{asked.digest[:12]}…); it stays pending"
                )
            first = paused.decisions.get(call_id) if call_id in paused.logged else None
            if first is not None:
                raise ApprovalMismatch(
                    f"call {call_id!r} was already decided ({decision_kind(first)}"
                    f"{f' by {first.by}' if first.by else ''}); a decision is made once, "
                    "and this one would be dropped"
                )
            check_runs_as_asked(paused, call_id, asked)
        for call_id, decision in decisions.items():
            if call_id in paused.waiting:
                if paused.waiting[call_id].asked_by.startswith("agent:"):
                    raise ApprovalMismatch(
                        f"call {call_id!r} waits for its child agent's calls: decide those "
                        f"({', '.join(map(repr, pending))})"
                    )
                paused.decisions[call_id] = decision
                continue
            parent_call, inner = route(paused, call_id)  # a child's call: route it down
            paused.routed.setdefault(parent_call, {})[inner] = decision
            paused.decisions[parent_call] = Approve(by="guardstack")
        return await self._hooked(anyio.CancelScope(), self._resume_turn(paused), "")

    def _resume_turn(self, paused: Paused) -> TurnRun:
        async def resumed(agent: Agent, _: str) -> TurnResult:
            if self.turn_model_calls == 0 or self._turn != paused.turn:
                # this process did not run the turn: its counts are what its log says
                self._turn = paused.turn
                self.turn_usage, self.turn_model_calls = paused.usage, paused.model_calls
            self.step = paused.step
            return await self._steps(paused.turn, paused.step, paused.last_text, paused)

        return resumed

    def _paused(self) -> Paused | None:
        return paused_of(self.session)

    async def _resume_calls(self, turn: int, step: int, paused: Paused) -> list[ToolOutcome]:
        """The paused step's outcomes in model order. Decisions are logged as they come;
        the decided calls run, in model order, once every waiting call is decided — so
        the results, and the request after them, are the ones the step would have had
        without the pause."""
        for call_id, decision in paused.decisions.items():
            if call_id not in paused.logged and call_id not in paused.routed:
                self.session.append(decision_event(turn, step, call_id, decision, None))
        undecided = [c for c in paused.waiting if c not in paused.decisions]
        outcomes = []
        for index, request in enumerate(paused.requests):
            call_id = request.call_id
            asked = paused.waiting.get(call_id)
            if asked is None:
                contexts = tuple(paused.deferred.get(call_id, ()))
                outcomes.append(ToolOutcome(ANSWERED, contexts))
                continue
            if undecided:
                outcomes.append(ToolOutcome(ANSWERED, (), False, paused.pending_of(asked)))
                continue
            routed = paused.routed.get(call_id)
            outcome = await self._run_decided(request, asked, paused.decisions[call_id], routed)
            if cancel_pending():
                await deliver_pending()
            if outcome.pending is None:
                self._answer(turn, step, paused.calls, index, outcome)
            outcomes.append(outcome)
        return outcomes

    async def _run_decided(
        self,
        request: ToolCallRequest,
        asked: ApprovalRequest,
        decision: Decision,
        routed: dict[str, Decision] | None = None,
    ) -> ToolOutcome:
        """Run a paused call a person decided; ``routed``: the decisions for the calls of
        the child agent it resumes (an ``AgentTool``), carried on the call."""
        call = self._tool_call(request)
        if routed is not None:
            call = call.scoped(decisions=routed)
        return await self.loop.tools.run_decided(call, decision, asked_by=asked.asked_by)

    def approval_decided(self, call_id: str, decision: Decision, waited_s: float | None) -> None:
        """Log a decision an in-process approver (or a policy's timeout) made."""
        self.session.append(decision_event(self._turn, self.step, call_id, decision, waited_s))

    def _last_text(self) -> str:
        reply = next(
            (e for e in reversed(self.session.events) if isinstance(e, AssistantMessage)), None
        )
        return "" if reply is None else reply.text

    def last_turn_result(self) -> TurnResult:
        """The last turn's result as its log records it (its end reason and error, the
        model's last text, its steps): for layers that end a turn from outside it."""
        return last_turn_of(self.session, self.turn_usage)

    def _result(
        self,
        reason: TurnEndReason,
        text: str,
        error: str | None,
        steps: int,
        pending: tuple[PendingApproval, ...] = (),
    ) -> TurnResult:
        return TurnResult(reason, text, error, steps, self.turn_usage, pending)

    def _answer_unanswered(self, turn: int, step: int, calls: StepCalls) -> None:
        for index, request in enumerate(calls.requests):
            started = index in calls.called
            if not started:
                self.session.append(ToolCallEvent.of(turn, step, request))
            if index not in calls.answered:
                result = aborted_result(before_dispatch=not started)
                self.session.append(self._result_event(turn, step, request.call_id, result))

    def _log_call(self, turn: int, step: int, calls: StepCalls, index: int) -> None:
        """Log ``tool/call`` for call ``index``: from here on it counts as started."""
        self.session.append(ToolCallEvent.of(turn, step, calls.requests[index]))
        calls.called.add(index)

    def _tool_call(self, request: ToolCallRequest) -> ToolCall:
        # Resolved here, so the registry need not rebuild the call to set ``tool``.
        tool = self.loop.tools.get(request.name)
        return ToolCall(request.name, request.arguments, request.call_id, self, tool)

    def _answer(
        self, turn: int, step: int, calls: StepCalls, index: int, outcome: ToolOutcome
    ) -> None:
        call_id = calls.requests[index].call_id
        waiting = outcome.pending
        if waiting is not None:  # logged where its result will be, once decided
            self.session.append(
                ApprovalRequest(
                    turn,
                    step,
                    call_id,
                    waiting.tool,
                    canonical_arguments(waiting.arguments),
                    waiting.digest,
                    waiting.reason,
                    waiting.asked_by,
                )
            )
            return
        self.session.append(self._result_event(turn, step, call_id, outcome.result))
        calls.answered.add(index)

    def _result_event(
        self, turn: int, step: int, call_id: str, result: ToolResult
    ) -> ToolResultEvent:
        """A call's ``tool/result``, naming the child session the call started, if any."""
        child = self._child_of_call.pop(call_id, None) if self._child_of_call else None
        return ToolResultEvent(turn, step, call_id, result, child)

    async def _run_calls(self, turn: int, step: int, calls: StepCalls) -> list[ToolOutcome]:
        execute = self.loop.tools.execute
        count = len(calls.requests)
        if self.loop.max_parallel_tool_calls == 1 or count == 1:
            # One call at a time: ``_log_call``, ``_tool_call`` and ``_answer`` written
            # out, as this runs for every call of every step.
            log, tools = self.session.append, self.loop.tools
            outcomes = []
            for index, request in enumerate(calls.requests):
                call_id = request.call_id
                log(ToolCallEvent.of(turn, step, request))
                calls.called.add(index)  # from here on it counts as started
                # resolved here, so the registry need not rebuild the call to set ``tool``
                call = ToolCall(
                    request.name, request.arguments, call_id, self, tools.get(request.name)
                )
                outcome = await execute(call)
                # A tool that ignored the turn's cancel still returns: it was aborted.
                if cancel_pending():
                    await deliver_pending()
                if outcome.pending is None and not self._child_of_call:  # the usual: a result
                    log(ToolResultEvent(turn, step, call_id, outcome.result))
                    calls.answered.add(index)
                else:
                    self._answer(turn, step, calls, index, outcome)
                outcomes.append(outcome)
            return outcomes
        parallelism = self.loop.max_parallel_tool_calls

        def log_call(index: int) -> None:
            if index not in calls.called:  # a hook may run a call's phases twice
                self._log_call(turn, step, calls, index)

        def answer(index: int, outcome: ToolOutcome) -> None:
            self._answer(turn, step, calls, index, outcome)

        return await run_overlapping(
            [self._tool_call(request) for request in calls.requests],
            self.loop.tools.execute,
            parallelism,
            log_call,
            answer,
        )
