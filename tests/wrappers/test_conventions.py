"""What guardstack emits, held to the OpenTelemetry semantic conventions' own constants
(``opentelemetry-semantic-conventions``): a rename upstream fails here first.

The GenAI conventions moved to their own repository (semantic-conventions-genai), whose
token counters the package does not carry yet: they are named after the usage
attributes it does carry (``gen_ai.usage.cache_read.input_tokens`` →
``gen_ai.client.inference.usage.cache_read.input_tokens``), and derived from them here.
"""

from __future__ import annotations

from typing import Any

from opentelemetry.semconv._incubating.attributes import gen_ai_attributes as attrs_
from opentelemetry.semconv._incubating.metrics import gen_ai_metrics, mcp_metrics

from guardstack.pipeline import Harness, ModelReply, ScriptedModel, Usage
from guardstack.wrappers import Metrics, Tracing
from guardstack.wrappers.metrics import (
    MODEL_DURATION_METRIC,
    OPERATION_HISTOGRAMS,
    TOKEN_USAGE_METRIC,
    USAGE_COUNTERS,
)
from tests.wrappers.otel import MetricRig, SpanRig

USAGE = Usage(1_000, 300, cached_input_tokens=600, reasoning_tokens=120, cache_write_tokens=50)


def counter_name(usage_attribute: str) -> str:
    return "gen_ai.client.inference." + usage_attribute.removeprefix("gen_ai.")


def test_the_names_are_the_conventions() -> None:
    assert MODEL_DURATION_METRIC == gen_ai_metrics.GEN_AI_CLIENT_OPERATION_DURATION
    assert TOKEN_USAGE_METRIC == gen_ai_metrics.GEN_AI_CLIENT_TOKEN_USAGE  # the legacy one
    derived = {
        counter_name(attrs_.GEN_AI_USAGE_INPUT_TOKENS),
        counter_name(attrs_.GEN_AI_USAGE_OUTPUT_TOKENS),
        counter_name(attrs_.GEN_AI_USAGE_CACHE_READ_INPUT_TOKENS),
        counter_name(attrs_.GEN_AI_USAGE_REASONING_OUTPUT_TOKENS),
    }
    assert derived <= set(USAGE_COUNTERS)
    # the conventions' repository renamed "cache_creation" to "cache_write" for the counter
    assert set(USAGE_COUNTERS) - derived == {
        "gen_ai.client.inference.usage.cache_write.input_tokens"
    }
    assert set(OPERATION_HISTOGRAMS) == {
        name.replace(".usage.", ".operation.")
        for name in derived
        if name.endswith((".usage.input_tokens", ".usage.output_tokens"))
    }


class Provided(ScriptedModel):
    model = "gpt-x"
    provider = "openai"


async def run(*plugins: Any, model: ScriptedModel | None = None) -> None:
    harness = Harness(model or Provided([ModelReply("hi", usage=USAGE, model="gpt-x-1")]))
    for plugin in plugins:
        harness.plugin(plugin)
    await harness.loop.create("s").prompt("go")


def points(rig: MetricRig, name: str) -> list[Any]:
    return rig.points(name)


async def test_the_token_counters_carry_every_subset_and_the_provider() -> None:
    rig = MetricRig()
    await run(Metrics(rig.provider, stage="model"))
    expected = {
        "gen_ai.client.inference.usage.input_tokens": 1_000,
        "gen_ai.client.inference.usage.output_tokens": 300,
        "gen_ai.client.inference.usage.cache_read.input_tokens": 600,
        "gen_ai.client.inference.usage.cache_write.input_tokens": 50,
        "gen_ai.client.inference.usage.reasoning.output_tokens": 120,
    }
    for name, value in expected.items():
        [point] = points(rig, name)
        assert point.value == value, name
        assert dict(point.attributes) == {
            attrs_.GEN_AI_OPERATION_NAME: "chat",
            attrs_.GEN_AI_PROVIDER_NAME: "openai",
            attrs_.GEN_AI_REQUEST_MODEL: "gpt-x",
            attrs_.GEN_AI_RESPONSE_MODEL: "gpt-x-1",
            "gen_ai.token.modality": "unknown",
        }
    [histogram] = points(rig, "gen_ai.client.inference.operation.input_tokens")
    assert (histogram.count, histogram.sum) == (1, 1_000)
    [duration] = points(rig, gen_ai_metrics.GEN_AI_CLIENT_OPERATION_DURATION)
    assert duration.attributes[attrs_.GEN_AI_PROVIDER_NAME] == "openai"
    # the old name still, for one minor version; off when asked
    assert len(points(rig, TOKEN_USAGE_METRIC)) == 2
    quiet = MetricRig()
    await run(Metrics(quiet.provider, stage="model", legacy_token_usage=False))
    assert points(quiet, TOKEN_USAGE_METRIC) == []
    assert len(points(quiet, "gen_ai.client.inference.usage.input_tokens")) == 1


async def test_a_model_naming_no_provider_is_other() -> None:
    rig, spans = MetricRig(), SpanRig()
    model = ScriptedModel([ModelReply("hi", usage=Usage(5, 5))])
    await run(Metrics(rig.provider, stage="model"), Tracing(spans.provider), model=model)
    [duration] = points(rig, gen_ai_metrics.GEN_AI_CLIENT_OPERATION_DURATION)
    assert duration.attributes[attrs_.GEN_AI_PROVIDER_NAME] == "_OTHER"
    [chat] = [span for span in spans.spans if span.name.startswith("chat")]
    assert dict(chat.attributes or {})[attrs_.GEN_AI_PROVIDER_NAME] == "_OTHER"


async def test_the_chat_span_carries_the_usage_subsets() -> None:
    spans = SpanRig()
    await run(Tracing(spans.provider))
    [chat] = [span for span in spans.spans if span.name.startswith("chat")]
    attributes = dict(chat.attributes or {})
    assert attributes[attrs_.GEN_AI_PROVIDER_NAME] == "openai"
    assert attributes[attrs_.GEN_AI_USAGE_INPUT_TOKENS] == 1_000
    assert attributes[attrs_.GEN_AI_USAGE_OUTPUT_TOKENS] == 300
    assert attributes[attrs_.GEN_AI_USAGE_CACHE_READ_INPUT_TOKENS] == 600
    assert attributes[attrs_.GEN_AI_USAGE_CACHE_CREATION_INPUT_TOKENS] == 50
    assert attributes[attrs_.GEN_AI_USAGE_REASONING_OUTPUT_TOKENS] == 120


def test_the_mcp_duration_names_are_the_conventions() -> None:
    from guardstack.integrations.mcp.tools import operation_duration

    rig = MetricRig()
    for side in ("client", "server"):
        operation_duration(side, rig.provider).record(0.5, {"mcp.method.name": "tools/call"})
    assert len(rig.points(mcp_metrics.MCP_CLIENT_OPERATION_DURATION)) == 1
    assert len(rig.points(mcp_metrics.MCP_SERVER_OPERATION_DURATION)) == 1
