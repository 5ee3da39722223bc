"""One agent step with one tool call, in guardstack and in three agent frameworks.

Each framework runs its own agent loop with its own test model: the model asks for
one tool call, the tool answers, the model answers — one step with one tool call.
CPU time (``time.process_time``) per such run, GC on, each framework in **three
separate processes** (one process per framework and run, so import and cache state
never leak between them), the median of the three with its range, as a ratio to
guardstack's in the same run:

* **guardstack** — ``AgentLoop`` with a guard stack comparable to the others' extras:
  ``ToolCallTimeoutPolicy``, ``Retry``, ``ToolCallLimit`` and ``RepeatToolReminder``,
  telemetry off;
* **LangChain v1** — ``create_agent`` (a LangGraph graph) with its
  ``ToolRetryMiddleware`` and ``ToolCallLimitMiddleware``, ``GenericFakeChatModel``;
* **pydantic-ai** — ``Agent`` with a ``FunctionModel``;
* **OpenAI Agents SDK** — ``Runner.run`` with the SDK's ``ScriptedModel``, tracing off;
* **Google ADK** — an ``LlmAgent`` in an ``InMemoryRunner`` whose model is ADK's
  ``BaseLlm`` answering the scripted function call, alone and with guardstack's
  ``GuardstackPlugin`` (the same stack as guardstack's row) running the tool and the
  model call: the second row's difference is what guardstack adds to an ADK step.

What each does per step that guardstack does not (so the ratio is honest): LangGraph
checkpoints the graph state between nodes and runs every node as a task with its own
channels; pydantic-ai validates the tool arguments and the output against pydantic
models and builds its graph run and usage records; the Agents SDK builds items for
every message and tool output, runs guardrail and handoff machinery, and its tool
schema is a pydantic model it validates against. guardstack logs six events a step
and rebuilds the request from its log.

    python -m benchmarks.frameworks [--runs 50] [--processes 3]
"""

from __future__ import annotations

import argparse
import gc
import itertools
import json
import statistics
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable
from typing import Any

import anyio

FRAMEWORKS = (
    "guardstack",
    "langchain",
    "pydantic-ai",
    "openai-agents",
    "google-adk",
    "google-adk + guardstack",
)


async def lookup(query: str) -> str:
    """Look something up."""
    return f"found {query}"


def guardstack_run() -> Callable[[], Awaitable[Any]]:
    from guardstack.guards import RepeatToolReminder, ToolCallLimit, ToolCallTimeoutPolicy
    from guardstack.pipeline import Harness, ModelReply, ToolCallRequest, tool
    from guardstack.wrappers import Retry

    class Model:
        async def complete(self, messages: list[dict[str, Any]], tools: Any) -> ModelReply:
            if messages[-1]["role"] == "tool":
                return ModelReply("done")
            return ModelReply(tool_calls=[ToolCallRequest("lookup", {"query": "x"})])

    harness = Harness(Model())
    harness.tools.register(tool(timeout_ms=10_000)(lookup))
    for plugin in (ToolCallTimeoutPolicy(), Retry(), ToolCallLimit(per_turn=10),
                   RepeatToolReminder()):  # fmt: skip
        harness.plugin(plugin)
    numbers = itertools.count()

    async def run() -> Any:
        result = await harness.loop.create(f"s{next(numbers)}").prompt("go")
        assert result.text == "done"
        return result

    return run


def langchain_run() -> Callable[[], Awaitable[Any]]:
    from langchain.agents import create_agent
    from langchain.agents.middleware import ToolCallLimitMiddleware, ToolRetryMiddleware
    from langchain_core.language_models.fake_chat_models import GenericFakeChatModel
    from langchain_core.messages import AIMessage, HumanMessage, ToolMessage
    from langchain_core.outputs import ChatGeneration, ChatResult
    from langchain_core.tools import tool as lc_tool

    class Fake(GenericFakeChatModel):
        """Answers by the conversation so far, so one agent (one compiled graph) serves
        every run."""

        def bind_tools(self, tools: Any, **kwargs: Any) -> Any:
            return self

        def _generate(self, messages: list[Any], *args: Any, **kwargs: Any) -> ChatResult:
            if isinstance(messages[-1], ToolMessage):
                reply = AIMessage("done")
            else:
                call = {"name": "lookup", "args": {"query": "x"}, "id": "c1"}
                reply = AIMessage("", tool_calls=[call])
            return ChatResult(generations=[ChatGeneration(message=reply)])

        async def _agenerate(self, messages: list[Any], *args: Any, **kwargs: Any) -> ChatResult:
            return self._generate(messages)

    agent = create_agent(
        Fake(messages=iter(())),
        [lc_tool(lookup)],
        middleware=[ToolRetryMiddleware(), ToolCallLimitMiddleware(run_limit=10)],  # type: ignore[list-item]
    )

    async def run() -> Any:
        result = await agent.ainvoke({"messages": [HumanMessage("go")]})
        assert result["messages"][-1].content == "done"
        return result

    return run


def pydantic_ai_run() -> Callable[[], Awaitable[Any]]:
    from pydantic_ai import Agent
    from pydantic_ai.messages import ModelResponse, TextPart, ToolCallPart
    from pydantic_ai.models.function import AgentInfo, FunctionModel

    async def model(messages: list[Any], info: AgentInfo) -> ModelResponse:
        if len(messages) > 1:
            return ModelResponse(parts=[TextPart("done")])
        return ModelResponse(parts=[ToolCallPart("lookup", {"query": "x"}, "c1")])

    agent = Agent(FunctionModel(model), tools=[lookup])

    async def run() -> Any:
        result = await agent.run("go")
        assert result.output == "done"
        return result

    return run


