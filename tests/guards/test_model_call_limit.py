"""Caps on model calls and usage: the turn ends ``blocked``, naming the limit, log whole."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from guardstack.guards import ModelCallLimit, UsageLimit
from guardstack.pipeline import (
    MODEL_UNAVAILABLE,
    ConfigError,
    Harness,
    ModelError,
    ModelReply,
    ScriptedModel,
    Session,
    ToolCallRequest,
    Usage,
)
from guardstack.pipeline.testing import ScriptedTool
from guardstack.wrappers import Retry, no_backoff


def looping(count: int, tokens: Usage | None = None, model: str | None = None) -> list[ModelReply]:
    """``count`` replies that each call the ``look`` tool."""
    return [
        ModelReply(tool_calls=(ToolCallRequest("look", {"n": index}),), usage=tokens, model=model)
        for index in range(count)
    ]


def harness_with(model: ScriptedModel, *plugins: object) -> Harness:
    harness = Harness(model)
    ScriptedTool("look", ["seen"]).register(harness.tools)
    for plugin in plugins:
        harness.plugin(plugin)  # type: ignore[arg-type]
    return harness


async def test_model_call_limit_per_turn_ends_the_turn_blocked_before_the_next_request() -> None:
    model = ScriptedModel(looping(10))
    harness = harness_with(model, ModelCallLimit(per_turn=3))
    agent = harness.loop.create("s")
    result = await agent.prompt("go")
    assert result.reason == "blocked"
    assert result.error == (
        "model-call-limit: this turn made 3 model calls and the limit is 3 per turn"
    )
    assert len(model.requests) == 3
    assert result.steps == 4
    events = [event.type for event in agent.session.events]
    assert events[-2:] == ["step/end", "turn/end"]
    assert events.count("tool/call") == events.count("tool/result") == 3
    assert agent.session.events[-1].reason == "blocked"  # type: ignore[union-attr]
    # a new person's prompt starts a new turn's count
    model2 = ScriptedModel([ModelReply("fine")])
    agent.model = model2
    assert (await agent.prompt("again")).reason == "completed"


async def test_with_both_limits_the_stop_names_the_one_that_refused() -> None:
    """``per_turn`` and ``per_session`` together: the turn's limit stops the first turn,
    the session's a later one, and each stop says which it was, with its own limit."""
    model = ScriptedModel(looping(13))
    agent = harness_with(model, ModelCallLimit(per_turn=3, per_session=5)).loop.create("s")
    first = await agent.prompt("go")
    assert first.error == (
        "model-call-limit: this turn made 3 model calls and the limit is 3 per turn"
    )
    second = await agent.prompt("again")
    assert second.error == (
        "model-call-limit: this session made 5 model calls and the limit is 5 per session"
    )
    assert len(model.requests) == 5


async def test_model_call_limit_per_session_counts_a_resumed_log(tmp_path: Path) -> None:
    harness = harness_with(
        ScriptedModel([ModelReply("a"), ModelReply("b")]), ModelCallLimit(per_session=3)
    )
    agent = harness.loop.create("s")
    await agent.prompt("one")
    await agent.prompt("two")
    agent.session.save(tmp_path / "s.jsonl")
    resumed = harness.loop.create(
        "s", session=Session.load(tmp_path / "s.jsonl"), model=ScriptedModel(looping(5))
    )
    result = await resumed.prompt("three")
    assert result.reason == "blocked"
    assert result.error == (
        "model-call-limit: this session made 3 model calls and the limit is 3 per session"
    )


async def test_model_call_limit_inside_a_retry_counts_attempts() -> None:
    failing = ModelError("down", MODEL_UNAVAILABLE)
    model = ScriptedModel([failing, failing, ModelReply("ok")])
    harness = harness_with(model, Retry(stage="model", attempts=3), ModelCallLimit(per_turn=2))
    with no_backoff():
        result = await harness.loop.create("s").prompt("go")
    assert result.reason == "blocked"  # the third attempt was refused, and not retried
    assert len(model.requests) == 2
    outside = ScriptedModel([failing, failing, ModelReply("ok")])
    harness = harness_with(outside, ModelCallLimit(per_turn=2), Retry(stage="model", attempts=3))
    with no_backoff():
        assert (await harness.loop.create("s").prompt("go")).reason == "completed"


