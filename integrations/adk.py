"""Google ADK: guardstack's stack around every tool call and model call of a runner.

``GuardstackPlugin(harness)`` is an ADK ``BasePlugin``; give it to the runner and every
agent in it — sub-agents, agents used as tools, workflow agents' children — is
guarded::

    from google.adk.apps import App
    from google.adk.runners import InMemoryRunner
    from guardstack.integrations.adk import GuardstackPlugin

    app = App(name="support", root_agent=root, plugins=[GuardstackPlugin(harness)])
    runner = InMemoryRunner(app=app)

* **Tools**: ``before_tool_callback`` runs the call through the harness's pre-execute,
  dispatch and post-execute stages, the ADK tool innermost (the plugin calls
  ``tool.run_async`` itself and hands ADK the result, so ADK does not run it again):
  timeouts from a harness ``ToolDefinition`` of the same name (else ``timeouts_ms``),
  retries, breakers, limits, caps, the loop guards (a reminder is added to the tool's
  response as ``guardstack_notice``) and approval (a denial is the response's
  ``error``).
* **Models**: ``before_model_callback`` runs the model stage (``AgentLoop.call_model``)
  around the agent's own model (its ``canonical_model``, called here, its response
  handed back): a model-stage ``Retry``, ``Timeout``, breaker and limits,
  ``ModelCallLimit`` and ``UsageLimit`` (from the reply's usage metadata), ``Tracing``'s
  ``chat`` span. A cap that stops the turn answers as the model, with the reason.
* **A cap that ends the turn ends the runner's invocation** (ADK's ``end_invocation``)
  with the model's answer saying why — the request the runner makes with the refused
  call's answer is answered here, ``Stopped by guardstack: …``, never sent —
  on a tool call as on a model call: the runner asks the model nothing more.
* **One budget, one deadline**: an ADK session is one guardstack conversation and
  each runner invocation one turn, so every agent of the tree spends from the same
  caps; a ``TurnDeadline`` in the harness bounds the whole invocation — a call past it
  is cancelled and answered ``ABORTED``.

Extra ``adk`` (``google-adk``; asyncio, as ADK is).
"""

from __future__ import annotations

import contextlib
import itertools
import json
from collections import OrderedDict
from collections.abc import AsyncIterator, Mapping
from typing import Any, Final

import anyio

from guardstack.integrations._extras import require
from guardstack.integrations._framework import FrameworkCalls
from guardstack.integrations._provider import usage_reported
from guardstack.pipeline import (
    MODEL_FAILED,
    MODEL_RATE_LIMITED,
    MODEL_UNAVAILABLE,
    Agent,
    Harness,
    ModelError,
    ModelReply,
    ModelRequest,
    ToolCall,
    ToolResult,
    TurnBlocked,
)

__all__ = ["GuardstackPlugin"]

EXTRA = "adk"
OWNER: Final = "GuardstackPlugin"
#: ADK sessions the plugin remembers at once (the least recently used are forgotten;
#: their caps' counts stay in the harness's store).
MAX_SESSIONS: Final = 10_000
_IDS = itertools.count(1)


def _adk() -> Any:
    require("google.adk", EXTRA)
    from google.adk.plugins.base_plugin import BasePlugin

    return BasePlugin


class _NoModel:
    """A session agent's own model: never called (each call names the ADK agent's)."""

    async def complete(self, messages: Any, tools: Any) -> ModelReply:
        raise ModelError("the plugin's agents have no model of their own", MODEL_FAILED)


def _messages(llm_request: Any) -> list[dict[str, Any]]:
    """An ADK request's contents as chat messages (for estimates and guards)."""
    messages = []
    for content in getattr(llm_request, "contents", None) or ():
        text = "".join(str(getattr(part, "text", "") or "") for part in content.parts or ())
        messages.append({"role": "user" if content.role == "user" else "assistant",
                         "content": text})  # fmt: skip
    return messages


