"""guardstack inside LangChain v1 agents: one middleware for ``create_agent``.

::

    agent = create_agent(model, tools, middleware=[GuardstackMiddleware(harness)],
                         checkpointer=InMemorySaver())
    await agent.ainvoke({"messages": [...]}, {"configurable": {"thread_id": "t1"}})

Where it belongs: in ``middleware=[…]``, LangChain's first entry is outermost. Every
tool call runs through the harness's pre-execute, dispatch and post-execute stages
*around* LangChain's own tool execution (LangChain runs the tool innermost, so its
tool errors and guardstack's timeout both become ``ToolMessage`` results the model
reads). Middleware listed before this one wraps the whole guarded call (a
LangChain ``ToolRetryMiddleware`` there retries guardstack's timeouts too);
middleware listed after it runs inside guardstack's layers, once per attempt.

* the tool's budget and idempotency come from a harness ``ToolDefinition`` of the
  same name (never executed), else from ``timeouts_ms``;
* reminders and other contexts reach the model as ``HumanMessage``s after all of
  the step's tool results, in the model's call order, just before the next model
  call (``before_model``);
* a cap that ends the turn (``ToolCallLimit(on_exceeded="end_turn")``) ends the
  run: the over-limit call is answered, and the run jumps to its end with an
  ``AIMessage`` saying why;
* the conversation is the LangGraph thread (``thread_id``); without a
  checkpointer, each run is its own conversation. Each new run starts a new turn
  (``harness.reset``), as a new prompt does in guardstack's own loop;
* approval: a call ``guards.Approval`` pauses (no approver) pauses the LangGraph
  thread with LangGraph's own ``interrupt`` — its value a dict with
  ``"guardstack": "approval"``, the call id, tool, arguments, digest and reason — and
  ``ainvoke(Command(resume=decision), config)`` resumes it, the decision a dict a
  checkpointer can store: ``{"type": "approve" | "reject" | "edit", "reason": …,
  "arguments": …, "by": …, "digest": …}``. The call then continues inside ``Approval``: the layers
  before it decided before the pause (in this process they are not asked again).

Async only (``ainvoke``/``astream``): guardstack's stages are anyio coroutines.
"""

from __future__ import annotations

import uuid
from collections.abc import Awaitable, Callable, Hashable, Mapping
from typing import Annotated, Any, NotRequired

import attrs

from guardstack.integrations._extras import require
from guardstack.integrations._framework import FrameworkCalls
from guardstack.pipeline import (
    ContextMessage,
    Harness,
    PendingApproval,
    ToolCall,
    ToolError,
    ToolOutcome,
)
from guardstack.pipeline import ToolResult as GuardResult
from guardstack.pipeline.approval import Decision, decision_from_dict
from guardstack.pipeline.values import TOOL_FAILED

require("langchain.agents.middleware", "langchain")

from langchain.agents.middleware import (  # noqa: E402
    AgentMiddleware,
    AgentState,
    hook_config,
)
from langchain.agents.middleware.types import PrivateStateAttr  # noqa: E402
from langchain_core.messages import AIMessage, HumanMessage, ToolMessage  # noqa: E402
from langgraph.prebuilt.tool_node import ToolCallRequest  # noqa: E402
from langgraph.runtime import Runtime  # noqa: E402
from langgraph.types import Command, interrupt  # noqa: E402

__all__ = ["GuardstackMiddleware", "GuardstackState"]

OWNER = "GuardstackMiddleware"
#: The state key this middleware keeps the run's conversation under (private).
CONVERSATION_KEY = "guardstack_conversation"


class GuardstackState(AgentState[Any]):
    """LangChain's agent state plus the run's guardstack conversation (never shown)."""

    guardstack_conversation: NotRequired[Annotated[Any, PrivateStateAttr]]


@attrs.define
class _Pending:
    """What a step's calls left for the model: contexts by call, and a reason to stop."""

    contexts: list[tuple[str, ContextMessage]] = attrs.Factory(list)
    stop: str | None = None


def _text(message: ToolMessage | Command[Any]) -> str:
    if isinstance(message, ToolMessage):
        return message.text if not isinstance(message.content, str) else message.content
    return ""


def _result(message: ToolMessage | Command[Any]) -> GuardResult:
    """LangChain's answer as a guardstack result (the answer kept as ``value``)."""
    text = _text(message)
    if isinstance(message, ToolMessage) and message.status == "error":
        error = ToolError(text or "the tool reported an error", "ToolException", TOOL_FAILED)
        return GuardResult(text, True, error, message)
    return GuardResult(text, value=message)


def _answer(request: ToolCallRequest, outcome: ToolOutcome) -> ToolMessage | Command[Any]:
    """LangChain's own answer when guardstack left it as it was, else a ``ToolMessage``."""
    result = outcome.result
    original = result.value
    if isinstance(original, ToolMessage | Command):
        unchanged = _result(original)
        if unchanged.content == result.content and unchanged.is_error == result.is_error:
            return original
    call = request.tool_call
    return ToolMessage(
        content=result.content,
        tool_call_id=call["id"],
        name=call["name"],
        status="error" if result.is_error else "success",
    )


def _thread(runtime: object) -> Hashable | None:
    """The LangGraph thread of a node's ``Runtime`` or a tool's ``ToolRuntime``."""
    thread = getattr(getattr(runtime, "execution_info", None), "thread_id", None)
    if thread is None:
        config = getattr(runtime, "config", None)
        configurable = config.get("configurable") if isinstance(config, Mapping) else None
        if isinstance(configurable, Mapping):
            thread = configurable.get("thread_id")
    return thread if isinstance(thread, Hashable) else None


