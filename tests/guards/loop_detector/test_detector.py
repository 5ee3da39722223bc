"""LoopDetector: each pattern on its shape, not on look-alikes; the ladder; properties."""

from __future__ import annotations

import itertools
from collections.abc import Mapping
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from guardstack.guards import LoopDetector
from guardstack.pipeline import (
    TOOL_DENIED,
    ConfigError,
    Harness,
    ModelReply,
    ScriptedModel,
    ToolCall,
    ToolCallRequest,
    ToolDefinition,
    ToolOutcome,
    ToolResult,
)

_ids = itertools.count()


class Tools:
    """Tools whose answers a test scripts per call: a value, or an exception to raise."""

    def __init__(self) -> None:
        self.answers: dict[str, Any] = {}

    async def run(self, arguments: Mapping[str, Any], call: ToolCall) -> Any:
        answer = self.answers.get(call.name, "ok")
        if callable(answer):
            answer = answer(arguments)
        if isinstance(answer, Exception):
            raise answer
        return answer


def detector_harness(detector: LoopDetector, tools: Tools) -> Harness:
    built = Harness()
    for name in ("read", "edit", "test", "grep", "poll", "todo", "list"):
        built.tools.register(ToolDefinition(name, tools.run))
    built.plugin(detector)
    return built


async def calls(built: Harness, *sequence: tuple[str, dict[str, Any]]) -> list[ToolOutcome]:
    outcomes = []
    for name, arguments in sequence:
        call = ToolCall(name, arguments, f"c{next(_ids)}", conversation="conversation")
        outcomes.append(await built.tools.execute(call))
    return outcomes


def first_detection(outcomes: list[ToolOutcome]) -> int | None:
    """The 1-based index of the first call that got a reminder, a denial or an end."""
    for index, outcome in enumerate(outcomes, start=1):
        if outcome.contexts or outcome.result.code == TOOL_DENIED or outcome.ends_turn:
            return index
    return None


ONLY = {
    "identical": None,
    "cycle": None,
    "no_progress": None,
    "repeated_error": None,
    "walking": None,
    "poll": None,
}


def only(pattern: str, threshold: int, **ladder: Any) -> LoopDetector:
    return LoopDetector(**{**ONLY, pattern: threshold, "deny": None, "end_turn": None, **ladder})


async def test_identical_fires_at_its_threshold_whatever_the_key_order() -> None:
    tools = Tools()
    tools.answers["read"] = lambda a: f"page {a}"  # varying results: not no_progress
    built = detector_harness(only("identical", 3), tools)
    outcomes = await calls(
        built, ("read", {"a": 1, "b": 2}), ("read", {"b": 2, "a": 1}), ("read", {"a": 1, "b": 2})
    )
    assert first_detection(outcomes) == 3
    assert "was called with the same arguments 3 times" in outcomes[2].contexts[0].text
    assert outcomes[2].contexts[0].source.plugin == "loop-detector"


async def test_identical_does_not_fire_on_a_batch_of_different_arguments() -> None:
    built = detector_harness(LoopDetector(), Tools())
    outcomes = await calls(built, *(("edit", {"file": f"f{n}.py"}) for n in range(30)))
    assert first_detection(outcomes) is None


async def test_a_cycle_of_two_fires_and_pagination_does_not() -> None:
    tools = Tools()
    tools.answers["test"] = "1 failed"
    tools.answers["edit"] = "patch does not apply"
    built = detector_harness(only("cycle", 3), tools)
    ab = [("edit", {"f": "x", "patch": "p"}), ("test", {})] * 3
    assert first_detection(await calls(built, *ab)) == 6
    tools.answers["list"] = lambda a: f"items {a['page'] * 20}-{a['page'] * 20 + 19}"
    built = detector_harness(only("cycle", 3), tools)
    pages = [("list", {"page": n}) for n in range(20)]
    assert first_detection(await calls(built, *pages)) is None


async def test_a_test_fix_cycle_that_makes_progress_is_not_a_cycle() -> None:
    tools = Tools()
    tools.answers["test"] = lambda a: f"{8 - a['run']} failed"
    built = detector_harness(LoopDetector(), tools)
    sequence: list[tuple[str, dict[str, Any]]] = []
    for attempt in range(8):
        sequence += [("edit", {"f": "x", "patch": f"fix {attempt}"}), ("test", {"run": attempt})]
    assert first_detection(await calls(built, *sequence)) is None


async def test_no_progress_fires_on_a_poll_that_never_changes_and_not_on_one_that_does() -> None:
    tools = Tools()
    tools.answers["poll"] = "3 items in the queue"
    built = detector_harness(only("no_progress", 4), tools)
    assert first_detection(await calls(built, *[("poll", {"job": 1})] * 6)) == 4
    states = iter(["1 item", "1 item", "1 item", "done"])
    tools.answers["poll"] = lambda a: next(states)
    built = detector_harness(only("no_progress", 4), tools)
    assert first_detection(await calls(built, *[("poll", {"job": 1})] * 4)) is None


