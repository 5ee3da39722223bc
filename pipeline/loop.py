"""The agent loop: prompt, model, tool calls, results, contexts, repeat.

One turn of ``agent.prompt(text)``:

1. the ``prompt_submit`` stage sees the person's text (guards reset per-turn state
   here), then ``turn/start`` and the person's ``user/message`` are logged;
2. each step logs ``step/start``, asks the model with ``session.messages()``, logs
   the ``assistant/message``, runs every tool call through ``tools.execute`` with
   ``call.agent`` set, logs ``tool/call`` / ``tool/result`` in the model's order, then
   the step's additional contexts as plugin-sourced ``user/message`` events — after
   all of the step's results, never between two — and ``step/end``;
3. the turn ends when the model answers without tool calls (``completed``), at
   ``max_steps`` (``max-steps``), when a cap says so (``blocked``), when the model
   raises (``error``) or when it is cancelled (``aborted``).

With ``max_parallel_tool_calls > 1`` the dispatch of a step's calls overlaps, while
pre-execute, post-execute and the logged results keep the model's order, so guards
see calls in the order the model made them.

Cancellation keeps the log whole: every ``tool/call`` gets exactly one
``tool/result`` (``ABORTED`` for a call that was running, ``ABORTED_BEFORE_DISPATCH``
for one never started), then ``turn/end`` with reason ``aborted``; a cancel from
outside re-raises after that, ``agent.cancel()`` returns the aborted turn.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from typing import TYPE_CHECKING, TypeAlias

import anyio
import anyio.lowlevel
import attrs

from pipeline.errors import ConfigError, TurnInProgressError
from pipeline.model import Model, ModelReply, ToolCallRequest
from pipeline.onion import Pipeline, Registration
from pipeline.registry import CALL_GATE
from pipeline.session import (
    AssistantMessage,
    Session,
    StepEnd,
    StepStart,
    ToolCallEvent,
    ToolResultEvent,
    TurnEnd,
    TurnEndReason,
    TurnStart,
    UserMessage,
)
from pipeline.values import (
    TOOL_ABORTED,
    TOOL_ABORTED_BEFORE_DISPATCH,
    USER_SOURCE,
    ToolCall,
    ToolOutcome,
    ToolResult,
)

if TYPE_CHECKING:
    from pipeline.registry import ToolRegistry

__all__ = ["Agent", "AgentLoop", "TurnResult", "aborted_result"]

PromptNext: TypeAlias = Callable[["Agent", str], Awaitable[str]]


def aborted_result(before_dispatch: bool) -> ToolResult:
    """The result a call gets when its turn is cancelled (the seed's two abort results)."""
    if before_dispatch:
        return ToolResult.failure(
            "tool call aborted before dispatch",
            name="AbortError",
            code=TOOL_ABORTED_BEFORE_DISPATCH,
        )
    return ToolResult.failure("tool call aborted", name="AbortError", code=TOOL_ABORTED)


@attrs.frozen
class TurnResult:
    """How a turn ended: its reason, the model's last text, and the error if any."""

    reason: TurnEndReason
    text: str = ""
    error: str | None = None
    steps: int = 0


async def _submit(agent: Agent, text: str) -> str:
    return text


def _positive_int(key: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigError(
            f"AgentLoop: `{key}` must be an integer >= 1, got {value!r}", key=key, value=value
        )
    return value


class AgentLoop:
    """Creates agents that share one tool registry and run turns."""

    def __init__(
        self,
        tools: ToolRegistry,
        model: Model | None = None,
        max_steps: int = 50,
        max_parallel_tool_calls: int = 1,
    ) -> None:
        self.tools = tools
        self.model = model
        self.max_steps = _positive_int("max_steps", max_steps)
        self.max_parallel_tool_calls = _positive_int(
            "max_parallel_tool_calls", max_parallel_tool_calls
        )
        #: ``async (agent, text, call_next) -> text``: sees every new person's prompt.
        self.prompt_submit: Pipeline[PromptNext] = Pipeline(_submit, stage="prompt_submit")
        self._create_hooks: list[Callable[[Agent], None]] = []

    def on_create(self, hook: Callable[[Agent], None]) -> Registration:
        """Run ``hook(agent)`` before ``create`` returns; if it raises, ``create`` raises."""
        self._create_hooks.append(hook)
        return Registration(lambda: self._create_hooks.remove(hook))

    def create(
        self, session_id: str, model: Model | None = None, *, session: Session | None = None
    ) -> Agent:
        """A new agent. ``session`` resumes a loaded log; guard state starts fresh."""
        chosen = model if model is not None else self.model
        if chosen is None:
            raise ConfigError(
                "AgentLoop.create: no model; pass model= here or to AgentLoop",
                key="model",
                value=None,
            )
        agent = Agent(self, session if session is not None else Session(session_id), chosen)
        for hook in list(self._create_hooks):
            hook(agent)
        return agent


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
        self._turn = sum(isinstance(event, TurnStart) for event in session.events)

    @property
    def session_id(self) -> str:
        return self.session.session_id

    def __repr__(self) -> str:
        return f"<Agent {self.session_id!r}>"

    def cancel(self) -> None:
        """Cancel the running turn, if any; ``prompt`` then returns reason ``aborted``."""
        if self._scope is not None:
            self._scope.cancel()

    async def prompt(self, text: str) -> TurnResult:
        """Run one turn for a person's ``text``."""
        if self._scope is not None:
            raise TurnInProgressError(f"agent {self.session_id!r} is already running a turn")
        with anyio.CancelScope() as scope:
            self._scope = scope
            try:
                text = await self.loop.prompt_submit(self, text)
                return await self._turn_body(text)
            finally:
                self._scope = None
        return TurnResult("aborted", error="cancelled by agent.cancel()")

    async def _turn_body(self, text: str) -> TurnResult:
        self._turn += 1
        turn, log = self._turn, self.session.append
        log(TurnStart(turn))
        log(UserMessage(text, USER_SOURCE))
        step, step_calls, last_text = 0, None, ""
        try:
            while step < self.loop.max_steps:
                step += 1
                step_calls = None
                log(StepStart(turn, step))
                try:
                    reply = await self.model.complete(
                        self.session.messages(), self.loop.tools.schemas()
                    )
                    if not isinstance(reply, ModelReply):
                        raise TypeError(  # noqa: TRY301 - ends the turn like any model failure
                            f"the model returned {reply!r}, not a ModelReply"
                        )
                except Exception as error:
                    log(StepEnd(turn, step))
                    message = f"{type(error).__name__}: {error}"
                    log(TurnEnd(turn, "error", message))
                    return TurnResult("error", last_text, message, step)
                requests = tuple(
                    request
                    if request.call_id
                    else request.with_call_id(f"call_{turn}_{step}_{index}")
                    for index, request in enumerate(reply.tool_calls)
                )
                last_text = reply.text
                log(AssistantMessage(turn, step, reply.text, requests))
                if not requests:
                    log(StepEnd(turn, step))
                    log(TurnEnd(turn, "completed"))
                    return TurnResult("completed", last_text, steps=step)
                step_calls = _StepCalls(requests)
                outcomes = await self._run_calls(turn, step, step_calls)
                for outcome in outcomes:
                    for context in outcome.contexts:
                        log(UserMessage(context.text, context.source))
                log(StepEnd(turn, step))
                if any(outcome.ends_turn for outcome in outcomes):
                    log(TurnEnd(turn, "blocked"))
                    return TurnResult("blocked", last_text, steps=step)
            log(TurnEnd(turn, "max-steps"))
            return TurnResult("max-steps", last_text, steps=step)
        except anyio.get_cancelled_exc_class():
            if step_calls is not None:
                self._answer_unanswered(turn, step, step_calls)
            if step:
                log(StepEnd(turn, step))
            log(TurnEnd(turn, "aborted"))
            raise

    def _answer_unanswered(self, turn: int, step: int, calls: _StepCalls) -> None:
        for index, request in enumerate(calls.requests):
            started = index in calls.called
            if not started:
                self.session.append(ToolCallEvent.of(turn, step, request))
            if index not in calls.answered:
                result = aborted_result(before_dispatch=not started)
                self.session.append(ToolResultEvent(turn, step, request.call_id, result))

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
        request = calls.requests[index]
        self.session.append(ToolResultEvent(turn, step, request.call_id, outcome.result))
        calls.answered.add(index)

    async def _run_calls(self, turn: int, step: int, calls: _StepCalls) -> list[ToolOutcome]:
        execute = self.loop.tools.execute
        count = len(calls.requests)
        if self.loop.max_parallel_tool_calls == 1 or count == 1:
            outcomes = []
            for index in range(count):
                self._log_call(turn, step, calls, index)
                outcome = await execute(self._tool_call(calls.requests[index]))
                # A tool that ignored the turn's cancel still returns: it was aborted.
                await anyio.lowlevel.checkpoint_if_cancelled()
                self._answer(turn, step, calls, index, outcome)
                outcomes.append(outcome)
            return outcomes
        return await self._run_calls_overlapping(turn, step, calls)

    async def _run_calls_overlapping(
        self, turn: int, step: int, calls: _StepCalls
    ) -> list[ToolOutcome]:
        count = len(calls.requests)
        prepared = [anyio.Event() for _ in range(count)]
        finalized = [anyio.Event() for _ in range(count)]
        committed = [anyio.Event() for _ in range(count)]
        slots = anyio.Semaphore(self.loop.max_parallel_tool_calls)
        outcomes: list[ToolOutcome | None] = [None] * count

        async def run(index: int) -> None:
            @asynccontextmanager
            async def in_order(done: list[anyio.Event]) -> AsyncIterator[None]:
                if index:
                    await done[index - 1].wait()
                try:
                    yield
                finally:
                    done[index].set()

            @asynccontextmanager
            async def prepare() -> AsyncIterator[None]:
                async with in_order(prepared):
                    self._log_call(turn, step, calls, index)  # in model order
                    yield

            @asynccontextmanager
            async def dispatch() -> AsyncIterator[None]:
                async with slots:
                    yield

            CALL_GATE.set(_Gate(prepare, dispatch, lambda: in_order(finalized)))
            outcome = await self.loop.tools.execute(self._tool_call(calls.requests[index]))
            await anyio.lowlevel.checkpoint_if_cancelled()
            async with in_order(committed):
                self._answer(turn, step, calls, index, outcome)
                outcomes[index] = outcome

        async with anyio.create_task_group() as group:
            for index in range(count):
                group.start_soon(run, index)
        return [outcome for outcome in outcomes if outcome is not None]


@attrs.frozen
class _Gate:
    """The per-call ``CallGate`` of an overlapping step (see ``pipeline.registry``)."""

    prepare: Callable[[], AbstractAsyncContextManager[None]]
    dispatch: Callable[[], AbstractAsyncContextManager[None]]
    finalize: Callable[[], AbstractAsyncContextManager[None]]