class GuardstackMiddleware(AgentMiddleware[GuardstackState, Any, Any]):
    """Every tool call of a LangChain v1 agent through a guardstack harness."""

    state_schema = GuardstackState

    def __init__(self, harness: Harness, *, timeouts_ms: Mapping[str, int] | None = None) -> None:
        super().__init__()
        self._calls = FrameworkCalls(harness, OWNER, timeouts_ms)
        self._pending: dict[Hashable, _Pending] = {}
        #: Calls paused for approval in this process, by (conversation, call id).
        self._paused: dict[tuple[Hashable, Any], PendingApproval] = {}

    @property
    def harness(self) -> Harness:
        return self._calls.harness

    # -- the run --------------------------------------------------------------------------

    async def abefore_agent(
        self, state: GuardstackState, runtime: Runtime[Any]
    ) -> dict[str, Any] | None:
        """A new run: a fresh turn of its conversation (the thread, or its own).

        The turn's key is text (the state may be checkpointed), its own for every run:
        two runs of one thread at once never share or reset each other's counts.
        """
        conversation = _thread(runtime)
        if conversation is None:
            conversation = "langchain-run"
        turn = f"{conversation}#run-{uuid.uuid4()}"
        return {CONVERSATION_KEY: turn}

    @hook_config(can_jump_to=["end"])
    async def abefore_model(
        self, state: GuardstackState, runtime: Runtime[Any]
    ) -> dict[str, Any] | None:
        """The last step's contexts as messages, or the run's end when a cap said so."""
        pending = self._pending.pop(state.get(CONVERSATION_KEY), None)
        if pending is None:
            return None
        order = _call_order(state)
        contexts = sorted(pending.contexts, key=lambda item: order.get(item[0], len(order)))
        messages: list[Any] = [
            HumanMessage(
                content=context.text,
                response_metadata={
                    "guardstack": {"source": context.source.kind, "plugin": context.source.plugin}
                },
            )
            for _, context in contexts
        ]
        if pending.stop is None:
            return {"messages": messages}
        messages.append(AIMessage(content=f"Stopped: {pending.stop}"))
        return {"messages": messages, "jump_to": "end"}

    async def aafter_agent(
        self, state: GuardstackState, runtime: Runtime[Any]
    ) -> dict[str, Any] | None:
        self._pending.pop(state.get(CONVERSATION_KEY), None)
        return None

    # -- each tool call -------------------------------------------------------------------

    async def awrap_tool_call(
        self,
        request: ToolCallRequest,
        handler: Callable[[ToolCallRequest], Awaitable[ToolMessage | Command[Any]]],
    ) -> ToolMessage | Command[Any]:
        """Pre-execute, dispatch (with LangChain's execution innermost), post-execute."""
        state = request.state if isinstance(request.state, Mapping) else {}
        conversation = state.get(CONVERSATION_KEY)
        if conversation is None:  # a ToolNode used without the agent's hooks
            conversation = _thread(request.runtime)
        call = request.tool_call

        async def run(arguments: Mapping[str, Any], guarded: ToolCall) -> GuardResult:
            return _result(await handler(request))

        tool = request.tool

        def execute(decision: Decision | None = None) -> Awaitable[ToolOutcome]:
            return self._calls.execute(
                call["name"],
                call["args"],
                call["id"] or "",
                conversation,
                run,
                description=tool.description if tool is not None else "",
                parameters=_parameters(tool),
                decision=decision,
            )

        paused = self._paused.pop((conversation, call["id"]), None)
        if paused is None:
            outcome = await execute()
            paused = outcome.pending
        if paused is not None:
            # LangGraph's own pause: raises the first time; on the thread's resume (the
            # node runs again) it returns the decision the person made
            self._paused[(conversation, call["id"])] = paused
            answer = interrupt(_interrupt_value(paused))
            self._paused.pop((conversation, call["id"]), None)
            outcome = await execute(_decision(answer))
        if outcome.contexts or outcome.ends_turn:
            pending = self._pending.setdefault(conversation, _Pending())
            pending.contexts.extend((call["id"] or "", context) for context in outcome.contexts)
            if outcome.ends_turn and pending.stop is None:
                error = outcome.result.error
                pending.stop = error.message if error is not None else outcome.result.content
        return _answer(request, outcome)


def _interrupt_value(pending: PendingApproval) -> dict[str, Any]:
    return {
        "guardstack": "approval",
        "call_id": pending.call_id,
        "tool": pending.tool,
        "arguments": dict(pending.arguments),
        "digest": pending.digest,
        "reason": pending.reason,
    }


def _decision(answer: Any) -> Decision:
    """A resume value as a decision: its dict form (or a guardstack decision)."""
    return decision_from_dict(answer, OWNER)


def _call_order(state: Mapping[str, Any]) -> dict[str, int]:
    """The position of each tool call of the last assistant message that made some."""
    for message in reversed(state.get("messages", [])):
        if isinstance(message, AIMessage) and message.tool_calls:
            return {call["id"] or "": index for index, call in enumerate(message.tool_calls)}
    return {}


def _parameters(tool: Any) -> dict[str, Any]:
    schema = getattr(tool, "tool_call_schema", None)
    json_schema = getattr(schema, "model_json_schema", None)
    if callable(json_schema):
        try:
            value = json_schema()
        except Exception:  # a schema LangChain itself cannot render: not ours to fix
            return {}
        return value if isinstance(value, dict) else {}
    return {}
