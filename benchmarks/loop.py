"""The agent loop at scale: per-step cost of ``AgentLoop`` against a hand-written loop.

Three measurements, GC on as users run:

* **long turns** — one turn of N steps (N = 10, 100, 1,000, 5,000): each step the
  model asks for one tool call, the tool answers, the result is appended. The peer
  is the minimal loop a user writes by hand (model call -> tool calls -> append
  messages) with the same model double and the same tool. Rounds are interleaved
  and the best of ``--rounds`` is kept; the growth exponent is the slope of
  log(turn time) over log(steps) (1.0 = constant per step).
* **a parallel step** — one step of 64 tool calls at 64-way parallelism, against a
  hand-written task group doing the same logging; CPU per call, median of
  ``--runs`` runs with the range.
* **with LoopDetector** — the long turns again with ``LoopDetector`` (its defaults)
  watching every call, against the same loop without it: what the detector adds per
  step, and whether that stays flat as the turn grows (``--detector`` runs this
  alone; run it on two checkouts to compare releases);
* **many agents** — 1,000 and 10,000 agents running a 5-step guarded turn at once;
  CPU per tool call with CPython's default GC thresholds and with a raised
  generation-0 threshold, which shows what the growth is.

    python -m benchmarks.loop [--rounds 3] [--runs 3] [--detector]
"""

from __future__ import annotations

import argparse
import gc
import json
import math
import time
from typing import Any

import anyio

from benchmarks.timing import median, per_call_ns, ratio, table
from guardstack.guards import RepeatToolReminder, ToolCallLimit, ToolCallTimeoutPolicy
from guardstack.pipeline import (
    AgentLoop,
    Harness,
    ModelReply,
    ToolCallRequest,
    ToolDefinition,
    ToolRegistry,
)

LENGTHS = (10, 100, 1_000, 5_000)


