"""LoopDetector on what real agent traffic does (the shapes of tau-bench's loops and
look-alikes): plain repeats of three, counters in results, retries with a step
between them, loops across a person's prompts, day-by-day searches — and hostile
arguments and results, which never raise and never block by accident."""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from guardstack.guards import LoopDetector
from guardstack.pipeline import (
    TOOL_DENIED,
    Harness,
    ModelReply,
    ScriptedModel,
    ToolCall,
    ToolCallRequest,
    ToolDefinition,
    ToolError,
    ToolResult,
)
from tests.guards.loop_detector.test_detector import calls as run
from tests.guards.loop_detector.test_detector import first_detection

_ids = itertools.count()


def harness_with(answers: Mapping[str, Any], detector: LoopDetector | None = None) -> Harness:
    """Tools named by ``answers``, each answering its value, or the value its function
    returns for the arguments (a ``ToolResult`` as it is)."""

    async def run(arguments: Mapping[str, Any], call: ToolCall) -> Any:
        answer = answers[call.name]
        return answer(arguments) if callable(answer) else answer

    built = Harness()
    for name in answers:
        built.tools.register(ToolDefinition(name, run))
    built.plugin(detector or LoopDetector())
    return built


def failed(message: str) -> ToolResult:
    return ToolResult(f"Error: {message}", True, ToolError(message, code="TOOL_FAILED"))


async def test_three_identical_calls_with_identical_results_are_a_loop_by_default() -> None:
    built = harness_with({"get_user": '{"name": "Mia", "tier": "gold"}'})
    outcomes = await run(built, *[("get_user", {"user_id": "mia_3668"})] * 3)
    assert first_detection(outcomes) == 3
    assert "returned the same result 3 times" in outcomes[2].contexts[0].text


async def test_an_id_the_tool_steps_on_each_identical_call_is_not_progress() -> None:
    """Three identical send_certificate calls, each naming a new id one further on:
    three vouchers issued, and a loop."""
    numbers = itertools.count(1001)
    built = harness_with(
        {"send_certificate": lambda a: f"Certificate certificate_{next(numbers)} sent: $50"}
    )
    outcomes = await run(built, *[("send_certificate", {"user_id": "u1", "amount": 50})] * 3)
    assert first_detection(outcomes) == 3


async def test_a_count_that_moves_on_in_a_pending_status_is_progress() -> None:
    rows = itertools.count()
    built = harness_with({"status": lambda a: f"job 7 running: {next(rows)} of 100 rows"})
    assert first_detection(await run(built, *[("status", {"job": 7})] * 20)) is None


async def test_the_same_failing_call_with_a_think_or_a_calculation_between_is_a_loop() -> None:
    """tau-bench: book_reservation failing the same way three times, a think (which
    answers nothing) and a calculate between the attempts."""
    booking = {"user_id": "ivan_7015", "flights": [{"flight_number": "HAT097"}], "paid": 299}
    sums = iter(["299.0", "374.0", "375.0"])
    built = harness_with(
        {
            "book_reservation": failed("payment amount does not add up, total price is 375"),
            "think": "",
            "calculate": lambda a: next(sums),
        }
    )
    sequence: list[tuple[str, dict[str, Any]]] = [
        ("book_reservation", booking),
        ("think", {"thought": "recalculate the payment"}),
        ("book_reservation", booking),
        ("think", {"thought": "check the total again"}),
        ("calculate", {"expression": "158 + 141"}),
        ("book_reservation", booking),
    ]
    outcomes = await run(built, *sequence)
    assert first_detection(outcomes) == 6
    assert "failed the same way 3 times" in outcomes[5].contexts[0].text


async def test_a_changed_attempt_that_changes_the_outcome_breaks_the_count() -> None:
    answers = {
        "update": lambda a: (
            failed("flight HAT030 not available")
            if "HAT030" in a["flights"]
            else failed("payment declined")
        )
    }
    built = harness_with(answers)
    a, b = {"flights": ["HAT030", "HAT223"]}, {"flights": ["HAT223"]}
    assert first_detection(await run(built, ("update", a), ("update", a), ("update", b))) is None
    # the same tool failing the same way with other arguments is passed over
    built = harness_with(answers)
    c = {"flights": ["HAT030", "HAT124"]}
    outcomes = await run(built, ("update", a), ("update", a), ("update", c), ("update", a))
    assert first_detection(outcomes) == 4


async def test_a_loop_across_a_persons_prompts_is_seen_and_the_ladder_starts_again() -> None:
    """The same read once a turn, four turns: the third is reminded; the ladder restarts
    at each prompt, so a later turn's denial needs its own detections."""
    same = ModelReply(tool_calls=[ToolCallRequest("read", {"path": "plan.md"})])
    model = ScriptedModel([same, ModelReply("ok")] * 4)
    built = Harness(model)
    built.tools.register(ToolDefinition("read", lambda arguments, call: "# Plan\n1. ship"))
    built.plugin(LoopDetector(deny=2))
    agent = built.loop.create("s")
    results = [await agent.prompt(f"turn {n}") for n in range(4)]
    assert [r.reason for r in results] == ["completed"] * 4
    reminded = [
        n
        for n, text in enumerate(
            str(m["content"]) for m in agent.session.messages() if m["role"] == "user"
        )
        if "Potential loop" in text
    ]
    assert reminded  # the third turn's read came back with the reminder


