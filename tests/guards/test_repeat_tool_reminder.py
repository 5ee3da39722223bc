"""The repeat-tool reminder: every rule of the original, through the public API."""

from __future__ import annotations

import gc
import json
import math
import weakref
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from guardstack.guards import (
    DETAILED_TEMPLATE,
    GENTLE_TEXT,
    RepeatToolReminder,
    ToolCallTimeoutPolicy,
)
from guardstack.pipeline import (
    Accept,
    Agent,
    Block,
    ConfigError,
    ContextMessage,
    Deny,
    Harness,
    MessageSource,
    ModelReply,
    ScriptedModel,
    Session,
    ToolCall,
    ToolDefinition,
    ToolOutcome,
    ToolResult,
    UserMessage,
)
from guardstack.pipeline.testing import Hang, Raise, ScriptedTool
from tests.helpers import calls

SOURCE = MessageSource("plugin", "repeat-tool-reminder")
OTHER = MessageSource("plugin", "other")


def harness_with(reminder: RepeatToolReminder, *tools: ScriptedTool) -> Harness:
    harness = Harness(model=ScriptedModel([]))
    for tool in tools:
        tool.register(harness.tools)
    harness.plugin(reminder)
    return harness


async def run(
    harness: Harness, agent: Agent | None, name: str, arguments: Any = None, call_id: str = "c"
) -> ToolOutcome:
    return await harness.tools.execute(
        ToolCall(name, {} if arguments is None else arguments, call_id, agent=agent)
    )


def reminder_texts(outcome: ToolOutcome) -> list[str]:
    return [context.text for context in outcome.contexts if context.source == SOURCE]


# -- configuration --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("config", "message"),
    [
        ({"thresholds": []}, "repeat-tool-reminder: `thresholds` must not be empty"),
        (
            {"thresholds": [3, 1]},
            "repeat-tool-reminder: invalid threshold 1 — every threshold must be an integer >= 2",
        ),
        (
            {"thresholds": [2.5]},
            "repeat-tool-reminder: invalid threshold 2.5 — every threshold must be an integer >= 2",
        ),
        ({"thresholds": [True]}, "repeat-tool-reminder: invalid threshold True"),
        ({"thresholds": ["3"]}, "repeat-tool-reminder: invalid threshold '3'"),
        (
            {"thresholds": [3, 5, 3]},
            "repeat-tool-reminder: `thresholds` must not contain duplicates",
        ),
        ({"thresholds": 3}, "repeat-tool-reminder: `thresholds` must be a list of integers"),
        (
            {"arguments_preview_chars": 0},
            "repeat-tool-reminder: invalid arguments_preview_chars 0 — must be an integer >= 1",
        ),
        ({"arguments_preview_chars": 1.5}, "invalid arguments_preview_chars 1.5"),
        ({"include": "grep"}, "repeat-tool-reminder: `include` must be a list of tool-name"),
        ({"exclude": [""]}, "repeat-tool-reminder: `exclude` must be a list of tool-name"),
    ],
)
def test_bad_configuration_fails_loud_with_the_originals_messages(
    config: dict[str, Any], message: str
) -> None:
    with pytest.raises(ConfigError) as raised:
        RepeatToolReminder(**config)
    assert message in str(raised.value)


def test_thresholds_are_sorted_and_integral_floats_accepted() -> None:
    assert RepeatToolReminder(thresholds=[8, 3.0, 5]).thresholds == (3, 5, 8)


@pytest.mark.parametrize(
    ("include", "exclude", "name", "tracked"),
    [
        ((), (), "anything", True),
        (("grep",), (), "grep", True),
        (("grep",), (), "grep2", False),  # the whole name must match
        (("pr.be",), (), "probe", False),  # everything but `*` is literal
        (("pr.be",), (), "pr.be", True),
        (("read_*",), (), "read_file", True),
        (("read_*",), ("read_secret",), "read_secret", False),
        ((), ("todo_*",), "todo_write", False),
        (("*",), (), "", True),
        (("never-matches",), (), "grep", False),
    ],
)
def test_patterns_match_whole_names_with_star_wildcards(
    include: tuple[str, ...], exclude: tuple[str, ...], name: str, tracked: bool
) -> None:
    assert RepeatToolReminder(include=include, exclude=exclude).tracks(name) is tracked


# -- detection and texts ------------------------------------------------------------------


