"""Real agent traffic for the loop corpus: public trajectories as guardstack session logs.

    python -m benchmarks.loops.real SOURCE.json   # writes sessions-real-*/ and labels

**Source.** tau-bench's historical trajectories (Sierra, MIT licence; ``NOTICE``):
repository ``sierra-research/tau-bench``, commit
``59a200c6d575d595120f1cb70fea53cef0632f6b``, path
``historical_trajectories/gpt-4o-airline.json`` — 200 conversations (50 airline
tasks, 4 trials each) between a simulated customer and a GPT-4o tool-calling agent,
with every tool call and result intact. The other files of that directory are not
in the copy this project could reach; tau2-bench's and terminal-bench's published
runs are kept out on purpose (they are reserved for judging this detector).

**Conversion.** Each customer message is a person's prompt (a new turn); each
assistant message with tool calls is a step, its calls answered with the logged
results; a result starting ``Error:`` (how tau-bench's environment reports a failed
action) is a failed call. The system prompt (the airline policy, the same in every
conversation) is left out. Sessions are written by the agent loop itself, so they
are ordinary session logs: ``guardstack replay`` runs over them.

**Labels, by one stated rule, checked by reading each candidate.** A conversation
holds a loop when the agent makes the same call — the same tool with the same
arguments — a third time after it was answered the same way twice, with nothing
learned in between that could change the answer: other calls between them
(``think``, which returns nothing, a ``calculate``, a search that found nothing)
do not break it, and neither does a customer message that does not ask for it
again. The loop starts at the first wasted call: the second of the three. Two
identical calls are not a loop (re-reading a reservation after a customer's
question is normal here). ``REASONS`` gives each loop's reason, read from the
conversation; every other conversation was read where it had any repeated call
and is labelled loop-free.

**Split.** By task, never by trial: even task ids are the tuning set, odd ones
validation, so no task's conversations are on both sides.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import anyio

from guardstack.pipeline import (
    Harness,
    ModelReply,
    ScriptedModel,
    Session,
    ToolCall,
    ToolCallRequest,
    ToolDefinition,
    ToolResult,
)

HERE = Path(__file__).parent
SOURCE = {
    "repository": "sierra-research/tau-bench",
    "commit": "59a200c6d575d595120f1cb70fea53cef0632f6b",
    "path": "historical_trajectories/gpt-4o-airline.json",
    "licence": "MIT",
}
#: Each loop found by reading: its session, the first wasted call and why it is one.
REASONS: dict[str, tuple[int, str]] = {
    "airline-task08-trial1": (
        11,
        "book_reservation sent three times with the same arguments, failing the same way "
        "('payment amount does not add up, total price is 4875, but paid 1625'), a think "
        "between each; then a transfer to a human",
    ),
    "airline-task09-trial2": (
        18,
        "book_reservation sent five times with the same arguments, failing the same way "
        "('total price is 1203, but paid 833'), a think between each",
    ),
    "airline-task11-trial2": (
        5,
        "book_reservation failed three times with the same arguments and error ('total "
        "price is 375, but paid 299'), thinks and a calculate between, before the agent "
        "changed the payment",
    ),
    "airline-task13-trial0": (
        6,
        "update_reservation_flights sent five times with the same flights, failing the "
        "same way ('flight HAT030 not available on date 2024-05-13'), two searches that "
        "found nothing between the second and third",
    ),
}


def name_of(trajectory: dict[str, Any]) -> str:
    return f"airline-task{trajectory['task_id']:02d}-trial{trajectory['trial']}"


def which_set(trajectory: dict[str, Any]) -> str:
    return "real-tuning" if trajectory["task_id"] % 2 == 0 else "real-validation"


def unique_ids(trajectory: dict[str, Any]) -> list[dict[str, Any]]:
    """The conversation's messages with every tool call id unique (GPT-4o reused ids
    within a conversation): a result answers the earliest unanswered call of its id."""
    messages: list[dict[str, Any]] = []
    unanswered: dict[str, list[str]] = {}
    for message in trajectory["traj"]:
        message = dict(message)
        if message["role"] == "assistant" and message.get("tool_calls"):
            calls: list[dict[str, Any]] = []
            for call in message["tool_calls"]:
                fresh = f"call-{len(messages)}-{len(calls)}"
                unanswered.setdefault(call["id"], []).append(fresh)
                calls.append({**call, "id": fresh})
            message["tool_calls"] = calls
        elif message["role"] == "tool":
            queued = unanswered.get(message["tool_call_id"]) or [message["tool_call_id"]]
            message["tool_call_id"] = queued.pop(0)
        messages.append(message)
    return messages


def turns(trajectory: dict[str, Any]) -> list[tuple[str, list[ModelReply]]]:
    """Each customer message and the agent's replies to it (tool-call steps, then text)."""
    made: list[tuple[str, list[ModelReply]]] = []
    for message in unique_ids(trajectory):
        role = message["role"]
        if role == "user":
            made.append((message["content"] or "", []))
        elif role == "assistant" and made:
            requests = [
                ToolCallRequest(
                    c["function"]["name"], json.loads(c["function"]["arguments"]), c["id"]
                )
                for c in message.get("tool_calls") or ()
            ]
            made[-1][1].append(ModelReply(message.get("content") or "", tool_calls=requests))
    for _, replies in made:
        if not replies or replies[-1].tool_calls:
            replies.append(ModelReply(""))  # the conversation stopped mid-turn
    return made


