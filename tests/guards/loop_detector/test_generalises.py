"""LoopDetector on loops that do not repeat exactly: volatile fields, walking, polls,
bookkeeping, monologues — each shape and its look-alike, and the properties."""

from __future__ import annotations

import itertools
import uuid
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
)
from tests.guards.loop_detector.test_detector import Tools, calls, detector_harness, first_detection

_ids = itertools.count()


def quiet(**patterns: Any) -> LoopDetector:
    """The defaults with the deny and end rungs off (a test reads the reminder)."""
    return LoopDetector(**{"deny": None, "end_turn": None, **patterns})


@pytest.mark.parametrize(
    ("arguments", "field"),
    [
        (lambda n: {"city": "Oslo", "ts": f"2026-11-30T09:00:{n:02d}Z"}, "ts"),
        (lambda n: {"city": "Oslo", "timestamp": 1_764_000_000 + 7 * n}, "timestamp"),
        (lambda n: {"title": "x", "request_id": str(uuid.uuid4())}, "request_id"),
        (lambda n: {"title": "x", "requestId": uuid.uuid4().hex}, "requestId"),
        (lambda n: {"target": "prod", "attempt": n + 1}, "attempt"),
        (lambda n: {"target": "prod", "step": n + 1}, "step"),  # any counter stepping by one
        (
            lambda n: {"query": ["Install Guide", "install guide", "  INSTALL   guide"][n % 3]},
            "query",
        ),
    ],
    ids=["iso-ts", "epoch", "uuid", "hex-id", "attempt", "counter", "case-space"],
)
async def test_a_call_repeated_with_only_a_volatile_field_changing_is_a_loop(
    arguments: Any, field: str
) -> None:
    tools = Tools()
    tools.answers["read"] = "no data for Oslo"
    built = detector_harness(quiet(), tools)
    outcomes = await calls(built, *[("read", arguments(n)) for n in range(6)])
    found = first_detection(outcomes)
    assert found == 3  # no_progress at its default, 3
    text = outcomes[found - 1].contexts[0].text
    assert f"differing only in {field}" in text


async def test_volatile_off_compares_exactly_and_custom_keys_are_masked_outright() -> None:
    tools = Tools()
    tools.answers["read"] = "same"
    stamped = [("read", {"ts": f"2026-11-30T09:00:{n:02d}Z"}) for n in range(8)]
    assert (
        first_detection(await calls(detector_harness(quiet(volatile=False), tools), *stamped))
        is None
    )
    # a date-time is volatile by its form, whatever the key; a key you name, whatever
    # its values and results (here each answer differs, and it is still one call)
    only_nonce = quiet(volatile=["nonce"])
    assert first_detection(await calls(detector_harness(only_nonce, tools), *stamped)) == 3
    numbered = iter(range(100))
    tools.answers["read"] = lambda a: f"same ({next(numbered) * 7})"
    nonced = [("read", {"nonce": f"n{n * 37}"}) for n in range(8)]
    assert first_detection(await calls(detector_harness(quiet(), tools), *nonced)) is None
    found = first_detection(await calls(detector_harness(only_nonce, tools), *nonced))
    assert found is None  # each answer differs: the result advanced, never a loop
    tools.answers["read"] = "same"
    assert first_detection(await calls(detector_harness(only_nonce, tools), *nonced)) == 3


@pytest.mark.parametrize(
    "differing",
    [
        [{"path": "App.py"}, {"path": "app.py"}],  # paths are compared exactly
        [{"id": "7f1c"}, {"id": "8a2d"}],  # an id under its own key is meaningful
        [{"query": "python docs"}, {"query": "python 3 docs"}],  # a refined query
        [{"page": 1}, {"page": 3}],  # a jump is not a counter
    ],
)
async def test_calls_that_differ_in_anything_else_are_never_merged(
    differing: list[dict[str, Any]],
) -> None:
    tools = Tools()
    tools.answers["read"] = "same"
    built = detector_harness(quiet(no_progress=2, identical=2), tools)
    assert first_detection(await calls(built, *[("read", args) for args in differing])) is None