async def test_a_pending_status_is_a_poll_given_its_own_patience_whatever_the_tool_is_called() -> (
    None
):
    tools = Tools()
    tools.answers["list"] = "job 7: running"
    built = detector_harness(only("poll", 6, no_progress=3, identical=3), tools)
    outcomes = await calls(built, *[("list", {"job": 7})] * 8)
    assert first_detection(outcomes) == 6  # not at 3: a pending status is waited for
    assert "answered the same pending status 6 times" in outcomes[5].contexts[0].text
    progress = iter(f"job 7: running, {n * 10}% done" for n in range(20))
    tools.answers["list"] = lambda a: next(progress)
    built = detector_harness(LoopDetector(remind=1, deny=2, end_turn=3), tools)
    outcomes = await calls(built, *[("list", {"job": 7})] * 20)
    assert first_detection(outcomes) is None  # it advances: never a loop, never denied


async def test_repeated_error_fires_and_a_retry_with_changed_arguments_does_not() -> None:
    tools = Tools()
    tools.answers["grep"] = RuntimeError("bad pattern")
    built = detector_harness(only("repeated_error", 3), tools)
    outcomes = await calls(built, *[("grep", {"q": "("})] * 3)
    assert first_detection(outcomes) == 3
    assert "failed the same way 3 times" in outcomes[2].contexts[0].text
    built = detector_harness(only("repeated_error", 3), tools)
    changed = [("grep", {"q": q}) for q in ("(", "\\(", "[(]")]
    assert first_detection(await calls(built, *changed)) is None


async def test_excluded_tools_are_transparent() -> None:
    built = detector_harness(LoopDetector(identical=3, exclude=["todo"]), Tools())
    sequence = [("read", {"a": 1}), ("todo", {"x": 1}), ("read", {"a": 1}), ("todo", {"x": 2})]
    outcomes = await calls(built, *sequence, ("read", {"a": 1}))
    assert first_detection(outcomes) == 5


async def test_the_ladder_reminds_then_denies_then_ends_the_turn() -> None:
    tools = Tools()
    answers = itertools.cycle(["a", "b"])  # alternating: identical, never no_progress
    tools.answers["read"] = lambda a: next(answers)
    built = detector_harness(LoopDetector(identical=3, remind=1, deny=2, end_turn=4), tools)
    outcomes = await calls(built, *[("read", {"a": 1})] * 6)
    kinds = [
        "end"
        if o.ends_turn
        else "deny"
        if o.result.code == TOOL_DENIED
        else "remind"
        if o.contexts
        else "-"
        for o in outcomes
    ]
    assert kinds == ["-", "-", "remind", "deny", "deny", "end"]
    assert "loop-detector: Potential loop detected" in outcomes[3].result.content


async def test_a_persons_prompt_resets_the_ladder_but_not_the_evidence() -> None:
    """Two identical reads a turn: across the person's prompt they are four in a row, so
    the second turn's first read is the third and is reminded (the ladder starts again
    at ``remind``); with ``across_turns=False`` each turn starts from nothing."""
    same = ModelReply(tool_calls=[ToolCallRequest("read", {"a": 1})])
    for across, reminded in ((True, True), (False, False)):
        model = ScriptedModel([same, same, ModelReply("done"), same, same, ModelReply("done")])
        built = detector_harness(LoopDetector(identical=3, across_turns=across), Tools())
        built.loop.model = model
        agent = built.loop.create("s")
        first = await agent.prompt("one")
        assert not any("loop" in str(m["content"]) for m in agent.session.messages())
        turn = await agent.prompt("two")
        assert (first.reason, turn.reason) == ("completed", "completed")
        texts = [str(m["content"]) for m in agent.session.messages() if m["role"] != "system"]
        assert any("Potential loop" in text for text in texts) is reminded


async def test_identical_calls_in_one_parallel_step_count_once() -> None:
    triple = ModelReply(tool_calls=[ToolCallRequest("read", {"a": 1})] * 3)
    for once, expected in ((True, False), (False, True)):
        built = Harness(ScriptedModel([triple, ModelReply("done")]), max_parallel_tool_calls=3)
        built.tools.register(ToolDefinition("read", Tools().run))
        built.plugin(LoopDetector(identical=3, count_parallel_once=once))
        agent = built.loop.create("s")
        await agent.prompt("go")
        reminded = any("loop" in str(m["content"]) for m in agent.session.messages()[1:])
        assert reminded is expected


