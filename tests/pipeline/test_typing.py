"""Types reach the core: checked by mypy (``make check``), which reads this module.

A ``# type: ignore[...]`` below marks a call that must *not* type-check; mypy's
``warn_unused_ignores`` (strict) fails the build if one of them ever starts to.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, assert_type

from guardstack.integrations.anthropic import AnthropicModel
from guardstack.integrations.litellm import LiteLLMModel
from guardstack.integrations.openai import OpenAIChatModel
from guardstack.pipeline import (
    BoundedModel,
    Harness,
    ModelReply,
    ModelRequest,
    NamedModel,
    ProvidedModel,
    StreamingModel,
    SwitchableModel,
    ToolCall,
    ToolResult,
)
from guardstack.pipeline.contract import (
    DISPATCH,
    MODEL,
    DispatchNext,
    ModelNext,
    ModelStage,
    Next,
    Outcome,
    ToolStage,
)
from guardstack.pipeline.outcome import Failed
from guardstack.wrappers import Hedge, Metrics, Retry, Timeout


def _never_called(harness: Harness, request: ModelRequest, call: ToolCall) -> None:
    """Bodies mypy checks and the tests never run."""
    assert_type(harness.tools.dispatch.entry, DispatchNext)
    assert_type(harness.loop.model_call.entry, ModelNext)
    harness.tools.dispatch.entry(request)  # type: ignore[arg-type]
    harness.loop.model_call.entry(call)  # type: ignore[arg-type]
    assert_type(DISPATCH.deliver(ToolResult("ok")), ToolResult)
    assert_type(MODEL.deliver(ModelReply("ok")), ModelReply)
    MODEL.deliver(ToolResult("ok"))  # type: ignore[arg-type]
    DISPATCH.failure(request, "TOOL_FAILED", "no")  # type: ignore[arg-type]
    outcome: Outcome[ModelReply] = ValueError("a model stage outcome may be an exception")
    assert_type(MODEL.failure_of(outcome), Failed | None)
    assert_type(call.with_attempt(2), ToolCall)
    assert_type(request.with_hedge(1), ModelRequest)


async def _layer_bodies(
    harness: Harness, request: ModelRequest, call: ToolCall, hedge: Hedge
) -> None:
    """A layer that serves both stages is generic in them: what it answers is what the
    chain it was handed answers, and a chain takes only its own stage's calls."""
    tools: Next[ToolCall, ToolResult] = harness.tools.dispatch.entry
    models: Next[ModelRequest, ModelReply] = harness.loop.model_call.entry
    assert_type(await hedge(call, tools), ToolResult)
    assert_type(await hedge(request, models), ModelReply)
    await hedge(request, tools)  # type: ignore[arg-type]
    wrong: Next[ToolCall, ToolResult] = harness.loop.model_call.entry  # type: ignore[assignment]
    del wrong


async def _tool_only(call: ToolCall, call_next: DispatchNext) -> ToolResult:
    return await call_next(call)


async def _model_only(request: ModelRequest, call_next: ModelNext) -> ModelReply:
    return await call_next(request)


def _registered_by_stage(harness: Harness) -> None:
    """``use()`` takes only a layer typed for its stage (reported: a tool-stage ``Retry``
    on the model stage passed ``mypy --strict`` and failed every turn)."""
    harness.tools.dispatch.use(_tool_only)
    harness.loop.model_call.use(_model_only)
    harness.tools.dispatch.use(Retry())
    harness.loop.model_call.use(Retry())  # type: ignore[arg-type]
    harness.loop.model_call.use(_tool_only)  # type: ignore[arg-type]
    harness.tools.dispatch.use(_model_only)  # type: ignore[arg-type]
    # a layer object built for a stage by its type (``stage=MODEL``) is typed for it
    harness.loop.model_call.use(Retry(stage=MODEL))
    harness.loop.model_call.use(Timeout(ms=5, stage=MODEL))
    harness.loop.model_call.use(Metrics(stage=MODEL))
    harness.tools.dispatch.use(Retry(stage=MODEL))  # type: ignore[arg-type]
    harness.tools.dispatch.use(Timeout(ms=5, stage=MODEL))  # type: ignore[arg-type]
    harness.tools.dispatch.use(Metrics(stage=MODEL))  # type: ignore[arg-type]
    harness.loop.model_call.use(Timeout(ms=5))  # type: ignore[arg-type]
    harness.loop.model_call.use(Metrics())  # type: ignore[arg-type]
    harness.tools.dispatch.use(Timeout(stage=DISPATCH))
    assert_type(Retry(stage=MODEL), Retry[ModelRequest, ModelReply])
    assert_type(Retry(), Retry[ToolCall, ToolResult])


def test_a_layer_for_the_other_stage_is_refused_at_use() -> None:
    """At run time too, before any turn: a layer object that says its stage."""
    import pytest

    from guardstack.pipeline import ConfigError

    harness = Harness()
    with pytest.raises(ConfigError) as refused:
        harness.loop.model_call.use(Retry())  # type: ignore[arg-type]
    message = str(refused.value)
    assert "Retry is built for the dispatch stage" in message
    assert "use Retry(stage=MODEL) here (MODEL from guardstack.pipeline.contract)" in message
    assert not harness.loop.model_call.layered  # nothing was registered
    harness.loop.model_call.use(Retry(stage="model"))  # type: ignore[arg-type]
    assert callable(_registered_by_stage)


