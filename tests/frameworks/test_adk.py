"""The Google ADK plugin against the real ``google-adk``: a real ``InMemoryRunner`` whose
agents' model is ADK's ``BaselLlm`` subclassed to answer scripted function calls, with
``GuardstackPlugin`` given to the runner (asyncio, virtual time)."""

from __future__ import annotations

from collections.abc import AsyncGenerator
from types import SimpleNamespace
from typing import Any

import anyio
import pytest

pytest.importorskip("google.adk", reason="pip install 'guardstack[adk]'")

from google.adk.agents import LlmAgent
from google.adk.apps import App
from google.adk.models.base_llm import BaseLlm
from google.adk.models.llm_response import LlmResponse
from google.adk.runners import InMemoryRunner
from google.adk.tools.agent_tool import AgentTool
from google.genai import types
from pydantic import Field

from guardstack.guards import (
    Approval,
    ModelCallLimit,
    ToolCallLimit,
    ToolCallTimeoutPolicy,
    TurnDeadline,
)
from guardstack.integrations.adk import GuardstackPlugin
from guardstack.pipeline import Harness, Reject, ToolDefinition
from guardstack.wrappers import Retry, no_backoff


class Busy(Exception):
    """What a provider's client raises for a 503 (the attribute ADK's clients carry)."""

    code = 503


class Scripted(BaseLlm):
    """Answers each request with the next scripted step (a response, or an exception to
    raise), and keeps every request it was sent."""

    model: str = "scripted-model"
    steps: list[Any] = Field(default_factory=list)
    requests: list[Any] = Field(default_factory=list)

    async def generate_content_async(
        self, llm_request: Any, stream: bool = False
    ) -> AsyncGenerator[LlmResponse, None]:
        self.requests.append(llm_request)
        step = self.steps.pop(0)
        if isinstance(step, BaseException):
            raise step
        yield step


def calls(*named: tuple[str, dict[str, Any]]) -> LlmResponse:
    parts = [
        types.Part(function_call=types.FunctionCall(name=name, args=args, id=f"{name}-{n}"))
        for n, (name, args) in enumerate(named)
    ]
    return LlmResponse(content=types.Content(role="model", parts=parts), usage_metadata=_usage())


def says(text: str) -> LlmResponse:
    return LlmResponse(
        content=types.Content(role="model", parts=[types.Part(text=text)]),
        usage_metadata=_usage(),
    )


def _usage() -> Any:
    return types.GenerateContentResponseUsageMetadata(
        prompt_token_count=10, candidates_token_count=5
    )


def runner_for(agent: Any, harness: Harness) -> InMemoryRunner:
    """A runner for ``agent`` with the plugin given on the App (ADK's one place for it)."""
    app = App(name="t", root_agent=agent, plugins=[GuardstackPlugin(harness)])
    return InMemoryRunner(app=app)


async def run(runner: InMemoryRunner, text: str = "go", session: Any = None) -> list[Any]:
    if session is None:
        session = await runner.session_service.create_session(app_name="t", user_id="u")
    events = []
    message = types.Content(role="user", parts=[types.Part(text=text)])
    async for event in runner.run_async(user_id="u", session_id=session.id, new_message=message):
        events.append(event)
    return events


def function_responses(events: list[Any]) -> list[dict[str, Any]]:
    return [
        dict(part.function_response.response)
        for event in events
        for part in (event.content.parts if event.content else [])
        if part.function_response is not None
    ]


def texts(events: list[Any]) -> list[str]:
    return [
        part.text
        for event in events
        for part in (event.content.parts if event.content else [])
        if part.text
    ]


async def test_a_hung_adk_tool_is_cut_at_its_budget_and_retried() -> None:
    attempts: list[str] = []

    async def search(q: str) -> dict[str, Any]:
        """Search the index."""
        attempts.append(q)
        if len(attempts) == 1:
            await anyio.sleep(3_600)
        return {"hits": 3}

    harness = Harness()
    harness.tools.register(ToolDefinition("search", _never, timeout_ms=200))
    harness.plugin(Retry(attempts=2, backoff_ms=1))
    harness.plugin(ToolCallTimeoutPolicy())
    model = Scripted(steps=[calls(("search", {"q": "x"})), says("3 hits")], requests=[])
    agent = LlmAgent(name="root", model=model, tools=[search])
    runner = runner_for(agent, harness)
    started = anyio.current_time()
    with no_backoff():
        events = await run(runner)
    assert anyio.current_time() - started == pytest.approx(0.2, abs=0.05)
    assert attempts == ["x", "x"]  # the plugin ran the tool (twice), ADK did not run it again
    assert function_responses(events) == [{"hits": 3}]
    assert texts(events)[-1] == "3 hits"


