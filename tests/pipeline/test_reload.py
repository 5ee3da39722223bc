"""Hot reload (``Harness.reload``): a new stack between calls, the old one for the calls
in flight, nothing changed by a configuration that does not load, and what plugins keep
in the store carried over by their ids. The property: under random calls and reloads,
no call is lost and every call runs on exactly one version's stack, whole."""

from __future__ import annotations

from pathlib import Path
from typing import Any, ClassVar

import anyio
import attrs
import pytest
from hypothesis import given
from hypothesis import strategies as st

from guardstack.pipeline import (
    TOOL_DENIED,
    TOOL_TIMEOUT,
    TOOL_UNAVAILABLE,
    ConfigError,
    Harness,
    ScriptedModel,
    ToolCall,
    ToolDefinition,
)
from guardstack.wrappers import Tracing
from tests.wrappers.otel import SpanRig

#: What every ``Marker`` layer saw: (call id, its tag), in order.
SEEN: list[tuple[str, str]] = []
#: The spans of the stacks a reload builds from configuration (``RigTracing``).
SPANS = SpanRig()


class RigTracing(Tracing):
    """``Tracing`` into the tests' span rig, for stacks built from configuration."""

    name: ClassVar[str] = "tracing"

    def __init__(self) -> None:
        super().__init__(SPANS.provider)


@attrs.frozen
class Marker:
    """A plugin for the tests: a dispatch layer that notes each call it sees, with its
    tag, at entry and again after the call (so a call spans a reload's instant)."""

    name: ClassVar[str] = "marker"
    tag: str = "?"

    def apply(self, scope: Any) -> None:
        async def before(call: ToolCall, call_next: Any) -> Any:
            SEEN.append((call.call_id, f"{self.tag}-pre"))
            await anyio.sleep(0.01)  # a reload may come now, between two stages
            return await call_next(call)

        async def layer(call: ToolCall, call_next: Any) -> Any:
            SEEN.append((call.call_id, self.tag))
            result = await call_next(call)
            SEEN.append((call.call_id, self.tag))
            return result

        async def after(call: ToolCall, result: Any, call_next: Any) -> Any:
            SEEN.append((call.call_id, f"{self.tag}-post"))
            return await call_next(call, result)

        scope.use(scope.tools.pre_execute, before, name=f"marker-{self.tag}")
        scope.use(scope.tools.dispatch, layer, name=f"marker-{self.tag}")
        scope.use(scope.tools.post_execute, after, name=f"marker-{self.tag}")


def marked(*tags: str) -> list[dict[str, Any]]:
    return [
        {"id": "tracing", "name": f"{__name__}:RigTracing"},
        *(
            {"id": f"m{n}", "name": f"{__name__}:Marker", "config": {"tag": tag}}
            for n, tag in enumerate(tags)
        ),
    ]


def harness_with_tool(hold_s: float = 0.0) -> Harness:
    harness = Harness()

    async def work(arguments: Any, call: ToolCall) -> str:
        await anyio.sleep(float(arguments.get("hold", hold_s)))
        return "done"

    harness.tools.register(ToolDefinition("work", work, timeout_ms=10_000))
    return harness


async def test_the_next_call_runs_on_the_new_stack() -> None:
    harness = harness_with_tool()
    harness.load([{"name": "tool-call-limit", "config": {"per_turn": 5}}])
    reloaded = harness.reload([{"name": "tool-call-limit", "config": {"per_turn": 1}}])
    assert (reloaded.version, reloaded.plugins) == (1, ("tool-call-limit",))
    assert harness.version == 1
    first = await harness.tools.execute(ToolCall("work", {}, "a", conversation="c"))
    second = await harness.tools.execute(ToolCall("work", {}, "b", conversation="c"))
    assert first.result.content == "done"
    assert second.result.code == TOOL_DENIED


def test_a_config_that_does_not_load_changes_nothing(tmp_path: Path) -> None:
    harness = harness_with_tool()
    harness.load([{"name": "timeout", "config": {"ms": 100}}])
    before = harness.describe()
    broken = tmp_path / "stack.yaml"
    broken.write_text(
        "- name: timeout\n  config: {ms: 100}\n- name: retry\n  config: {atempts: 3}\n"
    )
    with pytest.raises(ConfigError) as raised:
        harness.reload(broken)
    message = str(raised.value)
    assert "stack.yaml" in message
    assert "'retry'" in message
    assert "atempts" in message
    assert "did you mean 'attempts'" in message
    with pytest.raises(ConfigError, match="unknown plugin"):
        harness.reload([{"name": "circuit-braker"}])
    with pytest.raises(ConfigError, match="a reload keeps the store"):
        harness.reload([{"name": "redis-store", "config": {"url": "redis://127.0.0.1:1"}}])
    assert harness.describe() == before
    assert harness.version == 0


