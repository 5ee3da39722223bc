"""The tool registry and its three onion stages.

``registry.execute(call)`` runs ``pre_execute -> dispatch -> post_execute``:

* ``pre_execute`` layers decide ``Allow()`` or ``Deny(reason)``; a denied call skips
  dispatch and gets a ``TOOL_DENIED`` result, and post-execute still runs.
* ``dispatch`` layers wrap the tool (timeouts, retries, metrics…). The innermost
  step runs the tool and normalises whatever happens there — an unknown name, an
  exception, a value JSON cannot hold — into an error result, so layers only ever
  see results.
* ``post_execute`` layers return ``Accept(...)`` or ``Block(feedback)`` and may add
  contexts for the model.

Bad input never crashes the caller: arguments that are not a JSON object get
``INVALID_ARGUMENTS`` (the tool is not run, post-execute runs), and a layer that
raises — a bug in someone's middleware — gives a final ``TOOL_FAILED`` result that
names the layer (post-execute skipped). The caller's cancellation is never turned
into a result: it propagates.
"""

from __future__ import annotations

import logging
import weakref
from collections.abc import Awaitable, Callable
from typing import Any, Final, Literal, Protocol, TypeAlias

import attrs

from guardstack.pipeline.approval import (
    CALL_ORDER,
    ApprovalService,
    Decision,
    Pending,
    as_pre_decision,
)
from guardstack.pipeline.arguments import check_arguments, short_repr
from guardstack.pipeline.contract import (
    DispatchLayer,
    DispatchNext,
    Execute,
    PostLayer,
    PostNext,
    PreLayer,
    PreNext,
)
from guardstack.pipeline.control import Control
from guardstack.pipeline.decisions import decided, guardrail_result, layer_of, who_of
from guardstack.pipeline.errors import DuplicateToolError, GuardstackError
from guardstack.pipeline.onion import Pipeline, Registration
from guardstack.pipeline.readonly import read_only
from guardstack.pipeline.tool_runner import ToolRunner, checked_result
from guardstack.pipeline.tree import TREE_CAPS, RunKey, ancestor_caps
from guardstack.pipeline.validate import integer
from guardstack.pipeline.values import (
    TOOL_DENIED,
    ToolCall,
    ToolDefinition,
    ToolError,
    ToolResult,
    denied_result,
    failure_from_exception,
)
from guardstack.pipeline.verdicts import (
    Accept,
    Allow,
    Ask,
    Block,
    Deny,
    PostDecision,
    PreDecision,
    ToolOutcome,
)

__all__ = ["Phase", "PhaseOrder", "ToolRegistry"]

logger = logging.getLogger("guardstack")

Phase: TypeAlias = Literal["pre_execute", "dispatch", "post_execute"]


class PhaseOrder(Protocol):
    """How an agent loop orders the phases of one call among a parallel step's calls.

    The loop owns it and passes it to ``registry.execute(call, order=…)``; the
    registry brackets each phase with ``enter`` and ``leave``. Pre-execute and
    post-execute take turns in model order; dispatch overlaps, bounded by the loop's
    parallelism. ``leave`` is called for every ``enter`` that returned.
    """

    async def enter(self, phase: Phase) -> None: ...
    def leave(self, phase: Phase) -> None: ...


_ALLOW: Final = Allow()
_ACCEPT: Final = Accept()


async def _allow(call: ToolCall) -> PreDecision:
    return _ALLOW


async def _accept(call: ToolCall, result: ToolResult) -> PostDecision:
    return _ACCEPT


@attrs.frozen
class _Early:
    """A result decided before post-execute: ``final`` ones skip post-execute too."""

    result: ToolResult
    ends_turn: bool = False
    final: bool = False
    #: A call that waits for a person (``Pending``): no dispatch, no post-execute.
    pending: Any = None


def _under_ancestors(
    call: ToolCall, caps: tuple[tuple[Any, Callable[..., Awaitable[Any]]], ...], registry: Any
) -> PreNext:
    """A child agent's pre-execute: every ancestor's tool-call cap (``AgentTool``'s
    tree seam), each seeing the call as its ancestor's, outside the child's own layers."""

    def through(index: int) -> PreNext:
        if index == len(caps):
            return registry.pre_execute.entry  # type: ignore[no-any-return]
        ancestor, cap = caps[index]
        inner = through(index + 1)

        def step(_: ToolCall) -> Awaitable[PreDecision]:
            # an agent of the loop, or a framework run's conversation key
            as_ancestor = (
                attrs.evolve(call, agent=None, conversation=ancestor.key)
                if isinstance(ancestor, RunKey)
                else attrs.evolve(call, agent=ancestor)
            )
            return cap(as_ancestor, lambda _seen: inner(call))

        return step

    return through(0)