async def test_usage_limit_tokens_per_turn() -> None:
    model = ScriptedModel(looping(10, Usage(400, 100)))
    # each call reserves its input (a token per 4 characters) and 100 output tokens
    harness = harness_with(model, UsageLimit(tokens_per_turn=1_200, estimate_output_tokens=100))
    result = await harness.loop.create("s").prompt("go")
    assert result.reason == "blocked"
    assert result.error == "usage-limit: this turn used 1500 tokens and the limit is 1200 per turn"
    assert result.usage == Usage(1_200, 300)
    assert len(model.requests) == 3


async def test_a_call_whose_reservation_would_pass_the_limit_is_not_sent() -> None:
    model = ScriptedModel(looping(10, Usage(400, 100)))
    harness = harness_with(model, UsageLimit(tokens_per_turn=1_200))  # reserves ~1,000 a call
    result = await harness.loop.create("s").prompt("go")
    assert result.reason == "blocked"
    assert result.error == (
        "usage-limit: this turn used 500 tokens and the limit is 1200 per turn "
        "(this call's reservation of 1002 tokens would pass it)"
    )
    assert len(model.requests) == 1


async def test_usage_limit_tokens_per_session_spans_turns() -> None:
    model = ScriptedModel([ModelReply("a", usage=Usage(600, 0)), *looping(3, Usage(500, 0))])
    harness = harness_with(model, UsageLimit(tokens_per_session=1_000, estimate_output_tokens=10))
    agent = harness.loop.create("s")
    assert (await agent.prompt("one")).reason == "completed"
    result = await agent.prompt("two")
    assert result.reason == "blocked"
    assert result.error == (
        "usage-limit: this session used 1100 tokens and the limit is 1000 per session"
    )


async def test_usage_limit_dollars_per_session_from_a_price_table(tmp_path: Path) -> None:
    prices = {"deepseek-chat": (0.27, 1.10)}
    tokens = Usage(1_000_000, 100_000)  # $0.27 + $0.11 = $0.38 a call
    model = ScriptedModel(looping(5, tokens, "deepseek-chat"))
    harness = harness_with(model, UsageLimit(usd_per_session=1.0, prices=prices))
    agent = harness.loop.create("s")
    result = await agent.prompt("go")
    assert result.reason == "blocked"
    assert (
        result.error
        == "usage-limit: this session cost $1.1400 and the limit is $1.0000 per session"
    )
    assert len(model.requests) == 3
    # a resumed session is priced from its log
    agent.session.save(tmp_path / "s.jsonl")
    resumed = harness.loop.create(
        "s", session=Session.load(tmp_path / "s.jsonl"), model=ScriptedModel(looping(1))
    )
    assert (await resumed.prompt("more")).reason == "blocked"


@pytest.mark.parametrize(
    ("price", "cost"),
    [
        # Claude's prices: plain input $3, output $15, cache reads $0.30, writes $3.75
        ((3, 15, 0.3, 3.75), 0.1 * 3 + 0.8 * 0.3 + 0.1 * 3.75 + 0.01 * 15),
        # no cache prices: reads as input, writes at twice input (never under the bill)
        ((3, 15), 0.1 * 3 + 0.8 * 3 + 0.1 * 6 + 0.01 * 15),
        ((3, 15, 0.3), 0.1 * 3 + 0.8 * 0.3 + 0.1 * 6 + 0.01 * 15),
    ],
)
async def test_cache_reads_and_writes_are_priced_as_the_provider_charges(
    price: tuple[float, ...], cost: float
) -> None:
    # a million input tokens: 100k plain, 800k read from the cache, 100k written to it
    usage = Usage(1_000_000, 10_000, cached_input_tokens=800_000, cache_write_tokens=100_000)
    limit = UsageLimit(usd_per_session=100.0, prices={"claude": price})
    assert limit.cost_usd(usage, "claude", None) == pytest.approx(cost)
    with pytest.raises(ConfigError, match=r"prices\.claude"):
        UsageLimit(usd_per_session=1.0, prices={"claude": [3, 15, 0.3, 3.75, 9]})
    with pytest.raises(ConfigError, match="must be a number >= 0, got -15"):
        UsageLimit(usd_per_session=1.0, prices={"claude": [3, -15]})


async def test_a_cost_limit_never_guesses_a_price_low() -> None:
    """An unpriced model's calls are charged at the highest price the table holds, so
    a session limit stops no later than it would at any known price."""
    model = ScriptedModel(looping(3, Usage(100_000, 100_000), "mystery-model"))
    limit = UsageLimit(usd_per_session=0.5, prices={"cheap": (0.1, 0.2), "dear": (1, 2)})
    harness = harness_with(model, limit)
    result = await harness.loop.create("s").prompt("go")
    # $0.30 a call at the dear price: the second call's reservation would pass $0.50
    assert result.reason == "blocked"
    assert "usage-limit" in (result.error or "")


