"""``guardstack compare``: the same seeded faults for every stack, numbers that match theory."""

from __future__ import annotations

from typing import Any

import pytest

from guardstack.cli.compare import compare, load_scenario, render
from guardstack.pipeline import ConfigError, Harness
from guardstack.wrappers import Retry
from tests.cli.compare.stacks import (
    hanging,
    policy_then_retry,
    retry_then_policy,
)


@pytest.mark.parametrize(("p", "attempts"), [(0.3, 3), (0.5, 2), (0.1, 1)])
def test_success_rates_match_the_closed_form(p: float, attempts: int) -> None:
    """A tool that hangs with probability p, n attempts each with the tool's budget:
    1 - p**n of calls succeed; with the budget outside the retry, 1 - p."""
    scenario = load_scenario(hanging(p, 4_000))
    per_attempt, whole = compare(
        [
            ("per attempt", lambda: retry_then_policy(attempts)),
            ("whole operation", lambda: policy_then_retry(attempts)),
        ],
        scenario,
        seed=11,
    )
    assert per_attempt.success_rate == pytest.approx(1 - p**attempts, abs=0.015)
    assert whole.success_rate == pytest.approx(1 - p, abs=0.025)
    # every failure is a timeout of the policy; the caller never had to give up
    assert per_attempt.timeouts_by_code == {
        "TOOL_TIMEOUT": round((1 - per_attempt.success_rate) * 4_000)
    }
    assert per_attempt.mean_attempts == pytest.approx(sum(p**k for k in range(attempts)), abs=0.05)


def test_the_same_seed_gives_the_same_numbers_and_the_caller_gives_up_on_hangs() -> None:
    scenario = load_scenario(hanging(0.2, 500))
    first = compare([("bare", Harness)], scenario, seed=3)
    assert first == compare([("bare", Harness)], scenario, seed=3)
    assert first != compare([("bare", Harness)], scenario, seed=4)
    [bare] = first
    assert bare.timeouts_by_code == {"caller gave up": round((1 - bare.success_rate) * 500)}
    assert bare.p99_ms == 30_000


def test_the_progress_bar_changes_nothing() -> None:
    scenario = load_scenario(hanging(0.2, 100))
    quiet = compare([("bare", Harness)], scenario, seed=5)
    assert compare([("bare", Harness)], scenario, seed=5, progress=True) == quiet


def test_the_provider_model_answers_429_past_capacity_and_callers_run_at_once() -> None:
    from guardstack.pipeline import Harness

    played = load_scenario(
        {
            "calls": 40,
            "concurrency": 8,
            "tools": {"llm": {"latency_ms": 1_000, "capacity": {"concurrent": 4}}},
        }
    )
    [stats] = compare([("bare", Harness)], played, seed=3)
    # 8 callers, room for 4: the first 4 run for a second; the other 4 callers are each
    # answered 429 in 20 ms and take the next call, and so use up the other 36 (no retry)
    assert stats.success_rate == 0.1
    assert stats.rate_limited_per_success == 9.0
    # the 4th admitted found 3 running: 1 s × (1 + (3/4)²) — the run's last answer
    assert stats.goodput_per_s == pytest.approx(4 / 1.5625)
    with pytest.raises(ConfigError, match="did you mean 'capacity'"):
        load_scenario({"tools": {"llm": {"capacty": {"concurrent": 4}}}})
    with pytest.raises(ConfigError, match="concurrency"):
        load_scenario({"concurrency": 0, "tools": {"llm": {}}})
    halved = load_scenario(
        {
            "tools": {
                "llm": {
                    "capacity_change": [{"at_s": 10, "factor": 0.5}],
                    "capacity": {"concurrent": 4},
                }
            }
        }
    )
    assert halved.tools[0].capacity_factor(11) == 0.5
    assert halved.tools[0].capacity_factor(9) == 1.0


# -- streams, tenants and priorities --------------------------------------------------------


