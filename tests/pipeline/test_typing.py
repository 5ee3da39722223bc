"""Types reach the core: checked by mypy (``make check``), which reads this module.

A ``# type: ignore[...]`` below marks a call that must *not* type-check; mypy's
``warn_unused_ignores`` (strict) fails the build if one of them ever starts to.
"""

from __future__ import annotations

from typing import assert_type

from guardstack.pipeline import Harness, ModelReply, ModelRequest, ToolCall, ToolResult
from guardstack.pipeline.contract import (
    DISPATCH,
    MODEL,
    DispatchNext,
    ModelNext,
    ModelStage,
    Outcome,
    ToolStage,
)


def _never_called(harness: Harness, request: ModelRequest, call: ToolCall) -> None:
    """Bodies mypy checks and the tests never run."""
    assert_type(harness.tools.dispatch.entry, DispatchNext)
    assert_type(harness.loop.model_call.entry, ModelNext)
    harness.tools.dispatch.entry(request)  # type: ignore[arg-type]
    harness.loop.model_call.entry(call)  # type: ignore[arg-type]
    assert_type(DISPATCH.deliver(ToolResult("ok")), ToolResult)
    assert_type(MODEL.deliver(ModelReply("ok")), ModelReply)
    MODEL.deliver(ToolResult("ok"))  # type: ignore[arg-type]
    DISPATCH.with_attempt(request, 2)  # type: ignore[arg-type]
    outcome: Outcome[ModelReply] = ValueError("a model stage outcome may be an exception")
    assert_type(MODEL.failed(outcome), bool)


def test_the_stage_adapters_are_the_stages_types() -> None:
    assert isinstance(DISPATCH, ToolStage)
    assert isinstance(MODEL, ModelStage)
    assert callable(_never_called)
