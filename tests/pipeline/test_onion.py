"""The onion: first registered is outermost, disposal, describe, instrumentation."""

from __future__ import annotations

from typing import Any

import attrs
import pytest
from hypothesis import given
from hypothesis import strategies as st

from guardstack.pipeline import (
    TOOL_FAILED,
    Pipeline,
    ToolCall,
    ToolDefinition,
    ToolRegistry,
    ToolResult,
)
from guardstack.pipeline.contract import LayerInfo
from guardstack.pipeline.testing import RecordingLayer
from tests.helpers import call


async def _terminal(value: str) -> str:
    return f"<{value}>"


async def test_first_registered_layer_is_outermost() -> None:
    log: list[tuple[str, str]] = []
    pipeline: Pipeline[Any, Any] = Pipeline(_terminal, stage="test")
    for name in ("a", "b", "c"):
        pipeline.use(RecordingLayer(name, log))
    assert await pipeline("x") == "<x>"
    assert log == [
        ("enter", "a"),
        ("enter", "b"),
        ("enter", "c"),
        ("exit", "c"),
        ("exit", "b"),
        ("exit", "a"),
    ]


async def test_dispose_removes_exactly_that_layer_and_is_idempotent() -> None:
    log: list[tuple[str, str]] = []
    pipeline: Pipeline[Any, Any] = Pipeline(_terminal, stage="test")
    registrations = [pipeline.use(RecordingLayer(name, log)) for name in "abc"]
    registrations[1].dispose()
    registrations[1].dispose()
    assert not registrations[1].active
    await pipeline("x")
    assert [name for event, name in log if event == "enter"] == ["a", "c"]
    assert pipeline.describe().splitlines() == [
        "0. a: RecordingLayer('a')",
        "1. c: RecordingLayer('c')",
    ]


def test_describe_names_function_and_object_layers_outermost_first() -> None:
    async def audit(value: str, call_next: Any) -> Any:
        return await call_next(value)

    class Named:
        name = "custom-name"

        async def __call__(self, value: str, call_next: Any) -> Any:
            return await call_next(value)

        def __repr__(self) -> str:
            return "Named()"

    class Anonymous:
        async def __call__(self, value: str, call_next: Any) -> Any:
            return await call_next(value)

        def __repr__(self) -> str:
            return "Anonymous()"

    pipeline: Pipeline[Any, Any] = Pipeline(_terminal, stage="test")
    assert pipeline.describe() == "(no layers)"
    pipeline.use(audit)
    pipeline.use(Named())
    pipeline.use(Anonymous())
    pipeline.use(audit, name="renamed")
    assert pipeline.describe().splitlines() == [
        "0. audit",
        "1. custom-name: Named()",
        "2. Anonymous: Anonymous()",
        "3. renamed",
    ]


async def test_chain_is_composed_per_change_not_per_call() -> None:
    composed: list[LayerInfo] = []

    def hook(layer: Any, info: LayerInfo) -> Any:
        composed.append(info)
        return layer

    pipeline: Pipeline[Any, Any] = Pipeline(_terminal, stage="test")
    pipeline.instrument(hook)
    pipeline.use(RecordingLayer("a"))
    pipeline.use(RecordingLayer("b"))
    before = len(composed)
    for _ in range(10):
        await pipeline("x")
    assert len(composed) == before == 3  # once for [a], twice for [a, b]
    assert composed[-2:] == [LayerInfo("test", "b", 1), LayerInfo("test", "a", 0)]


async def test_instrumentation_wraps_every_layer_until_disposed() -> None:
    seen: list[str] = []

    def hook(layer: Any, info: LayerInfo) -> Any:
        async def wrapped(value: str, call_next: Any) -> Any:
            seen.append(f"{info.index}:{info.name}")
            return await layer(value, call_next)

        return wrapped

    pipeline: Pipeline[Any, Any] = Pipeline(_terminal, stage="test")
    pipeline.use(RecordingLayer("a"))
    registration = pipeline.instrument(hook)
    pipeline.use(RecordingLayer("b"))
    await pipeline("x")
    assert seen == ["0:a", "1:b"]
    registration.dispose()
    await pipeline("x")
    assert seen == ["0:a", "1:b"]


# -- the ordering property ----------------------------------------------------------------


class LayerBoom(Exception):
    pass


@attrs.frozen
class Spec:
    """A random layer: what it does when called."""

    ident: int
    behaviour: str  # "pass", "tag" (passes a changed call inward), "short", "raise"


