"""The plugin author's module: small, and enough to write a plugin on every stage."""

from __future__ import annotations

import guardstack.pipeline as pipeline
import guardstack.pipeline.plugin as plugin
from guardstack.pipeline import Harness, ScriptedModel, tool
from guardstack.pipeline.plugin import (
    Accept,
    Agent,
    Allow,
    Ask,
    Block,
    Deny,
    DispatchNext,
    ModelNext,
    ModelReply,
    ModelRequest,
    PostNext,
    PreNext,
    PromptNext,
    Scope,
    ToolCall,
    ToolResult,
)


def test_it_holds_at_most_twenty_names_each_the_packages_own_object() -> None:
    assert len(plugin.__all__) <= 20
    for name in plugin.__all__:
        if name in pipeline.__all__:  # the chain types moved here from the package
            assert getattr(plugin, name) is getattr(pipeline, name), name


class EveryStage:
    """A layer on each of the five stages, typed with this module's names alone."""

    def __init__(self) -> None:
        self.seen: list[str] = []

    def apply(self, scope: Scope) -> None:
        async def prompt(agent: Agent, text: str, call_next: PromptNext) -> str:
            self.seen.append("prompt")
            return await call_next(agent, text.upper())

        async def pre(call: ToolCall, call_next: PreNext) -> Allow | Deny | Ask:
            self.seen.append(f"pre {call.name}")
            return await call_next(call)

        async def dispatch(call: ToolCall, call_next: DispatchNext) -> ToolResult:
            self.seen.append(f"dispatch {call.name}")
            return await call_next(call)

        async def post(call: ToolCall, result: ToolResult, call_next: PostNext) -> Accept | Block:
            self.seen.append(f"post {result.content}")
            return await call_next(call, result)

        async def model(request: ModelRequest, call_next: ModelNext) -> ModelReply:
            self.seen.append(f"model {request.messages[-1]['content']}")
            return await call_next(request)

        scope.use(scope.loop.prompt_submit, prompt)
        scope.use(scope.tools.pre_execute, pre)
        scope.use(scope.tools.dispatch, dispatch)
        scope.use(scope.tools.post_execute, post)
        scope.use(scope.loop.model_call, model)


@tool
async def echo(text: str) -> str:
    """Say it back."""
    return text


async def test_a_plugin_written_with_it_runs_on_every_stage() -> None:
    from guardstack.pipeline import ToolCallRequest

    model = ScriptedModel(
        [ModelReply(tool_calls=[ToolCallRequest("echo", {"text": "hi"})]), ModelReply("done")]
    )
    harness = Harness(model)
    harness.tools.register(echo)
    every = EveryStage()
    harness.plugin(every)
    result = await harness.loop.create("s").prompt("go")
    assert result.text == "done"
    assert every.seen == ["prompt", "model GO", "pre echo", "dispatch echo", "post hi", "model hi"]
