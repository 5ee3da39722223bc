"""``guardstack compare`` reports: the table, the JSON (the same bytes for a seed) and the plot."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from guardstack.cli.compare import compare, load_scenario
from guardstack.cli.main import main
from guardstack.pipeline import Harness
from tests.cli.compare.stacks import example_comparison, hanging, retry_then_policy


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