def test_a_layer_built_with_the_stage_itself_is_the_one_built_with_its_name() -> None:
    """``stage=MODEL`` is ``stage="model"`` at run time: the same value, the same repr,
    refused on the other stage the same way; a stage that is neither is refused."""
    import pytest

    from guardstack.pipeline import ConfigError

    assert Retry(stage=MODEL) == Retry[ModelRequest, ModelReply](stage="model")
    assert repr(Timeout(ms=5, stage=MODEL)) == repr(Timeout(ms=5, stage="model"))
    assert Retry(stage=MODEL).stage == Metrics(stage=MODEL).stage == "model"
    with pytest.raises(ConfigError, match="built for the model stage"):
        Harness().tools.dispatch.use(Retry(stage=MODEL))  # type: ignore[arg-type]
    for layer in (Retry, Timeout, Metrics):
        with pytest.raises(ConfigError, match="`stage` must be 'dispatch'"):
            layer(stage="modle")
    # every two-stage layer takes the stage itself as well as its name
    from guardstack.pipeline import ScriptedModel
    from guardstack.wrappers import (
        AdaptiveConcurrencyLimit,
        Chaos,
        CircuitBreaker,
        ConcurrencyLimit,
        Fallback,
        RateLimit,
        TokenRateLimit,
    )

    made: list[tuple[Any, dict[str, Any]]] = [
        (AdaptiveConcurrencyLimit, {}),
        (Chaos, {"rate": 0.0, "fault": "hang"}),
        (CircuitBreaker, {}),
        (ConcurrencyLimit, {"max_concurrent": 1}),
        (Fallback, {"to": [ScriptedModel([])]}),
        (Hedge, {"delay_ms": 10}),
        (RateLimit, {"per_second": 1}),
        (TokenRateLimit, {"requests_per_minute": 10}),
    ]
    for kind, arguments in made:
        assert kind(stage=MODEL, **arguments).stage == "model", kind
        assert repr(kind(stage=MODEL, **arguments)) == repr(kind(stage="model", **arguments))


def test_the_stage_adapters_are_the_stages_types() -> None:
    assert isinstance(DISPATCH, ToolStage)
    assert isinstance(MODEL, ModelStage)
    assert callable(_never_called)
    assert callable(_layer_bodies)


def _the_shipped_adapters_match_the_model_protocols(
    openai: OpenAIChatModel, anthropic: AnthropicModel, litellm: LiteLLMModel
) -> None:
    """Each optional member an adapter has, it has in the protocol's shape."""
    for streaming in (openai, anthropic, litellm):
        _: StreamingModel = streaming
    named: list[NamedModel] = [openai, anthropic, litellm]
    provided: list[ProvidedModel] = [openai, anthropic, litellm]
    switching: list[SwitchableModel] = [openai, anthropic, litellm]
    bounded: BoundedModel = anthropic
    del named, provided, switching, bounded
    not_streaming: StreamingModel = _Plain()  # type: ignore[assignment]
    del not_streaming


class _Plain:
    """A model with only ``complete(messages, tools)``: no ``StreamingModel``."""

    async def complete(
        self, messages: list[dict[str, str]], tools: list[dict[str, str]]
    ) -> ModelReply:
        return ModelReply("ok")


# -- mypy itself, run by the test: what a plugin author writes ---------------------------

_WRONG_STAGE = """
from guardstack.pipeline import Harness
from guardstack.pipeline.plugin import DispatchNext, Scope, ToolCall, ToolResult


class Audit:
    def apply(self, scope: Scope) -> None:
        async def audit(call: ToolCall, call_next: DispatchNext) -> ToolResult:
            return await call_next(call)

        scope.use(scope.loop.model_call, audit)


Harness().plugin(Audit())
"""


def test_mypy_passes_the_plugin_guide_and_refuses_a_layer_on_the_wrong_stage(
    tmp_path: Path,
) -> None:
    """``mypy --strict`` on what a plugin author writes: the guide's plugin checks clean;
    the same dispatch layer put on the model stage is an error at ``scope.use``."""
    import re
    import subprocess
    import sys

    root = Path(__file__).resolve().parents[2]
    links = tmp_path / "links" / "guardstack"
    links.mkdir(parents=True)
    for package in ("pipeline", "guards", "wrappers", "integrations", "cli"):
        (links / package).symlink_to(root / package)
    guide = (root / "docs" / "plugins.md").read_text(encoding="utf-8")
    (tmp_path / "guide.py").write_text(re.findall(r"```python\n(.*?)```", guide, re.S)[0])
    (tmp_path / "wrong.py").write_text(_WRONG_STAGE)

    def mypy(name: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "mypy", "--strict", "--no-incremental",
             "--follow-imports=silent", "--ignore-missing-imports", name],
            cwd=tmp_path, env={**os.environ, "MYPYPATH": str(tmp_path / "links")},
            capture_output=True, text=True, timeout=600,
        )  # fmt: skip

    clean = mypy("guide.py")
    assert clean.returncode == 0, clean.stdout
    wrong = mypy("wrong.py")
    assert wrong.returncode == 1
    assert re.search(r"wrong\.py:11: error: .*\"use\" of \"Scope\"", wrong.stdout), wrong.stdout