async def test_durations_and_times_in_results_count_as_the_same_result() -> None:
    tools = Tools()
    timings = iter(f"1 failed in {0.5 + n / 10:.2f}s at 12:00:{n:02d}" for n in range(10))
    tools.answers["test"] = lambda a: next(timings)
    built = detector_harness(quiet(), tools)
    assert first_detection(await calls(built, *[("test", {})] * 6)) == 3


async def test_paging_past_the_end_is_walking_and_pagination_with_results_is_not() -> None:
    tools = Tools()
    tools.answers["list"] = "No results found."
    built = detector_harness(quiet(), tools)
    outcomes = await calls(built, *[("list", {"offset": n * 50}) for n in range(8)])
    assert first_detection(outcomes) == 4
    assert "one argument moving on" in outcomes[3].contexts[0].text
    tools.answers["list"] = lambda a: f"entries {a['offset']}-{a['offset'] + 49}"
    built = detector_harness(quiet(), tools)
    assert (
        first_detection(await calls(built, *[("list", {"offset": n * 50}) for n in range(20)]))
        is None
    )
    tools.answers["list"] = "applied"  # a batch of distinct files, each answering the same
    built = detector_harness(quiet(), tools)
    assert (
        first_detection(await calls(built, *[("list", {"path": f"f{n}.py"}) for n in range(50)]))
        is None
    )


async def test_bookkeeping_between_the_rounds_is_looked_through_without_exclude() -> None:
    tools = Tools()
    tools.answers["read"] = "def handler(): ..."
    tools.answers["todo"] = "Plan updated."
    sequence: list[tuple[str, dict[str, Any]]] = []
    for n in range(6):
        sequence += [("read", {"path": "api.py"}), ("todo", {"item": f"check api {n}"})]
    outcomes = await calls(detector_harness(quiet(), tools), *sequence)
    assert first_detection(outcomes) == 5  # the 3rd read: no_progress, todo looked through
    # a planning call whose answer says something is not bookkeeping
    tools.answers["todo"] = lambda a: f"next: {a['item']} needs the db schema"
    assert first_detection(await calls(detector_harness(quiet(), tools), *sequence)) is None


async def test_a_repeated_call_whose_result_advances_is_never_denied() -> None:
    tools = Tools()
    counter = itertools.count()
    tools.answers["poll"] = lambda a: f"job 7 running: {next(counter)} of 100 rows"
    built = detector_harness(LoopDetector(remind=1, deny=1, end_turn=2, identical=2), tools)
    outcomes = await calls(built, *[("poll", {"job": 7})] * 30)
    assert all(o.result.code != TOOL_DENIED and not o.ends_turn for o in outcomes)


def monologue_agent(replies: list[str], **config: Any) -> Any:
    built = Harness(ScriptedModel([ModelReply(text) for text in replies]))
    built.plugin(LoopDetector(monologue=3, continue_prompts=["Continue."], **config))
    return built.loop.create("runner")


async def test_a_monologue_across_automatic_continuations_climbs_the_ladder() -> None:
    said = "I will now continue the analysis of the logs."
    agent = monologue_agent([said] * 6, deny=None, end_turn=2)
    reasons = [(await agent.prompt(prompt)).reason for prompt in ["Go.", *["Continue."] * 4]]
    assert reasons == ["completed", "completed", "completed", "completed", "blocked"]
    prompts = [m["content"] for m in agent.session.messages() if m["role"] == "user"]
    assert "your last 3 replies said nearly the same thing" in prompts[3]  # the reminder
    assert "said nearly the same thing" not in prompts[2]


async def test_a_persons_prompt_resets_a_monologue_and_templates_are_not_monologues() -> None:
    said = "I will now continue the analysis of the logs."
    agent = monologue_agent([said] * 6, deny=None, end_turn=2)
    for prompt in ["Go.", "Continue.", "What next?", "Continue.", "Continue."]:
        assert (await agent.prompt(prompt)).reason == "completed"
    header = "## Progress report\nEverything below was checked against the spec.\n\n" * 3
    findings = [
        "The parser drops the last line of a file without a newline.",
        "Two retries share one budget, so the second never runs.",
        "The cache key ignores the locale; French users get English pages.",
        "Uploads over 2 GB overflow a 32-bit counter in the progress bar.",
        "The scheduler starts jobs an hour early after the clocks change.",
        "Deleting a user leaves their sessions valid until they expire.",
    ]
    reports = [f"{header}{finding}" for finding in findings]
    agent = monologue_agent(reports, deny=None, end_turn=2)
    for prompt in ["Go.", *["Continue."] * 5]:
        assert (await agent.prompt(prompt)).reason == "completed"


