"""The agent loop: prompt, model, tool calls, results, contexts, repeat.

One turn of ``agent.prompt(text)``:

1. the ``prompt_submit`` stage sees the person's text (guards reset per-turn state
   here), then ``turn/start`` and the person's ``user/message`` are logged;
2. each step logs ``step/start``, asks the model through the ``model_call`` stage
   (a ``ModelRequest`` holding ``session.messages()``), logs the
   ``assistant/message`` with the reply's usage and reasoning, runs every tool
   call through ``tools.execute`` with ``call.agent`` set, logs ``tool/call`` /
   ``tool/result`` in the model's order, then the step's additional contexts as
   plugin-sourced ``user/message`` events — after all of the step's results, never
   between two — and ``step/end``;
3. the turn ends when the model answers without tool calls (``completed``), at
   ``max_steps`` (``max-steps``), when a cap says so (``blocked``: a tool-stage cap
   through ``Deny(end_turn=True)``, a model-stage one by raising ``TurnBlocked``),
   when the model call fails (``error``) or when it is cancelled (``aborted``).

The ``model_call`` stage is an onion like the tool stages: a layer is
``async (request, call_next) -> ModelReply`` and the innermost calls
``agent.model.complete(request.messages, request.tools)``; model-stage ``Timeout``,
``Retry`` and ``Metrics`` sit there, in the order registered. A system prompt is
logged once, as the session's first event, so the log still rebuilds every
request. ``TurnResult.usage`` is the turn's tokens, ``agent.usage`` the session's.

With ``max_parallel_tool_calls > 1`` the dispatch of a step's calls overlaps, while
pre-execute, post-execute and the logged results keep the model's order, so guards
see calls in the order the model made them.

Cancellation keeps the log whole: every ``tool/call`` gets exactly one
``tool/result`` (``ABORTED`` for a call that was running, ``ABORTED_BEFORE_DISPATCH``
for one never started), then ``turn/end`` with reason ``aborted``; a cancel from
outside re-raises after that, ``agent.cancel()`` returns the aborted turn.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import anyio
import anyio.lowlevel
import attrs

from guardstack.pipeline.approval import (
    CHILD_DECISIONS,
    Approve,
    Decision,
    Edit,
    PendingApproval,
    Reject,
    call_digest,
    canonical_arguments,
    decision_kind,
)
from guardstack.pipeline.contract import ModelNext, PromptNext, TurnRun
from guardstack.pipeline.errors import (
    ApprovalMismatch,
    ConfigError,
    TurnBlocked,
    TurnInProgressError,
)
from guardstack.pipeline.frozen import quick_init
from guardstack.pipeline.model import (
    NO_USAGE,
    Model,
    ModelReply,
    ModelRequest,
    ToolCallRequest,
    Usage,
    reports_chunks,
)
from guardstack.pipeline.onion import Pipeline, Registration
from guardstack.pipeline.registry import Phase
from guardstack.pipeline.runtime import cancel_pending, cancel_scope, deliver_pending
from guardstack.pipeline.session import (
    ApprovalDecision,
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
from guardstack.pipeline.signals import USAGE_TOKENS, Signals
from guardstack.pipeline.tree import TreeLedger, merge_remaining
from guardstack.pipeline.validate import integer
from guardstack.pipeline.values import (
    TOOL_REJECTED,
    USER_SOURCE,
    ContextMessage,
    MessageSource,
    ToolCall,
    ToolOutcome,
    ToolResult,
    aborted_result,
    denied_result,
    message_of,
)

if TYPE_CHECKING:
    from guardstack.pipeline.registry import ToolRegistry

__all__ = ["Agent", "AgentLoop", "TurnResult", "TurnRun"]

logger = logging.getLogger("guardstack")


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


async def _submit(agent: Agent, text: str) -> str:
    return text


async def _complete(request: ModelRequest) -> ModelReply:
    """The innermost ``model_call`` layer: the agent's model itself (told of each piece
    of its reply when a layer listens and the model reports them)."""
    model = request.model if request.model is not None else request.agent.model
    on_chunk = request.on_chunk
    if on_chunk is not None and reports_chunks(model):
        streaming: Any = model
        reply: ModelReply = await streaming.complete(
            request.messages, request.tools, on_chunk=on_chunk
        )
        return reply
    return await model.complete(request.messages, request.tools)


def _checked(reply: object) -> ModelReply:
    """The reply, if the loop can log it; a ``TypeError`` naming what is wrong if not.

    Each check asks the exact type first: the usual reply passes without an
    ``isinstance`` call or a generator."""
    if type(reply) is not ModelReply and not isinstance(reply, ModelReply):
        raise TypeError(f"the model returned {reply!r}, not a ModelReply")
    text = reply.text
    if type(text) is not str and not isinstance(text, str):
        raise TypeError(f"the model's reply text is {type(text).__name__}, not str")
    usage = reply.usage
    if usage is not None and type(usage) is not Usage and not isinstance(usage, Usage):
        raise TypeError(f"the model's reply usage is {usage!r}, not a Usage")
    for name, value in (("reasoning", reply.reasoning), ("model", reply.model)):
        if value is not None and type(value) is not str and not isinstance(value, str):
            raise TypeError(f"the model's reply {name} is {type(value).__name__}, not str")
    if reply.thinking_blocks:
        if not all(isinstance(block, Mapping) for block in reply.thinking_blocks):
            raise TypeError("the model's reply thinking_blocks are not all mappings")
        try:
            json.dumps([dict(block) for block in reply.thinking_blocks], allow_nan=False)
        except (TypeError, ValueError, RecursionError) as error:
            raise TypeError(f"the model's reply thinking_blocks are not JSON: {error}") from None
    for request in reply.tool_calls:
        if type(request) is not ToolCallRequest and not isinstance(request, ToolCallRequest):
            raise TypeError("the model's reply tool_calls are not all ToolCallRequest")
    return reply


def _with_unique_ids(
    requests: tuple[ToolCallRequest, ...], turn: int, step: int
) -> tuple[ToolCallRequest, ...]:
    """The reply's calls, each with an id of its own: a missing or repeated id (two calls
    a provider sent under one id would get two results for it, and the next request
    would be refused) is replaced by ``call_<turn>_<step>_<index>``."""
    if not requests or (len(requests) == 1 and requests[0].call_id):
        return requests  # none, or one with an id: nothing can repeat it
    seen: set[str] = set()
    unique = []
    for index, request in enumerate(requests):
        if not request.call_id or request.call_id in seen:
            request = request.with_call_id(f"call_{turn}_{step}_{index}")
        seen.add(request.call_id)
        unique.append(request)
    return tuple(unique)


class AgentLoop:
    """Creates agents that share one tool registry and run turns."""

    def __init__(
        self,
        tools: ToolRegistry,
        model: Model | None = None,
        max_steps: int = 50,
        max_parallel_tool_calls: int = 1,
        *,
        system: str | None = None,
    ) -> None:
        self.tools = tools
        self.model = model
        self.max_steps = integer("AgentLoop", "max_steps", max_steps)
        self.max_parallel_tool_calls = integer(
            "AgentLoop", "max_parallel_tool_calls", max_parallel_tool_calls
        )
        self.system = _system_prompt(system)
        #: ``async (agent, text, call_next) -> text``: sees every new person's prompt.
        self.prompt_submit: Pipeline[PromptNext] = Pipeline(_submit, stage="prompt_submit")
        #: ``async (request, call_next) -> ModelReply``: every model call of every agent.
        self.model_call: Pipeline[ModelNext] = Pipeline(_complete, stage="model")
        self._turn_hooks: list[Callable[[TurnRun], TurnRun]] = []
        self._model_hooks: list[Callable[[ModelNext], ModelNext]] = []
        # the stage's own bound ``__call__``, not one of the loop's: no reference cycle
        self._call_model: ModelNext = self.model_call.__call__
        self._create_hooks: list[Callable[[Agent], None]] = []
        self._turn_end_hooks: list[Callable[[Agent], Awaitable[None]]] = []
        #: What a tree of agents counts at this loop's agents (``AgentTool``'s children).
        self.tree = TreeLedger()
        #: Where the layers report events and resilience metrics (``Tracing``, ``Metrics``).
        self.signals = Signals()
        #: Whose a model call is, when a plugin says (a ``UsageLimit`` that names its
        #: tenant): the usage metric then names the tenant its spend is counted for.
        self.tenant_of: Callable[[Agent, ModelRequest | None], str | None] | None = None

    def charge(self, agent: Agent, usage: Usage, request: ModelRequest | None = None) -> None:
        """Count a reply's usage for ``agent`` (its session and turn), and as
        ``guardstack.usage.tokens`` for its tenant: the one a cap that names tenants
        counts the call's spend for (``tenant_of``), else the agent's."""
        agent.usage += usage
        agent.turn_usage += usage
        resolver = self.tenant_of
        tenant = resolver(agent, request) if resolver is not None else None
        tenant = tenant or getattr(agent, "tenant", None) or "default"
        signals = self.signals
        signals.add(
            USAGE_TOKENS, usage.input_tokens, {"tenant": tenant, "gen_ai.token.type": "input"}
        )
        signals.add(
            USAGE_TOKENS, usage.output_tokens, {"tenant": tenant, "gen_ai.token.type": "output"}
        )

    def instrument_turn(self, hook: Callable[[TurnRun], TurnRun]) -> Registration:
        """Wrap every whole turn (``async (agent, text) -> TurnResult``) with ``hook``.

        For instrumentation such as ``Tracing``'s ``invoke_agent`` span; the turn's
        own work, the log and the result are unchanged by it.
        """
        self._turn_hooks.append(hook)
        return Registration(lambda: self._turn_hooks.remove(hook))

    async def call_model(self, request: ModelRequest) -> ModelReply:
        """One model call through the whole ``model_call`` stage: every layer, and every
        hook (``instrument_model_call``: ``Tracing``'s ``chat`` span, ``BudgetNotice``).
        The entrance for hosts that make model calls outside a turn (the model proxy,
        a child agent's calls charged to its parent)."""
        return await self._call_model(request)

    def on_turn_end(self, hook: Callable[[Agent], Awaitable[None]]) -> Registration:
        """Call ``await hook(agent)`` when one of this loop's agents' turns has ended
        (not when it paused for approval: it goes on later). Caps close the turn's
        windows here."""
        self._turn_end_hooks.append(hook)
        return Registration(lambda: self._turn_end_hooks.remove(hook))

    async def turn_ended(self, agent: Agent) -> None:
        """Tell the turn-end hooks that ``agent``'s turn is over (shielded; a hook that
        raises is logged, never raised). The loop calls it after each turn; a host that
        runs turns of its own (the model proxy's conversations) calls it itself."""
        if not self._turn_end_hooks:
            return
        with anyio.CancelScope(shield=True):
            for hook in tuple(self._turn_end_hooks):
                try:
                    await hook(agent)
                except Exception:
                    logger.warning("a turn-end hook failed", exc_info=True)

    def instrument_model_call(self, hook: Callable[[ModelNext], ModelNext]) -> Registration:
        """Wrap every whole model call (the ``model_call`` stage, all its layers) with ``hook``."""
        self._model_hooks.append(hook)
        self._compose_model_call()

        def remove() -> None:
            self._model_hooks.remove(hook)
            self._compose_model_call()

        return Registration(remove)

    def _compose_model_call(self) -> None:
        call: ModelNext = self.model_call.__call__
        for hook in reversed(self._model_hooks):
            call = hook(call)
        self._call_model = call

    def on_create(self, hook: Callable[[Agent], None]) -> Registration:
        """Run ``hook(agent)`` before ``create`` returns; if it raises, ``create`` raises."""
        self._create_hooks.append(hook)
        return Registration(lambda: self._create_hooks.remove(hook))

    def create(
        self,
        session_id: str,
        model: Model | None = None,
        *,
        session: Session | None = None,
        system: str | None = None,
    ) -> Agent:
        """A new agent. ``session`` resumes a loaded log; guard state starts fresh.

        ``system`` (else the loop's) is logged as a new session's first event; a
        resumed session keeps its own, and naming a different one raises.
        """
        chosen = model if model is not None else self.model
        if chosen is None:
            raise ConfigError(
                "AgentLoop.create: no model; pass model= here or to AgentLoop",
                key="model",
                value=None,
            )
        log = session if session is not None else Session(session_id)
        _start_with_system(log, _system_prompt(system) or self.system)
        agent = Agent(self, log, chosen)
        for hook in list(self._create_hooks):
            hook(agent)
        return agent


def _system_prompt(system: object) -> str | None:
    if system is not None and not isinstance(system, str):
        raise ConfigError(
            f"AgentLoop: `system` must be text, got {type(system).__name__}",
            key="system",
            value=system,
        )
    return system or None


def _start_with_system(session: Session, system: str | None) -> None:
    """Log ``system`` as the first event of a new session; check it against a resumed one."""
    if system is None:
        return
    if not session.events:
        session.append(SystemMessage(system))
        return
    if session.system != system:
        had = "a different system prompt" if session.system else "no system prompt"
        raise ConfigError(
            f"session {session.session_id!r} started with {had}; a log is never rewritten, "
            "so resume it with the system prompt it has (system=None keeps it)",
            key="system",
            value=system,
        )


@quick_init
@attrs.define(eq=False)
class _StepCalls:
    """Which of a step's calls were logged (started) and answered: what a cancel must fill."""

    requests: tuple[ToolCallRequest, ...]
    called: set[int] = attrs.Factory(set)
    answered: set[int] = attrs.Factory(set)


class Agent:
    """One conversation: a session log, a model, and turns run one at a time.

    Agents compare and hash by identity; guards keep per-agent state in weak maps
    keyed on them, so that state dies with the agent.
    """

    def __init__(self, loop: AgentLoop, session: Session, model: Model) -> None:
        self.loop = loop
        self.session = session
        self.model = model
        self._scope: anyio.CancelScope | None = None
        #: When the running turn must end (anyio time), set by ``TurnDeadline``; a turn
        #: cancelled at or past it ends with reason ``deadline`` instead of ``aborted``.
        self.turn_deadline: float | None = None
        #: The budget behind ``turn_deadline``, in milliseconds (for the log's text).
        self.turn_deadline_ms: int | None = None
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
        #: Whose calendar windows this agent's model calls count in when a ``UsageLimit``
        #: names no tenant of its own (the model proxy sets each client key's).
        self.tenant: str | None = None
        #: Its calls' place in the admission layers' queues (higher first), unless a
        #: call names its own: a person's interactive agent above a batch.
        self.priority = 0
        #: The agent whose tool started this one (``AgentTool``), and its depth in the
        #: tree (the root is 1).
        self.parent: Agent | None = None
        self.depth = 1
        #: Ancestors' tool-call caps, each with the ancestor it counts for (set by
        #: ``AgentTool``; the registry runs them outside this agent's own pre-execute).
        self.tree_caps: tuple[tuple[Agent, Callable[..., Awaitable[Any]]], ...] = ()
        #: Tool call id -> the id of the child session that call started.
        self._child_of_call: dict[str, str] = {}

    @property
    def session_id(self) -> str:
        return self.session.session_id

    def __repr__(self) -> str:
        return f"<Agent {self.session_id!r}>"

    @property
    def turn(self) -> int:
        """The current (or last) turn's number, from 1 (0 before the first)."""
        return self._turn

    @property
    def ancestors(self) -> list[Agent]:
        """The parent, its parent, … up to the root (empty for a root agent)."""
        chain, agent = [], self.parent
        while agent is not None:
            chain.append(agent)
            agent = agent.parent
        return chain

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
        result: TurnResult | None = None
        with cancel_scope() as scope:
            self._scope = scope
            try:
                run: TurnRun = self._run_turn
                for hook in reversed(self.loop._turn_hooks):
                    run = hook(run)
                result = await run(self, text)
                return result
            finally:
                self._scope = None
                if self.loop._turn_end_hooks and (result is None or result.reason != "approval"):
                    await self.loop.turn_ended(self)
        return TurnResult("aborted", error="cancelled by agent.cancel()", usage=self.turn_usage)

    @staticmethod
    async def _run_turn(agent: Agent, text: str) -> TurnResult:
        submit = agent.loop.prompt_submit
        if submit.layered:  # an empty stage hands the text on: skipped
            text = await submit(agent, text)
        return await agent._turn_body(text)

    async def _turn_body(self, text: str) -> TurnResult:
        self._reject_pending("a new prompt came before anyone decided on it")
        self._turn += 1
        self.turn_usage, self.turn_model_calls, self.step = NO_USAGE, 0, 0
        turn = self._turn
        self.session.append(TurnStart(turn))
        self.session.append(UserMessage(text, USER_SOURCE))
        return await self._steps(turn, 0, "", None)

    async def _steps(
        self, turn: int, step: int, last_text: str, paused: _Paused | None
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
                    call_model = loop._call_model if loop._model_hooks else loop.model_call._chain
                    reply = _checked(await call_model(request))
                except TurnBlocked as blocked:
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
                requests = _with_unique_ids(reply.tool_calls, turn, step)
                last_text = reply.text
                log(
                    AssistantMessage(
                        turn,
                        step,
                        reply.text,
                        requests,
                        reply.usage,
                        reply.reasoning,
                        reply.model,
                        reply.thinking_blocks,
                    )
                )
                if not requests:
                    log(StepEnd(turn, step))
                    log(TurnEnd(turn, "completed"))
                    return self._result("completed", last_text, None, step)
                step_calls = _StepCalls(requests)
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
            self._reject_waiting(
                turn, step, tuple(waiting), "the turn ended before anyone decided on it"
            )
        for outcome in outcomes:
            for context in outcome.contexts:
                log(UserMessage(context.text, context.source))
        log(StepEnd(turn, step))
        if ended is not None:
            why = ended.result.error.message if ended.result.error else ended.result.content
            log(TurnEnd(turn, "blocked", why))
            return self._result("blocked", self._last_text(), why, step)
        return None

    # -- approval ------------------------------------------------------------------------

    @property
    def pending(self) -> tuple[PendingApproval, ...]:
        """The calls of the last turn that wait for a person's decision, in model order;
        a child agent's (``AgentTool``) in its place, their ids ``{child id}#{call id}``."""
        return _pending_of(self.session)

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
            _check_runs_as_asked(paused, call_id, asked)
        for call_id, decision in decisions.items():
            if call_id in paused.waiting:
                if paused.waiting[call_id].asked_by.startswith("agent:"):
                    raise ApprovalMismatch(
                        f"call {call_id!r} waits for its child agent's calls: decide those "
                        f"({', '.join(map(repr, pending))})"
                    )
                paused.decisions[call_id] = decision
                continue
            parent_call, inner = _route(paused, call_id)  # a child's call: route it down
            paused.routed.setdefault(parent_call, {})[inner] = decision
            paused.decisions[parent_call] = Approve(by="guardstack")
        result: TurnResult | None = None
        with anyio.CancelScope() as scope:
            self._scope = scope
            try:
                run: TurnRun = self._resume_turn(paused)
                for hook in reversed(self.loop._turn_hooks):
                    run = hook(run)
                result = await run(self, "")
                return result
            finally:
                self._scope = None
                if self.loop._turn_end_hooks and (result is None or result.reason != "approval"):
                    await self.loop.turn_ended(self)
        return TurnResult("aborted", error="cancelled by agent.cancel()", usage=self.turn_usage)

    def _resume_turn(self, paused: _Paused) -> TurnRun:
        async def resumed(agent: Agent, _: str) -> TurnResult:
            if self.turn_model_calls == 0 or self._turn != paused.turn:
                # this process did not run the turn: its counts are what its log says
                self._turn = paused.turn
                self.turn_usage, self.turn_model_calls = paused.usage, paused.model_calls
            self.step = paused.step
            return await self._steps(paused.turn, paused.step, paused.last_text, paused)

        return resumed

    def _paused(self) -> _Paused | None:
        return _paused_of(self.session)

    async def _resume_calls(self, turn: int, step: int, paused: _Paused) -> list[ToolOutcome]:
        """The paused step's outcomes in model order. Decisions are logged as they come;
        the decided calls run, in model order, once every waiting call is decided — so
        the results, and the request after them, are the ones the step would have had
        without the pause."""
        for call_id, decision in paused.decisions.items():
            if call_id not in paused.logged and call_id not in paused.routed:
                self.session.append(_decision_event(turn, step, call_id, decision, None))
        undecided = [c for c in paused.waiting if c not in paused.decisions]
        outcomes = []
        for index, request in enumerate(paused.requests):
            call_id = request.call_id
            asked = paused.waiting.get(call_id)
            if asked is None:
                contexts = tuple(paused.deferred.get(call_id, ()))
                outcomes.append(ToolOutcome(_ANSWERED, contexts))
                continue
            if undecided:
                outcomes.append(ToolOutcome(_ANSWERED, (), False, paused.pending_of(asked)))
                continue
            routed = paused.routed.get(call_id)
            token = CHILD_DECISIONS.set(routed) if routed is not None else None
            try:
                outcome = await self._run_decided(request, asked, paused.decisions[call_id])
            finally:
                if token is not None:
                    CHILD_DECISIONS.reset(token)
            if cancel_pending():
                await deliver_pending()
            if outcome.pending is None:
                self._answer(turn, step, paused.calls, index, outcome)
            outcomes.append(outcome)
        return outcomes

    async def _run_decided(
        self, request: ToolCallRequest, asked: ApprovalRequest, decision: Decision
    ) -> ToolOutcome:
        call = self._tool_call(request)
        return await self.loop.tools.run_decided(call, decision, asked_by=asked.asked_by)

    def approval_decided(self, call_id: str, decision: Decision, waited_s: float | None) -> None:
        """Log a decision an in-process approver (or a policy's timeout) made."""
        self.session.append(_decision_event(self._turn, self.step, call_id, decision, waited_s))

    def _reject_pending(self, reason: str) -> None:
        """A new prompt while calls wait: each is rejected with ``reason`` and the paused
        turn is ended, so the next request is one a provider accepts."""
        paused = self._paused()
        if paused is None:
            return
        turn, step = paused.turn, paused.step
        self._reject_waiting(
            turn, step, [paused.pending_of(e) for e in paused.waiting.values()], reason
        )
        for request in paused.requests:
            for context in paused.deferred.get(request.call_id, ()):
                self.session.append(UserMessage(context.text, context.source))
        self.session.append(StepEnd(turn, step))
        self.session.append(TurnEnd(turn, "aborted", f"pending calls rejected: {reason}"))

    def _reject_waiting(
        self, turn: int, step: int, waiting: Sequence[PendingApproval], reason: str
    ) -> None:
        for pending in waiting:
            decision = Reject(reason, by="guardstack")
            self.session.append(_decision_event(turn, step, pending.call_id, decision, None))
            result = denied_result(f"rejected: {reason}", TOOL_REJECTED)
            self.session.append(ToolResultEvent(turn, step, pending.call_id, result))

    def _last_text(self) -> str:
        reply = next(
            (e for e in reversed(self.session.events) if isinstance(e, AssistantMessage)), None
        )
        return "" if reply is None else reply.text

    def last_turn_result(self) -> TurnResult:
        """The last turn's result as its log records it (its end reason and error, the
        model's last text, its steps): for layers that end a turn from outside it."""
        events = self.session.events
        starts = [i for i, event in enumerate(events) if isinstance(event, TurnStart)]
        turn = events[starts[-1] :] if starts else []
        end = next((e for e in reversed(turn) if isinstance(e, TurnEnd)), None)
        texts = [e.text for e in turn if isinstance(e, AssistantMessage)]
        return TurnResult(
            end.reason if end is not None else "aborted",
            texts[-1] if texts else "",
            end.error if end is not None else None,
            sum(isinstance(e, StepStart) for e in turn),
            self.turn_usage,
        )

    def _result(
        self,
        reason: TurnEndReason,
        text: str,
        error: str | None,
        steps: int,
        pending: tuple[PendingApproval, ...] = (),
    ) -> TurnResult:
        return TurnResult(reason, text, error, steps, self.turn_usage, pending)

    def _answer_unanswered(self, turn: int, step: int, calls: _StepCalls) -> None:
        for index, request in enumerate(calls.requests):
            started = index in calls.called
            if not started:
                self.session.append(ToolCallEvent.of(turn, step, request))
            if index not in calls.answered:
                result = aborted_result(before_dispatch=not started)
                self.session.append(self._result_event(turn, step, request.call_id, result))

    def _log_call(self, turn: int, step: int, calls: _StepCalls, index: int) -> None:
        """Log ``tool/call`` for call ``index``: from here on it counts as started."""
        self.session.append(ToolCallEvent.of(turn, step, calls.requests[index]))
        calls.called.add(index)

    def _tool_call(self, request: ToolCallRequest) -> ToolCall:
        # Resolved here, so the registry need not rebuild the call to set ``tool``.
        tool = self.loop.tools.get(request.name)
        return ToolCall(request.name, request.arguments, request.call_id, self, tool)

    def _answer(
        self, turn: int, step: int, calls: _StepCalls, index: int, outcome: ToolOutcome
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

    async def _run_calls(self, turn: int, step: int, calls: _StepCalls) -> list[ToolOutcome]:
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
        return await self._run_calls_overlapping(turn, step, calls)

    async def _run_calls_overlapping(
        self, turn: int, step: int, calls: _StepCalls
    ) -> list[ToolOutcome]:
        count = len(calls.requests)
        step_order = _StepOrder(count, self.loop.max_parallel_tool_calls)
        committed = [_Gate() for _ in range(count)]
        outcomes: list[ToolOutcome | None] = [None] * count

        def log_call(index: int) -> None:
            if index not in calls.called:  # a hook may run a call's phases twice
                self._log_call(turn, step, calls, index)

        async def run(index: int) -> None:
            order = _CallOrder(step_order, index, log_call)
            call = self._tool_call(calls.requests[index])
            outcome = await self.loop.tools.execute(call, order=order)
            # A hook that answered without running the phases still frees the next call.
            step_order.release(index)
            if cancel_pending():
                await deliver_pending()
            if index:
                await committed[index - 1].wait()
            log_call(index)
            self._answer(turn, step, calls, index, outcome)
            outcomes[index] = outcome
            committed[index].set()

        try:
            async with anyio.create_task_group() as group:
                for index in range(count):
                    group.start_soon(run, index)
        except BaseExceptionGroup as group_error:
            # One tool's KeyboardInterrupt (or the like) stopped the step: raise it as
            # itself, as the sequential path does (the log is repaired by the caller).
            if len(group_error.exceptions) == 1:
                raise group_error.exceptions[0] from None
            raise
        return [outcome for outcome in outcomes if outcome is not None]


#: A placeholder result for calls of a paused step that are not run again on resume.
_ANSWERED = ToolResult("")


@attrs.define(eq=False)
class _Paused:
    """A turn that ended waiting for decisions, read from the log (in any process)."""

    turn: int
    step: int
    requests: tuple[ToolCallRequest, ...]
    waiting: dict[str, ApprovalRequest]
    deferred: dict[str, list[ContextMessage]]
    calls: _StepCalls
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


def _paused_of(session: Session) -> _Paused | None:
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
    calls = _StepCalls(requests)
    calls.called.update(range(len(requests)))
    calls.answered.update(i for i, r in enumerate(requests) if r.call_id in answered)
    usage = sum((r.usage for r in replies if r.usage is not None), Usage())
    decided = {
        e.call_id: _decision_of(e)
        for e in turn
        if isinstance(e, ApprovalDecision) and e.call_id in waiting
    }
    return _Paused(
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


def _check_runs_as_asked(
    paused: _Paused, call_id: str, asked: ApprovalRequest | PendingApproval
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


def _route(paused: _Paused, call_id: str) -> tuple[str, str]:
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


def _pending_of(session: Session) -> tuple[PendingApproval, ...]:
    """What waits in ``session``'s paused turn; a child agent's calls in its place."""
    paused = _paused_of(session)
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
            for inner in _pending_of(child)
        )
    return tuple(found)


def _decision_of(event: ApprovalDecision) -> Decision:
    """A logged decision, as it was made."""
    if event.decision == "reject":
        return Reject(event.reason or "rejected", by=event.by)
    if event.decision == "edit":
        return Edit(json.loads(event.arguments_json or "{}"), by=event.by)
    return Approve(by=event.by)


def _decision_event(
    turn: int, step: int, call_id: str, decision: Decision, waited_s: float | None
) -> ApprovalDecision:
    edited = canonical_arguments(decision.arguments) if isinstance(decision, Edit) else None
    reason = decision.reason if isinstance(decision, Reject) else None
    return ApprovalDecision(
        turn, step, call_id, decision_kind(decision), decision.by, reason, edited, waited_s
    )


class _Gate:
    """A one-shot event that costs nothing unless someone has to wait for it.

    A parallel step has a gate per call and phase, and most are open by the time
    anyone looks: ``anyio.Event`` would be built for each, and its ``wait()`` yields
    to the scheduler even when set. The real event is made only for a waiter.
    """

    __slots__ = ("_event", "open")

    def __init__(self) -> None:
        self.open = False
        self._event: anyio.Event | None = None

    def set(self) -> None:
        self.open = True
        if self._event is not None:
            self._event.set()

    async def wait(self) -> None:
        if self.open:
            return
        if self._event is None:
            self._event = anyio.Event()
        await self._event.wait()


class _StepOrder:
    """The turns a parallel step's calls take: pre- and post-execute in model order."""

    __slots__ = ("done", "slots")

    def __init__(self, count: int, parallelism: int) -> None:
        self.done = {
            "pre_execute": [_Gate() for _ in range(count)],
            "post_execute": [_Gate() for _ in range(count)],
        }
        #: ``None`` when every call may run at once: no semaphore to pass.
        self.slots = anyio.Semaphore(parallelism) if parallelism < count else None

    def release(self, index: int) -> None:
        for events in self.done.values():
            events[index].set()


class _CallOrder:
    """One call's ``PhaseOrder`` within a ``_StepOrder`` (see ``pipeline.registry``)."""

    __slots__ = ("index", "log_call", "step")

    def __init__(self, step: _StepOrder, index: int, log_call: Callable[[int], None]) -> None:
        self.step = step
        self.index = index
        self.log_call = log_call

    async def enter(self, phase: Phase) -> None:
        if phase == "dispatch":
            slots = self.step.slots
            if slots is not None:
                try:
                    slots.acquire_nowait()
                except anyio.WouldBlock:
                    await slots.acquire()
            return
        if self.index:
            await self.step.done[phase][self.index - 1].wait()
        if phase == "pre_execute":
            self.log_call(self.index)  # in model order; from here on the call has started

    def leave(self, phase: Phase) -> None:
        if phase == "dispatch":
            if self.step.slots is not None:
                self.step.slots.release()
        else:
            self.step.done[phase][self.index].set()
