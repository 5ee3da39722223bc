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

import inspect
import logging
import math
import weakref
from collections.abc import Awaitable, Callable, Iterable, Mapping
from typing import Any, Final, Literal, Protocol, TypeAlias

import anyio
import anyio.lowlevel
import anyio.to_thread
import attrs

from guardstack.pipeline.approval import (
    CALL_ORDER,
    ApprovalService,
    Decision,
    Pending,
    as_pre_decision,
)
from guardstack.pipeline.contract import DispatchNext, Execute, PostNext, PreNext
from guardstack.pipeline.control import Control
from guardstack.pipeline.errors import DuplicateToolError, GuardstackError
from guardstack.pipeline.onion import Pipeline, Registration
from guardstack.pipeline.readonly import read_only
from guardstack.pipeline.runtime import cancel_pending, deliver_pending
from guardstack.pipeline.tree import TREE_CAPS, RunKey
from guardstack.pipeline.validate import integer
from guardstack.pipeline.values import (
    TOOL_DENIED,
    Accept,
    Allow,
    Ask,
    Block,
    Deny,
    PostDecision,
    PreDecision,
    ToolCall,
    ToolDefinition,
    ToolError,
    ToolOutcome,
    ToolResult,
    denied_result,
    failed_result,
    failure_from_exception,
    invalid_arguments_result,
    unknown_tool_result,
)

__all__ = ["Phase", "PhaseOrder", "ToolRegistry"]

logger = logging.getLogger("guardstack")

_MAX_ARGUMENT_DEPTH = 64
#: Python refuses to print an int with more than 4,300 digits; JSON cannot hold it then.
_MAX_INT_BITS = 14_000
_INT_LIMIT = 2**63  # integers the flat-arguments check passes without asking

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


def _check_arguments(arguments: object) -> ToolResult | None:
    """An ``INVALID_ARGUMENTS`` result for arguments that are not a JSON object."""
    if type(arguments) is dict:  # the usual case, without the ABC isinstance
        for key, value in arguments.items():
            if type(key) is not str:
                break
            kind = type(value)
            if kind not in _SCALARS and (kind is not int or not -_INT_LIMIT < value < _INT_LIMIT):
                break
        else:
            return None  # flat text, numbers, booleans and nulls: no call needed to see it
        if _json_problem(arguments, 0) is None:
            return None
    problem = _json_object_problem(arguments)
    return None if problem is None else invalid_arguments_result(problem)


def _json_object_problem(arguments: object) -> str | None:
    """Why ``arguments`` is not a JSON object, or ``None``. Never raises."""
    if isinstance(arguments, str):
        preview = arguments if len(arguments) <= 80 else arguments[:80] + "…"
        return f"tool call arguments must be a JSON object, got the text {preview!r}"
    if not isinstance(arguments, Mapping):
        return f"tool call arguments must be a JSON object, got {type(arguments).__name__}"
    try:
        problem = _json_problem(arguments, 0)
    except Exception as error:  # a hostile mapping: iteration or lookup raised
        problem = f"reading them raised {type(error).__name__}"
    return None if problem is None else f"tool call arguments must be JSON-serialisable: {problem}"


_SCALARS: Final = frozenset({str, bool, type(None)})


def _json_problem(value: object, depth: int) -> str | None:
    kind = type(value)
    if kind in _SCALARS:
        return None
    if isinstance(value, int):  # bool, IntEnum and other int subclasses too
        if value.bit_length() > _MAX_INT_BITS:
            return "an integer too large for JSON"
        return None
    if isinstance(value, float):
        return None if math.isfinite(value) else f"{value!r} is not a JSON number"
    if isinstance(value, str):  # StrEnum and other str subclasses
        return None
    if depth > _MAX_ARGUMENT_DEPTH:
        return f"nested deeper than {_MAX_ARGUMENT_DEPTH} levels (or circular)"
    items: Iterable[object]
    if isinstance(value, Mapping):
        for key in value:
            if not isinstance(key, str):
                return f"key {_short_repr(key)} is not a string"
        items = value.values()
    elif isinstance(value, list | tuple):
        items = value
    else:
        return f"a {kind.__name__} value is not JSON"
    for item in items:
        if type(item) in _SCALARS:
            continue
        problem = _json_problem(item, depth + 1)
        if problem is not None:
            return problem
    return None