async def test_a_call_in_flight_finishes_on_the_old_stack() -> None:
    harness = harness_with_tool(hold_s=0.5)
    harness.load([{"name": "timeout", "config": {"ms": 2_000}}])
    results: dict[str, Any] = {}

    async def run(call_id: str) -> None:
        results[call_id] = (await harness.tools.execute(ToolCall("work", {}, call_id))).result

    async with anyio.create_task_group() as group:
        group.start_soon(run, "old")
        await anyio.sleep(0.1)  # in flight
        harness.reload([{"name": "timeout", "config": {"ms": 200}}])
        group.start_soon(run, "new")
    assert results["old"].content == "done"  # its 2 s budget
    assert results["new"].code == TOOL_TIMEOUT  # the new 200 ms one


async def test_what_a_plugin_keeps_in_the_store_carries_over_by_its_id() -> None:
    harness = harness_with_tool()

    async def down(arguments: Any, call: ToolCall) -> str:
        raise RuntimeError("down")

    harness.tools.register(ToolDefinition("down", down))
    breaker = {"name": "circuit-breaker", "config": {"minimum_calls": 2, "failure_ratio": 1.0}}
    harness.load([breaker])
    for n in range(2):
        await harness.tools.execute(ToolCall("down", {}, f"d{n}"))
    harness.reload([breaker, {"name": "retry"}])
    refused = await harness.tools.execute(ToolCall("down", {}, "after"))
    assert refused.result.code == TOOL_UNAVAILABLE  # still open: its window was the store's


def test_check_warnings_are_reported_not_refused() -> None:
    from guardstack.cli.check import check

    harness = harness_with_tool()
    reloaded = harness.reload([{"name": "retry"}], check=check)
    assert any("no cap" in warning for warning in reloaded.warnings)
    assert reloaded.version == 1


@given(
    plan=st.lists(
        st.tuples(st.sampled_from(["call", "reload"]), st.integers(0, 30)), min_size=2, max_size=25
    ),
    holds=st.lists(st.integers(0, 20), min_size=25, max_size=25),
)
async def test_under_load_no_call_is_lost_and_each_runs_on_one_stack_whole(
    plan: list[tuple[str, int]], holds: list[int]
) -> None:
    """Calls and reloads at random instants (multiples of 10 ms; calls hold 0-200 ms);
    stacks alternate between three markers tagged by version and two tagged otherwise:
    every call answers, and every marker a call passed — on the way in and out — is
    of one version, all of that version's markers, in its order."""
    SEEN.clear()
    SPANS.clear()
    harness = harness_with_tool()
    stacks: dict[int, tuple[str, ...]] = {0: ("v0a", "v0b", "v0c")}
    harness.load(marked(*stacks[0]), allow_imports=True)
    answered: dict[str, str] = {}

    async def run(call_id: str, hold: int) -> None:
        outcome = await harness.tools.execute(ToolCall("work", {"hold": hold / 100}, call_id))
        answered[call_id] = outcome.result.content

    started: list[str] = []
    async with anyio.create_task_group() as group:
        for index, (kind, wait) in enumerate(plan):
            await anyio.sleep(wait / 100)
            if kind == "call":
                call_id = f"c{index}"
                started.append(call_id)
                group.start_soon(run, call_id, holds[index])
            else:
                version = harness.version + 1
                tags = (
                    (f"v{version}a", f"v{version}b")
                    if version % 2
                    else (f"v{version}a", f"v{version}b", f"v{version}c")
                )
                stacks[version] = tags
                assert harness.reload(marked(*tags), allow_imports=True).version == version
    assert sorted(answered) == sorted(started)
    assert set(answered.values()) == {"done"} or not answered
    for call_id in started:
        seen = [tag for seen_id, tag in SEEN if seen_id == call_id]
        versions = {tag.split("-")[0].rstrip("abc") for tag in seen}
        assert len(versions) == 1, (call_id, seen)
        stack = stacks[int(versions.pop()[1:])]
        assert seen == [
            *(f"{tag}-pre" for tag in stack),
            *stack,
            *reversed(stack),
            *(f"{tag}-post" for tag in stack),
        ]
    # every call's spans — its execute_tool span and its layers' — name one version
    by_trace: dict[int, set[int]] = {}
    for span in SPANS.spans:
        stamped = (span.attributes or {}).get("guardstack.stack.version", 0)
        assert isinstance(stamped, int)
        by_trace.setdefault(span.context.trace_id, set()).add(stamped)
    assert len(by_trace) == len(started)
    assert all(len(versions) == 1 for versions in by_trace.values())