def openai_agents_run() -> Callable[[], Awaitable[Any]]:
    from agents import Agent, RunConfig, Runner, function_tool
    from agents.testing import ScriptedModel, assistant_message, function_call

    searcher = function_tool(lookup)
    config = RunConfig(tracing_disabled=True)

    async def run() -> Any:
        scripted = ScriptedModel(
            [[function_call("lookup", {"query": "x"}, call_id="c1")], [assistant_message("done")]]
        )
        agent = Agent(name="bench", tools=[searcher], model=scripted)
        result = await Runner.run(agent, "go", run_config=config)
        assert result.final_output == "done"
        return result

    return run


def _adk_run(guarded: bool) -> Callable[[], Awaitable[Any]]:
    from google.adk.agents import LlmAgent
    from google.adk.apps import App
    from google.adk.models.base_llm import BaseLlm
    from google.adk.models.llm_response import LlmResponse
    from google.adk.runners import InMemoryRunner
    from google.genai import types

    usage = types.GenerateContentResponseUsageMetadata(
        prompt_token_count=10, candidates_token_count=5
    )

    def reply(*parts: Any) -> LlmResponse:
        content = types.Content(role="model", parts=list(parts))
        return LlmResponse(content=content, usage_metadata=usage)

    class Scripted(BaseLlm):
        async def generate_content_async(self, llm_request: Any, stream: bool = False) -> Any:
            last = llm_request.contents[-1].parts[0]
            if last.function_response is not None:
                yield reply(types.Part(text="done"))
            else:
                call = types.FunctionCall(name="lookup", args={"query": "x"}, id="c1")
                yield reply(types.Part(function_call=call))

    plugins: list[Any] = []
    if guarded:
        from guardstack.guards import RepeatToolReminder, ToolCallLimit, ToolCallTimeoutPolicy
        from guardstack.integrations.adk import GuardstackPlugin
        from guardstack.pipeline import Harness
        from guardstack.wrappers import Retry

        harness = Harness()
        for plugin in (ToolCallTimeoutPolicy(), Retry(), ToolCallLimit(per_turn=10),
                       RepeatToolReminder()):  # fmt: skip
            harness.plugin(plugin)
        plugins.append(GuardstackPlugin(harness, timeouts_ms={"lookup": 10_000}))
    agent = LlmAgent(name="bench", model=Scripted(model="scripted"), tools=[lookup])
    runner = InMemoryRunner(app=App(name="bench", root_agent=agent, plugins=plugins))
    message = types.Content(role="user", parts=[types.Part(text="go")])

    async def run() -> Any:
        session = await runner.session_service.create_session(app_name="bench", user_id="u")
        events: list[Any] = [
            event
            async for event in runner.run_async(
                user_id="u", session_id=session.id, new_message=message
            )
        ]
        assert events[-1].content.parts[0].text == "done"
        return events

    return run


BUILDERS: dict[str, Callable[[], Callable[[], Awaitable[Any]]]] = {
    "guardstack": guardstack_run,
    "langchain": langchain_run,
    "pydantic-ai": pydantic_ai_run,
    "openai-agents": openai_agents_run,
    "google-adk": lambda: _adk_run(guarded=False),
    "google-adk + guardstack": lambda: _adk_run(guarded=True),
}


async def _measure(framework: str, runs: int, seconds: float = 1.0) -> float:
    """µs of CPU per run: at least ``runs`` runs and at least ``seconds`` of CPU, so a
    fast loop is timed as long as a slow one."""
    run = BUILDERS[framework]()
    for _ in range(max(5, runs // 5)):  # warm up: imports, caches, specialisations
        await run()
    gc.collect()
    started = time.process_time()
    done = 0
    while done < runs or time.process_time() - started < seconds:
        await run()
        done += 1
    return (time.process_time() - started) / done * 1e6


def in_process(framework: str, runs: int) -> float:
    """µs of CPU per agent step, measured in a fresh process."""
    done = subprocess.run(
        [sys.executable, "-m", "benchmarks.frameworks", "--one", framework, "--runs", str(runs)],
        capture_output=True,
        text=True,
        check=True,
        timeout=600,
    )
    return float(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=50)
    parser.add_argument("--processes", type=int, default=3)
    parser.add_argument("--one", choices=FRAMEWORKS, help=argparse.SUPPRESS)
    parser.add_argument("--json", action="store_true")
    options = parser.parse_args()
    if options.one:
        print(anyio.run(_measure, options.one, options.runs))
        return
    # interleaved: process k of every framework before process k+1 of any
    measured: dict[str, list[float]] = {name: [] for name in FRAMEWORKS}
    for _ in range(options.processes):
        for name in FRAMEWORKS:
            measured[name].append(in_process(name, options.runs))
    if options.json:
        print(json.dumps(measured))
        return
    ours = measured["guardstack"]
    print(f"One agent step with one tool call, CPU µs per step ({options.processes} processes):\n")
    print("| framework | µs / step (median, range) | × guardstack (median, range) |")
    print("|-----------|---------------------------|------------------------------|")
    for name in FRAMEWORKS:
        values = measured[name]
        ratios = [value / mine for value, mine in zip(values, ours, strict=True)]
        print(
            f"| {name} | {statistics.median(values):,.0f} ({min(values):,.0f}–{max(values):,.0f}) "
            f"| {statistics.median(ratios):.1f}× ({min(ratios):.1f}–{max(ratios):.1f}) |"
        )


if __name__ == "__main__":
    main()
