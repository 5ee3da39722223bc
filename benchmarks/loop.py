"""The agent loop at scale: per-step cost of ``AgentLoop`` against a hand-written loop.

One turn of N steps (N = 10, 100, 1,000, 5,000): each step the model asks for one
tool call, the tool answers, the result is appended. The peer is the minimal loop
a user writes by hand (model call -> tool calls -> append messages) with the same
model double and the same tool. GC stays on, as users run. Rounds are interleaved
and the best of ``--rounds`` is kept; the growth exponent is the slope of
log(turn time) over log(steps) from 10 to the longest turn (1.0 = constant per step).

    python -m benchmarks.loop [--rounds 3]
"""

from __future__ import annotations

import argparse
import json
import math
import time
from typing import Any

import anyio

from benchmarks.timing import table
from guardstack.pipeline import AgentLoop, ModelReply, ToolCallRequest, ToolDefinition, ToolRegistry

LENGTHS = (10, 100, 1_000, 5_000)


class _Model:
    """A model double that costs nothing: asks for ``steps`` calls, then answers."""

    def __init__(self, steps: int) -> None:
        self.steps = steps
        self.calls = 0

    async def complete(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> Any:
        self.calls += 1
        if self.calls > self.steps:
            return ModelReply("done")
        return ModelReply(tool_calls=[ToolCallRequest("read", {"n": self.calls}, f"c{self.calls}")])


async def _read(arguments: Any, call: Any) -> str:
    return "content"


async def guardstack_turn(steps: int) -> list[dict[str, Any]]:
    registry = ToolRegistry()
    registry.register(ToolDefinition("read", _read))
    agent = AgentLoop(registry, _Model(steps), max_steps=steps + 1).create("s")
    await agent.prompt("go")
    return agent.session.messages()


async def hand_written_turn(steps: int) -> list[dict[str, Any]]:
    model = _Model(steps)
    tools = {"read": _read}
    schemas = [{"type": "function", "function": {"name": "read", "parameters": {}}}]
    messages: list[dict[str, Any]] = [{"role": "user", "content": "go"}]
    while True:
        reply = await model.complete(list(messages), schemas)
        if not reply.tool_calls:
            messages.append({"role": "assistant", "content": reply.text})
            return messages
        calls = [
            {
                "id": request.call_id,
                "type": "function",
                "function": {"name": request.name, "arguments": json.dumps(request.arguments)},
            }
            for request in reply.tool_calls
        ]
        messages.append({"role": "assistant", "content": None, "tool_calls": calls})
        for request in reply.tool_calls:
            content = await tools[request.name](request.arguments, None)
            messages.append({"role": "tool", "tool_call_id": request.call_id, "content": content})


async def _time(turn: Any, steps: int) -> float:
    started = time.perf_counter()
    await turn(steps)
    return time.perf_counter() - started


async def main(rounds: int) -> None:
    best: dict[tuple[str, int], float] = {}
    for _ in range(rounds):
        for steps in LENGTHS:
            for name, turn in (("guardstack", guardstack_turn), ("by hand", hand_written_turn)):
                elapsed = await _time(turn, steps)
                key = (name, steps)
                best[key] = min(best.get(key, math.inf), elapsed)
    rows = []
    for steps in LENGTHS:
        ours, peer = best[("guardstack", steps)], best[("by hand", steps)]
        rows.append(
            [
                f"{steps:,}",
                f"{ours / steps * 1e6:,.1f}",
                f"{peer / steps * 1e6:,.1f}",
                f"{ours / peer:.2f}x",
            ]
        )
    print(table(["steps", "AgentLoop µs/step", "by hand µs/step", "ratio"], rows))
    first, last = LENGTHS[0], LENGTHS[-1]
    for name in ("guardstack", "by hand"):
        exponent = math.log(best[(name, last)] / best[(name, first)]) / math.log(last / first)
        per_step_growth = (best[(name, last)] / last) / (best[(name, first)] / first)
        print(
            f"{name}: growth exponent {exponent:.2f}; per-step cost at {last:,} steps is "
            f"{per_step_growth:.2f}x the cost at {first}"
        )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    anyio.run(main, parser.parse_args().rounds)
