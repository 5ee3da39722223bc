"""What a child agent costs through ``AgentTool``, against running the same child by hand.

One parent turn: the parent's model asks for one tool call, whose body runs a child
agent's turn (three model calls, two tool calls), then the parent answers. Two ways:

* **by hand** — a plain tool whose body creates the child agent and awaits its
  ``prompt``: the same work, with none of the tree's bookkeeping (the child spends
  from nothing of the parent's, its log is not linked);
* **AgentTool** — the same child as ``AgentTool``: its model calls go through the
  parent's model stage too, its tool calls through the parent's tool-call caps, its
  session is linked into the parent's log.

Each is measured bare and capped (``UsageLimit``, ``ToolCallLimit``,
``ModelCallLimit``): AgentTool with the caps on the parent, which charge every child
call; by hand with the same caps on the parent and on the child harness — what a user
does without AgentTool, each child call checked once, against a fresh allowance. The
goal: AgentTool ≤ 1.2× by hand. Rounds interleaved, GC on, the median of ``--runs``
runs with its range.

    python -m benchmarks.agents [--runs 3] [--calls 2000]
"""

from __future__ import annotations

import argparse
import functools
import json
from typing import Any

import anyio

from benchmarks.timing import median, per_call_ns, ratio, runs_of, table
from guardstack.guards import ModelCallLimit, ToolCallLimit, UsageLimit
from guardstack.pipeline import (
    AgentTool,
    Harness,
    ModelReply,
    ToolCall,
    ToolCallRequest,
    ToolDefinition,
    Usage,
)

USAGE = Usage(10, 10)


class _Child:
    """Two tool calls, then an answer: three model calls."""

    async def complete(self, messages: list[dict[str, Any]], tools: Any) -> ModelReply:
        done = sum(1 for m in messages if m["role"] == "tool")
        if done < 2:
            return ModelReply(tool_calls=[ToolCallRequest("read", {"n": done})], usage=USAGE)
        return ModelReply("child answer", usage=USAGE)


class _Parent:
    """One call of ``research``, then an answer."""

    async def complete(self, messages: list[dict[str, Any]], tools: Any) -> ModelReply:
        if messages[-1]["role"] == "tool":
            return ModelReply("parent answer", usage=USAGE)
        return ModelReply(tool_calls=[ToolCallRequest("research", {"task": "t"})], usage=USAGE)


async def _read(arguments: Any, call: Any) -> str:
    return "text"


def _child() -> Harness:
    harness = Harness(_Child())
    harness.tools.register(ToolDefinition("read", _read))
    return harness


def _caps() -> list[Any]:
    return [
        UsageLimit(tokens_per_turn=10**9),
        ToolCallLimit(per_turn=10**6),
        ModelCallLimit(per_turn=10**6),
    ]


def _parent(tree: bool, capped: bool) -> Harness:
    parent = Harness(_Parent())
    child = _child()
    if capped and not tree:  # by hand, a child is capped by caps of its own (fresh ones)
        for cap in _caps():
            child.plugin(cap)
    if tree:
        parent.tools.register(AgentTool("research", child, description="Research."))
    else:
        numbers = iter(range(1, 10**9))

        async def by_hand(arguments: Any, call: ToolCall) -> str:
            agent = child.loop.create(f"by-hand/{next(numbers)}")
            return (await agent.prompt(arguments["task"])).text

        parent.tools.register(ToolDefinition("research", by_hand))
    for cap in _caps() if capped else ():
        parent.plugin(cap)
    return parent


def _turn(harness: Harness) -> Any:
    numbers = iter(range(1, 10**9))

    async def turn() -> Any:
        return await harness.loop.create(f"p{next(numbers)}").prompt("go")

    return turn


async def measure(calls: int) -> dict[str, float]:
    operations = {
        f"{kind}-{caps}": _turn(_parent(kind == "tree", caps == "capped"))
        for kind in ("hand", "tree")
        for caps in ("bare", "capped")
    }
    return await per_call_ns(operations, calls=calls, rounds=5)


async def same_answers() -> list[tuple[str, str, Usage]]:
    """Each way's turn: its reason, its text and the usage it reports (for the test)."""
    found = []
    for tree in (False, True):
        result = await _turn(_parent(tree, True))()
        found.append((result.reason, result.text, result.usage))
    return found


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--calls", type=int, default=2_000)
    parser.add_argument("--json", action="store_true")
    options = parser.parse_args()
    runs = await runs_of(lambda: measure(options.calls), options.runs)
    if options.json:
        print(json.dumps(runs))
        return
    rows = []
    for caps in ("bare", "capped"):

        def cost(run: dict[str, float], kind: str, caps: str = caps) -> float:
            return run[f"{kind}-{caps}"]

        rows.append(
            [
                caps,
                f"{median(runs, functools.partial(cost, kind='hand')) / 1000:.1f} µs",
                f"{median(runs, functools.partial(cost, kind='tree')) / 1000:.1f} µs",
                ratio(
                    runs,
                    functools.partial(cost, kind="tree"),
                    functools.partial(cost, kind="hand"),
                ),
            ]
        )
    print("One parent turn delegating to a child agent (3 model calls, 2 tool calls):\n")
    print(table(["parent caps", "by hand", "AgentTool", "AgentTool / by hand"], rows))


if __name__ == "__main__":
    anyio.run(main)