def test_bad_config_is_refused_naming_the_key() -> None:
    with pytest.raises(ConfigError, match="continue_prompts"):
        LoopDetector(monologue=3)
    with pytest.raises(ConfigError, match="volatile"):
        LoopDetector(volatile="ts")
    with pytest.raises(ConfigError, match="walking"):
        LoopDetector(walking=1)


# -- properties ------------------------------------------------------------------------------

plain_keys = st.sampled_from(["path", "name", "mode", "kind"])
plain_values = st.text(alphabet="abcXYZ/._", min_size=1, max_size=6)


@given(
    base=st.dictionaries(plain_keys, plain_values, min_size=1, max_size=3),
    data=st.data(),
)
async def test_normalisation_never_merges_calls_that_differ_in_a_non_volatile_field(
    base: dict[str, str], data: st.DataObject
) -> None:
    key = data.draw(st.sampled_from(sorted(base)))
    other = data.draw(plain_values.filter(lambda value: value != base[key]))
    tools = Tools()
    tools.answers["read"] = "same"
    built = detector_harness(quiet(no_progress=2, identical=2, cycle=2, walking=2), tools)
    outcomes = await calls(built, ("read", base), ("read", {**base, key: other}))
    assert first_detection(outcomes) is None


calls_of = st.lists(
    st.tuples(st.sampled_from(["read", "poll", "grep"]), st.integers(0, 2)), max_size=30
)


@given(sequence=calls_of)
async def test_a_call_whose_result_advanced_is_never_denied(
    sequence: list[tuple[str, int]],
) -> None:
    tools = Tools()
    fresh = itertools.count()
    for name in ("read", "poll", "grep"):
        # every answer is new (not a counter stepping by one, which is masked)
        tools.answers[name] = lambda a: f"result {next(fresh) * 7}"
    built = detector_harness(LoopDetector(identical=2, cycle=2, deny=1, end_turn=2), tools)
    outcomes = await calls(built, *[(name, {"n": n}) for name, n in sequence])
    assert not any(o.result.code == TOOL_DENIED or o.ends_turn for o in outcomes)


@given(sequence=calls_of, seed=st.integers(0, 10**6))
async def test_key_order_and_volatile_values_never_change_a_decision(
    sequence: list[tuple[str, int]], seed: int
) -> None:
    import random

    rng = random.Random(seed)
    detector = LoopDetector(identical=2, cycle=2, no_progress=2, deny=3, end_turn=5)
    plain = [(name, {"n": n, "mode": "x", "ts": "2026-01-01T00:00:00Z"}) for name, n in sequence]
    varied = []
    for name, arguments in plain:
        items = [*arguments.items()]
        rng.shuffle(items)
        changed = dict(items)
        changed["ts"] = f"2026-11-{rng.randint(1, 28):02d}T{rng.randint(0, 23):02d}:00:00Z"
        changed["request_id"] = uuid.UUID(int=rng.getrandbits(128)).hex
        varied.append((name, changed))
    first = await calls(detector_harness(detector, Tools()), *plain)
    again = await calls(
        detector_harness(detector, Tools()),
        *[(name, {**args, "request_id": "fixed"}) for name, args in plain],
    )
    second = await calls(detector_harness(detector, Tools()), *varied)

    def decisions(outcomes: list[Any]) -> list[tuple[Any, int, bool]]:
        return [(o.result.code, len(o.contexts), o.ends_turn) for o in outcomes]

    assert decisions(second) == decisions(again)
    assert len(first) == len(second)


def test_the_fresh_sets_figures_hold() -> None:
    """The defaults on the set made after they were chosen (README): precision and recall
    at least what was measured, so a change that loses ground there is seen."""
    import anyio

    from benchmarks.loops.score import score

    results = anyio.run(score, None, "fresh")["LoopDetector (defaults)"]
    assert results["precision"] >= 0.92  # 104 of 113 fired
    assert results["recall"] >= 0.928  # 104 of 112
