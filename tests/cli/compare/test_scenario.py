"""``guardstack compare`` scenarios: a file that does not describe one is refused,
naming the key path."""

from __future__ import annotations

import math
import re
from pathlib import Path
from typing import Any

import pytest

from guardstack.cli.compare import compare, load_scenario
from guardstack.pipeline import ConfigError, Harness

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