#: Each definition's read-only schema, made once however many registries hold it.
_SCHEMAS: weakref.WeakKeyDictionary[ToolDefinition, dict[str, Any]] = weakref.WeakKeyDictionary()


def _schema_of(definition: ToolDefinition) -> dict[str, Any]:
    schema = _SCHEMAS.get(definition)
    if schema is None:
        schema = _SCHEMAS[definition] = read_only(definition.schema())
    return schema


class ToolRegistry:
    """Tools by name, and the three stages every call goes through."""

    def __init__(self, *, thread_limit: int = 40) -> None:
        self._tools: dict[str, ToolDefinition] = {}
        self._schemas: list[dict[str, Any]] | None = None
        self._runner = ToolRunner(integer("ToolRegistry", "thread_limit", thread_limit))
        self.pre_execute: Pipeline[PreNext, PreLayer] = Pipeline(
            _allow, stage="pre_execute", arity=1
        )
        self.dispatch: Pipeline[DispatchNext, DispatchLayer] = Pipeline(
            self._runner.run, stage="dispatch", arity=1
        )
        self.post_execute: Pipeline[PostNext, PostLayer] = Pipeline(
            _accept, stage="post_execute", arity=2
        )
        self._operation_hooks: list[Callable[[Execute], Execute]] = []
        #: The whole ``execute`` wrapped by its hooks (``None`` without hooks: ``_run`` is
        #: called directly, and the registry holds no bound method of its own).
        self._operation: Execute | None = None
        #: Resolves an ``Ask`` no layer resolved (``guards.Approval`` sets it).
        self.approvals: ApprovalService | None = None
        #: An operator's overrides (``Harness.control``): a paused tool's calls are denied.
        self.control: Control | None = None

    @property
    def thread_limit(self) -> int:
        """How many calls of one plain-function tool may run in threads at once (per
        tool, not anyio's process-wide limiter: 40 hung calls of one sync tool cannot
        starve another tool of threads and eat its budget)."""
        return self._runner.limit

    @thread_limit.setter
    def thread_limit(self, limit: int) -> None:
        self._runner.limit = integer("ToolRegistry", "thread_limit", limit)

    # -- tools -------------------------------------------------------------------------

    def register(self, definition: ToolDefinition) -> Registration:
        """Add a tool; a duplicate name raises ``DuplicateToolError``."""
        if not isinstance(definition, ToolDefinition):
            raise TypeError(f"register() takes a ToolDefinition, got {definition!r}")
        if definition.name in self._tools:
            raise DuplicateToolError(f"tool {definition.name!r} is already registered")
        self._tools[definition.name] = definition
        self._schemas = None

        def remove() -> None:
            if self._tools.get(definition.name) is definition:
                del self._tools[definition.name]
                self._schemas = None

        return Registration(remove)

    def get(self, name: str) -> ToolDefinition | None:
        """The tool registered under ``name``, or ``None``."""
        return self._tools.get(name)

    def __contains__(self, name: object) -> bool:
        return name in self._tools

    def names(self) -> list[str]:
        """The registered tools' names, in registration order."""
        return list(self._tools)

    def schemas(self) -> list[dict[str, Any]]:
        """OpenAI function-tool schemas for every registered tool, in registration order.

        Built once per change of the tool set (the loop asks every step); the list is
        fresh, the schema dicts are shared and read-only (``dict(schema)`` to change one).
        """
        if self._schemas is None:
            self._schemas = [_schema_of(definition) for definition in self._tools.values()]
        return list(self._schemas)

    # -- instrumentation ---------------------------------------------------------------

    def instrument(self, hook: Callable[[Execute], Execute]) -> Registration:
        """Wrap every whole ``execute`` (pre, dispatch and post) with ``hook``."""
        self._operation_hooks.append(hook)
        self._operation = self._wrapped(self._run)

        def remove() -> None:
            self._operation_hooks.remove(hook)
            self._operation = self._wrapped(self._run) if self._operation_hooks else None

        return Registration(remove)

    def _wrapped(self, operation: Execute) -> Execute:
        for hook in reversed(self._operation_hooks):
            operation = hook(operation)
        return operation

    def describe(self) -> str:
        """Every stage's layers, outermost first."""
        return "\n".join(
            f"{stage.stage}:\n" + "\n".join(f"  {line}" for line in stage.describe().splitlines())
            for stage in (self.pre_execute, self.dispatch, self.post_execute)
        )

    # -- execution ---------------------------------------------------------------------

    def execute(
        self,
        call: ToolCall,
        *,
        order: PhaseOrder | None = None,
        tool: ToolDefinition | None = None,
    ) -> Awaitable[ToolOutcome]:
        """Run ``call`` through pre-execute, dispatch and post-execute.

        ``order`` is for agent loops running a step's calls in parallel: it decides
        when each phase of this call may start (see ``PhaseOrder``).

        ``tool`` runs that definition innermost instead of the one registered under
        the call's name: for framework adapters, whose framework owns and runs the
        tool (its budget, idempotency and description are the definition's).

        Not a coroutine itself: it hands back the phase runner's, and an ``async``
        ``execute`` awaiting it cost an empty call 6–8 % (2,528–2,587 ns against
        2,390 on ``benchmarks.overhead``).
        """
        if tool is None:
            if order is None:
                operation = self._operation
                return self._run(call) if operation is None else operation(call)
        elif call.tool is not tool:
            call = call.resolved(tool)  # instrumentation sees the definition that runs
        if not self._operation_hooks:
            return self._run(call, order, tool)
        return self._wrapped(lambda ordered: self._run(ordered, order, tool))(call)

    async def _run(
        self,
        call: ToolCall,
        order: PhaseOrder | None = None,
        override: ToolDefinition | None = None,
        resumed: tuple[PreNext | None] | None = None,
    ) -> ToolOutcome:
        """The one phase runner: pre-execute, dispatch, post-execute, each phase in its
        place in ``order`` when a parallel step gives one. ``resumed``: a call a person
        has decided, whose pre-execute runs from that chain inward only (``(None,)``:
        not at all) — its arguments were checked and the operator's overrides and the
        ancestors' caps read before it paused."""
        tool = self._tools.get(call.name) if override is None else override
        if call.tool is not tool:
            call = call.resolved(tool)
        # The stages as they are now, before anything can suspend: a stack swapped while
        # this call runs (``Harness.reload``) is the next call's, never half of this one's.
        # Stages without layers are skipped outright: zero cost when unused.
        pre = self.pre_execute
        pre_chain = pre.entry if pre.layered else None
        dispatch = self.dispatch.entry
        post = self.post_execute
        post_chain = post.entry if post.layered else None
        if order is not None:
            # its place in the step travels with it: a layer that waits for a person
            # steps out of the order (``outside_call_order``) by the call it was given
            call = call.scoped(order=order)
            await order.enter("pre_execute")
            placed = CALL_ORDER.set(order)  # 0.2 only: outside_call_order(waiting)
        try:
            if resumed is None:
                before = self._pre_executed(call, pre_chain)
            else:
                chain = resumed[0]
                before = None if chain is None else self._pre_execute(call, chain)
            decided = before if before is None or isinstance(before, _Early) else await before
            if type(decided) is ToolCall:  # a person edited the arguments
                call, decided = decided, None
        finally:
            if order is not None:
                CALL_ORDER.reset(placed)
                order.leave("pre_execute")
        if decided is None:
            if order is not None:
                await order.enter("dispatch")
            try:
                result = await dispatch(call)
                if type(result) is not ToolResult:
                    result = checked_result(result)
            except Exception as error:
                decided = self._final_failure(self.dispatch, error)
            else:
                if type(result.value) is Pending:  # a child agent waits for a person
                    return ToolOutcome(result, (), False, result.value.approval)
                if order is None and post_chain is None:
                    return ToolOutcome(result)
                decided = _Early(result)
            finally:
                if order is not None:
                    order.leave("dispatch")
        assert isinstance(decided, _Early)
        if decided.pending is not None:
            return ToolOutcome(decided.result, (), False, decided.pending)
        if order is not None:
            await order.enter("post_execute")
        try:
            return await self._finalize(call, decided, post_chain)
        finally:
            if order is not None:
                order.leave("post_execute")

    def _pre_executed(
        self, call: ToolCall, chain: PreNext | bool | None = True
    ) -> _Early | Awaitable[_Early | ToolCall | None] | None:
        """The arguments checked and what runs before dispatch: ``None`` to run the call
        now, an ``_Early`` answer, or what to await for the pre-execute stage (under the
        ancestors' tree caps, after an operator's overrides) — which answers ``None``, the
        call with edited arguments, or an ``_Early`` answer. ``chain``: the stage's chain
        as the call found it (``None``: no layers; ``True``: read it now). Not a
        coroutine: the usual call, with nothing to run before dispatch, makes none —
        measured, one more coroutine here costs an empty ``execute`` 6–7 % (2,565–2,585
        ns against 2,390–2,430 on ``benchmarks.overhead``), over the 5 % that keeps a
        fast path."""
        early = check_arguments(call.arguments)
        if early is not None:
            return _Early(early)
        control = self.control
        if control is not None and (control.paused or control.stale()):
            return self._controlled(call, control, chain)
        return self._stages_before(call, chain)

    def _stages_before(
        self, call: ToolCall, chain: PreNext | bool | None
    ) -> Awaitable[_Early | ToolCall | None] | None:
        agent = call.agent
        if agent is None:
            caps = TREE_CAPS.get()
        else:
            caps = () if agent.parent is None else ancestor_caps(agent)
        if caps:
            return self._pre_execute(call, _under_ancestors(call, caps, self))
        if chain is True:
            chain = self.pre_execute.entry if self.pre_execute.layered else None
        if chain is not None and chain is not False:
            return self._pre_execute(call, chain)
        return None

    async def _controlled(
        self, call: ToolCall, control: Control, chain: PreNext | bool | None
    ) -> _Early | ToolCall | None:
        """With an operator's overrides to read (or some held): a paused tool is denied
        with the reason given; any other call goes on to the stages before dispatch."""
        if control.stale():
            await control.refresh()
        reason = control.paused.get(call.name) if control.paused else None
        if reason is not None:
            return self._decided(call, Deny(f'tool "{call.name}" is paused: {reason}'))
        before = self._stages_before(call, chain)
        return None if before is None else await before

    async def decide(
        self, call: ToolCall, *, tool: ToolDefinition | None = None
    ) -> ToolCall | ToolOutcome:
        """The pre-execute half of ``execute``, for hosts that run the tool themselves
        between two hooks (the Claude Agent SDK's ``PreToolUse`` and ``PostToolUse``): the
        call to run (with the arguments a person edited, if one did), or the outcome
        that answers it instead — a denial (after post-execute, as ``execute`` answers
        it), a call waiting for a person (``pending``), a broken layer's failure."""
        resolved = self._tools.get(call.name) if tool is None else tool
        if call.tool is not resolved:
            call = call.resolved(resolved)
        before = self._pre_executed(call)
        decided = before if before is None or isinstance(before, _Early) else await before
        if decided is None:
            return call
        if type(decided) is ToolCall:
            return decided
        assert isinstance(decided, _Early)
        if decided.pending is not None:
            return ToolOutcome(decided.result, (), False, decided.pending)
        return await self._finalize(call, decided)

    async def review(
        self, call: ToolCall, result: ToolResult, *, tool: ToolDefinition | None = None
    ) -> ToolOutcome:
        """The post-execute half of ``execute``: ``result`` — the tool's, run by the host
        after ``decide`` let it — through the post-execute stage (reminders, blocks)."""
        resolved = self._tools.get(call.name) if tool is None else tool
        if call.tool is not resolved:
            call = call.resolved(resolved)
        return await self._finalize(call, _Early(result))

    async def _pre_execute(self, call: ToolCall, chain: PreNext) -> _Early | ToolCall | None:
        """``None`` to dispatch (or the call to dispatch, its arguments edited by a
        person); else a denial, a call waiting for a person, or a broken layer's final
        failure."""
        try:
            decision: Any = await chain(call)
            if isinstance(decision, Ask):
                decision = await self._resolve(call, decision)
            return self._decided(call, decision)
        except Exception as error:
            return self._final_failure(self.pre_execute, error)

    async def _resolve(self, call: ToolCall, ask: Ask) -> Any:
        """An ``Ask`` no layer resolved: the approval service's answer, or the original's
        denial when there is none."""
        if self.approvals is None:
            return Deny(ask.reason or f'tool "{call.name}" requires approval (not yet supported)')
        return await self.approvals.resolve(call, ask.reason)

    def _decided(self, call: ToolCall, decision: Any) -> _Early | ToolCall | None:
        if isinstance(decision, Deny):
            _log_denial(call, decision)
            return _Early(
                denied_result(decision.reason, decision.code), ends_turn=decision.end_turn
            )
        if isinstance(decision, Pending):
            waiting = ToolResult.failure("waiting for a person's decision", code=TOOL_DENIED)
            return _Early(waiting, final=True, pending=decision.approval)
        if not isinstance(decision, Allow):
            raise TypeError(
                f"pre-execute returned {short_repr(decision)}; expected Allow(), "
                "Deny(reason) or Ask(reason)"
            )
        if decision.arguments is None:
            return None
        problem = check_arguments(decision.arguments)
        if problem is not None:
            return _Early(problem)
        return attrs.evolve(call, arguments=decision.arguments)

    async def run_decided(
        self,
        call: ToolCall,
        decision: Decision,
        *,
        tool: ToolDefinition | None = None,
        asked_by: str = "approval",
    ) -> ToolOutcome:
        """Run a call paused for approval, now that a person decided: inside the
        approval service's layer when it asked (the layers before it decided before the
        pause), else with the decision as the whole pre-execute answer."""
        service = self.approvals
        chain = None
        if service is not None and asked_by == "approval":
            chain = self.pre_execute.chain_from(service.layer)
        if service is None or chain is None:
            answer = as_pre_decision(decision)

            async def decided(_: ToolCall) -> Any:
                return answer

            return await self.resume(call, decided, tool=tool)
        service.decide(call.call_id, decision)
        return await self.resume(call, chain, tool=tool)

    async def resume(
        self, call: ToolCall, chain: PreNext | None, *, tool: ToolDefinition | None = None
    ) -> ToolOutcome:
        """Run a call a person has now decided: pre-execute from ``chain`` inward (the
        layers outside it decided before the pause and are not asked again; ``None``:
        none are), then dispatch and post-execute as usual. ``tool`` as for ``execute``;
        the ``instrument`` hooks (an ``execute_tool`` span) wrap it as they wrap
        ``execute``."""
        if tool is None:
            tool = self._tools.get(call.name)
        if call.tool is not tool:
            call = call.resolved(tool)
        if not self._operation_hooks:
            return await self._run(call, None, tool, (chain,))
        return await self._wrapped(lambda c: self._run(c, None, tool, (chain,)))(call)

    async def _finalize(
        self, call: ToolCall, early: _Early, chain: PostNext | bool | None = True
    ) -> ToolOutcome:
        if chain is True:
            chain = self.post_execute.entry if self.post_execute.layered else None
        if early.final or chain is None or chain is False:
            return ToolOutcome(early.result, (), early.ends_turn)
        result, ends_turn = early.result, early.ends_turn
        try:
            decision = await chain(call, result)
            if isinstance(decision, Block):
                message = decision.feedback or "tool result blocked by post-execute policy"
                blocked = ToolResult(decision.feedback, is_error=True, error=ToolError(message))
                return ToolOutcome(
                    blocked, decision.additional_contexts, ends_turn or decision.end_turn
                )
            if not isinstance(decision, Accept):
                raise TypeError(  # noqa: TRY301 - reported like any post-execute bug
                    f"post-execute returned {short_repr(decision)}; "
                    "expected Accept(...) or Block(feedback)"
                )
            if decision.value is not None:
                if result.is_error:
                    raise GuardstackError(  # noqa: TRY301
                        "post-execute cannot replace the value of a failed result"
                    )
                result = ToolResult.of(decision.value)
        except Exception as error:
            # The call still ends the turn when a cap said so: a broken layer must not
            # let a looping agent through.
            failure = self._final_failure(self.post_execute, error).result
            return ToolOutcome(failure, (), ends_turn)
        _reminded(call, decision.additional_contexts)
        return ToolOutcome(result, decision.additional_contexts, ends_turn)

    def _final_failure(self, stage: Pipeline[Any, Any], error: Exception) -> _Early:
        layer = stage.blame(error)
        where = f'{stage.stage} layer "{layer}"' if layer else f"{stage.stage} stage"
        logger.error("%s raised; the call gets a final TOOL_FAILED result", where, exc_info=error)
        return _Early(failure_from_exception(error, prefix=f"{where} failed: "), final=True)


def _signals_of(call: ToolCall) -> Any:
    """The signals of the loop a call's agent runs in (``None``: no agent, no loop)."""
    return getattr(getattr(call.agent, "loop", None), "signals", None)


def _reminded(call: ToolCall, contexts: tuple[Any, ...] | list[Any]) -> None:
    """Each reminder a post-execute layer added: a guardrail result (``remind``), told
    apart from a denial — with no reason: a reminder's text may quote the call's
    arguments, and those never leave in telemetry."""
    for context in contexts:
        source = getattr(context, "source", None)
        layer = getattr(source, "plugin", None) or "guardstack"
        guardrail_result(layer, "remind", source="tool_output", signals=_signals_of(call))


def _log_denial(call: ToolCall, deny: Deny) -> None:
    """One decision-log line for a denied call (nothing of its arguments)."""
    decided(
        "deny",
        layer=layer_of(deny.reason),
        decision="end_turn" if deny.end_turn else "deny",
        reason=deny.reason,
        tool=call.name,
        signals=_signals_of(call),
        **who_of(call.agent),
    )
