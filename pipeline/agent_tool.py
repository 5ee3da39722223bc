"""AgentTool: a child agent as a tool, inside its parent's deadline and budget.

A tool that runs another agent is where budgets leak: the child gets fresh caps and
no deadline, so a parent capped at $1.25 whose children spend $1.00 each is billed
$2.00+. ``AgentTool(name, agent, description=…)`` is a ``ToolDefinition`` whose call
runs one turn of a child agent on the model's ``{"task": …}`` and returns the child's
final text:

* every model call the child makes also goes through the **parent's** model stage
  (as a request of the parent's, answered by the child's model), so the parent's
  ``UsageLimit`` and ``ModelCallLimit`` charge it as it happens — a parent's cap stops
  a running child — and its usage rolls up into the parent's turn; the child's own
  caps apply as well, and the stricter one wins;
* the child inherits the parent's turn deadline (``TurnDeadline``), so a stalled
  child is cut when the parent's time runs out, and cancelling the parent cancels it;
* a child stopped by a cap, a deadline or a guard answers ``AGENT_STOPPED`` with the
  reason, which the parent's model reads; it never raises into the parent;
* the child's session id is ``{parent}/{tool}/{n}`` (``n`` counts per parent).

``agent`` is a ``Harness`` (one shared by every call) or a function returning one (a
fresh child harness per call).
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from guardstack.pipeline.approval import (
    Decision,
    Pending,
    PendingApproval,
    call_digest,
)
from guardstack.pipeline.errors import AgentLimitExceeded
from guardstack.pipeline.model import ModelReply, ModelRequest
from guardstack.pipeline.model_members import model_name_of, stated_output_limit
from guardstack.pipeline.tree import ChildPolicy
from guardstack.pipeline.values import (
    AGENT_STOPPED,
    INVALID_ARGUMENTS,
    ToolCall,
    ToolDefinition,
    ToolResult,
)

if TYPE_CHECKING:
    from guardstack.pipeline.harness import Harness
    from guardstack.pipeline.loop import Agent, TurnResult
    from guardstack.pipeline.model import Model

__all__ = ["AgentTool", "is_agent_tool"]

TASK_SCHEMA = {
    "type": "object",
    "properties": {"task": {"type": "string", "description": "What the agent should do."}},
    "required": ["task"],
    "additionalProperties": False,
}


class _ThroughParent:
    """A child's model, each call of which goes through its parent's model stage (and,
    for a grandchild, on up through every ancestor's)."""

    def __init__(self, parent: Agent, model: Model) -> None:
        self.parent = parent
        self.inner = model
        self.model = model_name_of(model)
        self.max_tokens = stated_output_limit(model)

    async def complete(
        self, messages: list[dict[str, Any]], tools: list[dict[str, Any]]
    ) -> ModelReply:
        parent = self.parent
        above = parent.model
        answering: Model = (
            _ThroughParent(above.parent, self.inner)
            if isinstance(above, _ThroughParent)
            else self.inner
        )
        request = ModelRequest(parent, messages, tools, model=answering)
        reply: ModelReply = await parent.loop.model_call.entry(request)
        if isinstance(reply, ModelReply) and reply.usage is not None:
            parent.add_usage(reply.usage)  # rolled up as it happens: the parent's caps see it
        return reply


def _refusal(parent: Agent, depth: int) -> tuple[str | None, list[ChildPolicy]]:
    """Why ``parent`` may not start a child (the first policy that says no), else the
    policies to tell once it has: every ancestor's loop's, each asked once."""
    policies: list[ChildPolicy] = []
    for agent in (parent, *parent.ancestors):
        for policy in agent.loop.tree.children:
            if any(policy is seen for seen in policies):
                continue
            refusal = policy.refusal(parent, depth)
            if refusal is not None:
                return refusal, []
            policies.append(policy)
    return None, policies


def AgentTool(
    name: str,
    agent: Harness | Callable[[], Harness],
    *,
    description: str,
    timeout_ms: int | None = None,
) -> ToolDefinition:
    """A ``ToolDefinition`` that runs a child agent's turn (see the module docstring)."""
    from guardstack.pipeline.harness import Harness

    if not isinstance(agent, Harness) and not callable(agent):
        raise TypeError(f"AgentTool {name!r}: agent must be a Harness or a function returning one")
    direct = 0  # children of calls made outside an agent loop

    async def run(arguments: Mapping[str, Any], call: ToolCall) -> ToolResult:
        nonlocal direct
        task = arguments.get("task") if isinstance(arguments, Mapping) else None
        if not isinstance(task, str) or not task.strip():
            return ToolResult.failure(
                f'agent {name!r} needs a task: {{"task": "what to do"}}',
                code=INVALID_ARGUMENTS,
            )
        parent = call.agent
        scope = call.scope
        resumed = scope.decisions if scope is not None else None
        if resumed is not None and parent is not None:
            return await _resume_child(parent, call, resumed)
        if parent is None:
            direct += 1
            base, number = str(call.conversation or "agent"), direct
        else:
            refusal, policies = _refusal(parent, parent.depth + 1)
            if refusal is not None:
                return ToolResult.failure(
                    f"agent {name!r} was not started: {refusal}", code=AGENT_STOPPED
                )
            base, number = parent.session_id, len(parent.session.children) + 1
        harness = agent if isinstance(agent, Harness) else agent()
        try:
            child = harness.loop.create(f"{base}/{name}/{number}")
        except AgentLimitExceeded as refused:  # the child harness's own AgentLimit
            return ToolResult.failure(
                f"agent {name!r} was not started: {refused}", code=AGENT_STOPPED
            )
        if parent is not None:
            for policy in policies:
                policy.admitted(parent, child)
            _adopt(parent, child, call.call_id)
        if parent is not None:
            live[child.session_id] = child
        return _answer(name, call, child, await child.prompt(task))

    async def _resume_child(
        parent: Agent, call: ToolCall, decisions: Mapping[str, Decision]
    ) -> ToolResult:
        """A paused child, decided: its agent (this process's, or one rebuilt from its log)
        resumes with the decisions routed to it."""
        child_id = _paused_child(parent, call.call_id)
        child = live.get(child_id) if child_id is not None else None
        session = parent.session.children.get(child_id) if child_id is not None else None
        if child is None or child.session is not session:
            if session is None:
                return ToolResult.failure(
                    f"agent {name!r}: the paused child's log is not there to resume",
                    code=AGENT_STOPPED,
                )
            harness = agent if isinstance(agent, Harness) else agent()
            child = harness.loop.create(session.session_id, session=session)
            live[child.session_id] = child
        _adopt(parent, child, call.call_id)
        return _answer(name, call, child, await child.resume(decisions))

    live: weakref.WeakValueDictionary[str, Agent] = weakref.WeakValueDictionary()

    run.starts_agent = True  # type: ignore[attr-defined]  # for check and is_agent_tool
    return ToolDefinition(
        name, run, description=description, parameters=TASK_SCHEMA, timeout_ms=timeout_ms
    )


def is_agent_tool(definition: ToolDefinition) -> bool:
    """Whether ``definition`` runs a child agent (was made by ``AgentTool``)."""
    return getattr(definition.execute, "starts_agent", False) is True


def _paused_child(parent: Agent, call_id: str) -> str | None:
    """The child session a paused call of ``parent`` waits on (from the parent's log)."""
    for event in reversed(parent.session.events):
        asked_by = getattr(event, "asked_by", None)
        if getattr(event, "call_id", None) == call_id and isinstance(asked_by, str):
            return asked_by.removeprefix("agent:") if asked_by.startswith("agent:") else None
    return None


def _answer(name: str, call: ToolCall, child: Agent, result: TurnResult) -> ToolResult:
    """The child's turn as the parent's tool result: its text, a pause (its calls wait
    for a person, and so does the parent), or ``AGENT_STOPPED`` with why."""
    if result.reason == "completed":
        return ToolResult(result.text)
    if result.reason == "approval":
        arguments = call.arguments if isinstance(call.arguments, Mapping) else {}
        waiting = PendingApproval(
            call.call_id,
            call.name,
            arguments,
            call_digest(call.name, arguments),
            f"agent {name!r} waits for a decision on {len(result.pending)} of its calls",
            f"agent:{child.session_id}",
        )
        return ToolResult("waiting for a person's decision", value=Pending(waiting))
    why = result.error or result.reason
    return ToolResult.failure(
        f"agent {name!r} stopped ({result.reason}): {why}", code=AGENT_STOPPED
    )


def _adopt(parent: Agent, child: Agent, call_id: str) -> None:
    """Make ``child`` a child of ``parent``: linked in its log, spending from its caps,
    inside its deadline. A child adopted already (a live one resumed) is charged
    through its parent once, not once per adoption."""
    own = child.model.inner if isinstance(child.model, _ThroughParent) else child.model
    child.model = _ThroughParent(parent, own)
    child.join_tree(parent)
    if parent.session.children.get(child.session_id) is not child.session:
        parent.session.add_child(child.session)
    parent.child_started(call_id, child.session_id)