async def test_the_model_stage_retries_and_caps_model_calls() -> None:
    harness = Harness()
    harness.plugin(ModelCallLimit(per_turn=3))  # outside the retry: one count per call
    harness.plugin(Retry(stage="model", attempts=3, backoff_ms=1))

    async def look(path: str) -> str:
        """Look at a file."""
        return "contents"

    steps = [Busy("try later"), calls(("look", {"path": "a"})), calls(("look", {"path": "b"})),
             calls(("look", {"path": "c"})), says("never")]  # fmt: skip
    model = Scripted(steps=steps, requests=[])
    agent = LlmAgent(name="root", model=model, tools=[look])
    runner = runner_for(agent, harness)
    with no_backoff():
        events = await run(runner)
    assert len(model.requests) == 4  # the 503 retried, then three calls, the fourth refused
    assert texts(events)[-1].startswith("Stopped by guardstack: model-call-limit")


async def test_a_turns_cap_holds_across_sub_agents() -> None:
    made: list[str] = []

    async def note(text: str) -> str:
        """Write a note."""
        made.append(text)
        return "noted"

    harness = Harness()
    harness.plugin(ToolCallLimit(per_turn=3))
    child = LlmAgent(
        name="writer",
        model=Scripted(
            steps=[calls(("note", {"text": "c1"}), ("note", {"text": "c2"})), says("done")],
            requests=[],
        ),
        tools=[note],
    )
    root = LlmAgent(
        name="root",
        model=Scripted(
            steps=[
                calls(("note", {"text": "r1"})),
                calls(("writer", {"request": "write two"})),
                calls(("note", {"text": "r2"})),
                says("finished"),
            ],
            requests=[],
        ),
        tools=[note, AgentTool(agent=child)],
    )
    runner = runner_for(root, harness)
    events = await run(runner)
    # r1 and the writer tool are two of three; the writer's two notes would pass it
    responses = function_responses(events)
    assert made == ["r1", "c1"]
    assert any("tool call limit reached" in str(r.get("error", "")) for r in responses)


async def test_one_deadline_bounds_the_whole_invocation() -> None:
    async def slow(q: str) -> str:
        """Take a while."""
        await anyio.sleep(3_600)
        return "late"

    harness = Harness()
    harness.plugin(TurnDeadline(ms=500))
    model = Scripted(steps=[calls(("slow", {"q": "x"})), says("gave up")], requests=[])
    agent = LlmAgent(name="root", model=model, tools=[slow])
    runner = runner_for(agent, harness)
    started = anyio.current_time()
    events = await run(runner)
    assert anyio.current_time() - started == pytest.approx(0.5, abs=0.05)
    [response] = function_responses(events)
    assert response["error"].startswith("ABORTED")


async def _never(arguments: Any, call: Any) -> str:
    raise AssertionError("a framework's tool runs in the framework")


async def test_a_person_who_rejects_a_call_keeps_it_from_running() -> None:
    ran: list[str] = []

    async def deploy(target: str) -> str:
        """Deploy."""
        ran.append(target)
        return "deployed"

    async def person(pending: Any) -> Reject:
        return Reject(reason=f"not {pending.arguments['target']} this week")

    harness = Harness()
    harness.plugin(Approval(require=("deploy",), approver=person))
    steps = [calls(("deploy", {"target": "prod"})), says("did not deploy")]
    agent = LlmAgent(name="root", model=Scripted(steps=steps, requests=[]), tools=[deploy])
    events = await run(runner_for(agent, harness))
    assert ran == []
    [response] = function_responses(events)
    assert "not prod this week" in response["error"]


async def test_an_invocation_that_never_ended_leaves_the_next_a_whole_deadline() -> None:
    """ADK may start an invocation whose predecessor never reached ``after_run`` (it
    raised): the new one's deadline runs from its own start, not from the old one's."""
    harness = Harness()
    harness.plugin(TurnDeadline(ms=500))
    plugin = GuardstackPlugin(harness)
    context = SimpleNamespace(session=SimpleNamespace(id="s"), user_content=None)
    await plugin.before_run_callback(invocation_context=context)
    await anyio.sleep(2)  # the first invocation died without its after_run
    await plugin.before_run_callback(invocation_context=context)
    agent = plugin._agent("s")
    assert agent.turn_deadline == pytest.approx(anyio.current_time() + 0.5)
    await plugin.after_run_callback(invocation_context=context)
    assert agent.turn_deadline is None
