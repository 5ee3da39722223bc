"""``guardstack compare``: the same seeded faults for every stack, numbers that match theory."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path
from typing import Any

import pytest

from guardstack.cli.compare import compare, load_scenario, render
from guardstack.cli.main import main
from guardstack.guards import ToolCallTimeoutPolicy
from guardstack.pipeline import ConfigError, Harness
from guardstack.wrappers import Retry

ROOT = Path(__file__).parents[2]


def hanging(p: float, calls: int) -> dict[str, object]:
    return {
        "calls": calls,
        "give_up_s": 30,
        "tools": {"t": {"timeout_ms": 200, "latency_ms": 50, "hang_probability": p}},
    }


def retry_then_policy(attempts: int) -> Harness:
    harness = Harness()
    harness.plugin(Retry(attempts=attempts, backoff_ms=0, max_backoff_ms=0))
    harness.plugin(ToolCallTimeoutPolicy())
    return harness


def policy_then_retry(attempts: int) -> Harness:
    harness = Harness()
    harness.plugin(ToolCallTimeoutPolicy())
    harness.plugin(Retry(attempts=attempts, backoff_ms=0, max_backoff_ms=0))
    return harness


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


BAD_SCENARIOS = [
    ({"tools": {"t": {"hang_probability": 2}}}, "tools.t: `hang_probability` must be a finite"),
    ({"call": 3, "tools": {"t": {}}}, "unknown key 'call' (did you mean 'calls'?)"),
    ({"tools": {}}, "`tools` must map at least one tool"),
    ({"tools": {"search": {}}, "mix": {"serch": 1}}, "mix: unknown tool 'serch' (did you mean"),
    ({"tools": {"t": {}}, "mix": {"t": 0}}, "every weight is 0"),
    ({"tools": {"t": {"latncy_ms": 100}}}, "tools.t: unknown key 'latncy_ms' (did you mean"),
    ({"tools": {"t": {"failure_code": "TOOL_TIMOUT"}}}, "(did you mean 'TOOL_TIMEOUT'?)"),
    ({"tools": {"t": {"timeout_ms": math.inf}}}, "`timeout_ms` must be a finite number"),
    ({"tools": {"t": {}}, "calls": math.inf}, "`calls` must be a whole number"),
    ({"tools": {"t": {}}, "calls": "lots"}, "`calls` must be a whole number"),
    ({"tools": {"t": {"latency_ms": {"median": 5}}}}, "latency_ms: `p99` is missing"),
    ({"tools": {"t": {"idempotent": "yes"}}}, "`idempotent` must be true or false"),
]


@pytest.mark.parametrize(("scenario", "message"), BAD_SCENARIOS)
def test_bad_scenarios_are_refused_naming_the_key_path(
    scenario: dict[str, Any], message: str
) -> None:
    with pytest.raises(ConfigError, match=re.escape(message)):
        load_scenario(scenario)


def test_a_missing_scenario_file_says_scenario(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"cannot read scenario .*nope\.yaml"):
        load_scenario(str(tmp_path / "nope.yaml"))


@pytest.mark.parametrize("calls", [0, -5, 10**9])
def test_calls_out_of_range_are_refused(calls: int) -> None:
    scenario = load_scenario({"tools": {"t": {}}})
    with pytest.raises(ConfigError, match="--calls must be a whole number from 1"):
        compare([("bare", Harness)], scenario, calls=calls)


def example_comparison(calls: int) -> list[str]:
    """``compare`` of the two example stacks on the example scenario."""
    examples = ROOT / "examples"
    return [
        "compare",
        str(examples / "per-attempt.yaml"),
        str(examples / "whole-operation.yaml"),
        "--scenario",
        str(examples / "scenario.yaml"),
        "--calls",
        str(calls),
    ]


def test_json_output_is_byte_for_byte_the_same_for_a_seed(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Unseeded jitter in the stacks' retries drew from the system's entropy before."""
    args = [*example_comparison(400), "--seed", "1", "--json"]
    outputs = []
    for _ in range(2):
        assert main(args) == 0
        outputs.append(capsys.readouterr().out)
    assert outputs[0] == outputs[1]