class _Model:
    """A model double that costs nothing: asks for ``steps`` calls (``read`` with the
    arguments ``arguments(n)`` gives for the n-th), then answers."""

    def __init__(self, steps: int, arguments: Any = None) -> None:
        self.steps = steps
        self.calls = 0
        self.arguments = arguments or (lambda n: {"n": n})

    async def complete(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> Any:
        self.calls += 1
        if self.calls > self.steps:
            return ModelReply("done")
        arguments = self.arguments(self.calls)
        return ModelReply(tool_calls=[ToolCallRequest("read", arguments, f"c{self.calls}")])


async def _read(arguments: Any, call: Any) -> str:
    return "content"


async def _read_file(arguments: Any, call: Any) -> str:
    return f"def f(): return {len(arguments['path']) * 7}  # {arguments['path']}"


async def detector_turn(steps: int, watched: bool = True) -> list[dict[str, Any]]:
    from guardstack.guards import LoopDetector

    files = _Model(steps, lambda n: {"path": f"src/module_{n}.py"})  # distinct reads
    harness = Harness(files, max_steps=steps + 1)
    harness.tools.register(ToolDefinition("read", _read_file))
    if watched:
        harness.plugin(LoopDetector())
    agent = harness.loop.create("s")
    await agent.prompt("go")
    return agent.session.messages()


async def unwatched_turn(steps: int) -> list[dict[str, Any]]:
    return await detector_turn(steps, watched=False)


async def detector_turns(rounds: int) -> None:
    best: dict[tuple[str, int], float] = {}
    for _ in range(rounds):
        for steps in LENGTHS:
            for name, turn in (("on", detector_turn), ("off", unwatched_turn)):
                elapsed = await _time(turn, steps)
                best[(name, steps)] = min(best.get((name, steps), math.inf), elapsed)
    rows = [
        [
            f"{steps:,}",
            f"{best[('on', steps)] / steps * 1e6:,.1f}",
            f"{best[('off', steps)] / steps * 1e6:,.1f}",
            f"{(best[('on', steps)] - best[('off', steps)]) / steps * 1e6:,.1f}",
        ]
        for steps in LENGTHS
    ]
    print(table(["steps", "with LoopDetector µs/step", "without µs/step", "its share"], rows))
    first, last = LENGTHS[0], LENGTHS[-1]
    exponent = math.log(best[("on", last)] / best[("on", first)]) / math.log(last / first)
    print(f"with LoopDetector: growth exponent {exponent:.2f} (1.0 = constant per step)")


async def guardstack_turn(steps: int) -> list[dict[str, Any]]:
    registry = ToolRegistry()
    registry.register(ToolDefinition("read", _read))
    agent = AgentLoop(registry, _Model(steps), max_steps=steps + 1).create("s")
    await agent.prompt("go")
    return agent.session.messages()


def _assistant_message(reply: ModelReply) -> dict[str, Any]:
    """The assistant message a hand-written loop appends for a reply with tool calls."""
    calls = [
        {
            "id": request.call_id,
            "type": "function",
            "function": {"name": request.name, "arguments": json.dumps(request.arguments)},
        }
        for request in reply.tool_calls
    ]
    return {"role": "assistant", "content": None, "tool_calls": calls}


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
        messages.append(_assistant_message(reply))
        for request in reply.tool_calls:
            content = await tools[request.name](request.arguments, None)
            messages.append({"role": "tool", "tool_call_id": request.call_id, "content": content})


PARALLEL = 64


class _Fanout:
    """A model double: one step of ``PARALLEL`` calls, then an answer."""

    def __init__(self) -> None:
        self.calls = 0

    async def complete(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> Any:
        self.calls += 1
        if self.calls > 1:
            return ModelReply("done")
        return ModelReply(
            tool_calls=[ToolCallRequest("read", {"n": n}, f"c{n}") for n in range(PARALLEL)]
        )


async def _read_yielding(arguments: Any, call: Any) -> str:
    await anyio.lowlevel.checkpoint()  # a real tool awaits something
    return "content"


async def guardstack_parallel_step() -> list[dict[str, Any]]:
    registry = ToolRegistry()
    registry.register(ToolDefinition("read", _read_yielding))
    loop = AgentLoop(registry, _Fanout(), max_parallel_tool_calls=PARALLEL)
    agent = loop.create("s")
    await agent.prompt("go")
    return agent.session.messages()


async def hand_written_parallel_step() -> list[dict[str, Any]]:
    model = _Fanout()
    messages: list[dict[str, Any]] = [{"role": "user", "content": "go"}]
    while True:
        reply = await model.complete(list(messages), [])
        if not reply.tool_calls:
            messages.append({"role": "assistant", "content": reply.text})
            return messages
        messages.append(_assistant_message(reply))
        results: list[Any] = [None] * len(reply.tool_calls)
        async with anyio.create_task_group() as group:
            for index, request in enumerate(reply.tool_calls):
                group.start_soon(_into, results, index, request)
        for request, content in zip(reply.tool_calls, results, strict=True):
            messages.append({"role": "tool", "tool_call_id": request.call_id, "content": content})


async def _into(results: list[Any], index: int, request: ToolCallRequest) -> None:
    results[index] = await _read_yielding(request.arguments, None)


async def parallel(runs: int) -> None:
    operations = {"guardstack": guardstack_parallel_step, "by hand": hand_written_parallel_step}
    results = [await per_call_ns(operations, calls=200, rounds=5) for _ in range(runs)]
    rows = [
        [
            f"{PARALLEL} calls, {PARALLEL}-way",
            f"{median(results, lambda run: run['guardstack']) / PARALLEL / 1000:,.1f}",
            f"{median(results, lambda run: run['by hand']) / PARALLEL / 1000:,.1f}",
            ratio(results, lambda run: run["guardstack"], lambda run: run["by hand"]),
        ]
    ]
    print(table(["parallel step", "AgentLoop µs/call", "task group µs/call", "ratio"], rows))


AGENT_STEPS = 5


class _Stepper:
    """A model double for many agents: ``AGENT_STEPS`` calls, then an answer."""

    def __init__(self) -> None:
        self.calls = 0

    async def complete(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> Any:
        self.calls += 1
        await anyio.lowlevel.checkpoint()
        if self.calls > AGENT_STEPS:
            return ModelReply("done")
        return ModelReply(tool_calls=[ToolCallRequest("read", {"n": self.calls})])


async def many_agents(count: int) -> float:
    """CPU microseconds per tool call with ``count`` guarded agents running at once."""
    harness = Harness(max_steps=AGENT_STEPS + 1)
    harness.tools.register(ToolDefinition("read", _read_yielding, timeout_ms=5_000))
    harness.plugin(ToolCallTimeoutPolicy())
    harness.plugin(RepeatToolReminder())
    harness.plugin(ToolCallLimit(per_turn=50))
    agents = [harness.loop.create(f"s{n}", model=_Stepper()) for n in range(count)]
    gc.collect()
    started = time.process_time()
    async with anyio.create_task_group() as group:
        for agent in agents:
            group.start_soon(agent.prompt, "go")
    return (time.process_time() - started) / (count * AGENT_STEPS) * 1e6


async def agents(runs: int) -> None:
    rows = []
    default = gc.get_threshold()
    for label, threshold in (
        ("default GC", default),
        ("gen-0 threshold 50,000", (50_000, 20, 100)),
    ):
        per_count = {}
        for count in (1_000, 10_000):
            gc.set_threshold(*threshold)
            try:
                per_count[count] = sorted([await many_agents(count) for _ in range(runs)])
            finally:
                gc.set_threshold(*default)
        small, large = per_count[1_000], per_count[10_000]
        rows.append(
            [
                label,
                f"{small[len(small) // 2]:,.0f}",
                f"{large[len(large) // 2]:,.0f}",
                f"{large[len(large) // 2] / small[len(small) // 2]:.2f}x",
            ]
        )
    print(table(["GC", "1,000 agents µs/call", "10,000 agents µs/call", "growth"], rows))


async def _time(turn: Any, steps: int) -> float:
    """Seconds per turn, over enough turns (about 5,000 steps) that timer noise is small."""
    repeats = max(1, 5_000 // steps)
    started = time.perf_counter()
    for _ in range(repeats):
        await turn(steps)
    return (time.perf_counter() - started) / repeats


async def long_turns(rounds: int) -> None:
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


async def main(rounds: int, runs: int, detector: bool = False) -> None:
    if detector:
        await detector_turns(rounds)
        return
    await long_turns(rounds)
    print()
    await detector_turns(rounds)
    print()
    await parallel(runs)
    print()
    await agents(runs)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--detector", action="store_true", help="only the LoopDetector turns")
    arguments = parser.parse_args()
    anyio.run(main, arguments.rounds, arguments.runs, arguments.detector)
