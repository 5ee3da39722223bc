"""What the tests of agent trees share: a planning model, a worker harness, tools that
record their runs."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import anyio

from guardstack.pipeline import (
    Harness,
    ModelReply,
    ToolCallRequest,
    ToolResultEvent,
    Usage,
    tool,
)


class Plan:
    """A model that makes ``steps`` (each a list of tool calls, run as one step) and then
    answers; each call waits ``think_s`` and costs ``usage``."""

    model = "m"

    def __init__(
        self,
        steps: Sequence[Sequence[ToolCallRequest]],
        answer: str = "done",
        *,
        usage: Usage | None = None,
        think_s: float = 0.0,
    ) -> None:
        self.steps, self.answer, self.usage, self.think_s = steps, answer, usage, think_s
        self.requests: list[list[dict[str, Any]]] = []

    async def complete(self, messages: list[dict[str, Any]], tools: Any) -> ModelReply:
        self.requests.append(messages)
        if self.think_s:
            await anyio.sleep(self.think_s)
        made = sum(1 for m in messages[_prompt_at(messages) :] if m["role"] == "assistant")
        if made < len(self.steps):
            return ModelReply(tool_calls=tuple(self.steps[made]), usage=self.usage, model="m")
        return ModelReply(self.answer, usage=self.usage, model="m")


def _prompt_at(messages: list[dict[str, Any]]) -> int:
    """Where the current turn's prompt is (a user message not after a tool result and
    not a budget notice): a plan counts its steps from there."""
    for index in range(len(messages) - 1, -1, -1):
        message = messages[index]
        after_tool = index > 0 and messages[index - 1]["role"] == "tool"
        notice = str(message.get("content", "")).startswith("Budget left")
        if message["role"] == "user" and not after_tool and not notice:
            return index
    return 0


def calls(*names: str, **arguments: Any) -> list[ToolCallRequest]:
    return [ToolCallRequest(name, dict(arguments) or {"task": "t"}) for name in names]


ran: list[str] = []


@tool
async def search(q: str = "") -> str:
    """Search."""
    ran.append("search")
    return "results"


@tool
async def fetch(q: str = "") -> str:
    """Fetch."""
    ran.append("fetch")
    return "page"


def worker(steps: Sequence[Sequence[ToolCallRequest]], *plugins: Any, **plan: Any) -> Any:
    def build() -> Harness:
        child = Harness(Plan(steps, "child answer", **plan))
        child.tools.register(search)
        child.tools.register(fetch)
        for plugin in plugins:
            child.plugin(plugin)
        return child

    return build


def tool_results(agent_or_session: Any) -> list[ToolResultEvent]:
    session = getattr(agent_or_session, "session", agent_or_session)
    return [e for e in session.events if isinstance(e, ToolResultEvent)]