async def test_watching_a_file_reloads_on_a_change_and_keeps_the_stack_on_a_bad_one(
    tmp_path: Path,
) -> None:
    import io

    from guardstack.cli.watch import watch_config

    config = tmp_path / "stack.yaml"
    config.write_text("- name: timeout\n  config: {ms: 1000}\n")
    harness = harness_with_tool()
    harness.load(config)
    said = io.StringIO()
    async with anyio.create_task_group() as group:
        group.start_soon(lambda: watch_config(harness, config, interval_s=0.5, say=said))
        await anyio.sleep(0.6)
        config.write_text("- name: timeout\n  config: {ms: 100}\n- name: retry\n")
        await anyio.sleep(0.6)
        assert harness.version == 1
        config.write_text("- name: retry\n  config: {atempts: 2}\n")  # a typo
        await anyio.sleep(0.6)
        assert harness.version == 1  # unchanged
        group.cancel_scope.cancel()
    lines = said.getvalue().splitlines()
    assert lines[0] == f"guardstack: {config} reloaded: stack version 1 (timeout, retry)"
    assert lines[-1].startswith(f"guardstack: {config} not reloaded, the stack is unchanged:")
    assert "atempts" in lines[-1]
    assert "timeout: " in harness.describe()


@pytest.mark.parametrize("caller", ["conversation", "agent"])
async def test_a_reload_keeps_the_per_turn_counts_of_a_turn_in_progress(caller: str) -> None:
    """``tool-call-limit {per_turn: 2}``: two calls of a turn, then a reload of the same
    stack (another cap beside it): the turn's third call is still denied — the reloaded
    cap counts on in the turn it was in, it does not start the turn again from zero."""
    harness = harness_with_tool()
    cap = {"name": "tool-call-limit", "config": {"per_turn": 2}}
    harness.load([cap])
    agent = harness.loop.create("a-session", model=ScriptedModel([])) if caller == "agent" else None
    if agent is not None:
        agent.start_turn()

    def work(call_id: str) -> ToolCall:
        if agent is not None:
            return ToolCall("work", {}, call_id, agent)
        return ToolCall("work", {}, call_id, conversation="conv")

    for n in range(2):
        assert (await harness.tools.execute(work(f"c{n}"))).result.content == "done"
    harness.reload([cap, {"name": "retry"}])
    third = await harness.tools.execute(work("c2"))
    assert third.result.code == TOOL_DENIED
    assert "already made 2 tool calls" in third.result.content
    # a new turn of the conversation starts from zero, as before the reload
    if agent is not None:
        agent.start_turn()
        await harness.loop.prompt_submit(agent, "next")
    else:
        harness.reset("conv")
    assert (await harness.tools.execute(work("c3"))).result.content == "done"


async def test_watching_a_file_saved_the_way_editors_save_never_drops_a_cap(
    tmp_path: Path,
) -> None:
    """An editor's save: truncate, write in parts (a cut-off entry between), or write a
    new file and rename it over. The watcher never loads the empty or half-written file
    — the cap holds throughout — and loads the whole new file once it stops changing."""
    import io
    import os

    from guardstack.cli.watch import watch_config

    config = tmp_path / "stack.yaml"
    capped = "- name: tool-call-limit\n  config: {per_turn: 2}\n"
    config.write_text(capped)
    harness = harness_with_tool()
    harness.load(config)
    said = io.StringIO()
    stacks: list[str] = []
    async with anyio.create_task_group() as group:
        group.start_soon(lambda: watch_config(harness, config, interval_s=0.5, say=said))

        async def sample() -> None:  # the stack as a call would find it, every 10 ms
            while True:
                stacks.append(harness.describe())
                await anyio.sleep(0.01)

        group.start_soon(sample)
        await anyio.sleep(0.45)
        # 1. truncated, then nothing more for over a whole interval (an editor paused)
        config.write_text("")
        await anyio.sleep(1.2)
        assert harness.version == 0
        # 2. written in parts, 80 ms apart: the watcher may look at any instant
        whole = capped + "- name: retry\n  config: {attempts: 2}\n"
        config.write_text("")
        for end in (10, 30, len(capped) + 5, len(whole)):
            with config.open("w") as part:
                part.write(whole[:end])
            await anyio.sleep(0.08)
        await anyio.sleep(1.0)
        assert harness.version == 1
        # 3. a new file renamed over the old (whitespace only, first)
        blank = tmp_path / "stack.yaml.tmp"
        blank.write_text("  \n\n# nothing yet\n")
        os.replace(blank, config)
        await anyio.sleep(1.2)
        assert harness.version == 1
        group.cancel_scope.cancel()
    assert all("tool-call-limit" in stack for stack in stacks)  # never a moment without it
    lines = said.getvalue().splitlines()
    assert sum("reloaded:" in line for line in lines) == 1
    assert "(tool-call-limit, retry)" in next(line for line in lines if "reloaded:" in line)
    assert any("the file is empty" in line for line in lines)
