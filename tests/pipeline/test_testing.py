"""The scripted doubles users test their stacks with: a tool whose runs follow a script
(timed in ``after_ms``, as every duration is), recorded with when and how each ended;
a model that answers from a script (virtual time, both backends)."""

from __future__ import annotations

import anyio
import pytest

from guardstack.pipeline import ModelReply, ScriptedModel, ScriptExhaustedError, ToolCall
from guardstack.pipeline.testing import Hang, Raise, Reply, ScriptedTool
from tests.helpers import harness_with


async def test_a_scripted_tool_runs_its_steps_in_order_and_repeats_the_last() -> None:
    tool = ScriptedTool("t", [Reply("first", after_ms=250), Raise(KeyError("x"), after_ms=100)])
    harness = harness_with(tool)
    answers = [
        (await harness.tools.execute(ToolCall("t", {}, f"c{n}"))).result.content for n in range(3)
    ]
    assert answers[0] == "first"
    assert all("KeyError" in answer or "x" in answer for answer in answers[1:])
    assert [run.outcome for run in tool.runs] == ["returned", "raised", "raised"]
    first = tool.runs[0]
    assert first.ended is not None
    assert first.ended - first.started == pytest.approx(0.25)
    assert [call.call_id for call in tool.calls] == ["c0", "c1", "c2"]


async def test_a_cancelled_run_is_recorded_and_ignore_cancel_finishes_anyway() -> None:
    hanging = ScriptedTool("hang", [Hang()])
    stubborn = ScriptedTool("stubborn", [Reply("late", after_ms=500, ignore_cancel=True)])
    harness = harness_with(hanging, stubborn)
    for name in ("hang", "stubborn"):
        with anyio.move_on_after(0.1):
            await harness.tools.execute(ToolCall(name, {}, "c"))
    assert hanging.runs[0].outcome == "cancelled"
    assert stubborn.runs[0].outcome == "returned"  # it finished its half second


def test_the_old_seconds_keep_working_for_a_minor_version_with_a_warning() -> None:
    with pytest.warns(DeprecationWarning, match="after_s is deprecated .* write after_ms=500"):
        assert Reply("x", 0.5).after_ms == 500
    with pytest.warns(DeprecationWarning, match="write after_ms=2000"):
        assert Raise(RuntimeError(), after_s=2).after_ms == 2_000
    assert Reply("x", after_ms=30).after_ms == 30
    with pytest.warns(DeprecationWarning, match="write after_ms=30"):
        assert Reply("x", 0.03) == Reply("x", after_ms=30)  # one value, however spelt


async def test_a_scripted_model_answers_in_order_records_requests_and_says_when_it_ran_out() -> (
    None
):
    model = ScriptedModel([ModelReply("one"), ModelReply("two")], model="m")
    messages = [{"role": "user", "content": "hi"}]
    assert (await model.complete(messages, [])).text == "one"
    assert model.remaining == 1
    assert (await model.complete(messages, [])).text == "two"
    assert model.requests[0] == messages
    with pytest.raises(ScriptExhaustedError):
        await model.complete(messages, [])