def _short_repr(value: object) -> str:
    try:
        text = repr(value)
    except Exception:
        return f"<unprintable {type(value).__name__}>"
    return text if len(text) <= 80 else text[:80] + "…"


_ALLOW: Final = Allow()
_ACCEPT: Final = Accept()


async def _allow(call: ToolCall) -> PreDecision:
    return _ALLOW


async def _accept(call: ToolCall, result: ToolResult) -> PostDecision:
    return _ACCEPT


def _call_in_thread(
    tool: ToolDefinition, arguments: Mapping[str, Any] | str, call: ToolCall
) -> object:
    value = tool.execute(arguments, call)  # type: ignore[arg-type]  # checked: a mapping
    if inspect.isawaitable(value):
        close = getattr(value, "close", None)
        if close is not None:
            close()  # an un-awaited coroutine would warn when collected
        raise TypeError(
            f"tool {tool.name!r} is a plain function that returned an awaitable; "
            "declare it `async def`"
        )
    return value


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


def _checked(result: object) -> ToolResult:
    if not isinstance(result, ToolResult):
        raise TypeError(f"dispatch returned {_short_repr(result)}; expected a ToolResult")
    return result


class _ToolRunner:
    """The innermost dispatch step, and the thread limiters of plain-function tools.

    Apart from the registry, so the dispatch stage's terminal (this object's bound
    ``run``) holds no reference back to the registry: a registry is freed when its
    last user lets go, without waiting for the cyclic garbage collector.
    """

    __slots__ = ("_limiters", "limit")

    def __init__(self, limit: int) -> None:
        self.limit = limit
        #: One per anyio backend and tool name (bounded by the tools registered).
        self._limiters: dict[tuple[str, str], anyio.CapacityLimiter] = {}

    def _thread_limiter(self, tool: str) -> anyio.CapacityLimiter:
        key = (anyio.lowlevel.current_token().backend_class.__name__, tool)
        limiter = self._limiters.get(key)
        if limiter is None:
            limiter = self._limiters[key] = anyio.CapacityLimiter(self.limit)
        return limiter

    async def run(self, call: ToolCall) -> ToolResult:
        """The innermost dispatch step: run the tool, normalise whatever happens into a result."""
        tool = call.tool
        if tool is None:
            return unknown_tool_result(call.name)
        # No tool starts once its call is cancelled (or its deadline passed): the
        # cancellation is delivered here, and propagates.
        if cancel_pending():
            await deliver_pending()
        try:
            if tool.is_async:
                value = await tool.execute(call.arguments, call)  # type: ignore[arg-type,misc]
            else:
                value = await anyio.to_thread.run_sync(
                    _call_in_thread,
                    tool,
                    call.arguments,
                    call,
                    limiter=self._thread_limiter(tool.name),
                )
        except Exception as error:
            logger.debug("tool %r raised", call.name, exc_info=True)
            return failure_from_exception(error)
        if type(value) is str:
            return ToolResult(value, False, None, value)
        if isinstance(value, ToolResult):
            problem = value.problem()
            if problem is None:
                return value
            return failed_result(
                f"tool {tool.name!r} returned a ToolResult whose {problem}", "TypeError"
            )
        try:
            return ToolResult.of(value)
        except (TypeError, ValueError, RecursionError) as error:
            return failure_from_exception(
                error, prefix=f"tool {tool.name!r} returned a value that is not JSON-serialisable: "
            )


