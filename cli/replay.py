"""``guardstack replay SESSION --config CONFIG``: where guards would have fired on a real log.

A recorded session's tool calls run again, in the order they were logged, through
the guards a configuration assembles — but no tool runs: each call is answered
with the result the log recorded. Each person's prompt goes through the
``prompt_submit`` stage first, as in a live turn, so per-turn guard state resets
where it did live. What comes out is where the reminders and caps would fire, to
tune thresholds on real logs before changing a live stack.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

import attrs

from guardstack.guards import RepeatToolReminder
from guardstack.pipeline.harness import Harness
from guardstack.pipeline.session import Session, ToolCallEvent, ToolResultEvent, UserMessage
from guardstack.pipeline.values import TOOL_DENIED, ToolCall, ToolDefinition, ToolResult

__all__ = ["CapDecision", "Reminder", "ReplayReport", "render", "replay"]

_COUNT = re.compile(r"consecutive_calls: (\d+)")


@attrs.frozen
class Reminder:
    """A reminder a guard added after ``call_id`` (the call it follows)."""

    call_id: str
    tool: str
    count: int | None
    text: str
    #: The guard that added it (``repeat-tool-reminder``, ``loop-detector``, …).
    plugin: str = "repeat-tool-reminder"


@attrs.frozen
class CapDecision:
    """A call a cap denied (``deny``), or denied and ended the turn with (``end_turn``)."""

    call_id: str
    limit: str
    decision: str


@attrs.frozen
class ReplayReport:
    reminders: tuple[Reminder, ...]
    caps: tuple[CapDecision, ...]
    calls: int

    def to_dict(self) -> dict[str, Any]:
        return {
            "reminders": [attrs.asdict(reminder) for reminder in self.reminders],
            "caps": [attrs.asdict(cap) for cap in self.caps],
        }


class _NoModel:
    """A replay never asks a model."""

    async def complete(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> Any:
        raise AssertionError("replay does not call the model")  # pragma: no cover


def _answered_from(results: Mapping[str, ToolResult]) -> Any:
    async def answer(arguments: Mapping[str, Any], call: ToolCall) -> ToolResult:
        return results.get(call.call_id) or ToolResult("")

    return answer


async def replay(session: Session, harness: Harness) -> ReplayReport:
    """Run ``session``'s tool calls through ``harness``'s guards, tools answered from the log."""
    results = {e.call_id: e.result for e in session.events if isinstance(e, ToolResultEvent)}
    answer = _answered_from(results)
    for name in dict.fromkeys(e.name for e in session.events if isinstance(e, ToolCallEvent)):
        if harness.tools.get(name) is None:
            harness.tools.register(ToolDefinition(name, answer))
    first_threshold = _first_threshold(harness)
    agent = harness.loop.create(session.session_id, _NoModel())
    reminders: list[Reminder] = []
    caps: list[CapDecision] = []
    calls = 0
    for event in session.events:
        if isinstance(event, UserMessage) and event.source.kind == "user":
            await harness.loop.prompt_submit(agent, event.text)
        if not isinstance(event, ToolCallEvent):
            continue
        calls += 1
        call = ToolCall(event.name, event.arguments, event.call_id, agent)
        outcome = await harness.tools.execute(call)
        for context in outcome.contexts:
            plugin = context.source.plugin
            if context.source.kind != "plugin" or plugin is None:
                continue
            count = None
            if plugin == "repeat-tool-reminder":
                found = _COUNT.search(context.text)
                count = int(found.group(1)) if found else first_threshold
            reminders.append(Reminder(event.call_id, event.name, count, context.text, plugin))
        result = outcome.result
        # A call denied live is answered with its recorded denial: only a denial made
        # now (a new result, not the recorded one passed back) is this stack's cap.
        if result.code == TOOL_DENIED and result is not results.get(event.call_id):
            decision = "end_turn" if outcome.ends_turn else "deny"
            limit = result.error.message if result.error is not None else result.content
            caps.append(CapDecision(event.call_id, limit, decision))
    return ReplayReport(tuple(reminders), tuple(caps), calls)


def _first_threshold(harness: Harness) -> int | None:
    for handle in harness.plugins:
        if isinstance(handle.plugin, RepeatToolReminder):
            return handle.plugin.thresholds[0]
    return None


def render(report: ReplayReport) -> str:
    """The report for a person: one line per reminder and per cap decision."""
    lines = [f"{report.calls} tool calls replayed"]
    for reminder in report.reminders:
        first = reminder.text.splitlines()[0]
        repeats = f", {reminder.count} in a row" if reminder.count is not None else ""
        lines.append(
            f"{reminder.plugin} after {reminder.call_id} ({reminder.tool}{repeats}): {first[:100]}"
        )
    for cap in report.caps:
        lines.append(f"cap {cap.decision} at {cap.call_id}: {cap.limit[:120]}")
    if not report.reminders and not report.caps:
        lines.append("no reminder and no cap would have fired")
    return "\n".join(lines)