async def test_gentle_then_detailed_reminders_at_each_threshold_and_none_after() -> None:
    harness = harness_with(RepeatToolReminder(thresholds=(3, 5)), ScriptedTool("grep"))
    agent = harness.loop.create("a")
    texts = [reminder_texts(await run(harness, agent, "grep", {"q": "x"})) for _ in range(8)]
    detailed = DETAILED_TEMPLATE.format(tool="grep", count=5, arguments='{"q":"x"}')
    assert texts == [[], [], [GENTLE_TEXT], [], [detailed], [], [], []]
    assert detailed == (
        "Repeated tool call detected:\n- tool: grep\n- consecutive_calls: 5\n"
        '- arguments: {"q":"x"}\nThe repeated calls are not making progress. Do not call this '
        "tool with these exact arguments again. Inspect the latest result and choose a "
        "different action, different arguments, or finish the task if enough evidence has "
        "been gathered."
    )
    assert GENTLE_TEXT == (
        "You are repeating the exact same tool call with identical arguments. Carefully analyze "
        "the previous result before calling again: if the task is not complete, try a different "
        "approach or different arguments instead of repeating the call."
    )


async def test_key_order_and_integral_floats_do_not_break_a_chain() -> None:
    harness = harness_with(RepeatToolReminder(thresholds=(3,)), ScriptedTool("grep"))
    agent = harness.loop.create("a")
    await run(harness, agent, "grep", {"q": "x", "n": 1, "opts": {"b": 2, "a": [1, 2]}})
    await run(harness, agent, "grep", {"opts": {"a": [1, 2], "b": 2.0}, "n": 1.0, "q": "x"})
    third = await run(harness, agent, "grep", {"n": 1, "q": "x", "opts": {"b": 2, "a": [1, 2]}})
    assert reminder_texts(third) == [GENTLE_TEXT]


async def test_array_order_and_other_arguments_do_break_a_chain() -> None:
    harness = harness_with(RepeatToolReminder(thresholds=(2,)), ScriptedTool("grep"))
    agent = harness.loop.create("a")
    await run(harness, agent, "grep", {"a": [1, 2]})
    assert reminder_texts(await run(harness, agent, "grep", {"a": [2, 1]})) == []
    assert reminder_texts(await run(harness, agent, "grep", {"a": [2, 1]})) == [GENTLE_TEXT]


async def test_untracked_calls_neither_count_nor_reset() -> None:
    reminder = RepeatToolReminder(thresholds=(2, 3), exclude=("todo_write",))
    harness = harness_with(reminder, ScriptedTool("grep"), ScriptedTool("todo_write"))
    agent = harness.loop.create("a")
    await run(harness, agent, "grep", {"q": "X"})
    for _ in range(3):
        assert reminder_texts(await run(harness, agent, "todo_write", {})) == []
    assert reminder_texts(await run(harness, agent, "grep", {"q": "X"})) == [GENTLE_TEXT]


async def test_the_preview_is_capped_in_utf16_units_while_detection_uses_all() -> None:
    reminder = RepeatToolReminder(thresholds=(2, 3), arguments_preview_chars=10)
    harness = harness_with(reminder, ScriptedTool("write"))
    agent = harness.loop.create("a")
    long_a = {"text": "😀" * 20 + "A"}
    long_b = {"text": "😀" * 20 + "B"}  # same preview, different call
    await run(harness, agent, "write", long_a)
    await run(harness, agent, "write", long_b)
    assert reminder_texts(await run(harness, agent, "write", long_b)) == [GENTLE_TEXT]
    texts = reminder_texts(await run(harness, agent, "write", long_b))
    canonical = '{"text":"' + "😀" * 20 + 'B"}'  # 9 + 40 + 3 = 52 UTF-16 units
    assert texts == [
        DETAILED_TEMPLATE.format(tool="write", count=3, arguments='{"text":"… (+43 more chars)')
    ]
    assert len(canonical.encode("utf-16-le")) // 2 == 52
    reminder_ascii = RepeatToolReminder(thresholds=(2, 3), arguments_preview_chars=5)
    assert reminder_ascii.reminder("t", "0123456789", 3).text == DETAILED_TEMPLATE.format(
        tool="t", count=3, arguments="01234… (+5 more chars)"
    )


async def test_denied_unknown_failed_and_timed_out_calls_all_count() -> None:
    async def deny_rm(call: ToolCall, call_next: Any) -> Any:
        return Deny("no") if call.name == "rm" else await call_next(call)

    harness = harness_with(
        RepeatToolReminder(thresholds=(2,)),
        ScriptedTool("rm"),
        ScriptedTool("boom", [Raise(ValueError("x"))]),
        ScriptedTool("slow", [Hang()], timeout_ms=100),
    )
    harness.tools.pre_execute.use(deny_rm)
    harness.plugin(ToolCallTimeoutPolicy())
    agent = harness.loop.create("a")
    for name in ("rm", "ghost", "boom", "slow"):
        first = await run(harness, agent, name)
        second = await run(harness, agent, name)
        assert first.result.is_error
        assert second.result.is_error
        assert reminder_texts(second) == [GENTLE_TEXT], name