async def test_day_by_day_searches_are_never_a_loop() -> None:
    """A date is what such a search means: 80 days of flight searches (each day's
    flights) and a calendar searched day by day with nothing found are not loops."""
    built = harness_with({"search_flights": lambda a: f'[{{"flight": "HAT{a["date"][-2:]}"}}]'})
    days = [f"2024-{5 + n // 28:02d}-{1 + n % 28:02d}" for n in range(80)]
    searches = [
        ("search_flights", {"origin": "JFK", "destination": "SEA", "date": d}) for d in days
    ]
    assert first_detection(await run(built, *searches)) is None
    built = harness_with({"calendar": "No events."})
    outcomes = await run(built, *[("calendar", {"date": d}) for d in days[:14]])
    assert first_detection(outcomes) is None
    assert all(o.result.code != TOOL_DENIED and not o.ends_turn for o in outcomes)


async def test_a_field_that_changes_every_time_with_the_result_the_same_is_volatile() -> None:
    """By behaviour: a short token under a hinted key, new on every call while the
    answer stays the same; the detection names it. A path changing is never merged."""
    built = harness_with({"fetch": "HTTP 503 upstream busy"})
    tokens = [("fetch", {"url": "https://api.example/x", "nonce": f"n{n}x"}) for n in range(3)]
    outcomes = await run(built, *tokens)
    assert first_detection(outcomes) == 3
    assert "differing only in nonce" in outcomes[2].contexts[0].text
    built = harness_with({"edit": "applied"})
    edits = [("edit", {"path": f"src/m{n}.py", "patch": "-a +b"}) for n in range(30)]
    assert first_detection(await run(built, *edits)) is None


async def test_a_detection_names_its_pattern_and_the_fields_it_treated_as_volatile() -> None:
    built = harness_with({"read": "same"})
    stamped = [("read", {"path": "a", "ts": f"2026-12-02T10:00:0{n}Z"}) for n in range(3)]
    outcomes = await run(built, *stamped)
    text = outcomes[2].contexts[0].text
    assert "returned the same result 3 times" in text
    assert "differing only in ts" in text


def _latin1(raw: bytes) -> str:
    return raw.decode("latin-1")


def _containers(inner: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    return st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)


# Named functions, not lambdas: hypothesis reads a lambda's source with ``ast.parse``
# to describe it, which CPython 3.11.7 can fail at a deep stack (gh-106905: "AST
# constructor recursion depth mismatch"), failing the test for nothing it checks.
hostile_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(10**30), max_value=10**30)
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(alphabet=st.characters(codec="utf-8"), max_size=40)
    | st.binary(max_size=20).map(_latin1),
    _containers,
    max_leaves=20,
)


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.sampled_from(["a", "b"]),
            hostile_values,
            st.one_of(st.text(max_size=60), st.just(""), st.just("NaN")),
        ),
        max_size=12,
    )
)
def test_hostile_arguments_and_results_never_raise_and_a_fresh_result_is_never_denied(
    steps: list[tuple[str, Any, str]],
) -> None:
    import anyio

    async def scenario() -> None:
        results = iter([text for _, _, text in steps])
        built = harness_with(
            {"a": lambda a: next(results), "b": lambda a: next(results)},
            LoopDetector(deny=1, end_turn=2),
        )
        seen: dict[str, set[str]] = {}
        for name, arguments, text in steps:
            call = ToolCall(name, arguments, f"c{next(_ids)}", conversation="c")
            outcome = await built.tools.execute(call)
            if outcome.result.code == TOOL_DENIED or outcome.ends_turn:
                # denied only a repeat whose previous answer was an answer it gave before
                assert seen.get(name), (name, arguments)
            else:
                seen.setdefault(name, set()).add(text)

    anyio.run(scenario)


async def test_huge_and_deeply_nested_arguments_are_compared_without_an_exception() -> None:
    deep: Any = "leaf"
    for _ in range(60):  # the harness refuses arguments nested deeper than 64
        deep = {"x": deep}
    built = harness_with({"read": "x" * 200_000})
    hostile = {"blob": "\x00\udcff" * 10_000, "deep": deep, "\x07key": [10**40, -0.0]}
    outcomes = await run(built, *[("read", hostile)] * 3)
    assert all(o.result.content == "x" * 200_000 for o in outcomes)
    assert first_detection(outcomes) == 3  # compared all the same: three identical calls
    # NaN and infinities never reach a layer: the harness answers INVALID_ARGUMENTS
    refused = await run(built, ("read", {"n": math.nan}), ("read", {"n": math.inf}))
    assert [o.result.code for o in refused] == ["INVALID_ARGUMENTS"] * 2
