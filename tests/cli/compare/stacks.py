"""The scenarios and stacks the ``compare`` tests share."""

from __future__ import annotations

from pathlib import Path

from guardstack.guards import ToolCallTimeoutPolicy
from guardstack.pipeline import Harness
from guardstack.wrappers import Retry

ROOT = Path(__file__).parents[3]


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
