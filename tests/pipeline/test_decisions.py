"""The decision log in process: every stop, denial, shadow decision and reload is one
JSON line on the ``guardstack.decisions`` logger, with the fields operators read and
nothing of what the model or a tool said; a stop is also counted (``guardstack.stops``)."""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from guardstack.guards import LoopDetector, ModelCallLimit, ToolCallLimit
from guardstack.pipeline import (
    AgentLoop,
    ConfigError,
    Harness,
    ModelReply,
    ScriptedModel,
    ToolCallRequest,
    ToolRegistry,
)
from guardstack.pipeline.decisions import FIELDS, decided, layer_of, who_of
from guardstack.pipeline.testing import ScriptedTool
from guardstack.wrappers import Metrics
from tests.wrappers.otel import MetricRig

SECRET = "sk-live-do-not-log-0123456789"


class Lines(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.lines: list[dict[str, Any]] = []
        self.raw: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.raw.append(record.getMessage())
        self.lines.append(json.loads(record.getMessage()))


@pytest.fixture
def lines() -> Iterator[Lines]:
    logger = logging.getLogger("guardstack.decisions")
    handler, level = Lines(), logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    try:
        yield handler
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)


def calling(count: int) -> list[ModelReply]:
    """Replies that call ``look`` with the same secret-bearing arguments each time."""
    return [
        ModelReply(
            f"I will look, key {SECRET}", tool_calls=(ToolCallRequest("look", {"key": SECRET}),)
        )
        for _ in range(count)
    ]


def harness_with(model: ScriptedModel, *plugins: object) -> Harness:
    harness = Harness(model)
    ScriptedTool("look", [f"found {SECRET}"] * 20).register(harness.tools)
    for plugin in plugins:
        harness.plugin(plugin)  # type: ignore[arg-type]
    return harness


def test_each_line_has_every_field_and_nothing_else(lines: Lines) -> None:
    decided("deny", layer="x", decision="deny", reason="because", tool="t", tenant="acme")
    [line] = lines.lines
    assert tuple(line) == FIELDS
    assert (line["event"], line["layer"], line["tool"], line["tenant"]) == (
        "deny",
        "x",
        "t",
        "acme",
    )
    assert line["team"] is None


def test_who_asked_is_said_by_whoever_decides(lines: Lines) -> None:
    who = {"tenant": "acme", "team": "ci", "key_name": "acme/ci", "model": "gpt-x"}
    decided("stop", layer="budgets", decision="end_turn", reason="r" * 1_000, **who)
    decided("stop", layer="budgets", decision="end_turn")
    first, second = lines.lines
    assert (first["tenant"], first["team"], first["key_name"], first["model"]) == (
        "acme",
        "ci",
        "acme/ci",
        "gpt-x",
    )
    assert len(first["reason"]) == 300  # cut
    assert second["tenant"] is None  # nobody said: nobody (no context carries it)


def test_an_agent_is_named_by_its_tenant_labels_and_session() -> None:
    loop = AgentLoop(ToolRegistry(), model=ScriptedModel([]))
    agent = loop.create("s1", tenant="acme", labels={"team": "ci", "key_name": "acme/ci"})
    assert who_of(agent) == {
        "tenant": "acme",
        "team": "ci",
        "key_name": "acme/ci",
        "conversation": "s1",
    }
    assert who_of(None) == {}
    with pytest.raises(TypeError):
        agent.labels["team"] = "other"  # type: ignore[index]


def test_nobody_listening_costs_no_line() -> None:
    logger = logging.getLogger("guardstack.decisions")
    handler = Lines()
    logger.addHandler(handler)
    try:
        logger.setLevel(logging.ERROR)
        decided("deny", layer="x", decision="deny")
        assert handler.lines == []
    finally:
        logger.removeHandler(handler)
        logger.setLevel(logging.NOTSET)


@pytest.mark.parametrize(
    ("reason", "layer"),
    [
        ("model-call-limit: this turn made 3 model calls", "model-call-limit"),
        ("tool call limit reached: this turn already made 2 tool calls", "tool-call-limit"),
        ("rejected: not today", "approval"),
        ('tool "deploy" is paused: incident', "control"),
        ("loop-detector: you called read 5 times", "loop-detector"),
        ("Something else entirely", "guardstack"),
    ],
)
def test_the_layer_is_read_from_what_it_said(reason: str, layer: str) -> None:
    assert layer_of(reason) == layer


async def test_a_denial_and_a_stop_are_one_line_each_without_content(lines: Lines) -> None:
    rig = MetricRig()
    model = ScriptedModel(calling(6))
    harness = harness_with(model, ToolCallLimit(per_turn=1, on_exceeded="end_turn"))
    harness.plugin(Metrics(rig.provider))
    agent = harness.loop.create("session-1")
    result = await agent.prompt(f"use {SECRET}")
    assert result.reason == "blocked"
    events = [(line["event"], line["layer"], line["decision"]) for line in lines.lines]
    assert events == [
        ("deny", "tool-call-limit", "end_turn"),
        ("stop", "tool-call-limit", "end_turn"),
    ]
    assert lines.lines[0]["tool"] == "look"
    assert {line["conversation"] for line in lines.lines} == {"session-1"}
    assert not any(SECRET in raw for raw in lines.raw)
    assert rig.total("guardstack.stops", layer="tool-call-limit", tenant="default") == 1


async def test_a_cap_that_wraps_up_says_so(lines: Lines) -> None:
    model = ScriptedModel([*calling(1), ModelReply("done so far")])
    agent = harness_with(model, ModelCallLimit(per_turn=2, on_limit="wrap_up")).loop.create("s")
    assert (await agent.prompt("go")).text == "done so far"
    [line] = lines.lines
    assert (line["event"], line["layer"], line["decision"]) == (
        "stop",
        "model-call-limit",
        "wrap_up",
    )


async def test_a_shadow_decision_is_a_line(lines: Lines) -> None:
    model = ScriptedModel([*calling(3), ModelReply("ok")])
    agent = harness_with(model, ToolCallLimit(per_turn=1, shadow=True)).loop.create("s")
    assert (await agent.prompt("go")).reason == "completed"
    shadows = [line for line in lines.lines if line["event"] == "shadow"]
    assert len(shadows) == 2
    assert {(line["layer"], line["decision"]) for line in shadows} == {
        ("tool-call-limit", "would deny")
    }


async def test_a_loop_the_detector_denies_is_a_line(lines: Lines) -> None:
    model = ScriptedModel([*calling(8), ModelReply("ok")])
    agent = harness_with(model, LoopDetector(deny=1, end_turn=None)).loop.create("s")
    await agent.prompt("go")
    denials = [line for line in lines.lines if line["event"] == "deny"]
    assert denials
    assert {line["layer"] for line in denials} == {"loop-detector"}
    assert not any(SECRET in raw for raw in lines.raw)


def test_a_reload_is_a_line_whether_it_took_or_not(lines: Lines, tmp_path: Path) -> None:
    harness = Harness()
    harness.reload([{"name": "tool-call-limit", "config": {"per_turn": 3}}])
    with pytest.raises(ConfigError):
        harness.reload([{"name": "tool-call-limit", "config": {"per_tun": 3}}])
    took, refused = lines.lines
    assert (took["event"], took["decision"]) == ("reload", "reloaded")
    assert "stack version 1" in took["reason"]
    assert (refused["event"], refused["decision"]) == ("reload", "refused")
    assert "per_tun" in refused["reason"]