class ToolRegistry:
    """Tools by name, and the three stages every call goes through."""

    def __init__(self, *, thread_limit: int = 40) -> None:
        self._tools: dict[str, ToolDefinition] = {}
        self._schemas: list[dict[str, Any]] | None = None
        self._runner = _ToolRunner(integer("ToolRegistry", "thread_limit", thread_limit))
        self.pre_execute: Pipeline[PreNext] = Pipeline(_allow, stage="pre_execute")
        self.dispatch: Pipeline[DispatchNext] = Pipeline(self._runner.run, stage="dispatch")
        self.post_execute: Pipeline[PostNext] = Pipeline(_accept, stage="post_execute")
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
    ) -> ToolOutcome:
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
            await order.enter("pre_execute")
            placed = CALL_ORDER.set(order)
        try:
            decided = await self._pre_executed(call, pre_chain)
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
                    result = _checked(result)
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

    async def _pre_executed(
        self, call: ToolCall, chain: PreNext | bool | None = True
    ) -> _Early | ToolCall | None:
        """The arguments checked and the pre-execute stage run (under the ancestors' tree
        caps): ``None`` to run the call, the edited call, or what answers it instead.
        ``chain``: the stage's chain as the call found it (``None``: no layers; ``True``:
        read it now)."""
        early = _check_arguments(call.arguments)
        if early is not None:
            return _Early(early)
        control = self.control
        if control is not None:
            if control.stale():
                await control.refresh()
            if control.paused:
                reason = control.paused.get(call.name)
                if reason is not None:  # paused by an operator: denied, the reason said
                    return self._decided(call, Deny(f'tool "{call.name}" is paused: {reason}'))
        agent = call.agent
        caps = getattr(agent, "tree_caps", ()) if agent is not None else TREE_CAPS.get()
        if caps:
            return await self._pre_execute(call, _under_ancestors(call, caps, self))
        if chain is True:
            chain = self.pre_execute.entry if self.pre_execute.layered else None
        if chain is not None and chain is not False:
            return await self._pre_execute(call, chain)
        return None

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
        decided = await self._pre_executed(call)
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
            return _Early(
                denied_result(decision.reason, decision.code), ends_turn=decision.end_turn
            )
        if isinstance(decision, Pending):
            waiting = ToolResult.failure("waiting for a person's decision", code=TOOL_DENIED)
            return _Early(waiting, final=True, pending=decision.approval)
        if not isinstance(decision, Allow):
            raise TypeError(
                f"pre-execute returned {_short_repr(decision)}; expected Allow(), "
                "Deny(reason) or Ask(reason)"
            )
        if decision.arguments is None:
            return None
        problem = _check_arguments(decision.arguments)
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
            return await self._resumed(call, chain)
        return await self._wrapped(lambda c: self._resumed(c, chain))(call)

    async def _resumed(self, call: ToolCall, chain: PreNext | None) -> ToolOutcome:
        decided = None if chain is None else await self._pre_execute(call, chain)
        if type(decided) is ToolCall:
            call, decided = decided, None
        if decided is None:
            try:
                result = await self.dispatch.entry(call)
                if type(result) is not ToolResult:
                    result = _checked(result)
            except Exception as error:
                decided = self._final_failure(self.dispatch, error)
            else:
                if type(result.value) is Pending:  # the child still waits
                    return ToolOutcome(result, (), False, result.value.approval)
                decided = _Early(result)
        assert isinstance(decided, _Early)
        if decided.pending is not None:
            return ToolOutcome(decided.result, (), False, decided.pending)
        return await self._finalize(call, decided)

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
                    f"post-execute returned {_short_repr(decision)}; "
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
        return ToolOutcome(result, decision.additional_contexts, ends_turn)

    def _final_failure(self, stage: Pipeline[Any], error: Exception) -> _Early:
        layer = stage.blame(error)
        where = f'{stage.stage} layer "{layer}"' if layer else f"{stage.stage} stage"
        logger.error("%s raised; the call gets a final TOOL_FAILED result", where, exc_info=error)
        return _Early(failure_from_exception(error, prefix=f"{where} failed: "), final=True)