def test_bad_config_names_the_plugin_key_and_value() -> None:
    with pytest.raises(ConfigError, match=r"loop-detector.*identical.*1"):
        LoopDetector(identical=1)
    with pytest.raises(ConfigError, match=r"loop-detector.*end_turn"):
        LoopDetector(deny=4, end_turn=2)
    with pytest.raises(ConfigError, match="loop-detector"):
        Harness().load([{"id": "x", "name": "loop-detector", "config": {"noProgress": "many"}}])


# -- properties ------------------------------------------------------------------------------

names = st.sampled_from(["read", "edit", "test"])
arguments = st.dictionaries(st.sampled_from(["a", "b", "c"]), st.integers(0, 2), max_size=3)
steps = st.lists(st.tuples(names, arguments), max_size=25)


def signature(outcomes: list[ToolOutcome]) -> list[tuple[str | None, int, bool]]:
    return [(o.result.code, len(o.contexts), o.ends_turn) for o in outcomes]


@given(sequence=steps, bookkeeping=st.lists(st.integers(0, 25), max_size=6))
async def test_excluded_tools_never_change_a_decision(
    sequence: list[tuple[str, dict[str, Any]]], bookkeeping: list[int]
) -> None:
    detector = LoopDetector(identical=3, cycle=2, no_progress=3, exclude=["todo"])
    plain = await calls(detector_harness(detector, Tools()), *sequence)
    interleaved = list(sequence)
    for position in sorted(bookkeeping, reverse=True):
        interleaved.insert(min(position, len(interleaved)), ("todo", {"n": position}))
    mixed = await calls(detector_harness(detector, Tools()), *interleaved)
    watched = [o for o, (name, _) in zip(mixed, interleaved, strict=True) if name != "todo"]
    assert signature(watched) == signature(plain)


@given(sequence=steps)
async def test_key_order_never_matters(sequence: list[tuple[str, dict[str, Any]]]) -> None:
    detector = LoopDetector(identical=3, cycle=2)
    forward = await calls(detector_harness(detector, Tools()), *sequence)
    reordered = [(name, dict(reversed(list(args.items())))) for name, args in sequence]
    backward = await calls(detector_harness(detector, Tools()), *reordered)
    assert signature(backward) == signature(forward)


@given(sequence=steps)
async def test_the_ladder_only_moves_forward_within_a_turn(
    sequence: list[tuple[str, dict[str, Any]]],
) -> None:
    tools = Tools()
    built = detector_harness(LoopDetector(identical=2, cycle=2, deny=2, end_turn=4), tools)
    outcomes = await calls(built, *sequence)
    rungs = [2 if o.ends_turn else 1 if o.result.code == TOOL_DENIED else 0 for o in outcomes]
    climbed = 0
    for rung in rungs:
        if rung:
            assert rung >= climbed  # once denying, never back to merely reminding
            climbed = rung


weird = st.recursive(
    st.none() | st.booleans() | st.floats(allow_nan=True) | st.text(max_size=5),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=3), inner),
    max_leaves=8,
)


@given(values=st.lists(st.tuples(weird, weird), max_size=10))
async def test_nothing_is_ever_raised_on_any_arguments_or_results(values: list[Any]) -> None:
    built = Harness()

    async def echo(arguments: Any, call: ToolCall) -> Any:
        return arguments.get("answer")

    built.tools.register(ToolDefinition("echo", echo))
    built.plugin(LoopDetector(identical=2, cycle=2, no_progress=2, repeated_error=2))
    for arguments_value, answer in values:
        call = ToolCall("echo", {"x": arguments_value, "answer": answer}, "c", conversation=1)
        outcome = await built.tools.execute(call)
        assert isinstance(outcome.result, ToolResult)
        # no layer of ours failed (its final failure names it: 'post_execute layer "…"')
        assert 'layer "' not in (outcome.result.error.message if outcome.result.error else "")


async def test_each_denial_says_how_many_times_the_call_has_come_by_now() -> None:
    """Reported: after a loop was denied, every later call's message still said the
    count the loop had when it was found (the 8th, 9th… call: "7 times in a row")."""
    built = detector_harness(LoopDetector(no_progress=3, remind=1, deny=2, end_turn=5), Tools())
    outcomes = await calls(built, *[("read", {"a": 1})] * 6)
    denials = [o.result.content for o in outcomes if o.result.code == TOOL_DENIED]
    assert len(denials) == 3
    counts = [int(text.split("returned the same result ")[1].split(" ")[0]) for text in denials]
    assert counts == [3, 3, 3]  # what ran: a denied call returned nothing (#66)
    come = [int(text.split("call ")[-1].split(" ")[0]) for text in denials]
    assert come == [4, 5, 6]  # the 4th, 5th and 6th calls, each counted