async def test_unparseable_arguments_count_as_their_raw_text() -> None:
    harness = harness_with(RepeatToolReminder(thresholds=(2, 3)), ScriptedTool("grep"))
    agent = harness.loop.create("a")
    await run(harness, agent, "grep", '{"q": x')
    await run(harness, agent, "grep", '{"q": x')
    texts = reminder_texts(await run(harness, agent, "grep", '{"q": x'))
    assert texts == [DETAILED_TEMPLATE.format(tool="grep", count=3, arguments='"{\\"q\\": x"')]


async def test_calls_without_an_agent_count_in_their_conversation() -> None:
    harness = harness_with(RepeatToolReminder(thresholds=(2,)), ScriptedTool("grep"))

    async def texts(conversation: str) -> list[str]:
        call = ToolCall("grep", {}, "c", conversation=conversation)
        return reminder_texts(await harness.tools.execute(call))

    assert await texts("a") == []
    assert await texts("b") == []
    assert await texts("a") == [GENTLE_TEXT]


async def test_each_agent_has_its_own_chain() -> None:
    harness = harness_with(RepeatToolReminder(thresholds=(2,)), ScriptedTool("grep"))
    first, second = harness.loop.create("one"), harness.loop.create("two")
    await run(harness, first, "grep")
    assert reminder_texts(await run(harness, second, "grep")) == []
    assert reminder_texts(await run(harness, first, "grep")) == [GENTLE_TEXT]


@pytest.mark.parametrize("downstream", ["accept", "accept-value", "block"])
async def test_the_reminder_is_prepended_to_the_downstream_decision(downstream: str) -> None:
    theirs = ContextMessage("downstream note", OTHER)

    async def inner(call: ToolCall, result: ToolResult, call_next: Any) -> Any:
        if downstream == "block":
            return Block("blocked by policy", additional_contexts=[theirs])
        value = {"replaced": True} if downstream == "accept-value" else None
        return Accept(value=value, additional_contexts=[theirs])

    harness = harness_with(RepeatToolReminder(thresholds=(2,)), ScriptedTool("grep", ["found"]))
    harness.tools.post_execute.use(inner)
    agent = harness.loop.create("a")
    await run(harness, agent, "grep")
    outcome = await run(harness, agent, "grep")
    assert outcome.contexts == (ContextMessage(GENTLE_TEXT, SOURCE), theirs)
    expected_content = {
        "accept": "found",
        "accept-value": '{"replaced": true}',
        "block": "blocked by policy",
    }[downstream]
    assert outcome.result.content == expected_content


async def test_canonicalisation_never_raises_and_odd_values_still_chain() -> None:
    cyclic: dict[str, Any] = {"n": 1}
    cyclic["self"] = cyclic

    class Thing:
        def __init__(self) -> None:
            self.size = 3

    odd_arguments = [
        {"b": b"\x00\xff"},
        {"s": {3, 1, 2}},
        {"f": math.nan},
        cyclic,
        {"o": Thing()},
        {"k": {1: "int key", "1.5": 2}},
        {"u": "\ud800"},
    ]
    harness = harness_with(RepeatToolReminder(thresholds=(2,)), ScriptedTool("t"))
    agent = harness.loop.create("a")
    for arguments in odd_arguments:
        await run(harness, agent, "t", arguments)
        second = await run(harness, agent, "t", arguments)
        assert reminder_texts(second) == [GENTLE_TEXT], arguments
        await run(harness, agent, "t", {"reset": True})


async def test_a_new_prompt_resets_the_agents_chain_in_a_real_loop() -> None:
    grep = ("grep", {"q": "x"})
    model = ScriptedModel(
        [
            calls(grep),
            calls(grep),
            ModelReply("stuck"),
            calls(grep),
            calls(grep),
            calls(grep),
            ModelReply("done"),
        ]
    )
    harness = Harness(model=model)
    ScriptedTool("grep").register(harness.tools)
    harness.load([{"name": "@deepseek-ai/dsh-repeat-tool-reminder", "config": {"thresholds": [3]}}])
    agent = harness.loop.create("a")
    await agent.prompt("first")  # two greps: no reminder
    await agent.prompt("second")  # chain reset: the third grep of this turn is the 3rd
    reminders = [
        (index, e)
        for index, e in enumerate(agent.session.events)
        if isinstance(e, UserMessage) and e.source == SOURCE
    ]
    assert len(reminders) == 1
    index, message = reminders[0]
    assert message.text == GENTLE_TEXT
    # it follows the step's tool result, and the model saw it on the next request
    assert agent.session.events[index - 1].type == "tool/result"
    assert model.requests[-1][-1] == {"role": "user", "content": GENTLE_TEXT}
    # the tool's own output stays in the log untouched
    assert model.requests[-1][-2] == {"role": "tool", "tool_call_id": "call_2_3_0", "content": "ok"}


