"""``guardstack check``: each warning fires on the mistake, and never on the documented recipe."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from guardstack.cli.check import check
from guardstack.cli.main import main
from guardstack.guards import RepeatToolReminder, ToolCallLimit, ToolCallTimeoutPolicy
from guardstack.pipeline import TOOL_FAILED, TOOL_TIMEOUT, Harness, ToolDefinition
from guardstack.wrappers import Metrics, Retry, Timeout, Tracing


async def _tool(arguments: object, call: object) -> str:
    return "ok"


def stack(*plugins: object, budget: int | None = 5_000) -> Harness:
    harness = Harness()
    harness.tools.register(ToolDefinition("search", _tool, timeout_ms=budget))
    for plugin in plugins:
        harness.plugin(plugin)  # type: ignore[arg-type]
    return harness


GUARDS = (ToolCallLimit(per_turn=40), RepeatToolReminder())


def warnings_of(harness: Harness) -> list[str]:
    return list(check(harness).warnings)


def test_a_declared_budget_with_no_timeout_layer() -> None:
    assert any("no timeout layer applies them" in w for w in warnings_of(stack(*GUARDS)))
    assert warnings_of(stack(*GUARDS, ToolCallTimeoutPolicy())) == []


def test_a_whole_operation_timeout_no_longer_than_one_attempt() -> None:
    mistaken = stack(*GUARDS, Timeout(ms=5_000), Retry(), ToolCallTimeoutPolicy())
    assert any("the retry never runs" in w for w in warnings_of(mistaken))
    fine = stack(*GUARDS, Timeout(ms=12_000), Retry(), ToolCallTimeoutPolicy())
    assert warnings_of(fine) == []


def test_a_misspelt_retry_code() -> None:
    mistaken = stack(*GUARDS, Retry(retry_on=["TOOL_TIMOUT"]), ToolCallTimeoutPolicy())
    [warning] = warnings_of(mistaken)
    assert "retry waits for TOOL_TIMOUT, which no layer in this stack produces" in warning
    fine = stack(*GUARDS, Retry(retry_on=[TOOL_TIMEOUT, TOOL_FAILED]), ToolCallTimeoutPolicy())
    assert warnings_of(fine) == []


def test_a_retry_without_a_per_attempt_timeout_and_metrics_inside_it() -> None:
    mistaken = stack(*GUARDS, ToolCallTimeoutPolicy(), Retry(), Metrics())
    found = warnings_of(mistaken)
    assert any("no per-attempt timeout inside it" in w for w in found)
    assert any("metrics inside the retry count attempts" in w for w in found)


def test_no_cap_and_no_guard() -> None:
    found = warnings_of(stack(ToolCallTimeoutPolicy()))
    assert any(w.startswith("no cap:") for w in found)
    assert any(w.startswith("no loop guard") for w in found)


def test_each_plugin_is_explained_by_its_position() -> None:
    report = check(stack(Tracing(), *GUARDS, Timeout(ms=20_000), Retry(), Metrics(), Timeout()))
    assert "timeout: bounds the whole retried operation, backoff included, at 20000 ms" in (
        report.lines
    )
    assert "timeout: bounds each attempt at the tool's own declared budget" in report.lines
    assert "metrics: counts attempts (it is inside the retry), not operations" in report.lines


@given(
    budget=st.none() | st.integers(1, 60_000),
    total=st.none() | st.integers(1, 600_000),
    attempts=st.integers(1, 5),
    metrics_outside=st.booleans(),
    codes=st.sets(st.sampled_from([TOOL_TIMEOUT, TOOL_FAILED]), min_size=1),
)
def test_no_false_alarm_on_a_stack_built_by_the_documented_recipe(
    budget: int | None, total: int | None, attempts: int, metrics_outside: bool, codes: set[str]
) -> None:
    """Caps and guards, metrics outside, [a total budget longer than an attempt,] retry,
    then the per-attempt policy: the recipe in docs/order.md."""
    plugins: list[object] = [*GUARDS]
    if metrics_outside:
        plugins.append(Metrics())
    if total is not None and (budget is None or total > budget):
        plugins.append(Timeout(ms=total, code="TOTAL_TIMEOUT"))
    plugins += [Retry(attempts=attempts, retry_on=sorted(codes)), ToolCallTimeoutPolicy()]
    assert warnings_of(stack(*plugins, budget=budget)) == []


def test_the_command_and_strict(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = tmp_path / "stack.yaml"
    config.write_text(
        "- name: retry\n  config: {retry_on: [TOOL_TIMOUT]}\n- name: tool-call-timeout-policy\n",
        "utf-8",
    )
    assert main(["check", str(config)]) == 0
    printed = capsys.readouterr().out
    assert "1. retry: runs the layers after it again, up to 3 attempts, on TOOL_TIMOUT" in printed
    assert "warning: retry waits for TOOL_TIMOUT" in printed
    assert main(["check", "--strict", str(config)]) == 1


def test_the_resilience_layers_are_explained_by_position_and_warned_about() -> None:
    from guardstack.wrappers import (
        Chaos,
        CircuitBreaker,
        ConcurrencyLimit,
        Fallback,
        Hedge,
        RateLimit,
    )

    outside = stack(*GUARDS, CircuitBreaker(), Retry(), ToolCallTimeoutPolicy())
    assert warnings_of(outside) == []
    assert "circuit-breaker: counts operations" in check(outside).lines[2]
    inside = stack(*GUARDS, Retry(), CircuitBreaker(), ToolCallTimeoutPolicy())
    assert any("breaker inside the retry counts attempts" in w for w in warnings_of(inside))
    assert "counts attempts (it is inside the retry)" in check(inside).lines[3]
    others = stack(
        *GUARDS,
        ConcurrencyLimit(4),
        Retry(retry_on=["TOOL_OVERLOADED", "TOOL_RATE_LIMITED", "TOOL_TIMEOUT"]),
        RateLimit(2, wait=False),
        Fallback("search"),
        Hedge(delay_ms=100),
        ToolCallTimeoutPolicy(),
        Chaos(rate=0.1, fault="latency:10"),
    )
    lines = check(others).lines[2:]  # after the two guards
    assert lines[0].startswith("concurrency-limit: 4 at once, 0 queued; one slot per operation")
    assert lines[2].startswith("rate-limit: 2/s, burst 1; every attempt takes a token")
    assert lines[3].startswith("fallback: answers with Fallback(to='search'")
    assert "after each failed attempt" in lines[3]
    assert lines[4].startswith("hedge: another attempt after 100 ms")
    assert lines[6].startswith("chaos: injects latency:10")
    assert warnings_of(others) == [
        "chaos injects faults on purpose: for tests and game days, not production"
    ]  # the codes the retry waits for are produced here: no "misspelt?" warning


def test_every_plugin_guardstack_ships_is_explained() -> None:
    from importlib.metadata import entry_points

    from guardstack.pipeline.harness import PLUGIN_GROUP

    required = {
        "retry": {},
        "timeout": {},
        "metrics": {},
        "tracing": {},
        "circuit-breaker": {},
        "concurrency-limit": {"max_concurrent": 2},
        "rate-limit": {"per_second": 1},
        "token-rate-limit": {"tokens_per_minute": 10_000},
        "fallback": {"to": "search"},
        "hedge": {"delay_ms": 100},
        "chaos": {"rate": 0.1, "fault": "hang"},
        "tool-call-limit": {"per_turn": 3},
        "agent-limit": {"max_agents": 3},
        "model-call-limit": {"per_turn": 3},
        "usage-limit": {"tokens_per_turn": 100},
        "turn-deadline": {"ms": 1000},
    }
    for point in entry_points(group=PLUGIN_GROUP):
        harness = Harness()
        harness.tools.register(ToolDefinition("search", _tool))
        harness.load([{"name": point.name, "config": required.get(point.name, {})}])
        [line] = check(harness).lines
        assert "no explanation known" not in line, point.name


def test_the_loop_detector_counts_as_a_loop_guard() -> None:
    from guardstack.guards import LoopDetector

    assert (
        warnings_of(stack(ToolCallLimit(per_turn=40), LoopDetector(), ToolCallTimeoutPolicy()))
        == []
    )


def test_a_tools_budget_outside_a_retry_of_timeouts_is_a_retry_that_never_retries() -> None:
    outside = stack(*GUARDS, ToolCallTimeoutPolicy(), Retry(attempts=3))
    assert any("can never retry that timeout" in w for w in warnings_of(outside))
    inside = stack(*GUARDS, Retry(attempts=3), ToolCallTimeoutPolicy())
    assert not any("can never retry that timeout" in w for w in warnings_of(inside))
    total = stack(*GUARDS, Timeout(ms=20_000), Retry(attempts=3), ToolCallTimeoutPolicy())
    assert not any("can never retry that timeout" in w for w in warnings_of(total))


def test_agent_tools_without_a_bound_or_a_deadline_are_warned_about() -> None:
    from guardstack.guards import AgentLimit, BudgetNotice, TurnDeadline
    from guardstack.pipeline import AgentTool

    harness = Harness()
    harness.tools.register(AgentTool("research", Harness, description="Research."))
    warnings = check(harness).warnings
    assert any(
        "agent tools (research) start child agents but no agent-limit" in w for w in warnings
    )
    assert any("agent tools (research) have no deadline" in w for w in warnings)

    harness.plugin(AgentLimit(max_depth=3, max_children=4))
    harness.plugin(TurnDeadline(ms=60_000))
    harness.plugin(BudgetNotice())
    report = check(harness)
    assert not any("agent tools" in w for w in report.warnings)
    assert (
        "agent-limit: at most 3 levels deep, 4 children per agent per turn (child agents "
        "below this harness count too); a refused child answers AGENT_STOPPED"
    ) in report.lines[0]
    assert report.lines[2].startswith("budget-notice: before each model call, tells the model")


def test_check_says_which_way_round_approval_stands() -> None:
    from guardstack.guards import Approval, LoopDetector

    late = Harness()
    late.plugin(Approval(require=("deploy",)))
    late.plugin(ToolCallLimit(per_turn=3))
    late.plugin(LoopDetector())
    report = check(late)
    assert report.lines[0] == (
        "approval: asks a person about tools matching deploy and tools annotated "
        "destructive, and pauses the turn (reason approval) until "
        "agent.resume(decisions=...); pre-execute layers registered before it decide first"
    )
    assert (
        "tool-call-limit, loop-detector registered after approval: a person is asked about "
        "calls they may then refuse; register them before approval so they deny first"
    ) in report.warnings

    early = Harness()
    early.plugin(ToolCallLimit(per_turn=3))
    early.plugin(Approval(require=("deploy",)))
    assert not any("after approval" in w for w in check(early).warnings)


def test_stream_bounds_token_minutes_and_queue_order_are_explained() -> None:
    from guardstack.wrappers import ConcurrencyLimit, Retry, Timeout, TokenRateLimit

    harness = Harness()
    harness.plugin(Retry(stage="model"))
    harness.plugin(Timeout(stage="model", first_byte_ms=5_000, idle_ms=2_000))
    harness.plugin(TokenRateLimit(tokens_per_minute=90_000, requests_per_minute=500, fair=True))
    harness.plugin(ConcurrencyLimit(4, queue=10))
    harness.plugin(Timeout(idle_ms=1_000))
    lines = check(harness).lines
    assert any(
        "bounds each attempt at" in line
        and "the first byte within 5000 ms and no gap over 2000 ms between one chunk" in line
        for line in lines
    )
    assert any(
        "at most 90000 tokens, 500 requests in any sliding minute" in line
        and "every attempt reserves" in line
        and "tenants in weighted turns (fair)" in line
        for line in lines
    )
    assert any("waiters by priority, then first come first served" in line for line in lines)
    assert any(
        "a tool that reports progress outlives its declared budget" in line for line in lines
    )


def test_a_layer_in_shadow_says_so() -> None:
    from guardstack.wrappers import CircuitBreaker

    harness = Harness()
    harness.plugin(CircuitBreaker(shadow=True))
    harness.plugin(CircuitBreaker(key="other"))
    lines = check(harness).lines
    assert sum("IN SHADOW" in line for line in lines) == 1


def test_a_downgrade_is_explained() -> None:
    from guardstack.guards import UsageLimit

    harness = Harness()
    harness.plugin(UsageLimit(tokens_per_day=1_000, downgrade={"at": 0.8, "to": "gpt-mini"}))
    assert any("past 80% of a window the cheaper model gpt-mini answers" in line
               for line in check(harness).lines)  # fmt: skip


def test_check_warns_of_a_model_the_stack_names_that_a_dollar_limit_cannot_price() -> None:
    from guardstack.cli.check import check
    from guardstack.pipeline import Harness

    harness = Harness()
    harness.load(
        [
            {
                "name": "usage-limit",
                "config": {
                    "usd_per_day": 5,
                    "prices": {"gpt-4o": [2.5, 10]},
                    "downgrade": {"at": 0.8, "to": "gpt-4o-mini"},
                },
            }
        ]
    )
    warnings = check(harness).warnings
    assert any("no price for model 'gpt-4o-mini'" in warning for warning in warnings)


def test_check_prints_the_model_proxys_routes_and_refuses_one_to_nobody(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from guardstack.cli.main import main

    assert main(["check", "--upstream", "claude=http://127.0.0.1:1", "--upstream",
                 "http://127.0.0.1:2", "--route", "messages:claude-*=claude"]) == 0  # fmt: skip
    said = capsys.readouterr().out
    assert "messages:claude-*=claude -> http://127.0.0.1:1" in said
    assert "anything else -> http://127.0.0.1:2" in said
    assert (
        main(["check", "--upstream", "claude=http://127.0.0.1:1", "--route", "gemini=gemni"]) == 2
    )
    assert "no upstream is named 'gemni'" in capsys.readouterr().err