def _model_error(error: Exception) -> ModelError:
    code = getattr(error, "code", None)
    if code == 429:
        return ModelError(str(error), MODEL_RATE_LIMITED)
    if isinstance(code, int) and code >= 500:
        return ModelError(str(error), MODEL_UNAVAILABLE)
    return ModelError(f"{type(error).__name__}: {error}", MODEL_FAILED)


class _Call:
    """One ADK model call as the guardstack model the stage calls."""

    def __init__(self, llm: Any, llm_request: Any) -> None:
        self.llm, self.llm_request = llm, llm_request
        self.model = getattr(llm, "model", None)
        config = getattr(llm_request, "config", None)
        self.max_tokens = getattr(config, "max_output_tokens", None)
        self.response: Any = None

    async def complete(self, messages: Any, tools: Any) -> ModelReply:
        last = None
        try:
            stream: AsyncIterator[Any] = self.llm.generate_content_async(
                self.llm_request, stream=False
            )
            async with contextlib.aclosing(stream):  # type: ignore[type-var]
                async for response in stream:
                    last = response
        except ModelError:
            raise
        except Exception as error:
            raise _model_error(error) from error
        if last is None:
            raise ModelError("the model answered nothing", MODEL_FAILED)
        self.response = last
        if getattr(last, "error_code", None):
            raise ModelError(str(last.error_message or last.error_code), MODEL_FAILED)
        metadata = getattr(last, "usage_metadata", None)
        usage = (
            usage_reported(
                metadata.prompt_token_count or 0,
                metadata.candidates_token_count or 0,
                cached_input_tokens=metadata.cached_content_token_count,
                source="the ADK model",
            )
            if metadata is not None
            else None
        )
        parts = getattr(getattr(last, "content", None), "parts", None) or ()
        text = "".join(str(part.text) for part in parts if getattr(part, "text", None))
        return ModelReply(text, usage=usage, model=getattr(last, "model_version", None))


def _response_of(result: Any) -> str:
    if isinstance(result, str):
        return result
    try:
        return json.dumps(result, sort_keys=True, default=str)
    except (TypeError, ValueError):
        return str(result)