async def test_state_dies_with_the_agent_and_a_restored_session_starts_fresh() -> None:
    async def grep(arguments: Any, call: ToolCall) -> str:
        return "no match"  # unlike ScriptedTool, keeps no reference to the call

    harness = harness_with(RepeatToolReminder(thresholds=(2,)))
    harness.tools.register(ToolDefinition("grep", grep))
    agent = harness.loop.create("a")
    await run(harness, agent, "grep")
    saved = agent.session.to_jsonl()
    alive = weakref.ref(agent)
    del agent
    gc.collect()
    assert alive() is None  # the guard did not keep the agent alive
    restored = harness.loop.create("a", session=Session.from_jsonl(saved))
    assert reminder_texts(await run(harness, restored, "grep")) == []
    assert reminder_texts(await run(harness, restored, "grep")) == [GENTLE_TEXT]


def test_the_reminder_is_not_a_tool_the_model_sees() -> None:
    harness = harness_with(RepeatToolReminder(), ScriptedTool("grep"))
    assert [schema["function"]["name"] for schema in harness.tools.schemas()] == ["grep"]


# -- the chain against a reference model, over random interleavings ------------------------

TOOLS = ["grep", "read_file", "read_secret", "todo_write", "grep_denied", "ghost", "other"]
ARGUMENT_VARIANTS = [
    {"q": "x", "n": 1},
    {"n": 1.0, "q": "x"},  # the same call as the first
    {"q": "y", "n": 1},
    {"n": 2, "q": "x", "extra": [1, 2]},
    {"extra": [1, 2], "q": "x", "n": 2},  # the same as the previous
]
actions = st.lists(
    st.one_of(
        st.tuples(
            st.just("call"),
            st.integers(0, 2),
            st.sampled_from(TOOLS),
            st.integers(0, len(ARGUMENT_VARIANTS) - 1),
            st.randoms(use_true_random=False),  # shuffles the key order of the call
        ),
        st.tuples(st.just("prompt"), st.integers(0, 2)),
    ),
    max_size=40,
)


def reference_key(name: str, arguments: dict[str, Any]) -> str:
    normal = {
        k: (int(v) if isinstance(v, float) and v.is_integer() else v) for k, v in arguments.items()
    }
    return json.dumps([name, normal], sort_keys=True)


@given(actions=actions)
async def test_chains_match_a_reference_model(actions: list[tuple[Any, ...]]) -> None:
    reminder = RepeatToolReminder(
        thresholds=(2, 4), include=("grep*", "read_*", "ghost"), exclude=("read_secret", "todo_*")
    )
    harness = Harness(model=ScriptedModel([]))
    for name in ("grep", "read_file", "read_secret", "todo_write", "grep_denied", "other"):
        ScriptedTool(name).register(harness.tools)

    async def deny(call: ToolCall, call_next: Any) -> Any:
        return Deny("denied") if call.name == "grep_denied" else await call_next(call)

    harness.tools.pre_execute.use(deny)
    harness.plugin(reminder)
    agents = [harness.loop.create(f"agent-{index}") for index in range(3)]
    tracked = {"grep", "read_file", "grep_denied", "ghost"}
    chains: dict[int, tuple[str, int]] = {}
    for action in actions:
        if action[0] == "prompt":
            await harness.loop.prompt_submit(agents[action[1]], "new prompt")
            chains.pop(action[1], None)
            continue
        _, who, name, variant, shuffler = action
        arguments = ARGUMENT_VARIANTS[variant]
        keys = list(arguments)
        shuffler.shuffle(keys)
        outcome = await run(harness, agents[who], name, {key: arguments[key] for key in keys})
        expected: list[str] = []
        if name in tracked:
            key = reference_key(name, arguments)
            previous = chains.get(who)
            count = previous[1] + 1 if previous and previous[0] == key else 1
            chains[who] = (key, count)
            if count == 2:
                expected = [GENTLE_TEXT]
            elif count == 4:
                expected = [
                    DETAILED_TEMPLATE.format(
                        tool=name, count=4, arguments=outcome_arguments(arguments)
                    )
                ]
        assert reminder_texts(outcome) == expected


def outcome_arguments(arguments: dict[str, Any]) -> str:
    normal = {
        k: (int(v) if isinstance(v, float) and v.is_integer() else v) for k, v in arguments.items()
    }
    return json.dumps(normal, sort_keys=True, separators=(",", ":"))