class SpecLayer:
    def __init__(self, spec: Spec, log: list[tuple[str, int]]) -> None:
        self.spec, self.log = spec, log
        self.name = f"layer{spec.ident}"

    async def __call__(self, call: ToolCall, call_next: Any) -> ToolResult:
        self.log.append(("enter", self.spec.ident))
        try:
            if self.spec.behaviour == "short":
                return ToolResult(f"short {self.spec.ident}")
            if self.spec.behaviour == "raise":
                raise LayerBoom(f"boom {self.spec.ident}")
            if self.spec.behaviour == "tag":
                arguments = dict(call.arguments)  # type: ignore[arg-type]
                arguments["path"] = [*arguments["path"], self.spec.ident]
                call = attrs.evolve(call, arguments=arguments)
            result: ToolResult = await call_next(call)
            return result
        finally:
            self.log.append(("exit", self.spec.ident))


specs = st.lists(st.sampled_from(["pass", "tag", "short", "raise"]), max_size=8).map(
    lambda behaviours: [Spec(index, behaviour) for index, behaviour in enumerate(behaviours)]
)


@given(specs=specs, disposed=st.sets(st.integers(0, 7)))
async def test_trace_is_exactly_the_nesting_implied_by_registration_order(
    specs: list[Spec], disposed: set[int]
) -> None:
    log: list[tuple[str, int]] = []
    seen_paths: list[list[int]] = []

    async def tool(arguments: Any, tool_call: ToolCall) -> str:
        seen_paths.append(list(arguments["path"]))
        return "tool"

    post_calls: list[ToolCall] = []

    async def post(tool_call: ToolCall, result: ToolResult, call_next: Any) -> Any:
        post_calls.append(tool_call)
        return await call_next(tool_call, result)

    registry = ToolRegistry()
    registry.register(ToolDefinition("t", tool))
    registry.post_execute.use(post)
    registrations = [registry.dispatch.use(SpecLayer(spec, log)) for spec in specs]
    for index in disposed:
        if index < len(registrations):
            registrations[index].dispose()

    original = call("t", {"path": []})
    outcome = await registry.execute(original)

    # The model: walk the live layers outermost first until one stops the call.
    live = [spec for spec in specs if spec.ident not in disposed]
    entered: list[int] = []
    expected_path: list[int] = []
    stopper = None
    for spec in live:
        entered.append(spec.ident)
        if spec.behaviour in ("short", "raise"):
            stopper = spec
            break
        if spec.behaviour == "tag":
            expected_path.append(spec.ident)
    expected_log = [("enter", i) for i in entered] + [("exit", i) for i in reversed(entered)]
    assert log == expected_log
    assert [
        line.split(". ")[1].split(":")[0]
        for line in registry.dispatch.describe().splitlines()
        if ". " in line
    ] == [f"layer{spec.ident}" for spec in live]

    if stopper is None:
        assert outcome.result == ToolResult("tool")
        assert seen_paths == [expected_path]
    elif stopper.behaviour == "short":
        assert outcome.result == ToolResult(f"short {stopper.ident}")
        assert seen_paths == []
    else:
        assert outcome.result.code == TOOL_FAILED
        assert outcome.result.error is not None
        assert outcome.result.error.name == "LayerBoom"
        assert outcome.result.content == (
            f'Error: dispatch layer "layer{stopper.ident}" failed: boom {stopper.ident}'
        )
        assert seen_paths == []
    # post-execute sees the caller's call, not an inner layer's changed copy,
    # and is skipped only when a layer raised (a final result).
    if stopper is not None and stopper.behaviour == "raise":
        assert post_calls == []
    else:
        assert len(post_calls) == 1
        seen = post_calls[0]
        assert (seen.name, seen.arguments, seen.call_id) == ("t", {"path": []}, "call-1")


class _Uninspectable:
    """A terminal whose signature must not be read."""

    @property
    def __signature__(self) -> Any:
        raise AssertionError("the stage read its terminal's signature")

    async def __call__(self, call: str, result: str) -> str:
        return f"{call}={result}"


async def test_a_stage_that_declares_its_arity_never_reads_its_terminals_signature() -> None:
    """The registry's and the loop's stages say how many arguments their calls carry
    (``post_execute``: the call and its result) instead of inspecting a function."""
    pipeline: Pipeline[Any, Any] = Pipeline(_Uninspectable(), stage="test", arity=2)

    async def upper(call: str, result: str, call_next: Any) -> str:
        return str(await call_next(call, result.upper()))

    pipeline.use(upper)
    assert await pipeline("a", "b") == "a=B"
    with pytest.raises(AssertionError, match="signature"):
        Pipeline(_Uninspectable(), stage="test")