class GuardstackPlugin(_adk()):  # type: ignore[misc]
    """An ADK plugin that puts ``harness``'s stack around every tool and model call."""

    def __init__(
        self,
        harness: Harness,
        *,
        timeouts_ms: Mapping[str, int] | None = None,
        name: str = "guardstack",
    ) -> None:
        super().__init__(name=name)
        self.harness = harness
        self.calls = FrameworkCalls(harness, OWNER, timeouts_ms)
        self._agents: OrderedDict[str, Agent] = OrderedDict()
        #: A cap that ended a session's turn on a tool call, by session: its next model
        #: call is answered with the reason, and the invocation ends there.
        self._ending: dict[str, str] = {}
        from guardstack.guards import TurnDeadline

        deadlines = [h.plugin for h in harness.plugins if isinstance(h.plugin, TurnDeadline)]
        self.deadline_ms: int | None = min((d.ms for d in deadlines), default=None)

    # -- sessions and turns --------------------------------------------------------------

    def _agent(self, session_id: str) -> Agent:
        agent = self._agents.get(session_id)
        if agent is None:
            agent = self._agents[session_id] = self.harness.loop.create(
                f"adk/{session_id}", model=_NoModel()
            )
            while len(self._agents) > MAX_SESSIONS:
                self._agents.popitem(last=False)
        else:
            self._agents.move_to_end(session_id)
        return agent

    @staticmethod
    def _ids(context: Any) -> tuple[str, str]:
        session = getattr(context, "session", None)
        session_id = str(getattr(session, "id", None) or "adk")
        return session_id, str(getattr(context, "invocation_id", None) or "")

    async def before_run_callback(self, *, invocation_context: Any) -> Any:
        """A runner invocation begins: a new turn, its deadline from now."""
        agent = self._agent(str(invocation_context.session.id))
        text = ""
        user = getattr(invocation_context, "user_content", None)
        if user is not None:
            text = "".join(str(getattr(p, "text", "") or "") for p in user.parts or ())
        await self.harness.loop.prompt_submit(agent, text)
        agent.start_turn()
        if self.deadline_ms is not None:
            agent.limit_turn(None)  # from now, whatever an invocation that never ended left
            agent.limit_turn(self.deadline_ms)
        return None

    async def after_run_callback(self, *, invocation_context: Any) -> None:
        agent = self._agent(str(invocation_context.session.id))
        agent.limit_turn(None)
        await self.harness.loop.turn_ended(agent)

    def _scope(self, agent: Agent) -> anyio.CancelScope:
        deadline = agent.turn_deadline
        return anyio.CancelScope(deadline=deadline if deadline is not None else float("inf"))

    # -- tools ---------------------------------------------------------------------------

    async def before_tool_callback(self, *, tool: Any, tool_args: Any, tool_context: Any) -> Any:
        session_id, invocation = self._ids(tool_context)
        agent = self._agent(session_id)
        turn = self.calls.start_run(session_id, invocation)

        async def run(arguments: Mapping[str, Any], call: ToolCall) -> ToolResult:
            answer = await tool.run_async(args=dict(arguments), tool_context=tool_context)
            return ToolResult(_response_of(answer), value=answer)

        call_id = str(getattr(tool_context, "function_call_id", None) or f"adk-{next(_IDS)}")
        outcome = None
        with self._scope(agent) as scope:
            outcome = await self.calls.execute(
                tool.name,
                tool_args if isinstance(tool_args, Mapping) else {},
                call_id,
                turn,
                run,
                description=str(getattr(tool, "description", "") or ""),
            )
        if outcome is None or scope.cancelled_caught:
            return {"error": "ABORTED: the turn's deadline passed before the tool finished"}
        result = outcome.result
        if outcome.ends_turn:
            # the runner asks the model once more with this tool's answer: that request
            # is answered here, saying why, and the invocation ends with it
            self._ending[session_id] = result.error.message if result.error else result.content
        if result.is_error:
            response: dict[str, Any] = {"error": result.content}
        elif isinstance(result.value, Mapping):
            response = dict(result.value)
        else:
            response = {"result": result.content if result.value is None else result.value}
        if outcome.contexts:
            response["guardstack_notice"] = "\n\n".join(c.text for c in outcome.contexts)
        return response

    # -- models --------------------------------------------------------------------------

    async def before_model_callback(self, *, callback_context: Any, llm_request: Any) -> Any:
        invocation = getattr(callback_context, "_invocation_context", None)
        llm = getattr(getattr(invocation, "agent", None), "canonical_model", None)
        if llm is None:  # an ADK without the agent on its context: calls go unguarded
            return None
        session_id, _ = self._ids(callback_context)
        ending = self._ending.pop(session_id, None)
        if ending is not None:  # a cap ended the turn on a tool call: the model's answer
            _end_invocation(callback_context)
            return _stop_response(f"Stopped by guardstack: {ending}")
        agent = self._agent(session_id)
        call = _Call(llm, llm_request)
        request = ModelRequest(agent, _messages(llm_request), [], model=call)
        loop = self.harness.loop
        reply: ModelReply | None = None
        try:
            with self._scope(agent) as scope:
                reply = await loop.call_model(request)
        except TurnBlocked as blocked:
            _end_invocation(callback_context)
            return _stop_response(f"Stopped by guardstack: {blocked}")
        if reply is None or scope.cancelled_caught:
            return _stop_response("Stopped by guardstack: the turn's deadline passed")
        if reply.usage is not None:
            loop.charge(agent, reply.usage)
        return call.response


def _end_invocation(context: Any) -> None:
    """Tell the runner this invocation is over (ADK's ``end_invocation``): it asks the
    model nothing more, where a refusal alone would be answered by another request."""
    invocation = getattr(context, "_invocation_context", None)
    if invocation is not None:
        invocation.end_invocation = True


def _stop_response(text: str) -> Any:
    from google.adk.models.llm_response import LlmResponse
    from google.genai import types

    return LlmResponse(
        content=types.Content(role="model", parts=[types.Part(text=text)]),
        turn_complete=True,
    )
