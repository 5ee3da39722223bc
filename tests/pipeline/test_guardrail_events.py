"""Guard decisions as GenAI guardrail telemetry (``pipeline/decisions.py``): each stop,
denial, refusal, reminder and shadow decision is also a ``gen_ai.guardrail.result``
event on the call's span, named as the OpenTelemetry GenAI conventions name it —
semantic-conventions-genai, ``docs/gen-ai/gen-ai-guardrails.md`` at commit
f5e3733b19bdb5cb9074c2ec26da9e375d52a40a (the names are kept in
``tests/fixtures/semconv-guardrails.txt``) — with a reminder told apart from a denial
and a shadow decision from an enforced one, and nothing of a tool's arguments. On
asyncio and trio, in virtual time."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from guardstack.guards import LoopDetector, RepeatToolReminder, ToolCallLimit
from guardstack.pipeline import Harness, ModelReply, ScriptedModel, ToolCallRequest
from guardstack.pipeline.decisions import GUARDRAIL_EVENT, GUARDRAIL_SOURCES
from guardstack.pipeline.testing import ScriptedTool
from guardstack.wrappers import Tracing
from tests.wrappers.otel import SpanRig

PINNED = Path(__file__).parents[1] / "fixtures" / "semconv-guardrails.txt"
SECRET_ARGUMENT = "do-not-export-0123456789"


def pinned_names() -> dict[str, str]:
    """The event name and the attribute names, as the pinned convention has them."""
    found = {}
    for line in PINNED.read_text("utf-8").splitlines():
        if line and not line.startswith("#"):
            first, _, second = line.partition(" ")
            if first == "event":
                found["event"] = second.strip()
            else:
                found[first] = second.strip()
    return found


def guardrail_events(rig: SpanRig) -> list[dict[str, Any]]:
    return [
        dict(event.attributes or {})
        for span in rig.spans
        for event in span.events
        if event.name == GUARDRAIL_EVENT
    ]


def calls(count: int, name: str = "grep") -> ModelReply:
    asked = tuple(
        ToolCallRequest(name, {"pattern": SECRET_ARGUMENT}, f"c{n}") for n in range(count)
    )
    return ModelReply(tool_calls=asked)


async def test_the_event_and_its_attributes_are_the_pinned_conventions() -> None:
    names = pinned_names()
    assert names.pop("event") == GUARDRAIL_EVENT
    rig = SpanRig()
    harness = Harness(ScriptedModel([calls(1), calls(1), calls(1), ModelReply("done")]))
    ScriptedTool("grep", ["same"]).register(harness.tools)
    harness.plugin(Tracing(rig.provider))
    harness.plugin(RepeatToolReminder(thresholds=(2,)))
    await harness.loop.create("s").prompt("go")
    [event, *_] = guardrail_events(rig)
    ours = {key for key in event if key.startswith("gen_ai.")}
    assert ours <= set(names), ours - set(names)
    assert {"gen_ai.guardrail.component.name", "gen_ai.guardrail.result.type",
            "gen_ai.guardrail.result.value", "gen_ai.guardrail.source"} <= ours  # fmt: skip
    assert event["gen_ai.guardrail.source"] in GUARDRAIL_SOURCES


async def test_every_kind_of_decision_is_an_event_told_apart() -> None:
    """A reminder, a denial and a stop from enforcing layers, and a shadow layer's
    would-be denial: each a result on the call's span, its value the layer's own
    decision; none carries the tool's arguments."""
    rig = SpanRig()
    model = ScriptedModel([calls(1), calls(1), calls(1), calls(1), calls(3), ModelReply("ok")])
    harness = Harness(model)
    ScriptedTool("grep", ["same"]).register(harness.tools)
    harness.plugin(Tracing(rig.provider))
    harness.plugin(ToolCallLimit(per_turn=3, shadow=True), id="shadow-cap")
    harness.plugin(RepeatToolReminder(thresholds=(2,)))
    harness.plugin(ToolCallLimit(per_turn=5))
    await harness.loop.create("s").prompt("go")
    events = guardrail_events(rig)
    by_value = {(e["gen_ai.guardrail.component.name"], e["gen_ai.guardrail.result.value"],
                 e["guardstack.enforced"]) for e in events}  # fmt: skip
    assert ("repeat-tool-reminder", "remind", True) in by_value
    assert any(value.startswith("would") and not enforced
               for _, value, enforced in by_value)  # fmt: skip
    assert any(layer == "tool-call-limit" and value in ("deny", "end_turn") and enforced
               for layer, value, enforced in by_value)  # fmt: skip
    sources = {e["gen_ai.guardrail.source"] for e in events}
    assert {"tool_input", "tool_output"} <= sources
    assert SECRET_ARGUMENT not in repr(events)
    assert all(e["gen_ai.guardrail.result.type"] == "guardstack.decision" for e in events)


async def test_a_loop_detectors_stop_is_an_event_on_the_calls_span() -> None:
    rig = SpanRig()
    model = ScriptedModel([calls(1) for _ in range(8)] + [ModelReply("ok")])
    harness = Harness(model)
    ScriptedTool("grep", ["same"]).register(harness.tools)
    harness.plugin(Tracing(rig.provider))
    harness.plugin(LoopDetector(no_progress=3, remind=1, deny=2, end_turn=3))
    await harness.loop.create("s").prompt("go")
    events = guardrail_events(rig)
    values = [e["gen_ai.guardrail.result.value"] for e in events
              if e["gen_ai.guardrail.component.name"] == "loop-detector"]  # fmt: skip
    assert "remind" in values
    assert "deny" in values
    spans_with = {span.name for span in rig.spans for event in span.events
                  if event.name == GUARDRAIL_EVENT}  # fmt: skip
    assert spans_with <= {"execute_tool grep", "invoke_agent s"}, spans_with


async def test_with_no_span_recording_nothing_is_made() -> None:
    harness = Harness(ScriptedModel([calls(1), calls(1), calls(1), ModelReply("done")]))
    ScriptedTool("grep", ["same"]).register(harness.tools)
    harness.plugin(RepeatToolReminder(thresholds=(2,)))
    result = await harness.loop.create("s").prompt("go")
    assert result.reason == "completed"