def test_caps_load_from_config_and_refuse_bad_values() -> None:
    harness = Harness(ScriptedModel([]))
    harness.load(
        [
            {"name": "model-call-limit", "config": {"perTurn": 20}},
            {
                "name": "usage-limit",
                "config": {"usd_per_session": 5, "prices": {"gpt-x": [2.5, 10]}},
            },
        ]
    )
    assert harness.loop.model_call.names() == ["model-call-limit", "usage-limit"]
    with pytest.raises(ConfigError) as raised:
        Harness().load([{"id": "cap", "name": "model-call-limit", "config": {"per_turn": 0}}])
    assert str(raised.value) == (
        "plugin 'cap' (model-call-limit): config key 'per_turn' = 0: must be an integer >= 1"
    )
    with pytest.raises(ConfigError, match="`prices` must be given with a dollar limit"):
        UsageLimit(usd_per_session=1.0)
    with pytest.raises(ConfigError, match=r"prices\.m"):
        UsageLimit(usd_per_session=1.0, prices={"m": [1]})
    with pytest.raises(ConfigError, match="caps nothing"):
        ModelCallLimit()
    with pytest.raises(ConfigError, match="caps nothing"):
        UsageLimit()


def test_a_dollar_limit_of_zero_is_refused() -> None:
    with pytest.raises(ConfigError, match="usd_per_session"):
        UsageLimit(usd_per_session=0, prices={"m": (1, 1)})


# -- downgrade before the budget ends ---------------------------------------------------------


async def test_past_its_fraction_a_usage_limit_sends_calls_to_the_cheaper_model() -> None:
    """Each reply costs $0.30 at the expensive price ($0.03 at the cheap one); past 80 %
    of the $1.00 session the calls go to the cheap model, logged with its name, shown by
    BudgetNotice, and the session goes on instead of stopping."""
    from guardstack.guards import BudgetNotice, UsageLimit
    from guardstack.pipeline import AssistantMessage, UserMessage

    expensive = ScriptedModel([ModelReply("big", usage=Usage(0, 300_000))] * 3, model="big")
    cheap = ScriptedModel([ModelReply("small", usage=Usage(0, 300_000))] * 5, model="small")
    harness = Harness(expensive)
    harness.plugin(BudgetNotice(show=("usd",)))
    harness.plugin(
        UsageLimit(
            usd_per_session=1.0,
            prices={"big": (1.0, 1.0), "small": (0.1, 0.1)},
            estimate_output_tokens=1,
            downgrade={"at": 0.8, "to": cheap},
        )
    )
    agent = harness.loop.create("s")
    answers = [(await agent.prompt(f"q{n}")).text for n in range(5)]
    assert answers == ["big", "big", "big", "small", "small"]  # $0.90 > $0.80, then cheap
    models = [e.model for e in agent.session.events if isinstance(e, AssistantMessage)]
    assert models == ["big", "big", "big", "small", "small"]
    notes = [e.text for e in agent.session.events if isinstance(e, UserMessage) and e.source.plugin]
    assert "a cheaper model answers from now on" in notes[-1]
    assert "a cheaper model answers" not in notes[2]


async def test_a_downgrade_by_name_switches_the_answering_model() -> None:
    from guardstack.guards import UsageLimit

    class Named(ScriptedModel):
        def with_model(self, name: str) -> ScriptedModel:
            return ScriptedModel([ModelReply(f"from {name}", usage=Usage(0, 1))] * 3, model=name)

    harness = Harness(Named([ModelReply("first", usage=Usage(0, 1_000))] * 3, model="big"))
    harness.plugin(UsageLimit(tokens_per_session=1_500, estimate_output_tokens=1,
                              downgrade={"at": 0.5, "to": "small"}))  # fmt: skip
    agent = harness.loop.create("s")
    assert (await agent.prompt("one")).text == "first"
    assert (await agent.prompt("two")).text == "from small"


@pytest.mark.parametrize(
    ("downgrade", "key"),
    [
        ({"at": 0, "to": "m"}, "downgrade.at"),
        ({"at": 1.5, "to": "m"}, "downgrade.at"),
        ({"at": 0.5, "to": 5}, "downgrade.to"),
        ({"at": 0.5}, "downgrade"),
    ],
)
def test_a_bad_downgrade_fails_loud(downgrade: Any, key: str) -> None:
    from guardstack.guards import UsageLimit

    with pytest.raises(ConfigError) as raised:
        UsageLimit(tokens_per_session=10, downgrade=downgrade)
    assert raised.value.key == key