def streaming(stall: float) -> dict[str, object]:
    return {
        "calls": 400,
        "give_up_s": 60,
        "tools": {
            "gen": {
                "timeout_ms": 20_000,
                "latency_ms": {"median": 4_000, "p99": 8_000},
                "stream": {"first_byte_ms": 300, "chunk_ms": 100, "stall_probability": stall},
            }
        },
    }


def test_an_idle_bound_cuts_stalled_streams_where_a_whole_budget_waits_them_out() -> None:
    """A stream that stalls part-way: a Timeout with idle_ms ends it a second after its
    last piece (and the retry tries again), where the tool's whole budget of 20 s waits;
    the first byte comes at 300 ms in both."""
    from guardstack.wrappers import Timeout

    def budget_only() -> Harness:
        harness = Harness()
        harness.plugin(Retry(attempts=2, backoff_ms=0, max_backoff_ms=0))
        harness.plugin(Timeout())
        return harness

    def idle_bounded() -> Harness:
        harness = Harness()
        harness.plugin(Retry(attempts=2, backoff_ms=0, max_backoff_ms=0))
        harness.plugin(Timeout(idle_ms=1_000))
        return harness

    whole, idle = compare(
        [("budget", budget_only), ("idle 1s", idle_bounded)], load_scenario(streaming(0.3)), seed=3
    )
    assert whole.first_byte_p50_ms == pytest.approx(300)
    assert idle.first_byte_p50_ms == pytest.approx(300)
    assert idle.success_rate >= whole.success_rate  # both retry a stalled attempt once
    assert idle.p95_ms < whole.p95_ms / 3  # but one waits out the whole budget first
    assert idle.wasted_tool_s < whole.wasted_tool_s / 2
    # a long stream that keeps coming is not cut: without stalls, both succeed alike
    steady = compare([("idle 1s", idle_bounded)], load_scenario(streaming(0.0)), seed=3)[0]
    assert steady.success_rate == 1.0
    assert "first byte p50 ms" in render([whole, idle])


def tenants_scenario(**batch: object) -> dict[str, object]:
    return {
        "calls": 600,
        "concurrency": 20,
        "tools": {"llm": {"latency_ms": 200}},
        "tenants": {"batch": {"share": 9, **batch}, "person": {"share": 1, "priority": 5}},
    }


def limited(**options: Any) -> Harness:
    from guardstack.wrappers import ConcurrencyLimit

    harness = Harness()
    harness.plugin(ConcurrencyLimit(2, queue=1_000, **options))
    return harness


def test_a_priority_keeps_an_interactive_tenant_out_of_a_batchs_queue() -> None:
    scenario = load_scenario(tenants_scenario())
    fifo, prioritised = (
        compare(
            [("fifo", lambda: limited()), ("priority", lambda: limited())],
            load_scenario(
                {**tenants_scenario(), "tenants": {"batch": {"share": 9}, "person": {"share": 1}}}
            ),
            seed=5,
        )[0],
        compare([("priority", lambda: limited())], scenario, seed=5)[0],
    )
    assert set(prioritised.tenants) == {"batch", "person"}
    assert prioritised.tenants["person"]["p50_ms"] < fifo.tenants["person"]["p50_ms"] / 4
    assert prioritised.tenants["batch"]["p50_ms"] >= fifo.tenants["batch"]["p50_ms"]
    table = render([fifo, prioritised])
    assert "person: p50 / p99 ms, success" in table
    data = fifo.to_dict()
    assert data["tenants"]["person"]["calls"] == fifo.tenants["person"]["calls"]


def test_fair_shares_serve_a_small_tenant_in_turns_at_equal_priority() -> None:
    scenario = load_scenario(tenants_scenario(priority=5))  # equal priorities
    fifo, fair = compare(
        [("fifo", lambda: limited()), ("fair", lambda: limited(fair=True))], scenario, seed=5
    )
    assert fair.tenants["person"]["p50_ms"] < fifo.tenants["person"]["p50_ms"] / 2