def test_the_command_prints_a_table_and_json(capsys: pytest.CaptureFixture[str]) -> None:
    args = example_comparison(300)
    assert main(args) == 0
    table = capsys.readouterr().out
    assert table.splitlines()[0].startswith("| stack ")
    assert "per-attempt.yaml" in table
    assert main([*args, "--json"]) == 0
    stacks = json.loads(capsys.readouterr().out)["stacks"]
    assert [s["config"] for s in stacks] == ["per-attempt.yaml", "whole-operation.yaml"]
    assert set(stacks[0]) == {
        "config", "success_rate", "p50_ms", "p95_ms", "p99_ms", "mean_attempts",
        "wasted_tool_s", "timeouts_by_code", "goodput_per_s", "rate_limited_per_success",
    }  # fmt: skip
    assert stacks[0]["success_rate"] > stacks[1]["success_rate"]


def test_plot_draws_a_png(tmp_path: Path) -> None:
    from guardstack.cli.compare import plot

    scenario = load_scenario(hanging(0.2, 200))
    results = compare(
        [("per attempt", lambda: retry_then_policy(3)), ("bare", Harness)], scenario, seed=1
    )
    target = tmp_path / "compare.png"
    plot(results, str(target))
    data = target.read_bytes()
    assert data.startswith(b"\x89PNG\r\n\x1a\n")
    width, height = int.from_bytes(data[16:20], "big"), int.from_bytes(data[20:24], "big")
    assert (width, height) == (1210, 440)  # 11 x 4 inches at 110 dpi
    assert len(results[0].latencies_ms) == 200


def test_the_plot_can_be_read_at_a_glance() -> None:
    """A title naming scenario and seed, one colour per stack in both panels, the rate on
    each bar, a marker at each declared budget."""
    from matplotlib.colors import to_hex

    from guardstack.cli.compare import figure, scenario_budgets

    scenario = load_scenario(hanging(0.2, 100))
    results = compare(
        [("per attempt", lambda: retry_then_policy(3)), ("bare", Harness)], scenario, seed=1
    )
    drawn = figure(results, title="hang.yaml, seed 1", budgets_ms=scenario_budgets(scenario))
    latency, success = drawn.axes
    assert drawn._suptitle.get_text() == "hang.yaml, seed 1"
    lines = [line for line in latency.get_lines() if line.get_linestyle() == "-"]
    line_colours = [to_hex(line.get_color()) for line in lines]
    bar_colours = [to_hex(bar.get_facecolor()) for bar in success.patches]
    assert line_colours == bar_colours
    assert len(set(line_colours)) == 2
    labels = sorted(text.get_text() for text in success.texts)
    assert labels == sorted(f"{stats.success_rate * 100:.1f}%" for stats in results)
    budgets = [line for line in latency.get_lines() if line.get_linestyle() == "--"]
    assert [line.get_xdata()[0] for line in budgets] == [200.0]
    assert "t budget 200 ms" in [text.get_text() for text in latency.texts]


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


@pytest.mark.parametrize(
    ("change", "key"),
    [
        ({"tenants": {"a": {"share": 0}}}, "share"),
        ({"tenants": {"a": {"priority": 1.5}}}, "priority"),
        ({"tenants": {"a": {"weight": 1}}}, "weight"),
        ({"tenants": []}, "tenants"),
        ({"tools": {"t": {"stream": {"chunk_ms": 10}}}}, "first_byte_ms"),
        ({"tools": {"t": {"stream": {"first_byte_ms": 10, "chunk_ms": 0}}}}, "chunk_ms"),
        ({"tools": {"t": {"stream": {"first_byte_ms": 1, "chunk_ms": 1, "stall": 1}}}}, "stall"),
        (
            {"tools": {"t": {"capacity": {"concurrent": 2, "latency_grows": "no"}}}},
            "capacity.latency_grows",
        ),
    ],
)
def test_bad_tenants_streams_and_caps_are_named(change: dict[str, Any], key: str) -> None:
    base: dict[str, Any] = {"calls": 10, "tools": {"t": {"latency_ms": 10}}}
    with pytest.raises(ConfigError) as raised:
        load_scenario({**base, **change})
    assert raised.value.key == key