def results(trajectory: dict[str, Any]) -> dict[str, list[ToolResult]]:
    """Each call id's results (a list: a call left unanswered gets an empty result)."""
    answered: dict[str, list[ToolResult]] = {}
    for message in unique_ids(trajectory):
        if message["role"] == "tool":
            text = message["content"] or ""
            if text.startswith("Error:"):
                result = ToolResult.failure(text.removeprefix("Error:").strip(), code="TOOL_FAILED")
            else:
                result = ToolResult(text)
            answered.setdefault(message["tool_call_id"], []).append(result)
    return answered


async def record(trajectory: dict[str, Any]) -> Session:
    """One conversation as a session log, made by the agent loop."""
    conversation = turns(trajectory)
    replies = [reply for _, turn in conversation for reply in turn]
    harness = Harness(ScriptedModel(replies), max_steps=max(len(t) for _, t in conversation) + 1)
    answered = results(trajectory)

    async def answer(arguments: Any, call: ToolCall) -> ToolResult:
        queued = answered.get(call.call_id)
        return queued.pop(0) if queued else ToolResult("")

    names = {c.name for reply in replies for c in reply.tool_calls}
    for name in sorted(names):
        harness.tools.register(ToolDefinition(name, answer))
    agent = harness.loop.create(name_of(trajectory))
    for text, _ in conversation:
        await agent.prompt(text)
    return agent.session


def candidates(session: Session) -> list[int]:
    """Where the labelling rule's loop starts in a session, or nothing: the index of the
    second of three calls with the same tool, arguments and result (failures compared
    by their message), other calls between them allowed. Every candidate was read."""
    from guardstack.guards import canonical_json
    from guardstack.pipeline.session import ToolCallEvent, ToolResultEvent

    pending: dict[str, tuple[int, ToolCallEvent]] = {}
    seen: dict[tuple[str, str, bool, str], list[int]] = {}
    index = 0
    for event in session.events:
        if isinstance(event, ToolCallEvent):
            pending[event.call_id] = (index, event)
            index += 1
        elif isinstance(event, ToolResultEvent) and event.call_id in pending:
            at_index, call = pending.pop(event.call_id)
            if call.name == "think":
                continue
            result = event.result
            key = (call.name, canonical_json(call.arguments), result.is_error, result.content)
            at = seen.setdefault(key, [])
            at.append(at_index)
            if len(at) == 3:
                return [at[1]]
    return []


def write(source: Path) -> None:
    trajectories = json.loads(source.read_text(encoding="utf-8"))
    labels: dict[str, dict[str, dict[str, Any]]] = {"real-tuning": {}, "real-validation": {}}
    for trajectory in trajectories:
        name, which = name_of(trajectory), which_set(trajectory)
        session = anyio.run(record, trajectory)
        directory = HERE / f"sessions-{which}"
        directory.mkdir(exist_ok=True)
        session.save(directory / f"{name}.jsonl")
        start, reason = REASONS.get(name, (None, ""))
        shape = "loop" if start is not None else "legitimate"
        labels[which][name] = {"loop_start": start, "shape": shape, "reason": reason}
    for which, found in labels.items():
        path = HERE / f"labels-{which}.json"
        path.write_text(json.dumps(found, indent=1, sort_keys=True) + "\n", encoding="utf-8")


if __name__ == "__main__":
    write(Path(sys.argv[1]))
