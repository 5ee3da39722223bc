"""The model-call stage: layers, model-stage wrappers, usage, reasoning, the system prompt."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import anyio
import pytest

from guardstack.pipeline import (
    MODEL_RATE_LIMITED,
    MODEL_REJECTED,
    MODEL_TIMEOUT,
    AssistantMessage,
    ConfigError,
    Harness,
    ModelError,
    ModelReply,
    ModelRequest,
    ScriptedModel,
    Session,
    SystemMessage,
    ToolCallRequest,
    Usage,
)
from guardstack.pipeline.plugin import ModelNext
from guardstack.pipeline.testing import RecordingLayer, ScriptedTool
from guardstack.wrappers import Metrics, Retry, Timeout, no_backoff
from guardstack.wrappers.metrics import MODEL_DURATION_METRIC, TOKEN_USAGE_METRIC
from tests.wrappers.otel import MetricRig


def usage(prompt: int, completion: int) -> Usage:
    return Usage(input_tokens=prompt, output_tokens=completion)


async def hang(messages: list[dict[str, Any]]) -> ModelReply:
    await anyio.sleep(math.inf)
    raise AssertionError("unreachable")


async def test_model_call_layers_run_in_registration_order_around_the_model() -> None:
    log: list[tuple[str, str]] = []
    model = ScriptedModel([ModelReply("hi")])
    harness = Harness(model)
    harness.loop.model_call.use(RecordingLayer("outer", log))
    harness.loop.model_call.use(RecordingLayer("inner", log))
    seen: list[ModelRequest] = []

    async def spy(request: ModelRequest, call_next: ModelNext) -> ModelReply:
        seen.append(request)
        return await call_next(request)

    harness.loop.model_call.use(spy)
    agent = harness.loop.create("s")
    result = await agent.prompt("hello")
    assert result.reason == "completed"
    assert log == [("enter", "outer"), ("enter", "inner"), ("exit", "inner"), ("exit", "outer")]
    assert seen[0].agent is agent
    assert seen[0].messages == [{"role": "user", "content": "hello"}]
    assert seen[0].attempt == 1
    assert "model:\n  0. outer" in harness.describe()


async def test_a_model_stage_timeout_ends_a_hung_call_and_names_its_code() -> None:
    harness = Harness(ScriptedModel([hang]))
    harness.plugin(Timeout(ms=2_000, stage="model"))
    agent = harness.loop.create("s")
    started = anyio.current_time()
    result = await agent.prompt("go")
    assert anyio.current_time() - started == pytest.approx(2.0)
    assert result.reason == "error"
    assert result.error == "ModelError: MODEL_TIMEOUT: model call timed out after 2000ms"
    assert agent.session.events[-1].error == result.error  # type: ignore[union-attr]


async def test_a_model_stage_retry_waits_for_retry_after_and_numbers_the_attempts() -> None:
    model = ScriptedModel(
        [ModelError("slow down", MODEL_RATE_LIMITED, retry_after_s=7.0), ModelReply("done")]
    )
    harness = Harness(model)
    harness.plugin(Retry(stage="model", backoff_ms=10, jitter=False))
    attempts: list[tuple[int, float]] = []

    async def record(request: ModelRequest, call_next: ModelNext) -> ModelReply:
        attempts.append((request.attempt, anyio.current_time()))
        return await call_next(request)

    harness.loop.model_call.use(record)
    started = anyio.current_time()
    result = await harness.loop.create("s").prompt("go")
    assert result.reason == "completed"
    assert [(n, round(at - started, 6)) for n, at in attempts] == [(1, 0.0), (2, 7.0)]


async def test_retry_after_is_capped_by_max_backoff() -> None:
    model = ScriptedModel(
        [ModelError("slow down", MODEL_RATE_LIMITED, retry_after_s=3600.0), ModelReply("done")]
    )
    harness = Harness(model)
    harness.plugin(Retry(stage="model", backoff_ms=10, max_backoff_ms=5_000, jitter=False))
    started = anyio.current_time()
    assert (await harness.loop.create("s").prompt("go")).reason == "completed"
    assert anyio.current_time() - started == pytest.approx(5.0)


async def test_a_rejected_request_is_not_retried_and_ends_the_turn() -> None:
    model = ScriptedModel([ModelError("context too long", MODEL_REJECTED), ModelReply("never")])
    harness = Harness(model)
    harness.plugin(Retry(stage="model"))
    result = await harness.loop.create("s").prompt("go")
    assert result.reason == "error"
    assert result.error == "ModelError: MODEL_REJECTED: context too long"
    assert len(model.requests) == 1


async def test_any_other_exception_counts_as_model_failed_for_retry_on() -> None:
    model = ScriptedModel([RuntimeError("odd"), ModelReply("done")])
    harness = Harness(model)
    harness.plugin(Retry(stage="model", retry_on=["MODEL_FAILED"]))
    with no_backoff():
        assert (await harness.loop.create("s").prompt("go")).reason == "completed"
    assert len(model.requests) == 2


async def test_timeout_outside_retry_bounds_the_whole_model_operation() -> None:
    harness = Harness(ScriptedModel([hang, hang, hang]))
    harness.plugin(Timeout(ms=5_000, code="TOTAL", stage="model"))
    harness.plugin(Retry(stage="model", attempts=3, backoff_ms=0, max_backoff_ms=0))
    harness.plugin(Timeout(ms=2_000, stage="model"))
    started = anyio.current_time()
    result = await harness.loop.create("s").prompt("go")
    assert anyio.current_time() - started == pytest.approx(5.0)
    assert result.error == "ModelError: TOTAL: model call timed out after 5000ms"


async def test_model_stage_metrics_record_duration_and_token_usage() -> None:
    rig = MetricRig()

    class Named(ScriptedModel):
        model = "named-model"

    model = Named([ModelReply("hi", usage=usage(120, 30), model="named-model-2026")])
    harness = Harness(model)
    harness.plugin(Metrics(rig.provider, stage="model"))
    await harness.loop.create("s").prompt("go")
    [duration] = rig.points(MODEL_DURATION_METRIC)
    assert duration.attributes == {
        "gen_ai.operation.name": "chat",
        "gen_ai.provider.name": "_OTHER",  # the model names no provider
        "gen_ai.request.model": "named-model",
        "gen_ai.response.model": "named-model-2026",
    }
    tokens = {
        point.attributes["gen_ai.token.type"]: point.sum for point in rig.points(TOKEN_USAGE_METRIC)
    }
    assert tokens == {"input": 120, "output": 30}


async def test_model_stage_metrics_name_the_error_code() -> None:
    rig = MetricRig()
    harness = Harness(ScriptedModel([ModelError("no", MODEL_REJECTED)]))
    harness.plugin(Metrics(rig.provider, stage="model"))
    await harness.loop.create("s").prompt("go")
    [duration] = rig.points(MODEL_DURATION_METRIC)
    assert duration.attributes["error.type"] == MODEL_REJECTED


def test_stage_is_a_config_key_for_every_wrapper() -> None:
    harness = Harness(ScriptedModel([]))
    harness.load(
        [
            {"name": "timeout", "config": {"ms": 30_000, "stage": "model"}},
            {"name": "retry", "config": {"attempts": 4, "stage": "model"}},
            {"name": "metrics", "config": {"stage": "model"}},
        ]
    )
    assert harness.loop.model_call.names() == ["timeout", "retry", "metrics"]
    assert len(harness.tools.dispatch) == 0
    with pytest.raises(ConfigError) as raised:
        Harness().load([{"id": "t", "name": "timeout", "config": {"ms": 5, "stage": "modle"}}])
    assert str(raised.value) == (
        "plugin 't' (timeout): config key 'stage' = 'modle': must be 'dispatch' (tool calls) "
        "or 'model' (model calls)"
    )
    with pytest.raises(ConfigError, match="`ms` must be set on the model stage"):
        Timeout(stage="model")


async def test_usage_reasoning_and_model_are_logged_summed_and_sent_back() -> None:
    tool = ScriptedTool("look", ["seen"])
    first = ModelReply(
        tool_calls=(ToolCallRequest("look", {}, "c1"),),
        usage=usage(100, 20),
        reasoning="I should look.",
        model="m-1",
    )
    model = ScriptedModel([first, ModelReply("done", usage=usage(150, 5), model="m-1")])
    harness = Harness(model, system="You are terse.")
    tool.register(harness.tools)
    agent = harness.loop.create("s")
    result = await agent.prompt("go")
    assert result.usage == Usage(250, 25)
    assert agent.usage == Usage(250, 25)
    assert isinstance(agent.session.events[0], SystemMessage)
    assert model.requests[1] == [
        {"role": "system", "content": "You are terse."},
        {"role": "user", "content": "go"},
        {
            "role": "assistant",
            "content": None,
            "reasoning_content": "I should look.",
            "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "look", "arguments": "{}"}}
            ],
        },
        {"role": "tool", "tool_call_id": "c1", "content": "seen"},
    ]
    loaded = Session.from_jsonl(agent.session.to_jsonl())
    assert list(loaded.events) == list(agent.session.events)
    assert loaded.messages() == agent.session.messages()
    resumed = harness.loop.create("s", session=loaded, model=ScriptedModel([ModelReply("ok")]))
    assert resumed.usage == Usage(250, 25)
    second = await resumed.prompt("again")
    assert second.usage == Usage()
    assert resumed.usage == Usage(250, 25)


def test_a_log_written_before_usage_existed_still_loads() -> None:
    old = (
        '{"type": "session", "format": 1, "session_id": "old"}\n'
        '{"type": "turn/start", "turn": 1}\n'
        '{"type": "user/message", "text": "hi", "source": {"kind": "user", "plugin": null}}\n'
        '{"type": "step/start", "turn": 1, "step": 1}\n'
        '{"type": "assistant/message", "turn": 1, "step": 1, "text": "hello", "tool_calls": []}\n'
        '{"type": "step/end", "turn": 1, "step": 1}\n'
        '{"type": "turn/end", "turn": 1, "reason": "completed", "error": null}\n'
    )
    session = Session.from_jsonl(old)
    reply = session.events[3]
    assert isinstance(reply, AssistantMessage)
    assert (reply.usage, reply.reasoning, reply.model) == (None, None, None)
    assert session.usage() == Usage()
    assert session.to_jsonl() == old


def test_usage_in_a_log_is_schema_checked() -> None:
    line = {
        "type": "assistant/message",
        "turn": 1,
        "step": 1,
        "text": "",
        "tool_calls": [],
        "usage": {"input_tokens": -3},
    }
    text = '{"type": "session", "format": 1, "session_id": "x"}\n' + json.dumps(line) + "\n"
    with pytest.raises(ValueError, match="line 2: field 'usage'"):
        Session.from_jsonl(text)


async def test_a_system_prompt_is_logged_once_and_checked_on_resume(tmp_path: Path) -> None:
    harness = Harness(ScriptedModel([ModelReply("a"), ModelReply("b")]))
    agent = harness.loop.create("s", system="Be brief.")
    await agent.prompt("one")
    await agent.prompt("two")
    assert [type(event).__name__ for event in agent.session.events].count("SystemMessage") == 1
    path = tmp_path / "s.jsonl"
    agent.session.save(path)
    same = harness.loop.create("s", session=Session.load(path), system="Be brief.")
    kept = harness.loop.create("s", session=Session.load(path))
    assert same.session.system == kept.session.system == "Be brief."
    with pytest.raises(ConfigError, match="started with a different system prompt"):
        harness.loop.create("s", session=Session.load(path), system="Be verbose.")


async def test_garbage_from_the_model_ends_the_turn_and_keeps_the_log_whole() -> None:
    bad_usage = ModelReply("x", usage={"input_tokens": 3})  # type: ignore[arg-type]
    model = ScriptedModel([bad_usage])
    agent = Harness(model).loop.create("s")
    result = await agent.prompt("go")
    assert result.reason == "error"
    assert result.error is not None
    assert "usage" in result.error
    assert agent.session.rebuild_messages() == agent.session.messages()
    assert [event.type for event in agent.session.events][-2:] == ["step/end", "turn/end"]


def test_model_error_reads_well() -> None:
    error = ModelError("too many", MODEL_RATE_LIMITED, retry_after_s=2.5)
    assert str(error) == "MODEL_RATE_LIMITED: too many"
    assert (error.code, error.retry_after_s) == (MODEL_RATE_LIMITED, 2.5)
    assert Usage(1, 2, 3, 4) + Usage(10, 20) == Usage(11, 22, 3, 4)
    assert ModelError("x").code == "MODEL_FAILED"
    assert MODEL_TIMEOUT == "MODEL_TIMEOUT"
